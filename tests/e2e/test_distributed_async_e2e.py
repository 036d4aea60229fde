"""End to end at world size 2 with verl's colocate-async trainer, and a Hugging Face model from its shards
(the ``distributed`` CI stage).

ONE launch: the tiny RPG run (HF rollout, RPG-REINFORCE-UFKL, periodic reference with K=2 and
``rpg.reference.log_weight_diff=true``, torch AdamW) with ``trainer.v1.trainer_mode=colocate_async`` on two
FSDP2 ranks, 3 steps, checkpoints at steps 2 and 3. Checked:

* the stale sampler at world size 2: step 1 samples from pi_old (staleness 0), later steps one update
  behind, the behaviour weights pi_old/mu in the loss;
* the reference reset at step 2 across the two shards: the reference computes the actor's logits;
* verl's own merger, ``python -m verl.model_merger merge --backend fsdp`` on the world-size-2 checkpoint of
  step 2 (docs/data-and-reports.md#evaluation-protocol-mean32-on-aimeamc-one-sample-per-problem-on-minervaolympiadbench,
  "Evaluating a saved checkpoint"): transformers loads the result. "The actor's
  log-probs" are what the run itself computed with the actor of step 2 on a fixed batch: the reset at
  step 2 copies that actor into the reference, and step 3 logs the reference's mean next-token NLL of a
  fixed probe sequence (``rpg/ref_probe_nll``, ``rpg.verl.reference_copy``). The chain:
  (1) the fp32 model built from the two shards' concatenated local tensors computes that NLL exactly (the
  same float64 value); (2) the merged weights are exactly those tensors rounded to bfloat16 (verl 0.9.1's
  merger writes bfloat16 whatever the training dtype: ``model_merger/fsdp_model_merger.py``); (3) the
  merged model's per-token log-probs of the probe are within ``BF16_LOGP`` of the fp32 ones, and its NLL
  within ``BF16_LOGP`` of the run's. The tolerance discriminates: the initial model's log-probs lie
  further away than that (asserted).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from e2e_recipe import at, world_size_overrides
from test_verl_reference_resume_e2e import ENTRY, PERIODIC_K2

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]

B = "actor/rpg/behavior_"
# bfloat16 keeps 8 significant bits: each weight moves by up to 2^-9 of itself; through the tiny model that
# moved the probe's per-token log-probs by at most 0.03 nats (measured), its mean NLL by 0.012
BF16_LOGP = 0.1


@pytest.fixture(scope="module")
def run(tiny_assets, tmp_path_factory):
    from rpg.trainer_process import run_trainer
    from rpg.tiny.overrides import tiny_overrides

    out = tmp_path_factory.mktemp("async_ws2")
    run = run_trainer([*tiny_overrides(tiny_assets, steps=3), *PERIODIC_K2, *world_size_overrides(2),
                       "trainer.v1.trainer_mode=colocate_async", "trainer.save_freq=2",
                       f"trainer.default_local_dir={out / 'ckpt'}"],
                      output_dir=out / "run", entry=ENTRY, timeout_s=900)
    assert run.last_step() == 3, run.tail()
    assert not run.leftover_pids
    return run, out / "ckpt"


def test_two_ranks_train_with_the_stale_sampler_and_reset_the_reference(run):
    run, ckpt = run
    staleness = [at(run, s, "training/off_policy/trajectory_staleness/min") for s in (1, 2, 3)]
    assert staleness[0] == 0 and all(x >= 1 for x in staleness[1:]), staleness
    for s in (1, 2, 3):
        assert at(run, s, B + "weight_min") <= at(run, s, B + "weight_mean") <= at(run, s, B + "weight_max")
    assert at(run, 2, B + "kl_k3") > 1e-4  # one update behind
    assert at(run, 2, "rpg/ref_reset") == 1 and at(run, 2, "rpg/ref_actor_logit_diff_pre") > 0
    assert at(run, 2, "rpg/ref_actor_logit_diff_post") == 0.0
    assert sorted(p.name for p in (ckpt / "global_step_2" / "actor").glob("model_world_size_*.pt")) == [
        "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]


def _probe_logprobs(model, vocab_size: int) -> torch.Tensor:
    """log p(ids[t+1] | ids[:t+1]) of the fixed probe sequence, float64 from float32 logits."""
    from rpg.verl.reference_copy import probe_logits, probe_token_ids

    ids = probe_token_ids(vocab_size)
    logp = torch.log_softmax(probe_logits(model.float(), ids).double()[0, :-1], dim=-1)
    return logp.gather(-1, ids[0, 1:, None])[:, 0]


def test_verls_merger_turns_the_shards_into_a_model_that_computes_the_actors_log_probs(run, tiny_assets, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    run, ckpt = run
    actor = ckpt / "global_step_2" / "actor"
    target = tmp_path / "hf"
    p = subprocess.run([sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp",
                        "--local_dir", str(actor), "--target_dir", str(target)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    merged = AutoModelForCausalLM.from_pretrained(target)
    assert merged.dtype == torch.bfloat16  # verl's merger writes bfloat16

    # (1) the shards hold the actor that computed the run's log-probs: its mean NLL of the probe, exactly
    shards = [torch.load(actor / f"model_world_size_2_rank_{r}.pt", map_location="cpu", weights_only=False)
              for r in (0, 1)]
    full = {k: torch.cat([s[k].to_local() for s in shards]) for k in shards[0]}  # FSDP2: Shard(0), rank order
    config = AutoConfig.from_pretrained(actor / "huggingface")
    fp32 = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fp32.load_state_dict(full)
    actor_logp = _probe_logprobs(fp32, config.vocab_size)
    assert float(-actor_logp.mean()) == at(run, 3, "rpg/ref_probe_nll")
    # (2) the merger rounded exactly those tensors to bfloat16, nothing else
    assert merged.state_dict().keys() == full.keys()
    assert all(torch.equal(merged.state_dict()[k], v.bfloat16()) for k, v in full.items())
    # (3) transformers' forward of the merged model: the actor's log-probs up to bfloat16 weight rounding
    merged_logp = _probe_logprobs(merged, config.vocab_size)
    assert float((merged_logp - actor_logp).abs().max()) < BF16_LOGP
    assert abs(float(-merged_logp.mean()) - at(run, 3, "rpg/ref_probe_nll")) < BF16_LOGP
    # the tolerance tells models apart: the initial model's log-probs lie further off
    initial = AutoModelForCausalLM.from_pretrained(tiny_assets.model_dir, dtype=torch.float32)
    assert float((_probe_logprobs(initial, config.vocab_size) - actor_logp).abs().max()) > BF16_LOGP
