"""Data-parallel equivalence: one update from the same global mini-batch gives the same parameters, and verl logs
the same metrics, at world sizes 4, 2 and 1 and at every micro-batch size, for every policy loss the recipe runs.

The ranks (tests/support/dp_equivalence_ranks.py, spawned once: 4 gloo ranks, FSDP2 ``fully_shard``, verl's own loss
functions, global batch info and metric reduction) run each configuration at world size 4, twice at world size 2
and four times at world size 1 (1, 2, 4 and 8 micro-batches); world size 1 with one micro-batch is the reference.
Responses of 1 to 9 tokens (one fully masked, one masked interior token) split by equal row counts, so very
unequal token counts, across ranks.

Tolerance (float32, as verl's fp32 path on CPU): |update - reference update| <= 1e-5 x max |reference update|,
elementwise. Each parameter's gradient sums up to ~45 token terms, accumulated over 1-8 micro-batches and
averaged over 1-4 ranks in a different order at each world size; float32 rounds each step by <= 2^-24 relative,
so the order changes the sum by about (number of terms) x 6e-8 = ~3e-6 of the summed magnitudes. Measured worst
over all configurations: 1.7e-6 (2026-11-25). The negative controls differ by 4 (seq-mean-token-sum-norm without
its constant) and 15 (a per-rank token count) times the update's size: the test can fail. Metrics: relative 1e-5
(absolute 1e-7 near zero).

Cost: about 25 s inside the ranks plus start-up on 2 cores (marked ``distributed``: README's suite has no room).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).parents[1] / "support" / "dp_equivalence_ranks.py"
sys.path.insert(0, str(SCRIPT.parent))
from dp_equivalence_ranks import AGGS, configurations  # noqa: E402
from fsdp_reference_ranks import run_ranks_script  # noqa: E402

CONFIGS = configurations()
TESTED = [n for n in CONFIGS if not n.startswith("control-")]
CONTROLS = [n for n in CONFIGS if n.startswith("control-")]
PHASES = ["w4-rank0", "w4-rank1", "w4-rank2", "w4-rank3", "w2-rank0", "w2-rank1", "w2-rank2", "w2-rank3",
          "w1-rank1", "w1-rank2", "w1-rank3"]
REFERENCE = "w1-rank0"  # world size 1, one micro-batch of the whole mini-batch
UPDATE_TOL = 1e-5
METRIC_RTOL, METRIC_ATOL = 1e-5, 1e-7
# verl's own losses (rpg.loss.name=verl) keep verl's metrics: its policy-loss statistics are marked MEAN per
# micro-batch, so verl logs the mean of the micro-batches' means, which depends on the split (verl's behaviour, left
# as is); their losses (SUM) agree. The RPG losses' statistics are global means (rpg.verl.actor_loss._global_means).
VERL_MEAN_METRICS = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    per_rank = run_ranks_script(SCRIPT, tmp_path_factory.mktemp("dp_equivalence") / "records.json")
    merged: dict[str, dict] = {}
    for records in per_rank:
        for name, phases in records.items():
            if name != "_wall_s":
                merged.setdefault(name, {}).update(phases)
    print(f"ranks' wall time: {max(r['_wall_s'] for r in per_rank):.1f} s for {len(CONFIGS)} configurations")
    return merged


def _update_error(run: dict) -> tuple[float, float]:
    """(max over phases of max |update - reference| / max |reference|, max |reference|)."""
    ref = np.asarray(run[REFERENCE]["update"])
    scale = float(np.abs(ref).max())
    return max(float(np.abs(np.asarray(run[p]["update"]) - ref).max()) for p in PHASES) / scale, scale


def test_every_configuration_ran_in_every_phase(runs):
    assert set(runs) == set(CONFIGS)
    for name, run in runs.items():
        assert set(run) == {REFERENCE, *PHASES}, name
    assert {c.get("agg", "token-mean") for c in CONFIGS.values()} == set(AGGS)


@pytest.mark.parametrize("name", TESTED)
def test_one_update_is_the_same_at_every_world_size_and_micro_batch_size(runs, name):
    err, scale = _update_error(runs[name])
    assert scale > 1e-3, f"{name}: the update is too small to compare ({scale})"
    assert err <= UPDATE_TOL, f"{name}: relative update difference {err:.2e}"


@pytest.mark.parametrize("name", TESTED)
def test_logged_metrics_are_the_same_at_every_world_size(runs, name):
    """verl's reduction (append_to_dict, allgather over the group, Metric.aggregate_dp): a *_max / *_min is the
    extreme over all ranks' tokens, a mean the mean over the global mini-batch, a loss its global value."""
    run, verl_loss = runs[name], CONFIGS[name]["loss"].startswith("vanilla")
    want = run[REFERENCE]["metrics"]
    assert "loss" in want and "actor/pg_loss" in want
    if not verl_loss:
        assert {"rpg/kl_estimate", "rpg/ratio_mean", "rpg/ratio_max", "rpg/ratio_min"} <= set(want)
    for phase in PHASES:
        got = run[phase]["metrics"]
        assert set(got) == set(want), (name, phase)
        for key, value in want.items():
            if verl_loss and key in VERL_MEAN_METRICS:
                continue
            assert math.isfinite(got[key]), (name, phase, key)
            assert got[key] == pytest.approx(value, rel=METRIC_RTOL, abs=METRIC_ATOL), (name, phase, key)


@pytest.mark.parametrize("name", CONTROLS)
def test_negative_controls_differ(runs, name):
    """seq-mean-token-sum-norm without loss_scale_factor (verl divides by each micro-batch's longest response) and a
    per-rank token count (no all-reduce) change the update with the split: the comparison above can fail."""
    err, _ = _update_error(runs[name])
    assert err > 100 * UPDATE_TOL, f"{name}: {err:.2e}"
