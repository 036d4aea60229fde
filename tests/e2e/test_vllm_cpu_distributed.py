"""The vLLM-CPU stage at world size 2: verl's vLLM rollout with two FSDP2 ranks and two vLLM replicas.

ONE launch (``vllm_cpu`` stage, scripts/setup_vllm_cpu.sh's environment): 2 steps of the tiny RPG run
(RPG-REINFORCE-UFKL, periodic reference reset at step 1) on two FSDP2 ranks; verl starts one vLLM server
per rank (tensor parallelism 1). Every sync gathers the full weights from the two shards (FSDP2's
all-gather in the actor's weight generator) and streams them to that rank's replica. tests/support/vllm_sync_probe.py
records each sync at both ends. Checked:

* two replicas loaded weights (two vLLM worker processes), every sync landed: the sums of the weights
  each replica computes with equal the sums the actor sent (float64, ``SUM_RTOL``);
* verl's ``training/rollout_probs_diff_max`` (largest |p_vLLM - p_actor| over a step's sampled tokens)
  within ``PROB_TOL`` at every step, as at world size 1 (tests/e2e/test_vllm_cpu.py: measured 9e-7 .. 2e-6 there);
  the figure is printed (``pytest -s``) and given in docs/cpu-backend.md;
* the reference reset at step 1 across the two shards: the reference then computes the actor's logits.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from e2e_recipe import world_size_overrides
from test_vllm_cpu import DIFF, _landed, assert_synced_every_step
from vllm_sync_probe import SYNC_LOG_ENV

from rpg.backends.cpu import vllm_cpu

pytestmark = pytest.mark.vllm_cpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def launched(tiny_assets, tmp_path_factory):
    from rpg.trainer_process import run_trainer
    from rpg.tiny.overrides import RECIPE_ENTRY, tiny_overrides

    out = tmp_path_factory.mktemp("vllm_cpu_ws2")
    tmp = out / "tmp"
    tmp.mkdir()
    env = {vllm_cpu.ROLLOUT_ENV: "vllm", SYNC_LOG_ENV: str(out / "syncs.jsonl"), "TMPDIR": str(tmp),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "support"), os.environ.get("PYTHONPATH", "")])}
    overrides = [*tiny_overrides(tiny_assets, steps=2, algo="rpg"), *world_size_overrides(2),
                 "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                 "rpg.reference.mode=periodic", "rpg.reference.update_every=1", "rpg.reference.log_weight_diff=true",
                 "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1",
                 f"trainer.default_local_dir={out / 'ckpt'}", "trainer.resume_mode=disable"]
    run = run_trainer(overrides, output_dir=out / "run", entry=str(ROOT / RECIPE_ENTRY), env=env,
                      extra_modules=["vllm_sync_probe"], timeout_s=900.0)
    syncs = [json.loads(line) for line in (out / "syncs.jsonl").read_text().splitlines()]
    print(f"\nworld size 2, vLLM: {run.wall_time_s:.0f} s, peak PSS {run.peak_pss_bytes / 2**30:.1f} GiB, "
          f"{DIFF} by step {[(s, d[DIFF]) for s, d in run.metrics.items() if DIFF in d]}")
    return run, syncs


def test_two_replicas_get_the_weights_gathered_from_two_shards(launched):
    run, syncs = launched
    assert run.last_step() == 2 and not run.leftover_pids, run.tail()
    assert "actor_rollout_ref.rollout.name=vllm" in run.overrides
    sent = _landed(syncs)
    assert len({s["pid"] for s in syncs if s["side"] == "loaded"}) == 2  # two vLLM replicas
    assert len({s["pid"] for s in sent}) == 2  # each actor rank streams to its replica
    assert [s["global_steps"] for s in sent][:2] == [0, 0]  # dummy weights at start: both replicas synced at init


def test_vllm_log_probs_agree_with_the_actor_at_world_size_2(launched):
    run, _ = launched
    assert_synced_every_step(run, (1, 2))
    assert run.metrics[1]["rpg/ref_reset"] == 1 and run.metrics[1]["rpg/ref_actor_logit_diff_post"] == 0.0
