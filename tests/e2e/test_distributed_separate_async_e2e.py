"""End to end: verl's fully asynchronous trainer (``trainer.v1.trainer_mode=separate_async``) on the CPU backend, two
FSDP2 trainer ranks and one standalone HF rollout rank (the ``distributed`` CI stage).

ONE launch: the tiny RPG run (RPG-REINFORCE-UFKL + clip, 8 prompts in 4 mini-batches of 2, so verl's
``parameter_sync_step`` = 4 updates per weight sync), reference mode ``kl_threshold`` with a threshold below the
step's KL, 3 steps. Ray's log deduplication off (it would fold the servers' lines, whose numbers it masks). Checked:

* the weight sync (rpg.backends.cpu.weight_sync): one send at the start and one after each step; at each, the
  standalone rollout server's weights read back after its load have the digest the actor sent (each tensor's name,
  shape and bytes: rpg.backends.weight_digest; the hybrid server's loads at the start do not count), and the
  digest's metric is logged at each step (``rpg/weight_sync_checksum``);
* staleness: step 1 samples from the initial policy (staleness 0, mu == pi_old up to recomputation noise), later
  steps from the version one sync behind (staleness 1, within verl's threshold of 8), the behaviour KL then
  well above noise;
* pi_old is the snapshot of the step's start for all 4 mini-batches (rpg.verl.snapshot): the ratio pi_theta/pi_old
  leaves 1 within a step. With verl's aliasing snapshot on CPU pi_old would be the live weights at every
  mini-batch and every ratio 1 up to noise (``ON_POLICY``);
* the reference schedule in the detached worker: step 1's pi_old is the initial model, the reference (KL ~0, no
  reset); step 2 resets the reference to the actor (its logits equal the actor's after the copy); so step 3's
  pi_old, the snapshot of the weights after step 2, is the reference exactly (KL 0, no reset).
"""

from __future__ import annotations

import pytest
from e2e_recipe import ENTRY, K3_ROUNDING, ON_POLICY, at

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]

STEPS = 3
B = "actor/rpg/behavior_"


@pytest.fixture(scope="module")
def run(tiny_assets, tmp_path_factory):
    from rpg.trainer_process import run_trainer
    from rpg.tiny.overrides import tiny_overrides

    out = tmp_path_factory.mktemp("separate_async")
    mode = "separate_async"
    run = run_trainer([*tiny_overrides(tiny_assets, steps=STEPS, algo="rpg", world_size=2, trainer_mode=mode),
                       "trainer.n_gpus_per_node=2", f"trainer.v1.trainer_mode={mode}",
                       "trainer.val_before_train=False", "trainer.test_freq=-1",
                       "rpg.reference.mode=kl_threshold", "rpg.reference.kl_threshold=1e-6",
                       "rpg.reference.kl_ema_decay=0.0", "rpg.reference.log_weight_diff=true"],
                      output_dir=out / "run", entry=ENTRY, timeout_s=900, env={"RAY_DEDUP_LOGS": "0"})
    assert run.returncode == 0 and run.last_step() == STEPS, run.tail()
    assert not run.leftover_pids
    return run


def test_the_rollout_pool_gets_the_actors_weights_at_every_sync(run):
    from rpg.backends.weight_digest import loaded_digests, sent_digests, sync_problems

    assert sync_problems(run.log, run.metrics, STEPS, replicas=1) == []  # one standalone replica: a pool of 1 rank
    sent = sent_digests(run.log)
    assert len({d for _, d in sent}) == len(sent)  # the weights moved between syncs
    loads = loaded_digests(run.log)
    assert len(loads) == run.log.count("[hf-rollout] weights v"), loads  # every load's line names pool and replica
    # verl numbers the standalone replica after the hybrid ones (one per trainer rank)
    pools = {(pool, replica) for _, pool, replica, _ in loads}
    assert pools == {("hybrid", 0), ("hybrid", 1), ("standalone", 2)}, loads


def test_staleness_and_the_behaviour_kl(run):
    for s in range(1, STEPS + 1):
        lo = at(run, s, "training/off_policy/trajectory_staleness/min")
        hi = at(run, s, "training/off_policy/trajectory_staleness/max")
        assert (lo, hi) == ((0, 0) if s == 1 else (1, 1)), (s, lo, hi)
        assert at(run, s, B + "weight_min") <= at(run, s, B + "weight_mean") <= at(run, s, B + "weight_max")
        assert at(run, s, B + "weight_capped_frac") == 0.0  # untruncated
    assert at(run, 1, B + "kl_k3") < 1e-6
    assert 1 - ON_POLICY < at(run, 1, B + "weight_min") <= at(run, 1, B + "weight_max") < 1 + ON_POLICY
    for s in range(2, STEPS + 1):
        assert at(run, s, B + "kl_k3") > 1e-4, s
        assert at(run, s, "rollout_corr/k3_kl") > 1e-4, s


def test_pi_old_is_the_steps_snapshot_for_every_mini_batch(run):
    for s in range(1, STEPS + 1):
        lo, hi = at(run, s, "actor/rpg/ratio_min"), at(run, s, "actor/rpg/ratio_max")
        assert hi > 1 + ON_POLICY or lo < 1 - ON_POLICY, (s, lo, hi)


def test_the_reference_schedule_runs_in_the_detached_worker(run):
    assert [at(run, s, "rpg/ref_reset") for s in (1, 2, 3)] == [0.0, 1.0, 0.0]
    assert -K3_ROUNDING <= at(run, 1, "rpg/ref_kl") < 1e-6  # the initial model on both sides
    assert at(run, 2, "rpg/ref_kl") > 1e-4 and at(run, 2, "rpg/ref_actor_logit_diff_pre") > 0
    assert at(run, 2, "rpg/ref_actor_logit_diff_post") == 0.0
    assert at(run, 3, "rpg/ref_kl") == 0.0  # every mini-batch's pi_old is the snapshot the reference was copied from
