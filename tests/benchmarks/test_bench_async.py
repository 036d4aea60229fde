"""One-step smoke run of benchmarks/bench_async_cpu.py (the ``bench`` CI stage): the recipe's RPG trains a step in
verl's sync and colocate-async trainers, the medians and the ratio are printed."""

from __future__ import annotations

import json
import math

import pytest
from messages import names
from test_bench_trainer import run_benchmark


@pytest.mark.bench
@pytest.mark.e2e
def test_the_async_benchmark_runs_both_modes(tiny_assets, tmp_path):
    p = run_benchmark("bench_async_cpu.py", ["--steps", "1", "--out", str(tmp_path / "runs"), "--json",
                                             str(tmp_path / "out.json")], tiny_assets)
    res = json.loads((tmp_path / "out.json").read_text())
    assert list(res["medians"]) == ["rpg_sync", "rpg_colocate_async"]
    for name, m in res["medians"].items():
        assert m["runs"] == 1 and m["step_s"] > 0 and m["peak_pss_gb"] > 0.1, (name, m)
    assert math.isfinite(res["ratio_step_time_async_over_sync"]) and res["ratio_step_time_async_over_sync"] > 0
    (run,) = res["raw"]["rpg_colocate_async"]
    assert run["series"]["training/off_policy/trajectory_staleness/min"] == [0.0]  # step 1: nothing generated ahead
    names(p.stdout, "step 1 only", "not a measurement")  # a smoke run's figures are labelled as such
    assert "step_time colocate_async/sync" in p.stdout
