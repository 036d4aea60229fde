"""One-step smoke run of benchmarks/bench_trainer_cpu.py (the ``bench`` CI stage): verl's GRPO through the recipe
and the same GRPO through verl's own entry train a step each (the third arm, the recipe's RPG with the sampler
anchor, in bench_async_cpu.py's smoke run), the table and the ratios are printed, and each arm built the models
it should."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks_module import load_benchmark
from messages import names

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(name: str, args: list[str], tiny_assets, timeout_s: float = 1200) -> subprocess.CompletedProcess:
    """``python benchmarks/<name> ARGS`` from the project root, with the session's tiny build; asserts exit 0."""
    env = {**os.environ, "RPG_TINY_CACHE": str(tiny_assets.root.parent)}
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], capture_output=True, text=True,
                       timeout=timeout_s, cwd=ROOT, env=env)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    return p


def _load(name: str):
    return load_benchmark(name)  # bench_async_cpu puts benchmarks/ on sys.path to import bench_trainer_cpu


@pytest.mark.bench
@pytest.mark.e2e
def test_the_trainer_benchmark_runs_its_arms(tiny_assets, tmp_path, monkeypatch):
    """Before: the third arm (grpo_stock) stopped at Hydra's composition: verl's own entry was handed the
    recipe's rpg.loss.name=verl ("Could not override 'rpg.loss.name'"), and --steps 1 was refused.

    The two GRPO arms run here; the third, rpg_sampler, is launched by bench_async_cpu.py's smoke test as
    its rpg_sync arm (the same entry and overrides plus verl's default trainer mode, checked below): one
    trainer launch fewer in the bench stage."""
    monkeypatch.setenv("RPG_TINY_CACHE", str(tiny_assets.root.parent))
    trainer, asynchronous = _load("bench_trainer_cpu"), _load("bench_async_cpu")
    entry, sampler = trainer.overrides("rpg_sampler", 1)
    assert asynchronous.base.overrides("rpg_sync", 1, asynchronous.VARIANTS) == (
        entry, [*sampler, "trainer.v1.trainer_mode=sync"])  # verl's default (ppo_trainer.yaml trainer.v1)
    stock_entry, stock = trainer.overrides("grpo_stock", 1)
    assert stock_entry == "verl.trainer.main_ppo" and not [o for o in stock if o.startswith("rpg.")]
    assert [o for o in trainer.overrides("grpo_ref", 1)[1] if not o.startswith("rpg.")] == stock

    p = run_benchmark("bench_trainer_cpu.py", ["--steps", "1", "--repeats", "1", "--arms", "grpo_ref,grpo_stock",
                                               "--out", str(tmp_path / "runs"), "--json", str(tmp_path / "out.json")],
                      tiny_assets)
    res = json.loads((tmp_path / "out.json").read_text())
    med = res["medians"]
    assert list(med) == ["grpo_ref", "grpo_stock"]
    for name, m in med.items():
        assert m["runs"] == 1 and m["step_s"] > 0 and m["update_actor_s"] > 0 and m["peak_pss_gb"] > 0.1, (name, m)
        assert m["ref_s"] > 0, (name, m)  # both GRPO arms compute the fixed reference's log-probs
    assert set(res["ratios"]) == {k for k in trainer.RATIOS if "grpo_stock" in k}
    assert all(math.isfinite(v) and v > 0 for v in res["ratios"].values()), res["ratios"]
    names(p.stdout, "step 1 only", "not a measurement")  # a smoke run's figures are labelled as such
    assert "step_time grpo_ref/grpo_stock (recipe overhead)" in p.stdout
