"""The behaviour weights' per-step diagnostics (rpg.math.behavior): effective sample size and the log weight's second
moment over a step's tokens, against hand computations; the largest applied weight respects the arm's cap."""

from __future__ import annotations

import math

import pytest
import torch

from rpg.math.behavior import (add_step_sums, behavior_metrics, behavior_step_metrics, behavior_step_sums,
                               behavior_weights)


def _logs(*rows):
    """[B, T] float32 log-probs from ragged rows (0-padded) and their mask."""
    t = max(map(len, rows))
    lp = torch.zeros(len(rows), t)
    mask = torch.zeros(len(rows), t)
    for i, r in enumerate(rows):
        lp[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return lp, mask


def _step(old, mu, mask):
    return behavior_step_metrics(behavior_step_sums(old, mu, mask))


def test_ess_and_m2_by_hand():
    # log w = old - mu = [0, ln 2, ln 4] (w = 1, 2, 4) in one row, [-ln 2] (w = 1/2) in another; padding ignored
    mu, mask = _logs([-1.0, -2.0, -3.0], [-0.5])
    old = mu + torch.tensor([[0.0, math.log(2), math.log(4)], [-math.log(2), 99.0, 99.0]])
    w = [1.0, 2.0, 4.0, 0.5]
    log_w = [math.log(x) for x in w]
    m = _step(old, mu, mask)
    assert m["rpg/behavior_ess"] == pytest.approx(sum(w) ** 2 / (len(w) * sum(x * x for x in w)), rel=1e-6)
    assert m["rpg/behavior_ess"] == pytest.approx(56.25 / (4 * 21.25), rel=1e-6)
    assert m["rpg/behavior_log_w_m2"] == pytest.approx(sum(x * x for x in log_w) / 4, rel=1e-6)


def test_mu_equal_to_pi_old_gives_ess_1_and_m2_0():
    old, mask = _logs([-1.0, -2.5, -0.1], [-3.0, -0.2])
    assert _step(old, old.clone(), mask) == {"rpg/behavior_ess": 1.0, "rpg/behavior_log_w_m2": 0.0}
    # equal weights that are not 1 (a constant shift of the log weight) are an equally effective sample
    m = _step(old, old - 0.7 * mask, mask)
    assert m["rpg/behavior_ess"] == pytest.approx(1.0, abs=1e-12)
    assert m["rpg/behavior_log_w_m2"] == pytest.approx(0.49, rel=1e-6)


def test_a_step_of_several_mini_batches_is_one_statistic_over_all_its_tokens():
    """The sums of two mini-batches give the statistic of their concatenation (not the mean of two statistics)."""
    g = torch.Generator().manual_seed(0)
    old, mu = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    mask = (torch.rand(6, 5, generator=g) > 0.3).float()
    whole = _step(old, mu, mask)
    parts = None
    for rows in (slice(0, 2), slice(2, 6)):
        parts = add_step_sums(parts, behavior_step_sums(old[rows], mu[rows], mask[rows]))
    split = behavior_step_metrics(parts)
    assert split == pytest.approx(whole, rel=1e-12)
    halves = [_step(old[r], mu[r], mask[r])["rpg/behavior_ess"] for r in (slice(0, 2), slice(2, 6))]
    assert whole["rpg/behavior_ess"] != pytest.approx(sum(halves) / 2, rel=1e-6)  # a mean of two would differ
    assert 0 < whole["rpg/behavior_ess"] < 1
    # one dominant weight: ESS near 1/N
    spike = torch.zeros(1, 50)
    spike[0, 0] = 30.0
    ess = _step(spike, torch.zeros(1, 50), torch.ones(1, 50))["rpg/behavior_ess"]
    assert 1 / 50 < ess < 1.01 / 50


def test_no_valid_token_gives_no_statistic():
    old, mask = _logs([-1.0])
    assert _step(old, old, mask * 0) == {}


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_the_largest_applied_weight_respects_the_cap(level):
    mu, mask = _logs([-2.0, -2.0, -2.0], [-1.0, -1.0])
    old = mu + torch.tensor([[1.5, 0.0, -0.5], [0.2, 0.3, 0.0]]) * mask
    raw = behavior_weights(old, mu, mask, level)
    uncapped = behavior_metrics(old, mu, mask, raw, raw)
    top = math.exp(1.0) if level == "sequence" else math.exp(1.5)  # row 0: exp(1.5 + 0 - 0.5) per sequence
    assert uncapped["rpg/behavior_weight_max"] == pytest.approx(top, rel=1e-6)
    for cap in (2.0, 1.0, 0.5):
        applied = behavior_weights(old, mu, mask, level, cap)
        m = behavior_metrics(old, mu, mask, applied, raw)
        assert m["rpg/behavior_weight_max"] == pytest.approx(min(top, cap), rel=1e-6)
        assert m["rpg/behavior_weight_max"] <= cap
    none = behavior_weights(old, mu, mask, "none")
    assert behavior_metrics(old, mu, mask, none, raw)["rpg/behavior_weight_max"] == 1.0  # the none arm applies 1
