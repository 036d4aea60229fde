"""RPG's baseline-subtracted advantages (spec T28) and agreement with verl's GRPO estimator
when its std normalisation is switched off."""

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from rpg.advantage import batch_mean_advantage, group_mean_advantage, outcome_advantage


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
