"""rpg.memory: each term of the per-GPU memory estimate and of the checkpoint-disk estimate against
numbers computed by hand from the public model configs, the offload switches, the verdict, and the
launcher's --describe / DRY_RUN output. (Every shipped script fitting an 80 GB GPU is checked in
tests/launch/test_launch_dryrun.py, which composes all 84 scripts once.)"""

from __future__ import annotations

import json
import os

import pytest
from messages import names

from rpg.memory import (
    CUDAGRAPH_GIB,
    DEFAULT_GPU_MEM_GIB,
    DEFAULT_HOST_MEM_GIB,
    DRIVER_GIB,
    GIB,
    HEADROOM_FRACTION,
    KNOWN_ARCHITECTURES,
    RAY_DAEMONS_GIB,
    RUNTIME_OVERHEAD_GIB,
    SMALL_WORKER_GIB,
    TRAINER_PROCESS_GIB,
    VLLM_PROCESS_GIB,
    MemoryEstimateError,
    architecture_for,
    count_saves,
    estimate,
    estimate_disk,
    estimate_host,
    format_host,
    format_kv_check,
    gpu_mem_gib,
    host_mem_gib,
    host_settings_from_config,
    settings_from_config,
)

QWEN25_7B = KNOWN_ARCHITECTURES["Qwen/Qwen2.5-Math-7B"]
QWEN3_4B = KNOWN_ARCHITECTURES["Qwen/Qwen3-4B"]
P7 = 7_615_616_512  # Qwen2.5-7B parameters (model card: 7.61B)
QWEN25_7B_CONFIG = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                    "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                    "tie_word_embeddings": False}  # the public config.json's size fields


def _cfg(**over) -> dict:
    """A composed config reduced to the keys the estimate reads (values of run_grpo_7b)."""
    cfg = {
        "data": {"max_prompt_length": 2048, "max_response_length": 2048},
        "trainer": {"nnodes": 1, "n_gpus_per_node": 8, "save_freq": 20, "total_training_steps": 400,
                    "max_actor_ckpt_to_keep": 1},
        "algorithm": {"use_kl_in_reward": False},
        "rpg": {"reference": {"mode": "fixed"}},
        "actor_rollout_ref": {
            "model": {"path": "Qwen/Qwen2.5-Math-7B", "enable_gradient_checkpointing": True},
            "actor": {"strategy": "fsdp2", "use_kl_loss": True, "use_dynamic_bsz": True,
                      "ppo_max_token_len_per_gpu": 4096, "entropy_coeff": 0.0, "optim": {"optimizer": "AdamW"},
                      "fsdp_config": {"model_dtype": "fp32", "param_offload": False, "optimizer_offload": False,
                                      "offload_policy": False, "fsdp_size": -1},
                      "checkpoint": {"save_contents": ["model", "optimizer", "extra"]}},
            "ref": {"log_prob_use_dynamic_bsz": True, "log_prob_max_token_len_per_gpu": 4096,
                    "fsdp_config": {"model_dtype": "fp32"}},
            "rollout": {"gpu_memory_utilization": 0.6, "tensor_model_parallel_size": 1, "free_cache_engine": True,
                        "log_prob_use_dynamic_bsz": True, "log_prob_max_token_len_per_gpu": 4096,
                        "max_num_batched_tokens": 4096, "max_num_seqs": 256},
        },
    }
    for dotted, value in over.items():
        node = cfg
        *path, leaf = dotted.split("__")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return cfg


def _est(gpu=79.6, **over):
    s = settings_from_config(_cfg(**over))
    return estimate(s, architecture_for(s.model_path), gpu)


def _phase(e, prefix):
    return next(p for p in e.phases if p.name.startswith(prefix))


def _term(phase, prefix):
    return next(t.gib for t in phase.terms if t.name.startswith(prefix))


def _named(terms: dict, *facts: str) -> float:
    """The one term of a host estimate whose name holds every fact (what it counts, how many)."""
    (gib,) = [v for k, v in terms.items() if all(f in k for f in facts)]
    return gib


# ----------------------------------------------------------------------------- architectures


def test_parameter_counts_match_the_published_models():
    # Qwen2.5-7B layer: q 3584^2 + k,v 2*3584*512 + o 3584^2 + MLP 3*3584*18944 + 2 norms + qkv bias 3584+2*512
    assert QWEN25_7B.layer_params == 2 * 3584**2 + 2 * 3584 * 512 + 3 * 3584 * 18944 + 2 * 3584 + 3584 + 1024 == 233_057_792
    assert QWEN25_7B.params == 28 * 233_057_792 + 2 * 152064 * 3584 + 3584 == P7
    assert QWEN3_4B.params == 4_022_468_096  # tied embeddings, q/k norms, no biases
    assert QWEN25_7B.kv_cache_bytes_per_token() == 2 * 28 * 4 * 128 * 2 == 57_344
    assert QWEN3_4B.kv_cache_bytes_per_token() == 2 * 36 * 8 * 128 * 2 == 147_456


def test_local_config_json_is_read_and_unknown_models_fail_with_one_line(tmp_path):
    cfg = QWEN25_7B_CONFIG
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert architecture_for(str(tmp_path)).params == P7
    assert architecture_for("qwen/qwen3-4b").params == QWEN3_4B.params  # hub ids: case-insensitive
    with pytest.raises(MemoryEstimateError, match="no architecture for model 'someone/Model-9B'") as e:
        architecture_for("someone/Model-9B")
    assert "\n" not in str(e.value)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "mixtral"}))
    with pytest.raises(MemoryEstimateError, match="model_type='mixtral' is not modelled"):
        architecture_for(str(tmp_path))
    for text, msg in (('{"model_type": "qwen2",', "config.json: not a readable JSON file"),
                      ("[1, 2]", "config.json: expected a JSON object, got list")):
        (tmp_path / "config.json").write_text(text)
        with pytest.raises(MemoryEstimateError, match=msg) as e:
            architecture_for(str(tmp_path))
        assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- GPU terms


def test_terms_of_grpo_7b_by_hand():
    e = _est()
    shard = P7 * 4 / 8 / GIB                   # fp32 parameter shard, 3.546 GiB
    assert shard == pytest.approx(3.5463, abs=1e-4)
    gen = _phase(e, "generation")
    assert _term(gen, "actor parameters") == pytest.approx(shard)
    assert _term(gen, "optimizer states") == pytest.approx(2 * shard)
    assert _term(gen, "vLLM") == pytest.approx(0.6 * 79.6)
    assert gen.gib == pytest.approx(3 * shard + 0.6 * 79.6 + RUNTIME_OVERHEAD_GIB)
    upd = _phase(e, "update")
    assert _term(upd, "gradients") == pytest.approx(shard)
    assert _term(upd, "checkpointed activations") == pytest.approx(28 * 4096 * 3584 * 2 / GIB)
    # logits 4096 x 152064 bf16 + lm_head unit gathered in bf16 + its fp32 gradient
    assert _term(upd, "peak transient: logits") == pytest.approx((4096 * 152064 * 2 + 152064 * 3584 * 6) / GIB)
    sync = _phase(e, "weight sync")
    assert _term(sync, "vLLM weights") == pytest.approx(P7 * 2 / GIB)
    lp = _phase(e, "log-prob")
    assert _term(lp, "logits") == pytest.approx(4096 * 152064 * 2 / GIB)
    assert _term(lp, "entropy") == pytest.approx(4096 * 152064 * 4 / GIB)  # torch.compile'd: one fp32 T x V
    assert e.peak is gen and e.headroom_gib == pytest.approx(79.6 - gen.gib)


def test_update_transient_is_the_largest_of_logits_layer_recompute_and_optimizer_step(tmp_path):
    # a 16K budget: logits + lm_head unit (bf16 gathered + fp32 grad) 7.7 GiB vs one layer's
    # recompute + backward 16384*(18H+6kv+8I + 4I+4H) + unit*(2*2+4) = 6.5 GiB
    e = _est(actor_rollout_ref__actor__ppo_max_token_len_per_gpu=16384)
    layer = (16384 * (18 * 3584 + 6 * 512 + 8 * 18944) + 16384 * (4 * 18944 + 4 * 3584) + 233_057_792 * 8) / GIB
    head = (16384 * 152064 * 2 + 152064 * 3584 * 6) / GIB
    assert head == pytest.approx(7.686, abs=1e-3) and layer == pytest.approx(6.455, abs=1e-3)
    assert _term(_phase(e, "update"), "peak transient: logits") == pytest.approx(head)
    # a vocabulary of 1000 (local config.json): the layer recompute is the largest transient
    small_vocab = _est_arch(tmp_path, vocab_size=1000, budget=16384)
    assert _term(_phase(small_vocab, "update"), "peak transient: layer") == pytest.approx(
        (16384 * (22 * 3584 + 6 * 512 + 12 * 18944) + 233_057_792 * 8) / GIB)
    # a tiny budget: the optimizer step's temporary (one fp32 state shard) is the largest
    tiny = _est(actor_rollout_ref__actor__ppo_max_token_len_per_gpu=64)
    assert _term(_phase(tiny, "update"), "peak transient: optimizer step") == pytest.approx(P7 * 4 / 8 / GIB)
    # without gradient checkpointing every layer keeps its activations
    no_ckpt = _est(actor_rollout_ref__model__enable_gradient_checkpointing=False)
    assert _term(_phase(no_ckpt, "update"), "checkpointed activations") == pytest.approx(
        28 * 4096 * (22 * 3584 + 6 * 512 + 12 * 18944) / GIB)


def _est_arch(model_dir, vocab_size: int, budget: int):
    """The Qwen2.5-7B shape with another vocabulary, read from a local config.json."""
    (model_dir / "config.json").write_text(json.dumps({**QWEN25_7B_CONFIG, "vocab_size": vocab_size}))
    return _est(actor_rollout_ref__model__path=str(model_dir), actor_rollout_ref__actor__ppo_max_token_len_per_gpu=budget)


def test_reference_costs_host_memory_not_gpu_memory():
    with_ref, without = _est(), _est(actor_rollout_ref__actor__use_kl_loss=False)
    assert [p.gib for p in with_ref.phases] == [p.gib for p in without.phases]
    assert with_ref.host_ref_gib == pytest.approx(P7 * 4 / 8 / GIB) and without.host_ref_gib == 0


def test_offload_switches_move_state_off_the_gpu_where_verl_does():
    base, shard = _est(), P7 * 4 / 8 / GIB
    p_off = _est(actor_rollout_ref__actor__fsdp_config__param_offload=True)
    assert _phase(base, "generation").gib - _phase(p_off, "generation").gib == pytest.approx(shard)
    assert _phase(p_off, "update").gib == pytest.approx(_phase(base, "update").gib)  # loaded for the update
    o_off = _est(actor_rollout_ref__actor__fsdp_config__optimizer_offload=True)
    assert _phase(base, "generation").gib - _phase(o_off, "generation").gib == pytest.approx(2 * shard)
    assert _phase(o_off, "update").gib == pytest.approx(_phase(base, "update").gib)
    pol = _est(actor_rollout_ref__actor__fsdp_config__offload_policy=True)
    upd = _phase(pol, "update")
    assert _term(upd, "actor parameters") == _term(upd, "gradients") == _term(upd, "optimizer states") == 0


def test_entropy_in_the_update_and_no_free_cache_engine_add_their_terms():
    base = _phase(_est(), "update")
    ent = _phase(_est(actor_rollout_ref__actor__entropy_coeff=0.001), "update")
    assert _term(ent, "peak transient") - _term(base, "peak transient") == pytest.approx(2 * 4096 * 152064 * 2 / GIB)
    awake = _est(actor_rollout_ref__rollout__free_cache_engine=False)
    assert _phase(awake, "update").gib - base.gib == pytest.approx(0.6 * 79.6)
    assert not any(p.name.startswith("weight sync") for p in awake.phases)


def test_fsdp_size_budget_without_dynamic_batching_and_bad_dtype():
    s = settings_from_config(_cfg(actor_rollout_ref__actor__fsdp_config__fsdp_size=4))
    assert s.fsdp_size == 4 and s.n_gpus == 8
    s = settings_from_config(_cfg(actor_rollout_ref__actor__use_dynamic_bsz=False,
                                  actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu=2))
    assert s.train_tokens == 2 * 4096
    with pytest.raises(MemoryEstimateError, match="ppo_micro_batch_size_per_gpu is unset"):
        settings_from_config(_cfg(actor_rollout_ref__actor__use_dynamic_bsz=False))
    with pytest.raises(MemoryEstimateError, match="use_dynamic_bsz=true needs actor_rollout_ref.actor.ppo_max_token_len_per_gpu >= 1"):
        settings_from_config(_cfg(actor_rollout_ref__actor__use_dynamic_bsz=True,
                                  actor_rollout_ref__actor__ppo_max_token_len_per_gpu=None))
    notes = settings_from_config(_cfg(actor_rollout_ref__model__lora_rank=8,
                                      actor_rollout_ref__actor__fsdp_config__reshard_after_forward=False)).notes
    assert any("LoRA is not modelled" in n for n in notes) and any("reshard_after_forward=False" in n for n in notes)
    with pytest.raises(MemoryEstimateError, match="model_dtype='int3'"):
        settings_from_config(_cfg(actor_rollout_ref__actor__fsdp_config__model_dtype="int3"))


def test_kv_cache_capacity_and_verdict():
    e = _est()
    act = 4096 * (4 * 3584 + 3 * 18944) * 2 + 256 * 152064 * 4 * 2  # chunked prefill + sampler logits
    kv = 0.6 * 79.6 * GIB - P7 * 2 - act - CUDAGRAPH_GIB * GIB  # vLLM 0.24 takes its CUDA graphs out of the KV cache
    assert e.kv_cache_tokens == int(kv // 57_344)
    assert e.fits and e.required_headroom_gib == pytest.approx(HEADROOM_FRACTION * 79.6)
    # the authors' 0.85 (their 7B scripts): ~81 GiB of 79.6 -> does not fit
    assert not _est(actor_rollout_ref__rollout__gpu_memory_utilization=0.85).fits
    # too little for vLLM: the KV cache cannot hold one 4096-token sequence
    small = _est(actor_rollout_ref__rollout__gpu_memory_utilization=0.18)
    assert small.kv_cache_tokens < 4096 and not small.fits
    # the share is a fraction of the whole GPU: a bigger GPU leaves more room only for the actor's part
    h200 = _est(gpu=139.8)
    assert h200.fits and _term(_phase(h200, "generation"), "vLLM") == pytest.approx(0.6 * 139.8)


def test_gpu_size_override_parsing():
    assert gpu_mem_gib("", "X") == DEFAULT_GPU_MEM_GIB and gpu_mem_gib(None, "X") == DEFAULT_GPU_MEM_GIB
    assert gpu_mem_gib(" 80 ", "X") == 80.0
    for bad in ("x", "-1", "0", "nan", "inf"):
        with pytest.raises(MemoryEstimateError, match="X="):
            gpu_mem_gib(bad, "X")


# ----------------------------------------------------------------------------- made-up architecture: each new term by hand

TOY_CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 50000,
              "tie_word_embeddings": False, "max_position_embeddings": 8192}
# layer: q 64*64 + k,v 2*64*32 + o 64*64 + MLP 3*64*128 + 2 norms*64; + embed and lm_head 2*50000*64 + final norm
TOY_P = 2 * (3 * 4096 + 24576 + 128) + 2 * 50000 * 64 + 64
TOY_KV_PER_TOKEN = 2 * 2 * 2 * 16 * 2      # K and V x layers x kv_heads x head_dim x bf16 = 256 bytes


def _toy(model_dir, gpu=79.6, **over):
    (model_dir / "config.json").write_text(json.dumps(TOY_CONFIG))
    s = settings_from_config(_cfg(actor_rollout_ref__model__path=str(model_dir), **over))
    arch = architecture_for(s.model_path)
    assert arch.params == TOY_P == 6_474_048 and arch.kv_cache_bytes_per_token() == TOY_KV_PER_TOKEN
    return estimate(s, arch, gpu)


def test_without_flash_attn_the_update_adds_exactly_the_fp32_log_softmax(tmp_path):
    flash = _toy(tmp_path)
    assert _toy(tmp_path, actor_rollout_ref__model__override_config={"attn_implementation": "flash_attention_2"}
                ).phases == flash.phases  # asking for verl's default keeps today's terms
    sdpa = _toy(tmp_path, actor_rollout_ref__model__override_config={"attn_implementation": "sdpa"})
    # logprobs_from_logits_v2 under autocast: every row's fp32 log_softmax kept for the backward, T x V x 4
    assert _phase(sdpa, "update").gib - _phase(flash, "update").gib == pytest.approx(4096 * 50000 * 4 / GIB)
    assert _term(_phase(sdpa, "update"), "peak transient: logits") == pytest.approx(
        (4096 * 50000 * 2 + 50000 * 64 * 6 + 4096 * 50000 * 4) / GIB)
    # forward-only passes free each row: the log-prob phase is unchanged
    assert _phase(sdpa, "log-prob").gib == pytest.approx(_phase(flash, "log-prob").gib)
    assert any("attn_implementation=sdpa" in n for n in sdpa.notes)


def test_eager_entropy_of_the_old_log_prob_holds_three_fp32_copies(tmp_path):
    compiled = _phase(_toy(tmp_path), "log-prob")
    eager = _phase(_toy(tmp_path, actor_rollout_ref__actor__fsdp_config__use_torch_compile=False), "log-prob")
    assert _term(compiled, "entropy temporaries (compiled") == pytest.approx(4096 * 50000 * 4 / GIB)
    assert _term(eager, "entropy temporaries (eager") == pytest.approx(4096 * 50000 * 12 / GIB)


def test_weight_sync_holds_the_bucket_and_one_full_fp32_tensor(tmp_path):
    e = _toy(tmp_path)
    sync = _phase(e, "weight sync")
    assert _term(sync, "weight-sync bucket") == pytest.approx(2048 * 2**20 / GIB)  # verl's default 2048 MB
    assert _term(sync, "largest gathered tensor (32-bit") == pytest.approx(50000 * 64 * 4 / GIB)  # lm_head, fp32
    shard = TOY_P * 4 / 8 / GIB
    assert sync.gib == pytest.approx(3 * shard + TOY_P * 2 / GIB + 2.0 + 50000 * 64 * 4 / GIB + RUNTIME_OVERHEAD_GIB)
    small = _toy(tmp_path, actor_rollout_ref__rollout__checkpoint_engine={"update_weights_bucket_megabytes": 512})
    assert sync.gib - _phase(small, "weight sync").gib == pytest.approx(1.5)


def test_separate_async_adds_the_rollout_pool_and_the_trainers_nccl_send():
    from rpg.memory.formatting import report
    from rpg.memory.gpu import estimate_rollout_pool

    over = {"trainer__v1": {"trainer_mode": "separate_async"},
            "actor_rollout_ref__rollout__nnodes": 1, "actor_rollout_ref__rollout__n_gpus_per_node": 4,
            "actor_rollout_ref__rollout__checkpoint_engine": {"backend": "nccl",
                                                              "update_weights_bucket_megabytes": 1024}}
    s = settings_from_config(_cfg(**over))
    assert (s.rollout_pool, s.sync_engine) == ((1, 4), "nccl")
    trainer = estimate(s, QWEN25_7B, 79.6)
    shard, bucket = P7 * 4 / 8 / GIB, 1024 * 2**20 / GIB
    send = _phase(trainer, "standalone weight sync (nccl send")
    assert _term(send, "nccl send + receive buffers") == pytest.approx(2 * bucket)
    assert send.gib == pytest.approx(3 * shard + 2 * bucket + 152064 * 3584 * 4 / GIB + RUNTIME_OVERHEAD_GIB)
    pool = estimate_rollout_pool(s, trainer)
    serve, sync = pool.phases
    assert serve.gib == pytest.approx(0.6 * 79.6 + RUNTIME_OVERHEAD_GIB)  # vLLM's share: weights + KV cache
    # the sync: vLLM's bf16 weights (KV cache released), nccl's two buffers, the adapter's CUDA-IPC bucket
    assert sync.gib == pytest.approx(P7 * 2 / GIB + 3 * bucket + RUNTIME_OVERHEAD_GIB)
    assert pool.kv_cache_tokens == trainer.kv_cache_tokens and pool.fits
    awake = settings_from_config(_cfg(**over, actor_rollout_ref__rollout__free_cache_engine=False))
    kept = estimate_rollout_pool(awake, trainer)
    assert _term(kept.phases[1], "vLLM weights + KV cache") == pytest.approx(0.6 * 79.6)
    text = report(_cfg(**over))
    names(text, "training pool (actor, optimizer, reference", "standalone rollout pool", "1 x 4 = 4 GPUs",
          "training pool's 8")
    # the other modes: one pool
    assert estimate_rollout_pool(settings_from_config(_cfg()), _est()) is None
    assert "standalone" not in report(_cfg()) and not any(p.name.startswith("standalone") for p in _est().phases)


def test_cuda_graphs_come_out_of_the_kv_cache_unless_enforce_eager(tmp_path):
    act = 4096 * (4 * 64 + 3 * 128) * 2 + 256 * 50000 * 4 * 2      # chunked prefill + sampler logits
    kv_eager = 0.6 * 79.6 * GIB - TOY_P * 2 - act
    graphs, eager = _toy(tmp_path), _toy(tmp_path, actor_rollout_ref__rollout__enforce_eager=True)
    assert eager.kv_cache_tokens == int(kv_eager // TOY_KV_PER_TOKEN)
    assert graphs.kv_cache_tokens == int((kv_eager - CUDAGRAPH_GIB * GIB) // TOY_KV_PER_TOKEN)
    assert _phase(graphs, "generation").gib == _phase(eager, "generation").gib  # inside vLLM's share


def test_kv_check_against_vllm_max_model_len(tmp_path):
    e = _toy(tmp_path)
    # unset rollout.max_model_len: verl passes the model's max_position_embeddings (config.json: 8192)
    assert (e.vllm_max_model_len, e.kv_needed_tokens) == (8192, 8192) and e.kv_fits and e.fits
    assert f"holds {e.kv_cache_tokens // 8192} sequences of that length: OK" in format_kv_check(e)
    room = e.kv_cache_tokens // 16 * 16           # the longest whole-block sequence the cache holds
    ok = _toy(tmp_path, actor_rollout_ref__rollout__max_model_len=room)
    assert ok.kv_fits and ok.fits and "holds 1 sequences of that length: OK" in format_kv_check(ok)
    bad = _toy(tmp_path, actor_rollout_ref__rollout__max_model_len=room + 1)  # needs one more 16-token block
    assert bad.kv_needed_tokens == room + 16 and not bad.kv_fits
    assert not bad.fits and bad.headroom_gib == ok.headroom_gib  # the KV check alone flips the verdict
    line = format_kv_check(bad)
    assert "NO FIT" in line and "actor_rollout_ref.rollout.gpu_memory_utilization" in line
    assert f"max_model_len {room + 1} (actor_rollout_ref.rollout.max_model_len)" in line
    assert _est().vllm_max_model_len == 4096 and architecture_for("Qwen/Qwen3-4B").max_position_embeddings == 40960
    assert not e.notes and any("> max_position_embeddings 8192: verl refuses" in n for n in ok.notes)
    short = _toy(tmp_path, actor_rollout_ref__rollout__max_model_len=1024)   # < prompt + response 4096
    assert any("rollout.max_model_len 1024 < prompt + response 4096" in n for n in short.notes)


# ----------------------------------------------------------------------------- host RAM per node


def _host(model_dir, host_gib, **over):
    (model_dir / "config.json").write_text(json.dumps(TOY_CONFIG))
    cfg = _cfg(actor_rollout_ref__model__path=str(model_dir), data__train_batch_size=4, data__dataloader_num_workers=2,
               actor_rollout_ref__rollout__n=2, actor_rollout_ref__rollout__agent={"num_workers": 3},
               reward__num_workers=1, **over)
    s = settings_from_config(cfg)
    return estimate_host(host_settings_from_config(cfg, s), architecture_for(s.model_path), host_gib)


def test_host_terms_by_hand(tmp_path):
    shard = TOY_P * 4 / 8 / GIB
    # reference (use_kl_loss) pinned + offloaded parameters + 2 offloaded states; object store set to 10 GiB
    e = _host(tmp_path, 100.0, actor_rollout_ref__actor__fsdp_config__param_offload=True,
              actor_rollout_ref__actor__fsdp_config__optimizer_offload=True,
              ray_kwargs={"ray_init": {"object_store_memory": 10 * GIB}})
    per_gpu = TRAINER_PROCESS_GIB + shard + shard + 2 * shard + VLLM_PROCESS_GIB
    batch = 4 * 2 * (2048 + 2048) * 64 / GIB
    assert e.total_gib == pytest.approx(8 * per_gpu + 10 + batch + DRIVER_GIB + RAY_DAEMONS_GIB + 6 * SMALL_WORKER_GIB)
    terms = dict(e.terms)
    assert terms["8 x reference shard, pinned"] == pytest.approx(8 * shard)
    # FSDP2 offload_policy: parameters, gradients and states pinned on the CPU
    pol = dict(_host(tmp_path, 100.0, actor_rollout_ref__actor__fsdp_config__offload_policy=True).terms)
    assert _named(pol, "8 x ", "FSDP2 offload_policy", "2 states") == pytest.approx(8 * 4 * shard)
    # FSDP1 saves each rank's model + optimizer shard through CPU memory
    fsdp1 = dict(_host(tmp_path, 100.0, actor_rollout_ref__actor__strategy="fsdp").terms)
    assert fsdp1["8 x FSDP1 checkpoint save: model + optimizer shard on CPU"] == pytest.approx(8 * 3 * shard)
    # LoRA adapters: verl sleeps vLLM at level 1, which backs its bf16 weights up on the CPU
    lora = dict(_host(tmp_path, 100.0, actor_rollout_ref__model__lora_rank=8).terms)
    assert lora["8 x vLLM sleep level 1: bf16 weights backed up, pinned"] == pytest.approx(8 * TOY_P * 2 / GIB)
    assert not any("sleep level 1" in k for k in terms)


def test_host_verdict_flips_at_the_right_size(tmp_path):
    fixed = _host(tmp_path, 100.0, ray_kwargs={"ray_init": {"object_store_memory": 10 * GIB}})
    flip = fixed.total_gib / (1 - HEADROOM_FRACTION)  # fits when total <= 90% of the node
    set_store = {"ray_kwargs": {"ray_init": {"object_store_memory": 10 * GIB}}}
    assert _host(tmp_path, flip + 0.01, **set_store).fits and not _host(tmp_path, flip - 0.01, **set_store).fits
    # Ray's default store is 30% of the node: total = rest + 0.3 h, fits when rest + 0.3 h <= 0.9 h
    rest = fixed.total_gib - 10
    flip = rest / (1 - HEADROOM_FRACTION - 0.3)
    assert _host(tmp_path, flip + 0.01).fits and not _host(tmp_path, flip - 0.01).fits
    assert _named(dict(_host(tmp_path, 4000.0).terms), "Ray object store", "30%", "200 GB") == pytest.approx(200e9 / GIB)
    assert "host RAM DOES NOT FIT" in format_host(_host(tmp_path, flip - 0.01))
    with pytest.raises(MemoryEstimateError, match="object_store_memory='lots'"):
        _host(tmp_path, 100.0, ray_kwargs={"ray_init": {"object_store_memory": "lots"}})


def test_host_size_override_parsing():
    assert host_mem_gib("", "X") == DEFAULT_HOST_MEM_GIB and host_mem_gib(" 1024 ", "X") == 1024.0
    for bad in ("x", "-1", "0", "nan"):
        with pytest.raises(MemoryEstimateError, match="X=.*the node's RAM in GiB"):
            host_mem_gib(bad, "X")


# ----------------------------------------------------------------------------- checkpoint disk


def test_checkpoint_disk_by_hand():
    s = settings_from_config(_cfg())
    d = estimate_disk(s, QWEN25_7B)
    assert dict(d.items)["actor model shards (32-bit)"] == pytest.approx(P7 * 4 / 1e9)       # 30.46 GB
    assert dict(d.items)["optimizer states (2 x 32-bit)"] == pytest.approx(2 * P7 * 4 / 1e9)  # 60.92 GB
    assert (d.saves, d.kept, d.peak_kept) == (20, 1, 2)  # keep=1: the old one goes after the new is written
    assert d.peak_gb == pytest.approx(2 * d.per_checkpoint_gb)
    ref = estimate_disk(settings_from_config(_cfg(rpg__reference__mode="periodic")), QWEN25_7B)
    assert ref.per_checkpoint_gb - d.per_checkpoint_gb == pytest.approx(P7 * 4 / 1e9)  # rpg_reference/ fp32
    hf = estimate_disk(settings_from_config(_cfg(
        actor_rollout_ref__actor__checkpoint__save_contents=["model", "optimizer", "extra", "hf_model"])), QWEN25_7B)
    assert hf.per_checkpoint_gb - d.per_checkpoint_gb == pytest.approx(P7 * 4 / 1e9)
    keep_all = estimate_disk(settings_from_config(_cfg(trainer__max_actor_ckpt_to_keep=None)), QWEN25_7B)
    assert (keep_all.kept, keep_all.peak_kept) == (20, 20)
    keep3 = estimate_disk(settings_from_config(_cfg(trainer__max_actor_ckpt_to_keep=3)), QWEN25_7B)
    assert (keep3.kept, keep3.peak_kept) == (3, 3)


def test_count_saves_follows_verl():
    # saves at every multiple of save_freq and at the last step
    assert count_saves(20, 400) == 20 and count_saves(20, 410) == 21 and count_saves(20, 5) == 1
    assert count_saves(0, 400) == 0 and count_saves(-1, 400) == 0 and count_saves(20, None) is None


# ----------------------------------------------------------------------------- launcher


def _clean_env(**kw):
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "NNODES", "N_GPUS_PER_NODE", "DRY_RUN",
                                                             "RPG_BACKEND", "RAY_ADDRESS", "RPG_GPU_MEM_GIB",
                                                             "RPG_HOST_MEM_GIB")}
    env.update(kw)
    return env


def test_describe_prints_estimate_and_disk(capsys):
    from launching import launch as main

    assert main(["run_grpo_7b", "--describe", "--gpu-mem-gib", "80"], _clean_env()) == 0
    out = capsys.readouterr().out
    assert "GRPO" in out and "GPU 80 GiB" in out and "FITS: peak" in out
    assert "gpu_memory_utilization 0.6 x 80 GiB" in out
    assert "reference model: CPU-offloaded" in out and "checkpoint disk (estimate): 91.4 GB per checkpoint" in out
    # the authors' 0.85 as an override: the verdict flips
    assert main(["run_grpo_7b", "--describe", "actor_rollout_ref.rollout.gpu_memory_utilization=0.85"],
                _clean_env()) == 0
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_describe_errors_are_one_line(capsys):
    from launching import launch as main

    assert main(["run_grpo_7b", "--describe", "--gpu-mem-gib", "lots"], _clean_env()) == 2
    assert "--gpu-mem-gib='lots' is invalid" in capsys.readouterr().err
    assert main(["run_grpo_7b", "--describe", "--gpu-mem-gib"], _clean_env()) == 2
    assert "--gpu-mem-gib needs a value" in capsys.readouterr().err
    assert main(["run_grpo_7b"], _clean_env(DRY_RUN="1", RPG_GPU_MEM_GIB="0")) == 2
    assert "RPG_GPU_MEM_GIB='0' is invalid" in capsys.readouterr().err
    assert main(["run_grpo_7b", "--describe"], _clean_env(MODEL_PATH="someone/Model-9B")) == 2
    err = capsys.readouterr().err
    assert "no architecture for model 'someone/Model-9B'" in err and err.count("\n") == 1


def test_describe_4b_8k_shows_host_verdict_and_kv_check(capsys):
    from launching import launch as main

    name = "run_rpg_4b_ctx8k_urkl1e-4_rf_clip_ppo_0.2_0.28"
    assert main([name, "--describe"], _clean_env()) == 0
    out = capsys.readouterr().out
    (kv,) = [x for x in out.splitlines() if "KV cache check" in x]
    names(kv, "max_model_len 40960", "rollout.max_model_len unset", "max_position_embeddings")
    assert "sequences of that length: OK" in out and "host RAM per node (estimate" in out
    assert "host RAM FITS: " in out and f"of {DEFAULT_HOST_MEM_GIB:g} GiB" in out
    assert main([name, "--describe", "--host-mem-gib=64"], _clean_env()) == 0
    assert "host RAM DOES NOT FIT: " in capsys.readouterr().out
    assert main([name, "--describe", "--host-mem-gib", "x"], _clean_env()) == 2
    assert "--host-mem-gib='x' is invalid" in capsys.readouterr().err
    assert main([name], _clean_env(DRY_RUN="1", RPG_HOST_MEM_GIB="-5")) == 2
    assert "RPG_HOST_MEM_GIB='-5' is invalid" in capsys.readouterr().err


def test_dry_run_prints_estimate_for_the_gpu_size(capsys):
    from launching import launch as main

    assert main(["run_rpg_4b_ctx8k_ufkl1e-4"], _clean_env(DRY_RUN="1", RPG_GPU_MEM_GIB="139.8")) == 0
    out = capsys.readouterr().out
    (head,) = [x for x in out.splitlines() if x.startswith("# ---- memory per GPU")]
    names(head, "docs/memory.md", "Qwen/Qwen3-4B")
    assert "GPU 139.8 GiB" in out
    assert "#   FITS: peak" in out and "# checkpoint disk (estimate)" in out
    assert "#   KV cache check: max_model_len 40960" in out and "#   host RAM FITS: " in out
    assert out.index("---- composed and validated config") < out.index("# ---- memory per GPU")  # printed last
    # an unknown model: the dry run still succeeds and says why there is no estimate
    assert main(["run_grpo_7b"], _clean_env(DRY_RUN="1", MODEL_PATH="someone/Model-9B")) == 0
    (why,) = [x for x in capsys.readouterr().out.splitlines() if "'someone/Model-9B'" in x]
    assert why.startswith("# ---- memory estimate unavailable")
    names(why, "no architecture")


def test_the_memory_modules_import_one_way():
    """host.py builds on the per-GPU estimate's modules (their settings, architectures and units); those
    import nothing of host.py, not even inside a function (the launcher's whole report lives in
    formatting.py, which no estimate imports). Inside the package, modules import each other directly,
    never through the package's __init__."""
    import ast
    from pathlib import Path

    import rpg.memory as memory

    package = Path(memory.__file__).parent

    def imported(module: str) -> set[str]:
        tree = ast.parse((package / f"{module}.py").read_text())
        names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level], module  # no relative ones
        return names

    for module in ("sizes", "architecture", "run_settings", "gpu", "disk"):
        found = imported(module)
        assert not {m for m in found if m.startswith(("rpg.memory.host", "rpg.memory.formatting"))}, found
    assert not {m for m in imported("host") if m.startswith("rpg.memory.formatting")}
    modules = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    assert {"sizes", "architecture", "run_settings", "gpu", "disk", "host", "formatting"} <= set(modules), modules
    for module in modules:
        assert "rpg.memory" not in imported(module), module
