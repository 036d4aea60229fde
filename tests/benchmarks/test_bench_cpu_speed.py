"""Smoke run of benchmarks/bench_cpu_speed.py (the ``bench`` CI stage): README's main command (2 steps, so that a
step median exists) and one test file as the "suite", in this tree alone (no ``--baseline``: one launch, not
two; the baseline is measured by the same functions), every quantity measured."""

from __future__ import annotations

import json

import pytest
from test_bench_trainer import run_benchmark


@pytest.mark.bench
@pytest.mark.e2e
def test_the_cpu_speed_benchmark_measures_the_main_command_and_the_suite(tiny_assets, tmp_path):
    p = run_benchmark("bench_cpu_speed.py", ["--steps", "2", "--suite",
                                             "--suite-args", "tests/project/test_docs_references.py", "--json",
                                             str(tmp_path / "out.json")], tiny_assets)
    res = json.loads((tmp_path / "out.json").read_text())
    assert list(res["main_command"]) == list(res["suite"]) == ["this"]
    (cmd,), (suite,) = res["main_command"]["this"], res["suite"]["this"]
    assert cmd["wall_s"] > cmd["first_step_s"] > 0 and cmd["step_median_s"] > 0, cmd
    assert cmd["validations"] == 2 and cmd["validation_median_s"] > 0, cmd  # before training, at the last step
    assert cmd["machine_busy_cpu_s"] > 0 and len(cmd["val_acc"]) == 2, cmd
    assert suite["returncode"] == 0 and suite["counts"]["passed"] > 0 and suite["wall_s"] > 0, suite
    assert "main command, this: {" in p.stdout and "suite, this: {" in p.stdout and " ratio " not in p.stdout
