"""Operator and memory budgets: forward+backward of every RPG loss with its metrics launches at most ``OPS_BUDGET``
times the top-level aten operators of verl's vanilla dual-clip PPO loss with its metrics, counted the same way
(``benchmarks/bench_losses.count_ops``, torch.profiler, 4 x 1024 tokens), and holds at most ``MEMORY_BUDGET`` times
its peak tensor bytes (the profiler's allocation events). Both are deterministic, so they are tests; each is an upper
bound with a margin over today's figures (benchmarks/README.md#bench_lossespy), not a freeze of them: a clearer
statement of a loss may spend a few operators. Times are the benchmark's, not asserted here."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_losses",
                                               Path(__file__).parents[2] / "benchmarks" / "bench_losses.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

INPUTS = bench.make_inputs(4, 1024)
OPS_BUDGET = 1.2  # today at most 0.96 (90 of vanilla's 94: reinforce urkl, clip, reference anchor)
MEMORY_BUDGET = 1.1  # today at most 1.02


@pytest.fixture(scope="module")
def vanilla_ops():
    n = bench.count_ops(bench.make_step(None, INPUTS))
    assert 60 < n < 200, f"implausible vanilla count {n}: the counting itself is broken"
    return n


@pytest.mark.parametrize("variant", bench.VARIANTS, ids=bench.label)
def test_rpg_loss_ops_within_budget(variant, vanilla_ops):
    n = bench.count_ops(bench.make_step(variant, INPUTS))
    assert n <= OPS_BUDGET * vanilla_ops, \
        f"{bench.label(variant)}: {n} aten ops > {OPS_BUDGET} x verl vanilla's {vanilla_ops}"


def test_verl_glue_ops_within_budget(vanilla_ops):
    variant = dict(form="reinforce", divergence="ufkl", clip=True, anchor="sampler")
    n = bench.count_ops(bench.make_step(variant, INPUTS, glue=True))
    assert n <= OPS_BUDGET * vanilla_ops, \
        f"rpg.verl.policy_loss.rpg_policy_loss: {n} aten ops > {OPS_BUDGET} x verl vanilla's {vanilla_ops}"


def test_count_ops_counts_what_runs():
    """The counter sees an extra operator: guard against a count that cannot fail."""
    import torch

    lp0 = INPUTS[0]

    def step(lp):
        (lp * 2).sum().backward()

    def step_more(lp):
        (lp * 2 + 1).sum().backward()

    def once_of(s):
        def once():
            s(lp0.clone().requires_grad_(True))
        once.step, once.log_prob0 = s, lp0
        return once

    assert bench.count_ops(once_of(step_more)) > bench.count_ops(once_of(step)) > 0
    assert torch.is_tensor(lp0)


MEMORY_INPUTS = bench.make_inputs(16, 1024)


@pytest.fixture(scope="module")
def vanilla_peak():
    return bench.peak_bytes(bench.make_step(None, MEMORY_INPUTS), "cpu")


@pytest.mark.parametrize("variant", bench.VARIANTS, ids=bench.label)
def test_rpg_loss_peak_memory_within_budget(variant, vanilla_peak):
    """Peak live tensor bytes (profiler allocation events: deterministic)."""
    peak = bench.peak_bytes(bench.make_step(variant, MEMORY_INPUTS), "cpu")
    assert peak <= MEMORY_BUDGET * vanilla_peak, \
        f"{bench.label(variant)}: {peak} bytes > {MEMORY_BUDGET} x vanilla's {vanilla_peak}"
