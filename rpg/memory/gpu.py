"""Per-GPU memory estimate of a composed run config (verl 0.9.1, FSDP + vLLM); its checkpoint disk: disk.py.

Pure Python (no torch, verl or omegaconf import): ``estimate(settings_from_config(cfg), arch, gpu_gib)``
takes the composed config as a plain nested mapping (``OmegaConf.to_container(cfg, resolve=True)``),
the model's architecture (``architecture_for(model_path)``, architecture.py) and the GPU's memory, and returns the
peak per-GPU memory of each phase of a training step and the headroom. A paper script's ``--describe``
and ``DRY_RUN=1`` print it (docs/memory.md).

Every term, and where verl 0.9.1 decides it (paths under ``verl/``; P = parameters, F = FSDP shard
group size = all GPUs unless ``fsdp_size`` is set, T = tokens of one micro-batch on one GPU,
V = vocabulary, H = hidden size, I = MLP width, L = layers)::

  actor parameters   P * bytes(model_dtype) / F   model_dtype defaults to fp32 (trainer/config/engine/
                     fsdp.yaml `model_dtype: fp32`; workers/engine/fsdp/transformer_impl.py:258-264),
                     sharded by FSDP2 fully_shard (utils/fsdp_utils.py:573-600).
  gradients          P * bytes(model_dtype) / F   only inside the update: train mode zeroes them
                     (set_to_none) on exit (workers/engine/base.py:312, transformer_impl.py:1135-1139).
  optimizer states   2 * P * bytes(model_dtype)/F AdamW (exp_avg, exp_avg_sq) and schedule-free
                     AdamW (z, exp_avg_sq); built only for the trainable actor (transformer_impl.py:616-622).
  offload            param_offload / optimizer_offload move them to CPU outside the phases that use
                     them (workers/engine/base.py:314-328); FSDP2 offload_policy keeps them on CPU
                     throughout (transformer_impl.py:459-463).
  reference model    0 GPU memory at rest: a forward-only engine is always built with CPU offload,
                     FSDP1 CPUOffload(offload_params=True), FSDP2 CPUOffloadPolicy(pin_memory=True)
                     (transformer_impl.py:431-435, 459-463); its pinned host copy is P*bytes/F per GPU.
                     A reference exists when use_kl_loss or use_kl_in_reward (trainer/ppo/utils.py:75-79).
  vLLM               util * GPU memory while awake: vLLM's per-process budget for its weights,
                     activation peak, CUDA graphs and KV cache (vllm/v1/worker/gpu_worker.py
                     Worker.determine_available_memory: requested = total * gpu_memory_utilization;
                     KV = requested - weights - profiled peak - CUDA graphs, the last because
                     VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1 since vLLM 0.21, vllm/envs.py;
                     graphs measured by gpu_model_runner.py profile_cudagraph_memory, assumed CUDAGRAPH_GIB
                     here, 0 with rollout.enforce_eager). Weights P*2/TP (bf16). Asleep
                     (free_cache_engine) weights and KV cache are freed.
  KV check           vLLM refuses to start unless its KV cache holds one max_model_len sequence in whole
                     16-token blocks (vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory);
                     verl's max_model_len is rollout.max_model_len, else the model's max_position_embeddings
                     (workers/rollout/vllm_rollout/vllm_async_server.py _validate_configs).
  phase order        the sync trainer sleeps vLLM after sampling and wakes it after the update and the
                     checkpoint (trainer/ppo/v1/trainer_sync.py:35-42): log-probs and the update run with
                     vLLM asleep; generation and validation with the actor's resident state beside it.
  weight sync order  update_weights resumes vLLM weights, streams the actor's parameters, offloads
                     the actor if param_offload, then resumes the KV cache (workers/engine_workers.py:
                     769-824): params + optimizer states + vLLM weights coexist before the KV cache,
                     with one bucket of rollout.checkpoint_engine.update_weights_bucket_megabytes on the
                     trainer's GPU (workers/rollout/vllm_rollout/bucketed_weight_transfer.py
                     BucketedWeightSender._init_buffer, CUDA IPC) and the tensor being sent, gathered in
                     the actor's dtype (transformer_impl.py get_per_tensor_param: DTensor.full_tensor()).
  gathered units     FSDP2 all-gathers one unit at a time in bf16 (mixed precision param_dtype,
                     transformer_impl.py:391-401, 455-457): a decoder layer, or embed_tokens/lm_head
                     (V*H; utils/fsdp_utils.py:558-569); its unsharded gradient is fp32 (reduce_dtype).
  logits             T * V * 2: Qwen2/Qwen3 return lm_head output in the compute dtype, bf16
                     (transformers models/qwen2/modeling_qwen2.py `logits = self.lm_head(...)`);
                     temperature 1 does not copy (transformer_impl.py:98-103). flash-attn's
                     cross-entropy computes the log-probs and writes the logits' gradient in place
                     (utils/torch_functional.py:95-101, transformer_impl.py:1424-1431). Without
                     flash-attn (model.override_config.attn_implementation other than flash_attention_2,
                     workers/config/model.py) logprobs_from_logits_v2 runs log_softmax row by row under
                     forward_step's torch.autocast(bf16), which computes it in fp32, and autograd keeps
                     every row: + T*V*4 in the update (forward-only passes free each row). An entropy in
                     the update keeps up to 2 more bf16 copies.
  old log-prob       forward only, entropy computed (trainer/ppo/v1/trainer_base.py:1653): logits +
                     entropy_from_logits (utils/torch_functional.py:243-244) under autocast, i.e. in fp32.
                     Compiled (fsdp_config.use_torch_compile, the default; transformer_impl.py:183-187)
                     inductor keeps one fp32 T*V buffer: T*V*4. Eager: softmax's fp32 output + logsumexp's
                     fp32 input copy and its (x - max) temporary: T*V*12.
  token budgets      update: actor.ppo_max_token_len_per_gpu (engine_workers.py:626); old log-prob:
                     rollout.log_prob_max_token_len_per_gpu (:620); reference: ref.log_prob_max_token_len_per_gpu
                     (:552, 581). Without dynamic batching: micro-batch size * (prompt + response).
  activations        gradient checkpointing keeps each decoder layer's bf16 input, L*T*H*2; the layer
                     being recomputed holds its saved tensors, ~T*(18H + 6*kv + 8I) bytes (bf16 q, k, v,
                     rotated q/k, attention output, gate/up/act/product, fp32 RMSNorm inputs), plus the
                     backward's gradients of its widest tensors, ~T*(4I + 4H). Activation offload: 0.
  standalone pool    trainer.v1.trainer_mode=separate_async adds verl's standalone rollout pool
                     (rollout.nnodes x rollout.n_gpus_per_node GPUs, estimate_rollout_pool): on each GPU a
                     vLLM server with the same gpu_memory_utilization share (weights P*2/TP + KV cache)
                     and its CheckpointEngineWorker. verl's nccl engine holds a send and a receive buffer
                     of update_weights_bucket_megabytes each on every GPU of the broadcast, while a sync
                     runs (checkpoint_engine/nccl_checkpoint_engine.py:165-175, freed in finalize :182-193):
                     on the trainer's rank 0 beside its parameters and optimizer states, on each rollout
                     GPU beside vLLM's weights, the adapter's CUDA-IPC bucket and, with free_cache_engine
                     (released for the sync, vllm_async_server.py:875-892) its KV cache freed. The trainer
                     pool keeps its hybrid replicas (actor_rollout_ref.hybrid_engine=True).
  optimizer step     after the backward (activations freed): torch AdamW's foreach step holds one
                     temporary the size of the state shard (sqrt of exp_avg_sq), P*bytes/F.

Left out (covered by the required headroom, HEADROOM_FRACTION of the GPU): allocator fragmentation,
CUDA contexts / NCCL and cuBLAS workspaces / vLLM's sleeping residue (a fixed RUNTIME_OVERHEAD_GIB is
added instead of measured), the RPG loss's own temporaries (~0.1 GiB at 2M tokens, measured on an
H100), sequence parallelism, LoRA, Megatron. Host RAM per node: host.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rpg.memory.architecture import Architecture
from rpg.memory.sizes import DEFAULT_GPU_MEM_GIB, GIB, HEADROOM_FRACTION, MemoryEstimateError
from rpg.memory.run_settings import RunSettings

RUNTIME_OVERHEAD_GIB = 3.0        # assumed: 2 CUDA contexts (trainer, vLLM) ~1, NCCL/cuBLAS ~0.5, vLLM CUDA graphs ~1.5
CUDAGRAPH_GIB = 1.0               # assumed: vLLM's CUDA graphs (FULL_AND_PIECEWISE, up to 51 sizes), measured by vLLM at start
KV_BLOCK_TOKENS = 16              # vLLM's default KV block: a sequence's KV is rounded up to whole blocks


@dataclass(frozen=True)
class Term:
    name: str
    gib: float


@dataclass(frozen=True)
class Phase:
    name: str
    terms: tuple[Term, ...]

    @property
    def gib(self) -> float:
        return sum(t.gib for t in self.terms)


@dataclass(frozen=True)
class MemoryEstimate:
    arch: Architecture
    settings: RunSettings
    gpu_gib: float
    phases: tuple[Phase, ...]
    kv_cache_gib: float          # vLLM's KV cache while awake (its budget minus weights, activations, CUDA graphs)
    kv_cache_tokens: int
    vllm_max_model_len: int      # what vLLM checks one sequence of against the KV cache at start
    vllm_max_model_len_source: str
    host_ref_gib: float          # pinned host memory of the reference shard, per GPU process
    notes: tuple[str, ...] = field(default=())

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.gib)

    @property
    def headroom_gib(self) -> float:
        return self.gpu_gib - self.peak.gib

    @property
    def required_headroom_gib(self) -> float:
        return HEADROOM_FRACTION * self.gpu_gib

    @property
    def kv_needed_tokens(self) -> int:
        """vLLM refuses to start unless its KV cache holds one max_model_len sequence, in whole blocks
        (vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory; FullAttentionSpec.max_memory_usage_bytes)."""
        return -(-self.vllm_max_model_len // KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS

    @property
    def kv_fits(self) -> bool:
        return self.kv_cache_tokens >= self.kv_needed_tokens

    @property
    def fits(self) -> bool:
        return self.headroom_gib >= self.required_headroom_gib and self.kv_fits


def _g(n_bytes: float) -> float:
    return n_bytes / GIB


def _largest_tensor_gib(arch: Architecture, dtype_bytes: int) -> float:
    return _g(max(arch.vocab, arch.intermediate) * arch.hidden * dtype_bytes)


def layer_recompute_bytes(arch: Architecture, tokens: int) -> int:
    """One decoder layer under recomputation: its saved tensors plus the backward's widest gradients."""
    h, i, kv = arch.hidden, arch.intermediate, arch.kv_heads * arch.head_dim
    return tokens * (18 * h + 6 * kv + 8 * i) + tokens * (4 * i + 4 * h)


def vllm_activation_bytes(arch: Architecture, batched_tokens: int, max_num_seqs: int) -> int:
    """vLLM's profiled peak: one chunked-prefill forward (widest: MLP) + fp32 logits of the sampler."""
    return batched_tokens * (4 * arch.hidden + 3 * arch.intermediate) * 2 + max_num_seqs * arch.vocab * 4 * 2


def fallback_logprob_bytes(arch: Architecture, tokens: int) -> int:
    """Without flash-attn, logprobs_from_logits_v2 (utils/torch_functional.py) runs log_softmax row by
    row over the bf16 logits, inside verl's torch.autocast(bf16) (transformer_impl.py forward_step);
    autocast computes log_softmax in fp32 and autograd keeps each row's fp32 output for the backward:
    the update holds the full fp32 log-softmax, T * V * 4 bytes. Forward-only passes free each row."""
    return tokens * arch.vocab * 4


def cudagraph_gib(s: RunSettings) -> float:
    """vLLM 0.24 profiles its CUDA-graph memory and takes it out of the KV cache, inside the
    gpu_memory_utilization share (vllm/v1/worker/gpu_worker.py Worker.determine_available_memory,
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 by default since v0.21; gpu_model_runner.py
    profile_cudagraph_memory). Its size is measured at start: CUDAGRAPH_GIB is assumed. enforce_eager: none."""
    return 0.0 if s.enforce_eager else CUDAGRAPH_GIB


def vllm_max_model_len(s: RunSettings, arch: Architecture) -> tuple[int, str]:
    """verl passes rollout.max_model_len to vLLM, or, unset, the model's max_position_embeddings
    (workers/rollout/vllm_rollout/vllm_async_server.py _validate_configs)."""
    if s.vllm_max_model_len is not None:
        return s.vllm_max_model_len, "actor_rollout_ref.rollout.max_model_len"
    if arch.max_position_embeddings is not None:
        return arch.max_position_embeddings, "rollout.max_model_len unset: the model's max_position_embeddings"
    return s.max_model_len, "max_position_embeddings unknown: prompt + response assumed"


def max_model_len_notes(s: RunSettings, arch: Architecture, max_len: int) -> tuple[str, ...]:
    """A rollout.max_model_len verl rejects, or one that cuts the responses (vllm_async_server.py:
    _validate_configs; generate caps max_tokens at max_model_len - prompt length)."""
    notes = []
    if arch.max_position_embeddings is not None and max_len > arch.max_position_embeddings:
        notes.append(f"rollout.max_model_len {max_len} > max_position_embeddings {arch.max_position_embeddings}: "
                     "verl refuses to start vLLM")
    if max_len < s.max_model_len:
        notes.append(f"rollout.max_model_len {max_len} < prompt + response {s.max_model_len}: long prompts get "
                     "shorter responses")
    return tuple(notes)


def estimate(s: RunSettings, arch: Architecture, gpu_gib: float = DEFAULT_GPU_MEM_GIB) -> MemoryEstimate:
    """Per-GPU peak of each phase of a step (see the module docstring for each term's source)."""
    if not gpu_gib > 0:
        raise MemoryEstimateError(f"GPU memory must be > 0 GiB, got {gpu_gib}")
    P, F, b = arch.params, s.fsdp_size, s.param_bytes
    params = _g(P * b / F)
    states = _g(s.optimizer_states * P * b / F)
    overhead = Term("runtime overhead (CUDA contexts, NCCL, cuBLAS; assumed)", RUNTIME_OVERHEAD_GIB)
    lm_unit, layer_unit = arch.vocab * arch.hidden, arch.layer_params

    # resident actor state outside the update (offloaded state is on CPU there)
    p_rest = 0.0 if (s.param_offload or s.offload_policy) else params
    o_rest = 0.0 if (s.optimizer_offload or s.offload_policy) else states
    vllm_share = s.rollout_util * gpu_gib
    vllm_weights = _g(P * 2 / s.rollout_tp)
    rollout = Phase("generation / validation (vLLM awake)", (
        Term(f"actor parameters ({b * 8}-bit shard 1/{F})", p_rest),
        Term(f"optimizer states ({s.optimizer_states} x shard)", o_rest),
        Term(f"vLLM: gpu_memory_utilization {s.rollout_util:g} x {gpu_gib:g} GiB (weights + KV cache)", vllm_share),
        overhead))
    # FSDP2 streams shards from where they are; FSDP1 loads an offloaded model first (transformer_impl.py:988-991)
    p_sync = 0.0 if (s.offload_policy or (s.param_offload and s.fsdp2)) else params
    # the sender gathers one full tensor at a time in the actor's dtype and copies it into (or, when
    # larger, sends it beside) one CUDA-IPC bucket on the trainer's GPU (bucketed_weight_transfer.py)
    sync = Phase("weight sync (vLLM weights back, KV cache not yet)", (
        Term("actor parameters", p_sync), Term("optimizer states", o_rest),
        Term("vLLM weights (bf16)", vllm_weights),
        Term(f"weight-sync bucket (update_weights_bucket_megabytes {s.bucket_mb})", _g(s.bucket_mb * 2**20)),
        Term(f"largest gathered tensor ({b * 8}-bit full_tensor)", _largest_tensor_gib(arch, b)),
        overhead))

    # forward-only log-probs (old: actor with entropy; reference: CPU-offloaded weights, gathered per unit)
    t_lp = max(s.logprob_tokens, s.ref_tokens if s.reference else 0)
    gathered = _g(2 * max(lm_unit, layer_unit) * 2)  # current + prefetched unit, bf16
    # free_cache_engine=False: vLLM never sleeps, its share stays beside the log-probs and the update
    awake = () if s.free_cache_engine else (Term("vLLM kept awake (free_cache_engine=False)", vllm_share),)
    logprob = Phase("log-prob forward", (
        Term("actor parameters", 0.0 if s.offload_policy else params), Term("optimizer states", o_rest),
        Term("gathered FSDP units (bf16, 2)", gathered),
        Term(f"logits {t_lp} tok x {arch.vocab} (bf16)", _g(t_lp * arch.vocab * 2)),
        Term(f"entropy temporaries ({'compiled' if s.entropy_compiled else 'eager'}, fp32)",
             _g(s.logprob_tokens * arch.vocab * (4 if s.entropy_compiled else 12))),
        Term("one layer forward", _g(s.logprob_tokens * (3 * arch.intermediate + 4 * arch.hidden) * 2)),
        *awake, overhead))

    # update: forward + backward of one micro-batch at the token budget
    t = s.train_tokens
    if s.activation_offload:
        kept = 0.0
    elif s.gradient_checkpointing:
        kept = _g(arch.layers * t * arch.hidden * 2)
    else:
        kept = _g(arch.layers * layer_recompute_bytes(arch, t))
    extra_logit_copies = 2 if s.entropy_in_update else 0
    head_bytes = t * arch.vocab * 2 * (1 + extra_logit_copies) + lm_unit * (2 + 4)  # logits + gathered + fp32 grad
    head_bytes += 0 if s.flash_cross_entropy else fallback_logprob_bytes(arch, t)
    head = _g(head_bytes)
    layer = _g(layer_recompute_bytes(arch, t) + layer_unit * (2 * 2 + 4))
    on_gpu = 0.0 if s.offload_policy else 1.0
    step = params * on_gpu  # optimizer step temporaries (activations are freed by then); CPU with offload_policy
    head_name = "logits + lm_head unit (bf16 + fp32 grad)" + ("" if s.flash_cross_entropy else " + fp32 log-softmax rows")
    transient = max((head, head_name), (layer, "layer recompute + FSDP units"),
                    (step, "optimizer step temporaries"))
    update = Phase("update (forward + backward)", (
        Term("actor parameters", params * on_gpu), Term("gradients (shard)", params * on_gpu),
        Term("optimizer states", states * on_gpu),
        Term(f"checkpointed activations ({arch.layers} layers x {t} tok)", kept),
        Term(f"peak transient: {transient[1]}", transient[0]),
        *awake, overhead))

    kv = (vllm_share - vllm_weights - _g(vllm_activation_bytes(arch, s.max_num_batched_tokens, s.max_num_seqs))
          - cudagraph_gib(s))
    kv_tokens = max(0, int(kv * GIB // (arch.kv_cache_bytes_per_token() / s.rollout_tp)))
    phases = (rollout, sync, logprob, update) if s.free_cache_engine else (rollout, logprob, update)
    if s.rollout_pool[0] > 0:  # the standalone pool's sync, sent from the trainer's rank 0 (its hybrid vLLM asleep)
        phases += (Phase(f"standalone weight sync ({s.sync_engine} send, trainer rank 0)", (
            Term("actor parameters", p_sync), Term("optimizer states", o_rest),
            Term(f"{s.sync_engine} send + receive buffers (2 x {s.bucket_mb} MB)", _g(2 * s.bucket_mb * 2**20)),
            Term(f"largest gathered tensor ({b * 8}-bit full_tensor)", _largest_tensor_gib(arch, b)),
            overhead)),)
    max_len, len_source = vllm_max_model_len(s, arch)
    return MemoryEstimate(arch=arch, settings=s, gpu_gib=gpu_gib, phases=phases, kv_cache_gib=kv,
                          kv_cache_tokens=kv_tokens, vllm_max_model_len=max_len, vllm_max_model_len_source=len_source,
                          host_ref_gib=_g(P * s.ref_param_bytes / F) if s.reference else 0.0,
                          notes=s.notes + max_model_len_notes(s, arch, max_len))


def estimate_rollout_pool(s: RunSettings, trainer: MemoryEstimate) -> MemoryEstimate | None:
    """Per-GPU peak of each phase on the standalone rollout pool of ``trainer.v1.trainer_mode=separate_async`` (see
    the module docstring, "standalone pool"); None without one. ``trainer``: the trainer pool's estimate, whose
    vLLM settings, and so KV cache, the standalone replicas share."""
    if s.rollout_pool[0] <= 0:
        return None
    gpu_gib, arch = trainer.gpu_gib, trainer.arch
    vllm_share, vllm_weights = s.rollout_util * gpu_gib, _g(arch.params * 2 / s.rollout_tp)
    overhead = Term("runtime overhead (CUDA contexts of vLLM + its sync worker, NCCL; assumed)",
                    RUNTIME_OVERHEAD_GIB)
    serve = Phase("generation (standalone vLLM)", (
        Term(f"vLLM: gpu_memory_utilization {s.rollout_util:g} x {gpu_gib:g} GiB (weights + KV cache)", vllm_share),
        overhead))
    kept = (Term("vLLM weights (bf16; KV cache released)", vllm_weights) if s.free_cache_engine else
            Term("vLLM weights + KV cache (free_cache_engine=False)", vllm_share))
    sync = Phase(f"weight sync ({s.sync_engine} receive)", (
        kept,
        Term(f"{s.sync_engine} send + receive buffers (2 x {s.bucket_mb} MB)", _g(2 * s.bucket_mb * 2**20)),
        Term(f"CUDA-IPC bucket to vLLM ({s.bucket_mb} MB)", _g(s.bucket_mb * 2**20)),
        overhead))
    return MemoryEstimate(arch=arch, settings=s, gpu_gib=gpu_gib, phases=(serve, sync),
                          kv_cache_gib=trainer.kv_cache_gib, kv_cache_tokens=trainer.kv_cache_tokens,
                          vllm_max_model_len=trainer.vllm_max_model_len,
                          vllm_max_model_len_source=trainer.vllm_max_model_len_source, host_ref_gib=0.0)
