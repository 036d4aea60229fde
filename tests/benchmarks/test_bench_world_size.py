"""One-step smoke run of benchmarks/bench_world_size.py (the ``bench`` CI stage): both world sizes train a step,
the table and the ratios are printed, every rank's peak memory was measured (one figure per rank)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.bench
@pytest.mark.e2e
def test_the_world_size_benchmark_runs_one_step_at_each_world_size(tiny_assets, tmp_path):
    env = {**os.environ, "RPG_TINY_CACHE": str(tiny_assets.root.parent)}
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_world_size.py"), "--steps", "1",
                        "--out", str(tmp_path / "runs"), "--json", str(tmp_path / "out.json")],
                       capture_output=True, text=True, timeout=1200, cwd=ROOT, env=env)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    res = json.loads((tmp_path / "out.json").read_text())
    for ws in ("1", "2"):
        r = res["results"][ws]
        assert len(r["rank_peak_rss_gb"]) == int(ws) and all(0.1 < g < 20 for g in r["rank_peak_rss_gb"]), r
        assert r["step_s"] and all(t > 0 for t in r["step_s"]) and r["peak_pss_gb"] > 0, r
    assert "step time ws2/ws1" in p.stdout and "peak RSS per rank" in p.stdout
