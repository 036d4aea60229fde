"""The CPU backend's vectorized validation bootstrap (rpg/backends/cpu/patches.py, item 4) against verl's own
``bootstrap_metric``: the same resamples, so the same (mean, std) bit for bit. (Its speed is a measurement, not
asserted here: verl's ``process_validation_metrics`` on the tiny demo's 30 prompts x 4 samples took 11.2 s on the
loaded development machine, 0.7 s with the patch; docs/cpu-backend.md.)"""

import functools
import types

import numpy as np
import pytest
from verl.trainer.ppo import metric_utils

from rpg.backends.cpu.patches import patch_vectorized_bootstrap

VERL_BOOTSTRAP = getattr(metric_utils.bootstrap_metric, "__wrapped__", metric_utils.bootstrap_metric)


@pytest.fixture(scope="module")
def fast():
    module = types.SimpleNamespace(bootstrap_metric=VERL_BOOTSTRAP)  # a stand-in module: verl's stays as it is
    from rpg.backends.cpu import patches

    applied = set(patches._APPLIED)
    patches._APPLIED.discard("bootstrap")
    try:
        patch_vectorized_bootstrap(module)
    finally:
        patches._APPLIED.clear()
        patches._APPLIED.update(applied)
    assert module.bootstrap_metric is not VERL_BOOTSTRAP
    return module.bootstrap_metric


@pytest.mark.parametrize("data", [[1.0, -1.0, -1.0, 1.0], [True, False, True, True, False, False, True, True],
                                  list(np.random.default_rng(0).normal(size=7)), [0, 1], [0.5]])
@pytest.mark.parametrize("subset_size", [1, 2, 4])
def test_same_means_and_stds_bit_for_bit_as_verls(fast, data, subset_size):
    for seed in (42, 7):
        ours = fast(data, subset_size, [np.max, np.min], n_bootstrap=200, seed=seed)
        theirs = VERL_BOOTSTRAP(data, subset_size, [np.max, np.min], n_bootstrap=200, seed=seed)
        assert ours == theirs  # exact: the same float64 values, reduced in the same order


def test_other_reductions_run_verls_loop(fast):
    vote = [{"val": v, "pred": p} for v, p in [(1, "a"), (0, "b"), (1, "a"), (0, "c")]]
    maj = [functools.partial(metric_utils.calc_maj_val, vote_key="pred", val_key="val")]
    assert fast(vote, 3, maj, n_bootstrap=50) == VERL_BOOTSTRAP(vote, 3, maj, n_bootstrap=50)
    assert fast([1.0, 2.0, 4.0], 2, [np.mean], n_bootstrap=50) == VERL_BOOTSTRAP([1.0, 2.0, 4.0], 2, [np.mean], n_bootstrap=50)


def test_a_validations_metrics_are_verls(fast, monkeypatch):
    """``process_validation_metrics`` (what the trainer calls after every validation) on the tiny demo's shape
    (prompts x 4 samples, scores +-1 with acc; 8 prompts here, the demo has 30): identical output."""
    rng = np.random.default_rng(1)
    uids = [f"u{i}" for i in range(8) for _ in range(4)]
    acc = [bool(a) for a in rng.uniform(size=32) < 0.4]
    infos = {"acc": acc, "score": [1.0 if a else -1.0 for a in acc], "reward": [1.0 if a else -1.0 for a in acc]}
    theirs = metric_utils.process_validation_metrics(["math_dapo"] * 32, uids, infos)
    monkeypatch.setattr(metric_utils, "bootstrap_metric", fast)
    assert metric_utils.process_validation_metrics(["math_dapo"] * 32, uids, infos) == theirs
