"""RPG's baseline-subtracted advantages (T28 in docs/math.md#testable-identities) and agreement with verl's GRPO estimator
when its std normalisation is switched off."""

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from rpg.math.advantage import batch_mean_advantage, group_mean_advantage, outcome_advantage


def test_t28_group_sums_vanish_and_singletons_keep_their_reward():
    scores = torch.tensor([1.0, -1.0, 1.0, 1.0, 0.5, -1.0, -1.0, 2.0])
    index = ["a", "a", "a", "b", "b", "c", "c", "solo"]
    adv = group_mean_advantage(scores, index)
    for g in set(index) - {"solo"}:
        members = [i for i, x in enumerate(index) if x == g]
        assert adv[members].sum().abs() < 1e-6
    assert adv[-1] == 2.0
    assert torch.allclose(adv[:3], torch.tensor([1 / 3 * 2, -4 / 3, 2 / 3]))
    assert (adv[5:7] == 0).all(), "all-equal rewards give zero advantage, no division by a zero std"


def test_matches_verl_grpo_without_std_normalisation():
    g = torch.Generator().manual_seed(0)
    rewards = torch.zeros(12, 5)
    lengths = torch.randint(1, 6, (12,), generator=g)
    mask = (torch.arange(5)[None] < lengths[:, None]).float()
    rewards[torch.arange(12), lengths - 1] = torch.randn(12, generator=g)
    index = np.array(["p0"] * 4 + ["p1"] * 4 + ["p2"] * 3 + ["p3"])
    ours, returns = outcome_advantage(rewards, mask, index, mode="group")
    verl_adv, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(ours, verl_adv)
    assert torch.equal(ours, returns)
    assert (ours[mask == 0] == 0).all()


def test_verl_grpo_divides_by_the_unbiased_group_std_plus_eps():
    """What GRPO/DAPO runs log (docs/data-and-reports.md#comparing-with-the-authors-logs): verl 0.9.1's
    ``grpo`` estimator uses the sample std (n - 1), eps on the std, A = 0 for equal rewards, and a
    singleton keeps mean 0 / std 1. With n = 16 and k correct of +-1 rewards, a correct response gets
    sqrt((16 - k) / k) * sqrt(15 / 16), sqrt(15/16) times the population-std value."""
    k = 5
    scores = torch.tensor([1.0] * k + [-1.0] * (16 - k) + [1.0] * 16 + [-1.0])
    index = np.array(["g"] * 16 + ["equal"] * 16 + ["single"])
    rewards, mask = scores[:, None].clone(), torch.ones(33, 1)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True)
    adv = adv[:, 0].double()
    group = scores[:16].double()
    unbiased = ((group - group.mean()) ** 2).sum().div(15).sqrt()
    torch.testing.assert_close(adv[:16], ((group - group.mean()) / (unbiased + 1e-6)), rtol=1e-6, atol=0)
    torch.testing.assert_close(adv[0], torch.tensor(((16 - k) / k) ** 0.5 * (15 / 16) ** 0.5, dtype=torch.float64),
                               rtol=1e-5, atol=0)
    population = group.std(unbiased=False)
    assert abs(adv[0] / ((1 - group.mean()) / population) - (15 / 16) ** 0.5) < 1e-5
    assert (adv[16:32] == 0).all()
    torch.testing.assert_close(adv[32], torch.tensor(-1 / (1 + 1e-6), dtype=torch.float64), rtol=1e-6, atol=0)


def test_batch_mean():
    scores = torch.tensor([1.0, 2.0, 6.0])
    assert torch.allclose(batch_mean_advantage(scores), torch.tensor([-2.0, -1.0, 3.0]))
    assert batch_mean_advantage(torch.tensor([5.0])).item() == 5.0
    adv, _ = outcome_advantage(torch.tensor([[0.0, 1.0], [3.0, 0.0]]), torch.ones(2, 2), mode="batch")
    assert torch.allclose(adv, torch.tensor([[-1.0, -1.0], [1.0, 1.0]]))


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="mode="):
        outcome_advantage(torch.zeros(2, 2), torch.ones(2, 2), ["a", "b"], mode="std")
    with pytest.raises(ValueError, match="index"):
        outcome_advantage(torch.zeros(2, 2), torch.ones(2, 2), None, mode="group")
    with pytest.raises(ValueError, match="index has length"):
        group_mean_advantage(torch.zeros(3), ["a"])
    with pytest.raises(ValueError, match="must both be"):
        outcome_advantage(torch.zeros(2, 3), torch.ones(2, 2), ["a", "b"])
