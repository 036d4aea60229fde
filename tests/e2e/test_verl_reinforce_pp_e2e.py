"""End to end: REINFORCE++ (k1 KL against pi_old, no reference model) with DAPO dynamic sampling and overlong reward
shaping, the paper's REINFORCE++ setup, through the RPG recipe and verl 0.9.1's real v1 trainer on the CPU backend
with the tiny model (2 training steps, off-policy mini-batches as in tests/e2e/test_verl_e2e.py, whose run beside
this one is GRPO with the corrected KL: one launch a file, so that the trainer_e2e stage's two workers share its
launches evenly).
"""

from __future__ import annotations

import pytest
from e2e_recipe import at, keys, rpg_run

pytestmark = [pytest.mark.e2e, pytest.mark.trainer_e2e]  # a CI stage: README's suite runs no trainer launch


def test_reinforce_pp_sampler_kl_with_dapo_filtering_and_overlong(cpu_trainer, tmp_path):
    run = rpg_run(
        cpu_trainer, tmp_path,
        ["rpg.loss.name=verl", "algorithm.adv_estimator=reinforce_plus_plus",
         "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_type=kl",
         "actor_rollout_ref.actor.kl_loss_coef=0.001",
         "algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc",
         "reward.reward_manager.name=dapo", "reward.reward_kwargs.overlong_buffer_cfg.enable=True",
         "reward.reward_kwargs.overlong_buffer_cfg.len=14", "reward.reward_kwargs.overlong_buffer_cfg.log=True",
         "trainer.val_before_train=False", "trainer.test_freq=2"],
        n=2,
    )
    all_keys = keys(run)
    assert "timing_s/ref" not in all_keys  # KL against pi_old: no reference model
    assert "actor/kl_loss" in all_keys and not any(k.startswith("actor/rpg/") for k in all_keys)
    # k1 KL against pi_old: no sign; 0 on the first mini-batch of a step, non-zero on the later ones:
    # DAPO's filter keeps only groups with mixed rewards, so every mini-batch has a non-zero gradient
    assert all(at(run, s, "actor/kl_loss") != 0 for s in (1, 2))
    evicted = [k for k in all_keys if k.endswith("filter_groups/evicted_samples")]
    # groups were dropped (premise: among the 2 x 8 groups of 2 responses, one with equal rewards; each
    # group has equal rewards with probability p^2 + (1-p)^2 >= 1/2)
    assert evicted and sum(d.get(evicted[0], 0) for d in run.metrics.values()) > 0
    overlong = [k for k in run.metrics[2] if "overlong_reward/mean@" in k]
    # buffer 14 of data.max_response_length=16: every response longer than 2 tokens is penalised, and an
    # answer of the tiny task ("Answer: <n>" + end of text) is longer; the penalty is <= 0 by definition
    assert overlong and run.metrics[2][overlong[0]] < 0
