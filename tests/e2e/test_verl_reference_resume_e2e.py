"""End to end: a periodic reference, and resuming a reference-resetting run from a checkpoint.

Two trainer runs of the RPG recipe on the CPU backend (tiny model), RPG-REINFORCE-UFKL, periodic
reference with K=2, ``rpg.reference.log_weight_diff=true``, 4 mini-batches per step (off-policy):

1. uninterrupted: 4 steps, a checkpoint every step, ``trainer.max_actor_ckpt_to_keep=2``. Resets at
   steps 2 and 4: the reference equals the actor right after a reset, differs after the next update,
   and its log-probs equal the old log-probs on the step after a reset. Step 3's checkpoint holds the
   reference shards (reference = actor of step 2 != saved actor); step 4's holds none (reset at the
   save step).
2. resumed from the uninterrupted run's ``global_step_3``: trains step 4 only, from the step-3
   weights, on the prompts the uninterrupted run saw at step 4.

The reference of step 4 is the step-2 copy in both runs (the step-4 reset happens at the end of the
step), so its outputs must be identical: compared through ``rpg/ref_probe_nll`` (mean NLL of a
fixed probe sequence under the reference, float64 from float32 logits). Exact equality is
expected: the resumed reference holds bit-identical float32 shards and runs the same forward on the
same machine with the same thread count. (Only quantities of the restored state are compared, not the
weights after a resumed update.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_recipe import RPG_LOSS_KEYS, assert_off_policy, at, synced_weights, weight_syncs

pytestmark = [pytest.mark.e2e, pytest.mark.resume_e2e]  # a CI stage: README's suite has no room

ROOT = Path(__file__).resolve().parents[2]
ENTRY = str(ROOT / "recipe" / "rpg" / "main_rpg.py")

# everything the assertions rely on, set explicitly (the tiny task's own defaults may change)
PERIODIC_K2 = [
    "rpg.loss.name=rpg", "rpg.loss.form=reinforce", "rpg.loss.divergence=ufkl",
    "rpg.reference.mode=periodic", "rpg.reference.update_every=2", "rpg.reference.log_weight_diff=true",
    "algorithm.adv_estimator=rpg", "algorithm.norm_adv_by_std_in_grpo=False",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=0",  # verl's warm-up starts at lr 0: step 1 would not move
    "actor_rollout_ref.actor.optim.lr=5e-4",
    "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4",
    # 4 mini-batches of 2 prompts per step (off-policy after the first), one micro-batch each
    "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
    "trainer.val_before_train=False", "trainer.test_freq=-1",
]


def _run(tiny_assets, out: Path, extra: list[str]):
    from rpg.trainer_process import run_trainer
    from rpg.tiny.overrides import tiny_overrides

    run = run_trainer([*tiny_overrides(tiny_assets, steps=4), *PERIODIC_K2, *extra],
                      output_dir=out / "run", entry=ENTRY, timeout_s=900)
    assert run.last_step() == 4, run.tail()
    assert not run.leftover_pids
    return run


@pytest.fixture(scope="module")
def uninterrupted(tiny_assets, tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    run = _run(tiny_assets, out, ["trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=2",
                                  "trainer.resume_mode=disable", f"trainer.default_local_dir={out / 'ckpt'}",
                                  f"trainer.rollout_data_dir={out / 'rollouts'}"])
    return run, out / "ckpt"


def test_periodic_reference_is_reset_every_k_steps(uninterrupted):
    run, _ = uninterrupted
    assert "anchor=reference mode=periodic K=2" in run.log and "timing_s/ref" in run.metrics[1]
    for step in (1, 2, 3, 4):
        for key in RPG_LOSS_KEYS:
            at(run, step, key)
    assert_off_policy(run, (1, 2, 3, 4))
    # step 1: reference = initial model = the policy that sampled; no reset (1 % 2 != 0)
    assert at(run, 1, "rpg/ref_reset") == 0 and "rpg/ref_actor_weight_diff_post" not in run.metrics[1]
    assert at(run, 1, "actor/rpg/ref_old_logp_absdiff_max") < 1e-4
    assert at(run, 1, "rpg/ref_actor_weight_diff_pre") > 0  # the update moved the actor
    # step 2: the reference (initial model) is behind pi_old; reset at the end of the step
    assert at(run, 2, "actor/rpg/ref_old_logp_absdiff_max") > 1e-4
    assert at(run, 2, "rpg/ref_kl") > 0
    assert at(run, 2, "rpg/ref_reset") == 1 and at(run, 2, "rpg/ref_resets_total") == 1
    # step 3: reference log-probs == old log-probs (both from the reset weights); differs after the update
    assert at(run, 3, "actor/rpg/ref_old_logp_absdiff_max") < 1e-4
    assert at(run, 3, "rpg/ref_reset") == 0 and at(run, 3, "rpg/ref_steps_since_reset") == 1
    assert at(run, 3, "rpg/ref_actor_weight_diff_pre") > 0


def rollout_prompts(path: Path, step: int) -> list[str]:
    """The prompts of a step's rollout, as verl dumped them (``trainer.rollout_data_dir``)."""
    rows = [json.loads(line) for line in (path / f"{step}.jsonl").read_text().splitlines() if line.strip()]
    return sorted(r["input"] for r in rows)


def test_reset_makes_the_reference_compute_like_the_actor_and_old_reference_state_is_pruned(uninterrupted):
    run, ckpt = uninterrupted
    for step in (2, 4):  # resets: the reference's outputs (not only its shards) equal the actor's
        assert at(run, step, "rpg/ref_reset") == 1
        assert at(run, step, "rpg/ref_actor_logit_diff_pre") > 0  # the update moved the actor away
        assert at(run, step, "rpg/ref_actor_weight_diff_post") == 0.0
        assert at(run, step, "rpg/ref_actor_logit_diff_post") == 0.0
    assert at(run, 3, "rpg/ref_reset") == 0 and "rpg/ref_actor_logit_diff_post" not in run.metrics[3]
    # steps 3 and 4 use the same reference (the step-2 copy); step 2 used the initial model
    assert at(run, 3, "rpg/ref_probe_nll") == at(run, 4, "rpg/ref_probe_nll") != at(run, 2, "rpg/ref_probe_nll")
    # verl kept the actors of steps 3 and 4 (max_actor_ckpt_to_keep=2); the reference state follows
    for step in (1, 2):
        folder = ckpt / f"global_step_{step}"
        assert not (folder / "actor").exists()
        assert not (folder / "rpg_reference").exists() and not (folder / "rpg_reference.json").exists()
    assert sorted(p.name for p in (ckpt / "global_step_3" / "rpg_reference").iterdir()) == ["reference_rank_0.pt"]
    assert (ckpt / "global_step_4" / "rpg_reference.json").exists()
    assert not (ckpt / "global_step_4" / "rpg_reference").exists()  # reset at the save step: no shards


def test_resumed_reference_outputs_equal_the_uninterrupted_runs(uninterrupted, tiny_assets, tmp_path):
    first, ckpt = uninterrupted
    resumed = _run(tiny_assets, tmp_path, ["trainer.save_freq=-1", "trainer.resume_mode=resume_path",
                                           f"trainer.resume_from_path={ckpt / 'global_step_3'}",
                                           f"trainer.default_local_dir={tmp_path / 'ckpt'}",
                                           f"trainer.rollout_data_dir={tmp_path / 'rollouts'}"])
    assert sorted(resumed.metrics) == [4]  # only step 4 was trained
    # the reference of step 4 (loaded from global_step_3/rpg_reference) computes exactly what the
    # uninterrupted run's in-memory reference computed at step 4
    assert at(resumed, 4, "rpg/ref_probe_nll") == at(first, 4, "rpg/ref_probe_nll")
    # and the schedule resumed (last reset 2, one so far): reset at 4, two resets in all
    assert at(resumed, 4, "rpg/ref_reset") == 1 and at(resumed, 4, "rpg/ref_resets_total") == 2
    assert at(resumed, 4, "rpg/ref_steps_since_reset") == 0
    assert at(resumed, 4, "rpg/ref_actor_logit_diff_post") == 0.0
    # the data order and the actor were restored too: step 4 sees the prompts the uninterrupted run saw,
    # starting from the step-3 weights (the resumed run's first sync == the uninterrupted sync after step 3);
    # the rollout seeds each sequence by its identity, so step 4 samples the same responses. The weights after
    # step 4 are not compared.
    assert rollout_prompts(tmp_path / "rollouts", 4) == rollout_prompts(ckpt.parent / "rollouts", 4)
    after_step_3 = synced_weights(first)["3"]  # the sync that follows step 3's update
    assert weight_syncs(resumed)[0][1] == pytest.approx(after_step_3, rel=0, abs=1e-6)
    for key in ("critic/score/mean", "response_length/mean"):
        assert at(resumed, 4, key) == pytest.approx(at(first, 4, key), rel=1e-6), key
