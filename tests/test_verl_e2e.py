"""End to end: the RPG recipe (recipe/rpg/main_rpg.py) trains through verl 0.9.1's real v1
trainer on the CPU backend with the tiny local model. One run per variant; each run checks
everything it can (metrics come from verl's FileLogger through the CPU harness).

Every run is off-policy, as in the paper: the rollout batch of 8 prompts is trained in
mini-batches of 2 (rpg.tiny.overrides.MINI_BATCH_SIZE), so from the second mini-batch of a step on
the importance ratio leaves 1 and clipping can bind; the runs assert it (``assert_off_policy``).

Each assertion states what the quantity guarantees, not what it usually shows: a k3-type KL is >= 0
(up to float32 rounding), a normalized one has no sign; the ratio range of a step contains 1; equal
only where the math makes two quantities equal (then within float32 rounding). Where an assertion
needs the policy to have moved ("> 0", "!= before"), its premise is a non-zero gradient, and the
threshold (1e-4 on log-probs, 1e-6 on a KL) lies far above float32 recomputation noise (~1e-6 on
log-probs, ~1e-12 on a KL) and far below what one update of the tiny model moves.

Runs (2 training steps unless noted):
  1. RPG-UFKL, fully differentiable, sampler anchor      -> no reference worker, RPG loss metrics
  1b. RPG-REINFORCE-UFKL, sampler anchor                -> the same updates as run 1 (the two forms
     have identical gradients at every theta when nothing is clipped); runs 1 and 1b take 1 step
     in 2 epochs over one mini-batch (see the test for why)
  2. RPG-REINFORCE-URKL + RPG-Style Clip, schedule-free   -> old_log_prob weights == sampling
     weights (y), clipping binds, eval weights for validation and checkpoint
  3. RPG-REINFORCE-UFKL, periodic reference K=2, 3 steps -> reference == actor right after the
     reset, differs after the next update; reference log-probs == old log-probs after a reset
  3b. RPG-REINFORCE-RKL + RPG-Style Clip, fixed reference (no iterative reference ablation)
                                                       -> reference stays the initial model, never reset
  4. GRPO with the corrected KL, fixed reference          -> vanilla PPO part + corrected KL
  5. GRPO (stock verl loss), fixed reference, k3 KL loss
  6. REINFORCE++ (k1 KL against pi_old, no reference model) with DAPO dynamic sampling and
     overlong reward shaping (the paper's REINFORCE++ setup)
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch


pytestmark = pytest.mark.e2e

from rpg.tiny.overrides import MINI_BATCH_SIZE

ROOT = Path(__file__).resolve().parents[1]
ENTRY = str(ROOT / "recipe" / "rpg" / "main_rpg.py")
_WEIGHTS_LINE = re.compile(r"\[hf-rollout\] weights v\d+ loaded \(global_steps=(\w+), checksum=([-0-9.e]+)")


def rpg_run(cpu_trainer, tmp_path, overrides, steps=2, mini=MINI_BATCH_SIZE, n=8, validate=False, name="run"):
    """Run the recipe on the tiny task (conftest's ``cpu_trainer``) with RPG defaults: rpg advantage,
    no verl KL, ``mini`` prompts per mini-batch (8 per step) and 2 micro-batches per mini-batch."""
    ov = [
        "actor_rollout_ref.actor.use_kl_loss=False",
        "algorithm.adv_estimator=rpg",
        "algorithm.norm_adv_by_std_in_grpo=False",
        # the recipe's 10 warm-up steps start at lr 0 (verl's schedule): step 1 would not move the actor
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        f"actor_rollout_ref.rollout.n={n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={max(1, mini * n // 2)}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={8 * n}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={8 * n}",
        f"trainer.val_before_train={validate}",
        f"trainer.test_freq={1 if validate else -1}",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        *overrides,
    ]
    run = cpu_trainer(ov, steps=steps, entry=ENTRY, name=name)
    assert run.last_step() == steps, run.tail()
    assert not run.leftover_pids
    return run


# float32 rounding of a k3-type mean: exp(x) near 1 is rounded by up to 6e-8 (half an ulp of 1), so
# w - 1 - log w can come out a few 1e-8 below 0 on a token where w is 1 or nearly
K3_ROUNDING = 1e-6
# on-policy tokens (the first mini-batch of a step, pi_theta == pi_old) give |log w| of float32
# recomputation noise only (~1e-6: other micro-batching than the old-log-prob pass); moved ones far more
ON_POLICY = 1e-3
# (eps_low, eps_high, c) of the runs that check RPG-Style Clip: a band narrower than the paper's
# (0.2, 0.28) so that "some token was clipped" needs only a ratio 5 % away from 1, not a large update
NARROW_CLIP = (0.05, 0.05, 10.0)
NARROW_CLIP_OVERRIDES = [f"actor_rollout_ref.actor.clip_ratio_low={NARROW_CLIP[0]}",
                         f"actor_rollout_ref.actor.clip_ratio_high={NARROW_CLIP[1]}",
                         f"actor_rollout_ref.actor.clip_ratio_c={NARROW_CLIP[2]}"]


def assert_off_policy(run, steps, clip=None):
    """What the RPG loss metrics guarantee at every step, then that the run was off-policy.

    Several mini-batches per step: the first is on-policy (pi_theta == pi_old), the later ones see the
    earlier updates. Guaranteed at every step, whatever was sampled:

    * the ratio range contains 1 (the first mini-batch) and ratio_min > 0;
    * mean(w) - 1 - mean(log w) = mean(w - 1 - log w) >= 0 (k3 token by token; verl averages the
      micro-batch means with equal weights, which keeps it);
    * kl_estimate >= 0 for the unnormalized surrogates (ufkl: w - 1 - log w against the sampler,
      r_ref * k3(rho) against a reference; urkl: r_ref * (rho log rho - rho + 1)), both >= 0 token by
      token; nothing for the normalized ones (fkl: -log rho, rkl: w log rho have a zero-mean part and
      their sample mean can be negative: -6.2e-4 was measured for rkl at step 1);
    * with RPG-Style Clip (``clip`` = (eps_low, eps_high, c)): the clipped share splits into its
      three kinds, and a kind can be counted only where the ratio range reaches its bound (a positive
      token is clipped only at w >= 1 + eps_high, a negative one below at w <= 1 - eps_low, by the dual
      clip at w >= c).

    Off-policy (the point of these runs): some step's ratio range leaves 1. Premise: an update before
    a step's last mini-batch has a non-zero gradient (a group with mixed rewards in it); with clip,
    premise: some ratio also leaves the clip band (``clip`` is chosen narrow for that)."""
    divergence = _divergence(run)
    for s in steps:
        assert_step_guarantees(run, s, divergence, clip)
    ranges = [(s, at(run, s, "actor/rpg/ratio_min"), at(run, s, "actor/rpg/ratio_max")) for s in steps]
    assert any(hi > 1 + ON_POLICY or lo < 1 - ON_POLICY for _, lo, hi in ranges), ranges
    if clip is not None:
        assert any(at(run, s, "actor/rpg/clipfrac") > 0 for s in steps)


def assert_step_guarantees(run, s, divergence, clip=None):
    """The guaranteed part of ``assert_off_policy`` for step ``s`` (tests/test_e2e_assertions.py feeds it
    steps built from the loss library: it must hold whatever was sampled)."""
    kl = at(run, s, "actor/rpg/kl_estimate")
    if divergence in ("ufkl", "urkl"):
        assert kl >= -K3_ROUNDING, (s, divergence, kl)
    lo, hi = at(run, s, "actor/rpg/ratio_min"), at(run, s, "actor/rpg/ratio_max")
    assert 0 < lo <= 1 + ON_POLICY and hi >= 1 - ON_POLICY, (s, lo, hi)
    k3 = at(run, s, "actor/rpg/ratio_mean") - 1 - at(run, s, "actor/rpg/log_ratio_mean")
    assert k3 >= -K3_ROUNDING, (s, k3)
    if clip is not None:
        eps_low, eps_high, c = clip
        parts = {k: at(run, s, f"actor/rpg/clipfrac{k}") for k in ("", "_high", "_low", "_dual")}
        assert 0 <= parts[""] <= 1 and parts[""] == pytest.approx(
            parts["_high"] + parts["_low"] + parts["_dual"], abs=1e-6), (s, parts)
        assert parts["_high"] == 0 or hi >= (1 + eps_high) * (1 - 1e-6), (s, parts, hi)
        assert parts["_low"] == 0 or lo <= (1 - eps_low) * (1 + 1e-6), (s, parts, lo)
        assert parts["_dual"] == 0 or hi >= c * (1 - 1e-6), (s, parts, hi)


def _divergence(run) -> str:
    """The run's rpg.loss.divergence, from the driver's one-line description of the loss."""
    found = re.search(r"divergence=(\w+)", run.log)
    assert found, "the driver's 'rpg: loss=...' line is missing from the log"
    return found.group(1)


def synced_weights(run) -> dict[str, float]:
    """global_steps -> checksum of the weights the actor sent to the rollout server."""
    return {g: float(c) for g, c in _WEIGHTS_LINE.findall(run.log)}


def at(run, step, key):
    value = run.metrics[step][key]
    assert math.isfinite(value), (key, value)
    return value


def keys(run):
    return {k for d in run.metrics.values() for k in d}


RPG_LOSS_KEYS = ["actor/rpg/kl_estimate", "actor/rpg/ratio_max", "actor/rpg/ratio_min", "actor/rpg/clipfrac",
                 "actor/rpg/clipfrac_high", "actor/rpg/clipfrac_low", "actor/rpg/clipfrac_dual",
                 "actor/rpg/reg_adv_mean", "actor/pg_loss"]


def test_rpg_fd_and_reinforce_ufkl_sampler_anchor_same_first_update(cpu_trainer, tmp_path):
    """Fully differentiable and REINFORCE-style UFKL without clipping, same seed, one step: the
    gradient of L_RF = -E[SG(Weight) log pi] equals that of L_FD at every theta (docs/math.md#fully-differentiable-losses), not
    only at theta = pi_old, so both runs apply the same updates and end with the same weights.

    The step is trained in 2 epochs over one mini-batch: the first update is on-policy (ratio 1,
    where the KL gradient vanishes), the second off-policy (ratio != 1, KL gradient != 0), so the
    comparison covers the KL term. Not 4 mini-batches: verl's v1 replay buffer orders a batch by
    rollout completion, which varies between runs, so mini-batch membership would differ; with one
    mini-batch only the summation order does. The rollouts agree because the CPU rollout samples
    each sequence from its own seeded generator and verl's data order is seeded."""
    same = ["rpg.loss.divergence=ufkl", "rpg.loss.clip=false", "actor_rollout_ref.actor.ppo_epochs=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64"]
    fd = rpg_run(cpu_trainer, tmp_path, ["rpg.loss.form=differentiable", *same], steps=1, mini=8, name="fd")
    assert "anchor=sampler (pi_old; no reference model)" in fd.log
    all_keys = keys(fd)
    assert "timing_s/ref" not in all_keys and "rpg/ref_kl" not in all_keys  # no reference forward ever
    assert "actor/kl_loss" not in all_keys  # verl's KL term is not used
    assert "actor/pg_clipfrac_lower" not in all_keys  # verl's vanilla loss did not run
    for key in RPG_LOSS_KEYS:
        at(fd, 1, key)
    assert_off_policy(fd, (1,))

    rf = rpg_run(cpu_trainer, tmp_path, ["rpg.loss.form=reinforce", *same], steps=1, mini=8, name="rf")
    assert "form=reinforce" in rf.log and "form=differentiable" in fd.log
    assert_off_policy(rf, (1,))
    # the same rollout (same weights, seeded per-sequence sampling, seeded data order) ...
    for key in ("critic/score/mean", "response_length/mean", "actor/entropy"):
        assert at(rf, 1, key) == pytest.approx(at(fd, 1, key), rel=1e-5), key
    # ... (the two surrogates' values differ by construction, but no bound on how much is guaranteed:
    # the forms are told apart by the driver's description line above) ...
    # ... the same gradients, the same ratios and KL after the first update, the same weights after both.
    # Equal in exact arithmetic; in float32 the gradients differ by rounding only, and Adam's first
    # step is lr * g / |g| per parameter, so the weights after it are the same but for parameters
    # whose gradient is at rounding level. The KL (k3, cancellation near w = 1) gets an absolute
    # floor of its float32 rounding.
    for key in ("actor/grad_norm", "actor/rpg/ratio_max", "actor/rpg/ratio_min", "actor/rpg/kl_estimate"):
        assert at(rf, 1, key) == pytest.approx(at(fd, 1, key), rel=1e-4, abs=1e-7), key
    assert at(rf, 1, "actor/grad_norm") > 0  # a non-zero gradient: the updates move the weights
    rf_w, fd_w = synced_weights(rf), synced_weights(fd)
    assert rf_w["0"] == fd_w["0"] and rf_w["1"] != rf_w["0"]  # same start (one model file); the updates moved it
    assert rf_w["1"] == pytest.approx(fd_w["1"], rel=0, abs=5e-3)  # sum of 340k parameters


def test_rpg_reinforce_urkl_clip_schedulefree(cpu_trainer, tmp_path):
    run = rpg_run(
        cpu_trainer, tmp_path,
        ["rpg.loss.form=reinforce", "rpg.loss.divergence=urkl", "rpg.loss.clip=true", "rpg.optimizer=schedulefree",
         "trainer.save_freq=2", *NARROW_CLIP_OVERRIDES],
        validate=True,
    )
    assert "optimizer=schedulefree" in run.log
    for step in (1, 2):
        for key in RPG_LOSS_KEYS:
            at(run, step, key)
        # old_log_prob is computed with the weights the rollout sampled with (y, not the eval x of the
        # validation before): verl's comparison of the two log-probs of the same tokens agrees
        assert at(run, step, "training/rollout_probs_diff_max") < 1e-3
    assert_off_policy(run, (1, 2), clip=NARROW_CLIP)
    # validation switched to the averaged x weights and back (x != y after the second SF step)
    assert at(run, 2, "rpg/sf_to_eval_max_abs_change") > 0
    assert at(run, 2, "rpg/sf_to_train_max_abs_change") > 0
    assert "val-core/math_dapo/acc/mean@4" in run.metrics[2]
    # the checkpoint holds eval-mode (x) optimizer state
    optim_files = sorted((tmp_path / "ckpt" / "global_step_2" / "actor").glob("optim*.pt"))
    assert optim_files, list((tmp_path / "ckpt").rglob("*"))
    state = torch.load(optim_files[0], map_location="cpu", weights_only=False)
    groups = state["param_groups"] if "param_groups" in state else state["optimizer"]["param_groups"]
    assert all(g["train_mode"] is False for g in groups)


def test_rpg_reinforce_periodic_reference(cpu_trainer, tmp_path):
    run = rpg_run(cpu_trainer, tmp_path, ["rpg.loss.form=reinforce", "rpg.loss.divergence=ufkl",
                                     "rpg.reference.mode=periodic", "rpg.reference.update_every=2",
                                     "rpg.reference.log_weight_diff=true"], steps=3)
    assert "timing_s/ref" in run.metrics[1]
    for step in (1, 2, 3):
        for key in RPG_LOSS_KEYS:
            at(run, step, key)
    assert_off_policy(run, (1, 2, 3))
    # step 1: reference = initial model = the policy that sampled; no reset (1 % 2 != 0)
    assert at(run, 1, "rpg/ref_reset") == 0 and "rpg/ref_actor_weight_diff_post" not in run.metrics[1]
    assert at(run, 1, "actor/rpg/ref_old_logp_absdiff_max") < 1e-4
    assert at(run, 1, "rpg/ref_actor_weight_diff_pre") > 0  # the update moved the actor
    # step 2: the reference (initial model) is behind pi_old; reset at the end of the step
    assert at(run, 2, "actor/rpg/ref_old_logp_absdiff_max") > 1e-4
    assert at(run, 2, "rpg/ref_kl") > 0
    assert at(run, 2, "rpg/ref_reset") == 1 and at(run, 2, "rpg/ref_resets_total") == 1
    assert at(run, 2, "rpg/ref_actor_weight_diff_pre") > 0
    assert at(run, 2, "rpg/ref_actor_weight_diff_post") == 0.0  # reference == actor right after the reset
    # step 3: reference log-probs == old log-probs (both from the reset weights); differs after the update
    assert at(run, 3, "actor/rpg/ref_old_logp_absdiff_max") < 1e-4
    assert at(run, 3, "rpg/ref_reset") == 0 and at(run, 3, "rpg/ref_steps_since_reset") == 1
    assert at(run, 3, "rpg/ref_actor_weight_diff_pre") > 0


def test_rpg_reinforce_fixed_reference(cpu_trainer, tmp_path):
    run = rpg_run(cpu_trainer, tmp_path, ["rpg.loss.form=reinforce", "rpg.loss.divergence=rkl", "rpg.loss.clip=true",
                                     "rpg.reference.mode=fixed", *NARROW_CLIP_OVERRIDES])
    all_keys = keys(run)
    assert "timing_s/ref" in all_keys and "rpg/ref_reset" not in all_keys  # a reference model, never reset
    assert "actor/kl_loss" not in all_keys  # the RPG loss carries the KL, not verl's term
    for step in (1, 2):
        for key in RPG_LOSS_KEYS:
            at(run, step, key)
    assert_off_policy(run, (1, 2), clip=NARROW_CLIP)
    # step 1: reference = initial model = sampler; step 2: pi_old moved on, the reference did not
    assert at(run, 1, "actor/rpg/ref_old_logp_absdiff_max") < 1e-4 < at(run, 2, "actor/rpg/ref_old_logp_absdiff_max")
    assert at(run, 1, "rpg/ref_kl") < 1e-6 < at(run, 2, "rpg/ref_kl")


def test_grpo_corrected_kl_fixed_reference(cpu_trainer, tmp_path):
    run = rpg_run(cpu_trainer, tmp_path, ["rpg.loss.name=grpo_corrected", "rpg.loss.beta=0.01",
                                     "rpg.reference.mode=fixed", "algorithm.adv_estimator=grpo",
                                     "algorithm.norm_adv_by_std_in_grpo=True"])
    all_keys = keys(run)
    assert "timing_s/ref" in all_keys and "rpg/ref_reset" not in all_keys
    assert "actor/kl_loss" not in all_keys  # verl's unweighted KL is not added
    for step in (1, 2):
        # the corrected KL w * k3(pi_ref / pi_theta) is >= 0 token by token (rpg.losses.grpo_corrected_kl)
        assert at(run, step, "actor/rpg/kl_estimate") >= -K3_ROUNDING
        at(run, step, "actor/pg_clipfrac_lower")  # the vanilla dual-clip PPO part ran
    assert at(run, 1, "rpg/ref_kl") < 1e-6 < at(run, 2, "rpg/ref_kl")  # fixed reference: pi_old drifts away


def test_grpo_stock_verl_loss_fixed_reference(cpu_trainer, tmp_path):
    run = rpg_run(cpu_trainer, tmp_path, ["rpg.loss.name=verl", "rpg.reference.mode=fixed", "algorithm.adv_estimator=grpo",
                                     "algorithm.norm_adv_by_std_in_grpo=True", "actor_rollout_ref.actor.use_kl_loss=True",
                                     "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
                                     "actor_rollout_ref.actor.kl_loss_coef=0.01"])
    all_keys = keys(run)
    assert "timing_s/ref" in all_keys and not any(k.startswith("actor/rpg/") for k in all_keys)
    assert "actor/pg_clipfrac_lower" in all_keys and "actor/kl_loss" in all_keys
    assert at(run, 2, "rpg/ref_kl") > at(run, 1, "rpg/ref_kl")


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
