"""Operator and memory budget: forward+backward of every RPG loss (with its metrics) launches at most as many
top-level aten operators as verl's vanilla dual-clip PPO loss with its metrics, counted the same way
(``benchmarks/bench_losses.count_ops``, torch.profiler, 4 x 1024 tokens). Operator counts are
deterministic, so this is a test, and so are peak tensor bytes from the profiler's allocation events (at most
1.10x vanilla's); times are measured by the benchmark, not here."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_losses", Path(__file__).parents[1] / "benchmarks" / "bench_losses.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

INPUTS = bench.make_inputs(4, 1024)


@pytest.fixture(scope="module")
def vanilla_ops():
    n = bench.count_ops(bench.make_step(None, INPUTS))
    assert 60 < n < 200, f"implausible vanilla count {n}: the counting itself is broken"
    return n


@pytest.mark.parametrize("variant", bench.VARIANTS, ids=bench.label)
def test_rpg_loss_costs_at_most_vanilla_ops(variant, vanilla_ops):
    n = bench.count_ops(bench.make_step(variant, INPUTS))
    assert n <= vanilla_ops, f"{bench.label(variant)}: {n} aten ops > verl vanilla's {vanilla_ops}"


def test_verl_glue_costs_at_most_vanilla_ops(vanilla_ops):
    variant = dict(form="reinforce", divergence="ufkl", clip=True, anchor="sampler")
    n = bench.count_ops(bench.make_step(variant, INPUTS, glue=True))
    assert n <= vanilla_ops, f"rpg.verl.policy_loss.rpg_policy_loss: {n} aten ops > verl vanilla's {vanilla_ops}"


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
def test_rpg_loss_peak_memory_at_most_vanilla(variant, vanilla_peak):
    """Peak live tensor bytes (profiler allocation events: deterministic) <= 1.10x verl vanilla's."""
    peak = bench.peak_bytes(bench.make_step(variant, MEMORY_INPUTS), "cpu")
    assert peak <= 1.10 * vanilla_peak, f"{bench.label(variant)}: {peak} bytes > 1.10 x vanilla's {vanilla_peak}"
