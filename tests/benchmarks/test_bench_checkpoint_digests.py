"""Smoke run of benchmarks/bench_checkpoint_digests.py (the ``bench`` CI stage): both arms save, mark and verify
a small checkpoint at world size 1 and 2, and the ratios are printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.bench
def test_the_checkpoint_digest_benchmark_saves_marks_and_verifies_at_each_world_size(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_checkpoint_digests.py"), "--gib", "0.02",
                        "--repeats", "1", "--dir", str(tmp_path), "--json", str(tmp_path / "out.json")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    res = json.loads((tmp_path / "out.json").read_text())
    for ws in ("1", "2"):
        for arm in ("one process", "per rank"):
            r = res["results"][ws][arm]
            assert 0.015 < r["gib"] < 0.03 and r["save_marker_s"] > 0 and r["verify_s"] > 0, r
        assert res["ratios"][ws]["save_marker"] > 0, res["ratios"]
        read = {arm: res["results"][ws][arm]["trainer_read_mib"] for arm in ("one process", "per rank")}
        assert read["per rank"] < 0.01 < 15 < read["one process"], read  # data.pt only, against every file
        assert f"world size {ws}: save+marker one process / per rank = " in p.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # the checkpoints were removed
