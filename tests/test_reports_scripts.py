"""The thin CLI wrappers in scripts/ run as plain `python scripts/<name>.py` commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_scripts_end_to_end(tmp_path):
    log = tmp_path / "run.jsonl"
    lines = []
    for s in range(0, 401, 10):
        lines.append({"step": s, "data": {"val-core/aime2024/acc/mean@32": 0.25, "val-core/aime2025/acc/mean@32": 0.125,
                                          "critic/score/mean": 0.0, "actor/entropy": 0.5, "response_length/mean": 900}})
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = _run("scripts/report_tables.py", f"GRPO={log}", "--table", "6")
    assert r.returncode == 0, r.stderr
    assert "| GRPO | 0.2500 | 0.2563 | -0.0063 | 0.2500 | 0.2708 | -0.0208 | 0.1250 | 0.2323 | -0.1073 |" in r.stdout
    r = _run("scripts/plot_curves.py", f"GRPO={log}", "--out", str(tmp_path / "fig"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "fig.png").stat().st_size > 0 and (tmp_path / "fig.svg").stat().st_size > 0
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    r = _run("scripts/prepare_data.py", "prepare", "aime2024", "--input", str(src), "--out", str(tmp_path / "a.parquet"))
    assert r.returncode == 0 and "wrote 1 rows" in r.stdout
