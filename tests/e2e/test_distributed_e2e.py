"""End to end at world size 2, and a checkpoint carried across world sizes (the ``distributed`` CI stage).

Three trainer launches of the RPG recipe on the CPU backend (tiny model, HF rollout), RPG-REINFORCE-UFKL,
a periodic reference with K=2 (``rpg.reference.log_weight_diff=true``), schedule-free AdamW, 4 mini-batches
per step (off-policy after the first), a checkpoint every step:

1. world size 2 (two FSDP2 ranks, two rollout replicas), steps 1-3. Resets at step 2: the reference computes
   what the actor computes right after the copy across the two shards (its probe logits equal the
   actor's), and at step 3 its log-probs of the step's responses equal the old log-probs (both from the
   reset weights). Step 3's checkpoint holds two ranks' shards and reference shards (reference = the actor
   of step 2, not the saved one), digests verified.
2. that checkpoint resumed at world size 1: steps 4-5. The driver's resume line names both world sizes and
   says the RNG is not restored; no traceback. What was restored is checked by what it computes: the
   actor's first weight sync (the schedule-free y weights rebuilt from the resharded x weights and z state)
   equals the one run 1 made after step 3, and the step-4 reference (the step-2 copy, resharded) computes
   exactly run 1's step-3 reference (``rpg/ref_probe_nll``: the same float64 value). The schedule resumes
   (reset at 4).
3. run 2's step-5 checkpoint (world size 1, reference = the step-4 copy) resumed at world size 2: step 6,
   the same checks.

The full-tensor equality of every loaded tensor is tests/verl/test_reshard.py's (gloo ranks, milliseconds of
float comparisons); here the whole path runs: driver, Ray, verl's workers, the recipe's worker.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_recipe import RPG_LOSS_KEYS, assert_off_policy, at, weight_syncs, world_size_overrides
from messages import names
from test_verl_reference_resume_e2e import ENTRY, PERIODIC_K2

from rpg.verl.checkpoints import checkpoint_problem

pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.gpu_stack]  # gpu_stack: .ci/run


SCHEDULE_FREE = ["rpg.optimizer=schedulefree"]


def _run(tiny_assets, out: Path, world_size: int, steps: int, extra: list[str]):
    from rpg.trainer_process import run_trainer
    from rpg.tiny.overrides import tiny_overrides

    run = run_trainer([*tiny_overrides(tiny_assets, steps=steps), *PERIODIC_K2, *SCHEDULE_FREE,
                       *world_size_overrides(world_size), "trainer.save_freq=1",
                       f"trainer.default_local_dir={out / 'ckpt'}", *extra],
                      output_dir=out / "run", entry=ENTRY, timeout_s=900)
    assert run.last_step() == steps, run.tail()
    assert not run.leftover_pids
    return run


@pytest.fixture(scope="module")
def at_two(tiny_assets, tmp_path_factory):
    out = tmp_path_factory.mktemp("ws2")
    return _run(tiny_assets, out, 2, 3, ["trainer.resume_mode=disable"]), out / "ckpt"


def _resumed(tiny_assets, tmp_path_factory, name: str, folder: Path, world_size: int, steps: int):
    out = tmp_path_factory.mktemp(name)
    return _run(tiny_assets, out, world_size, steps, ["trainer.resume_mode=resume_path",
                                                      f"trainer.resume_from_path={folder}"]), out / "ckpt"


@pytest.fixture(scope="module")
def at_one(at_two, tiny_assets, tmp_path_factory):
    return _resumed(tiny_assets, tmp_path_factory, "ws1", at_two[1] / "global_step_3", 1, 5)


@pytest.fixture(scope="module")
def at_two_again(at_one, tiny_assets, tmp_path_factory):
    return _resumed(tiny_assets, tmp_path_factory, "ws2again", at_one[1] / "global_step_5", 2, 6)


def _shards(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "actor").glob("*_world_size_*.pt"))


def test_two_ranks_train_rpg_with_a_periodic_reference_and_schedule_free_adamw(at_two):
    run, ckpt = at_two
    assert "anchor=reference mode=periodic K=2" in run.log and "optimizer=schedulefree" in run.log
    for step in (1, 2, 3):
        for key in RPG_LOSS_KEYS:
            at(run, step, key)
        # old log-probs come from the weights the two replicas sampled with (schedule-free y, synced from two shards)
        assert at(run, step, "training/rollout_probs_diff_max") < 1e-3
    assert_off_policy(run, (1, 2, 3))
    # the reset at step 2 copies the two shards: the reference then computes what the actor computes
    assert at(run, 2, "rpg/ref_reset") == 1 and at(run, 2, "rpg/ref_actor_logit_diff_pre") > 0
    assert at(run, 2, "rpg/ref_actor_weight_diff_post") == 0.0
    assert at(run, 2, "rpg/ref_actor_logit_diff_post") == 0.0
    # step 3: the reference's log-probs of the step's responses equal the old log-probs (reset weights)
    assert at(run, 3, "actor/rpg/ref_old_logp_absdiff_max") < 1e-4 < at(run, 2, "actor/rpg/ref_old_logp_absdiff_max")
    # two ranks' shards, their placement recorded; a complete, verified checkpoint
    step3 = ckpt / "global_step_3"
    assert _shards(step3) == [f"{k}_world_size_2_rank_{r}.pt" for k in ("extra_state", "model", "optim") for r in (0, 1)]
    assert json.loads((step3 / "actor" / "fsdp_config.json").read_text()) == {"FSDP_version": 2, "world_size": 2}
    assert sorted(p.name for p in (step3 / "rpg_reference").iterdir()) == ["reference_rank_0.pt", "reference_rank_1.pt"]
    assert checkpoint_problem(step3) is None


def _resume_line(run, old: int, new: int) -> str:
    """The driver's one line of the resume decision that names the world sizes."""
    lines = [ln for ln in run.log.splitlines() if f"was saved at world size {old}, this run has world size {new}" in ln]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("direction", ["2 -> 1", "1 -> 2"])
def test_a_checkpoint_resumes_at_another_world_size_and_computes_what_it_saved(at_two, at_one, at_two_again, direction):
    (saved, saved_ckpt), (resumed, ckpt), step = ((at_two, at_one, 3) if direction == "2 -> 1"
                                                  else (at_one, at_two_again, 5))
    old, new = (int(x) for x in direction.split(" -> "))
    line = _resume_line(resumed, old, new)
    names(line, str(saved_ckpt / f"global_step_{step}"), f"world size {old}", f"world size {new}", "resharded")
    assert "the per-rank RNG state is not restored" in line
    assert "Traceback" not in resumed.log
    # continues at the next step
    assert min(resumed.metrics) == step + 1
    # the actor and its schedule-free state: the first sync equals the saving run's sync after that step
    assert weight_syncs(resumed)[0] == (str(step), dict(weight_syncs(saved))[str(step)])
    # the reference: computes exactly what the saving run's reference computed at its step
    assert at(resumed, step + 1, "rpg/ref_probe_nll") == at(saved, step, "rpg/ref_probe_nll")
    # the schedule: last reset at step - 1, so the resumed step + 1 resets
    assert at(resumed, step + 1, "rpg/ref_reset") == 1 and at(resumed, step + 1, "rpg/ref_actor_logit_diff_post") == 0.0
    # the next checkpoint: the new world size's files, its own digests
    last = ckpt / f"global_step_{max(resumed.metrics)}"
    assert _shards(last) == [f"{k}_world_size_{new}_rank_{r}.pt" for k in ("extra_state", "model", "optim")
                             for r in range(new)]
    assert checkpoint_problem(last) is None
