"""Every file of ``rpg/`` stays readable: at most ``MAX_LINES`` lines (split a longer one by concern)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 450


@pytest.mark.parametrize("path", sorted((ROOT / "rpg").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_files_stay_readable(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(ROOT)} has {n} lines (at most {MAX_LINES}): split it by concern"
