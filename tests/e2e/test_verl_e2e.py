"""End to end: the RPG recipe (recipe/rpg/main_rpg.py) trains through verl 0.9.1's real v1
trainer on the CPU backend with the tiny local model. One run per variant; each run checks
everything it can (metrics come from verl's FileLogger through the CPU harness; helpers and what
each assertion guarantees: tests/support/e2e_recipe.py).

Every run is off-policy, as in the paper: the rollout batch of 8 prompts is trained in
mini-batches of 2 (rpg.tiny.overrides.MINI_BATCH_SIZE), so from the second mini-batch of a step on
the importance ratio leaves 1 and clipping can bind; the runs assert it (``assert_off_policy``).

Run here (2 training steps): GRPO with the corrected KL, fixed reference -> vanilla PPO part + corrected KL.
Elsewhere, one trainer run each: REINFORCE++ (k1 KL against pi_old, no reference model) with DAPO dynamic sampling
and overlong reward shaping, the paper's REINFORCE++ setup (test_verl_reinforce_pp_e2e.py: a file of its own, so that
the trainer_e2e stage's two workers share its launches evenly); fully differentiable vs REINFORCE-style,
the same updates (test_resume_e2e.py, with the launcher's SIGHUP run); periodic reference and its resume
(test_verl_reference_resume_e2e.py); RPG-REINFORCE-URKL + RPG-Style Clip (clipping binds) + schedule-free AdamW
(old log-probs with the sampling weights y, eval weights x for validation and checkpoint) + a fixed reference,
through a shipped script, with the evaluation protocol (test_launch_cpu_e2e.py); GRPO with verl's stock loss and a
fixed reference, checkpoints and the weight sync (test_cpu_e2e.py); the asynchronous trainer
(test_async_e2e.py).
"""

from __future__ import annotations

import pytest
from e2e_recipe import K3_ROUNDING, at, keys, rpg_run

pytestmark = [pytest.mark.e2e, pytest.mark.trainer_e2e]  # a CI stage: README's suite runs no trainer launch


def test_grpo_corrected_kl_fixed_reference(cpu_trainer, tmp_path):
    run = rpg_run(cpu_trainer, tmp_path, ["rpg.loss.name=grpo_corrected", "rpg.loss.beta=0.01",
                                     "rpg.reference.mode=fixed", "algorithm.adv_estimator=grpo",
                                     "algorithm.norm_adv_by_std_in_grpo=True"])
    all_keys = keys(run)
    assert "timing_s/ref" in all_keys and "rpg/ref_reset" not in all_keys
    assert "actor/kl_loss" not in all_keys  # verl's unweighted KL is not added
    for step in (1, 2):
        # the corrected KL w * k3(pi_ref / pi_theta) is >= 0 token by token (rpg.math.fused.grpo_corrected_kl)
        assert at(run, step, "actor/rpg/kl_estimate") >= -K3_ROUNDING
        at(run, step, "actor/pg_clipfrac_lower")  # the vanilla dual-clip PPO part ran
    assert at(run, 1, "rpg/ref_kl") < 1e-6 < at(run, 2, "rpg/ref_kl")  # fixed reference: pi_old drifts away
