"""Per-GPU memory and per-checkpoint disk estimate of a composed run config (verl 0.9.1, FSDP + vLLM).

Pure Python (no torch, verl or omegaconf import): ``estimate(settings_from_config(cfg), arch, gpu_gib)``
takes the composed config as a plain nested mapping (``OmegaConf.to_container(cfg, resolve=True)``),
the model's architecture (``architecture_for(model_path)``) and the GPU's memory, and returns the
peak per-GPU memory of each phase of a training step and the headroom. ``python -m rpg.launch
--describe NAME`` and ``DRY_RUN=1`` print it (docs/memory.md).

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
  optimizer step     after the backward (activations freed): torch AdamW's foreach step holds one
                     temporary the size of the state shard (sqrt of exp_avg_sq), P*bytes/F.

Left out (covered by the required headroom, HEADROOM_FRACTION of the GPU): allocator fragmentation,
CUDA contexts / NCCL and cuBLAS workspaces / vLLM's sleeping residue (a fixed RUNTIME_OVERHEAD_GIB is
added instead of measured), the RPG loss's own temporaries (~0.1 GiB at 2M tokens, measured on an
H100), sequence parallelism, LoRA, Megatron. Host RAM per node: rpg.launch.memory_host.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = 2**30
GB = 10**9
DEFAULT_GPU_MEM_GIB = 79.6        # what an 80 GB H100 reports as total memory (torch / nvidia-smi, GiB)
HEADROOM_FRACTION = 0.10          # a run "fits" when its peak leaves >= 10% of the GPU free
RUNTIME_OVERHEAD_GIB = 3.0        # assumed: 2 CUDA contexts (trainer, vLLM) ~1, NCCL/cuBLAS ~0.5, vLLM CUDA graphs ~1.5
GPU_MEM_ENV = "RPG_GPU_MEM_GIB"   # DRY_RUN's GPU-size override (--describe: --gpu-mem-gib)
CUDAGRAPH_GIB = 1.0               # assumed: vLLM's CUDA graphs (FULL_AND_PIECEWISE, up to 51 sizes), measured by vLLM at start
FLASH_ATTN = "flash_attention_2"  # verl's default attn_implementation (workers/config/model.py HFModelConfig.__post_init__)
KV_BLOCK_TOKENS = 16              # vLLM's default KV block: a sequence's KV is rounded up to whole blocks

_DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2, "float": 4}
_OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "adamwschedulefree": 2, "_adamw": 2}


class MemoryEstimateError(ValueError):
    """The estimate cannot be made (unknown model, unsupported setting): one clear line."""


# ----------------------------------------------------------------------------- architectures


@dataclass(frozen=True)
class Architecture:
    """A dense decoder-only transformer (Qwen2 / Qwen3 / Llama layout)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_embeddings: bool
    qkv_bias: bool      # Qwen2: q/k/v projections have biases
    qk_norm: bool       # Qwen3: RMSNorm on q and k per head
    max_position_embeddings: int | None = None  # verl's vLLM max_model_len when rollout.max_model_len is unset

    @property
    def layer_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        n = self.hidden * q + 2 * self.hidden * kv + q * self.hidden + 3 * self.hidden * self.intermediate
        n += 2 * self.hidden                              # input / post-attention RMSNorm
        n += (q + 2 * kv) if self.qkv_bias else 0
        n += 2 * self.head_dim if self.qk_norm else 0
        return n

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return self.layers * self.layer_params + embeddings + self.hidden   # + final norm

    def kv_cache_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V of every layer for one token (vLLM's cache dtype = model dtype, bf16)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def _qwen2(name: str, max_pos: int) -> Architecture:   # config.json of Qwen/Qwen2.5-7B, -Instruct and -Math-7B
    return Architecture(name, layers=28, hidden=3584, intermediate=18944, heads=28, kv_heads=4, head_dim=128,
                        vocab=152064, tie_embeddings=False, qkv_bias=True, qk_norm=False,
                        max_position_embeddings=max_pos)


def _qwen3_4b(name: str, max_pos: int) -> Architecture:  # config.json of Qwen/Qwen3-4B and Qwen3-4B-Base
    return Architecture(name, layers=36, hidden=2560, intermediate=9728, heads=32, kv_heads=8, head_dim=128,
                        vocab=151936, tie_embeddings=True, qkv_bias=False, qk_norm=True,
                        max_position_embeddings=max_pos)


KNOWN_ARCHITECTURES: dict[str, Architecture] = {  # max_position_embeddings from each public config.json
    "Qwen/Qwen2.5-Math-7B": _qwen2("Qwen/Qwen2.5-Math-7B", 4096),
    "Qwen/Qwen2.5-7B-Instruct": _qwen2("Qwen/Qwen2.5-7B-Instruct", 32768),
    "Qwen/Qwen2.5-7B": _qwen2("Qwen/Qwen2.5-7B", 131072),
    "Qwen/Qwen3-4B": _qwen3_4b("Qwen/Qwen3-4B", 40960),
    "Qwen/Qwen3-4B-Base": _qwen3_4b("Qwen/Qwen3-4B-Base", 32768),
}

_LAYOUTS = {"qwen2": (True, False), "qwen3": (False, True), "llama": (False, False), "mistral": (False, False)}


def architecture_from_hf_config(config: Mapping[str, Any], name: str) -> Architecture:
    """Architecture from a Hugging Face ``config.json`` (model_type qwen2, qwen3, llama, mistral)."""
    model_type = config.get("model_type")
    if model_type not in _LAYOUTS:
        raise MemoryEstimateError(f"{name}: model_type={model_type!r} is not modelled; "
                                  f"supported: {', '.join(_LAYOUTS)} (dense decoders)")
    try:
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        bias, qk_norm = _LAYOUTS[model_type]
        return Architecture(
            name, layers=int(config["num_hidden_layers"]), hidden=hidden,
            intermediate=int(config["intermediate_size"]), heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads), vocab=int(config["vocab_size"]),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=bias or bool(config.get("attention_bias", False)), qk_norm=qk_norm,
            max_position_embeddings=int(config["max_position_embeddings"]) if config.get("max_position_embeddings") else None)
    except (KeyError, TypeError, ValueError) as e:
        raise MemoryEstimateError(f"{name}: config.json lacks or mangles a size field ({e})") from None


def architecture_for(model_path: str) -> Architecture:
    """A local model directory's ``config.json``, else a known Hugging Face id; anything else fails."""
    local = Path(model_path).expanduser()
    if (local / "config.json").is_file():
        path = local / "config.json"
        try:
            config = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise MemoryEstimateError(f"{path}: not a readable JSON file ({e})") from None
        if not isinstance(config, dict):
            raise MemoryEstimateError(f"{path}: expected a JSON object, got {type(config).__name__}")
        return architecture_from_hf_config(config, str(local))
    for known, arch in KNOWN_ARCHITECTURES.items():
        if known.lower() == model_path.strip().rstrip("/").lower():
            return arch
    raise MemoryEstimateError(
        f"no architecture for model {model_path!r}: not a local directory with config.json and not one of "
        f"{', '.join(KNOWN_ARCHITECTURES)} (set MODEL_PATH to a downloaded copy)")


# ----------------------------------------------------------------------------- settings from the config


def _get(cfg: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def _dtype_bytes(value: Any, key: str) -> int:
    name = str(value).lower().replace("torch.", "")
    if name not in _DTYPE_BYTES:
        raise MemoryEstimateError(f"{key}={value!r} is not a dtype the estimate knows ({', '.join(_DTYPE_BYTES)})")
    return _DTYPE_BYTES[name]


@dataclass(frozen=True)
class RunSettings:
    """The memory-relevant part of a composed config (``settings_from_config``)."""

    model_path: str
    n_gpus: int
    fsdp_size: int
    param_bytes: int             # actor.fsdp_config.model_dtype
    param_offload: bool
    optimizer_offload: bool
    offload_policy: bool         # FSDP2: parameters, gradients and optimizer states stay on CPU
    fsdp2: bool
    optimizer_states: int
    optimizer_name: str
    train_tokens: int            # per GPU micro-batch of the update
    logprob_tokens: int          # per GPU micro-batch of the old log-prob forward
    ref_tokens: int
    gradient_checkpointing: bool
    activation_offload: bool
    entropy_in_update: bool
    reference: bool
    ref_param_bytes: int
    rollout_util: float
    rollout_tp: int
    free_cache_engine: bool
    max_model_len: int           # prompt + response (the longest sequence the run generates)
    max_num_batched_tokens: int  # vLLM chunked-prefill budget (its profiled activation peak)
    max_num_seqs: int
    save_freq: int
    total_steps: int | None
    keep: int | None             # trainer.max_actor_ckpt_to_keep (None = all)
    save_contents: tuple[str, ...]
    reference_resets: bool       # rpg.reference.mode periodic | kl_threshold: rpg_reference/ in checkpoints
    attn_implementation: str = FLASH_ATTN  # model.override_config.attn_implementation
    bucket_mb: int = 2048        # rollout.checkpoint_engine.update_weights_bucket_megabytes
    enforce_eager: bool = False  # rollout.enforce_eager: no CUDA graphs
    entropy_compiled: bool = True  # actor.fsdp_config.use_torch_compile: torch.compile'd entropy_from_logits
    vllm_max_model_len: int | None = None  # rollout.max_model_len (None: verl uses max_position_embeddings)
    notes: tuple[str, ...] = ()

    @property
    def flash_cross_entropy(self) -> bool:
        """verl computes log-probs with flash-attn's cross-entropy when flash-attn imports
        (utils/torch_functional.py logprobs_from_logits); flash_attention_2 needs it installed, any
        other attention is taken to mean it is absent (the fallback logprobs_from_logits_v2)."""
        return self.attn_implementation == FLASH_ATTN


def settings_from_config(cfg: Mapping[str, Any]) -> RunSettings:
    a, r, ro = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout"
    n_gpus = int(_get(cfg, "trainer.nnodes", 1)) * int(_get(cfg, "trainer.n_gpus_per_node", 1))
    fsdp = int(_get(cfg, f"{a}.fsdp_config.fsdp_size", -1))
    fsdp = n_gpus if fsdp <= 0 else min(fsdp, n_gpus)
    prompt, response = int(_get(cfg, "data.max_prompt_length", 0)), int(_get(cfg, "data.max_response_length", 0))
    notes = []

    def budget(dyn_key: str, tok_key: str, micro_key: str) -> int:
        if _get(cfg, dyn_key, False):
            tokens = _get(cfg, tok_key)
            if tokens is None or int(tokens) < 1:
                raise MemoryEstimateError(f"{dyn_key}=true needs {tok_key} >= 1 (the per-GPU token budget), got {tokens!r}")
            return int(tokens)
        micro = _get(cfg, micro_key)
        if micro is None:
            raise MemoryEstimateError(f"{micro_key} is unset and dynamic batching is off: no token budget to estimate")
        return int(micro) * (prompt + response)

    optimizer = str(_get(cfg, f"{a}.optim.optimizer", "AdamW"))
    states = _OPTIMIZER_STATES.get(optimizer.lower())
    if states is None:
        states = 2
        notes.append(f"optimizer {optimizer}: assumed 2 fp32 states per parameter like AdamW")
    if int(_get(cfg, f"{a}.ulysses_sequence_parallel_size", 1)) > 1:
        notes.append("ulysses sequence parallelism is not modelled (activation terms are per full token budget)")
    if int(_get(cfg, "actor_rollout_ref.model.lora_rank", 0)) > 0 or int(_get(cfg, "actor_rollout_ref.model.lora.rank", 0)) > 0:
        notes.append("LoRA is not modelled: the terms are those of full fine-tuning (an over-estimate)")
    if not _get(cfg, f"{a}.fsdp_config.reshard_after_forward", True):
        notes.append("reshard_after_forward=False keeps gathered bf16 parameters between forward and backward: "
                      "not modelled (add up to P*2 bytes to the update)")
    strategy = str(_get(cfg, f"{a}.strategy", "fsdp"))
    if strategy not in ("fsdp", "fsdp2"):
        raise MemoryEstimateError(f"{a}.strategy={strategy!r}: only fsdp / fsdp2 are modelled")
    model_dtype = _get(cfg, f"{a}.fsdp_config.model_dtype", "fp32")
    attn = str(_get(cfg, "actor_rollout_ref.model.override_config.attn_implementation", FLASH_ATTN))
    if attn != FLASH_ATTN and _get(cfg, "actor_rollout_ref.model.use_remove_padding", True):
        notes.append(f"attn_implementation={attn} over packed sequences (use_remove_padding) may build a T x T "
                     "attention mask or score matrix per forward: not modelled")
    vllm_len = _get(cfg, f"{ro}.max_model_len")
    mode = str(_get(cfg, "rpg.reference.mode", "sampler"))
    steps = _get(cfg, "trainer.total_training_steps")
    keep = _get(cfg, "trainer.max_actor_ckpt_to_keep")
    return RunSettings(
        model_path=str(_get(cfg, "actor_rollout_ref.model.path", "")),
        n_gpus=n_gpus, fsdp_size=fsdp,
        param_bytes=_dtype_bytes(model_dtype, f"{a}.fsdp_config.model_dtype"),
        param_offload=bool(_get(cfg, f"{a}.fsdp_config.param_offload", False)),
        optimizer_offload=bool(_get(cfg, f"{a}.fsdp_config.optimizer_offload", False)),
        offload_policy=strategy == "fsdp2" and bool(_get(cfg, f"{a}.fsdp_config.offload_policy", False)),
        fsdp2=strategy == "fsdp2",
        optimizer_states=states, optimizer_name=optimizer,
        train_tokens=budget(f"{a}.use_dynamic_bsz", f"{a}.ppo_max_token_len_per_gpu", f"{a}.ppo_micro_batch_size_per_gpu"),
        logprob_tokens=budget(f"{ro}.log_prob_use_dynamic_bsz", f"{ro}.log_prob_max_token_len_per_gpu",
                              f"{ro}.log_prob_micro_batch_size_per_gpu"),
        ref_tokens=budget(f"{r}.log_prob_use_dynamic_bsz", f"{r}.log_prob_max_token_len_per_gpu",
                          f"{r}.log_prob_micro_batch_size_per_gpu"),
        gradient_checkpointing=bool(_get(cfg, "actor_rollout_ref.model.enable_gradient_checkpointing", False)),
        activation_offload=bool(_get(cfg, "actor_rollout_ref.model.enable_activation_offload", False)),
        entropy_in_update=bool(_get(cfg, f"{a}.calculate_entropy", False)) or float(_get(cfg, f"{a}.entropy_coeff", 0.0)) != 0.0,
        reference=bool(_get(cfg, "algorithm.use_kl_in_reward", False)) or bool(_get(cfg, f"{a}.use_kl_loss", False)),
        ref_param_bytes=_dtype_bytes(_get(cfg, f"{r}.fsdp_config.model_dtype", model_dtype), f"{r}.fsdp_config.model_dtype"),
        rollout_util=float(_get(cfg, f"{ro}.gpu_memory_utilization", 0.5)),
        rollout_tp=int(_get(cfg, f"{ro}.tensor_model_parallel_size", 1)),
        free_cache_engine=bool(_get(cfg, f"{ro}.free_cache_engine", True)),
        max_model_len=prompt + response,
        max_num_batched_tokens=int(_get(cfg, f"{ro}.max_num_batched_tokens", prompt + response)),
        max_num_seqs=int(_get(cfg, f"{ro}.max_num_seqs", 256)),
        save_freq=int(_get(cfg, "trainer.save_freq", -1)),
        total_steps=None if steps is None else int(steps),
        keep=None if keep is None or int(keep) <= 0 else int(keep),
        save_contents=tuple(_get(cfg, f"{a}.checkpoint.save_contents", ("model", "optimizer", "extra"))),
        reference_resets=mode in ("periodic", "kl_threshold"),
        attn_implementation=attn,
        bucket_mb=int(_get(cfg, f"{ro}.checkpoint_engine.update_weights_bucket_megabytes", 2048)),
        enforce_eager=bool(_get(cfg, f"{ro}.enforce_eager", False)),
        entropy_compiled=bool(_get(cfg, f"{a}.fsdp_config.use_torch_compile", True)),
        vllm_max_model_len=None if vllm_len is None else int(vllm_len),
        notes=tuple(notes),
    )


# ----------------------------------------------------------------------------- GPU memory


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
        Term(f"largest gathered tensor ({b * 8}-bit full_tensor)", _g(max(arch.vocab, arch.intermediate) * arch.hidden * b)),
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
    max_len, len_source = vllm_max_model_len(s, arch)
    return MemoryEstimate(arch=arch, settings=s, gpu_gib=gpu_gib, phases=phases, kv_cache_gib=kv,
                          kv_cache_tokens=kv_tokens, vllm_max_model_len=max_len, vllm_max_model_len_source=len_source,
                          host_ref_gib=_g(P * s.ref_param_bytes / F) if s.reference else 0.0,
                          notes=s.notes + max_model_len_notes(s, arch, max_len))


def format_estimate(e: MemoryEstimate) -> str:
    s, peak = e.settings, e.peak
    lines = [f"memory per GPU (estimate, docs/memory.md): {e.arch.name}, {e.arch.params / 1e9:.2f}B parameters, "
             f"{s.n_gpus} GPUs (FSDP shard 1/{s.fsdp_size}), GPU {e.gpu_gib:g} GiB"]
    for ph in e.phases:
        lines.append(f"  {ph.name:<52} {ph.gib:6.1f} GiB" + ("   <- peak" if ph is peak else ""))
    lines.append(f"  peak phase, by term ({peak.name}):")
    lines += [f"    {t.name:<70} {t.gib:6.1f}" for t in peak.terms if t.gib > 0]
    lines.append(f"  vLLM KV cache ~{max(e.kv_cache_gib, 0):.1f} GiB = ~{e.kv_cache_tokens} tokens "
                 f"(~{e.kv_cache_tokens // max(1, s.max_model_len)} full {s.max_model_len}-token sequences at once; "
                 f"CUDA graphs {cudagraph_gib(s):g} GiB taken out)")
    lines.append(format_kv_check(e))
    if s.reference:
        lines.append(f"  reference model: CPU-offloaded by verl (0 GiB on GPU at rest), pinned host memory "
                     f"~{e.host_ref_gib:.1f} GiB per GPU process")
    lines += [f"  note: {n}" for n in e.notes]
    verdict = "FITS" if e.fits else "DOES NOT FIT"
    why = "" if e.kv_fits else f"; vLLM's KV cache cannot hold one {e.vllm_max_model_len}-token sequence"
    lines.append(f"  {verdict}: peak {peak.gib:.1f} of {e.gpu_gib:g} GiB, headroom {e.headroom_gib:.1f} GiB "
                 f"(required >= {e.required_headroom_gib:.1f} GiB = {HEADROOM_FRACTION:.0%}){why}")
    return "\n".join(lines)


def format_kv_check(e: MemoryEstimate) -> str:
    """vLLM's start-up check: one max_model_len sequence must fit its KV cache (else it refuses to start)."""
    need_gib = _g(e.kv_needed_tokens * e.arch.kv_cache_bytes_per_token() / e.settings.rollout_tp)
    head = (f"  KV cache check: max_model_len {e.vllm_max_model_len} ({e.vllm_max_model_len_source}) "
            f"needs {need_gib:.1f} GiB")
    if e.kv_fits:
        return head + f"; the KV cache holds {e.kv_cache_tokens // e.kv_needed_tokens} sequences of that length: OK"
    return (head + f"; NO FIT: the KV cache (~{max(e.kv_cache_gib, 0):.1f} GiB) cannot hold one and vLLM refuses "
            "to start: raise actor_rollout_ref.rollout.gpu_memory_utilization or set actor_rollout_ref.rollout."
            "max_model_len (>= data.max_prompt_length + data.max_response_length)")


# ----------------------------------------------------------------------------- checkpoint disk


@dataclass(frozen=True)
class DiskEstimate:
    items: tuple[tuple[str, float], ...]   # (what, GB) of one checkpoint
    saves: int | None                      # checkpoints written over the run (None: total steps unknown)
    kept: int | None                       # on disk at the end
    peak_kept: int | None                  # on disk while the newest one is written

    @property
    def per_checkpoint_gb(self) -> float:
        return sum(gb for _, gb in self.items)

    @property
    def peak_gb(self) -> float | None:
        return None if self.peak_kept is None else self.peak_kept * self.per_checkpoint_gb


TOKENIZER_CONFIG_GB = 0.02  # huggingface/ config + tokenizer files written with every checkpoint (Qwen: ~11 MB)


def count_saves(save_freq: int, total_steps: int | None) -> int | None:
    """verl saves at every multiple of save_freq and at the last step (trainer/ppo/v1/trainer_base.py:480-485)."""
    if save_freq <= 0:
        return 0
    if total_steps is None:
        return None
    return total_steps // save_freq + (1 if total_steps % save_freq else 0)


def estimate_disk(s: RunSettings, arch: Architecture) -> DiskEstimate:
    """One checkpoint as verl 0.9.1's FSDPCheckpointManager writes it (utils/checkpoint/
    fsdp_checkpoint_manager.py:316-362 shards, :364-417 config/tokenizer, :422-462 hf_model), plus the
    RPG reference copy (rpg/verl/trainer.py ``_save_reference_state``); retention follows
    ``max_actor_ckpt_to_keep`` (utils/checkpoint/checkpoint_manager.py:166-194: with keep=1 the old
    checkpoint is deleted only after the new one is written, so two exist while saving)."""
    P, b = arch.params, s.param_bytes
    items = []
    if "model" in s.save_contents:
        items.append((f"actor model shards ({b * 8}-bit)", P * b / GB))
    if "optimizer" in s.save_contents:
        items.append((f"optimizer states ({s.optimizer_states} x {b * 8}-bit)", s.optimizer_states * P * b / GB))
    items.append(("config, tokenizer, lr scheduler, RNG, dataloader", TOKENIZER_CONFIG_GB))
    if "hf_model" in s.save_contents:
        items.append((f"Hugging Face model ({b * 8}-bit full state dict)", P * b / GB))
    if s.reference_resets:
        items.append((f"RPG reference copy rpg_reference/ ({s.ref_param_bytes * 8}-bit; not when reset at that step)",
                      P * s.ref_param_bytes / GB))
    saves = count_saves(s.save_freq, s.total_steps)
    if saves is None:
        kept = peak = None
    elif s.keep is None:
        kept = peak = saves
    else:
        kept, peak = min(s.keep, saves), min(max(s.keep, 2) if s.keep == 1 else s.keep, saves)
    return DiskEstimate(items=tuple(items), saves=saves, kept=kept, peak_kept=peak)


def format_disk(d: DiskEstimate, s: RunSettings) -> str:
    lines = [f"checkpoint disk (estimate): {d.per_checkpoint_gb:.1f} GB per checkpoint"]
    lines += [f"    {what:<70} {gb:7.2f} GB" for what, gb in d.items]
    keep = "all" if s.keep is None else str(s.keep)
    if d.saves == 0:
        lines.append("  no checkpoints (trainer.save_freq <= 0)")
    elif d.saves is None:
        lines.append(f"  every {s.save_freq} steps; trainer.total_training_steps unset: number of saves unknown")
    else:
        lines.append(f"  {d.saves} saves (save_freq {s.save_freq}, {s.total_steps} steps, and the last step), "
                     f"max_actor_ckpt_to_keep={keep}: {d.kept} kept, up to {d.peak_kept} on disk while saving "
                     f"= {d.peak_gb:.0f} GB")
    return "\n".join(lines)


def parse_gib(raw: str | None, source: str, default: float, expected: str) -> float:
    """Parse a memory-size override in GiB (empty = ``default``); anything but a finite number > 0 fails."""
    if raw is None or not str(raw).strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise MemoryEstimateError(f"{source}={raw!r} is invalid; expected {expected}")
    return value


def gpu_mem_gib(raw: str | None, source: str) -> float:
    """Parse a GPU-size override (``--gpu-mem-gib`` / ``RPG_GPU_MEM_GIB``); empty = the default."""
    return parse_gib(raw, source, DEFAULT_GPU_MEM_GIB, "the GPU's memory in GiB, e.g. 80 or 139.8")
