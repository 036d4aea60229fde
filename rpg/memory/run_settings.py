"""The memory-relevant part of a composed run config: ``settings_from_config(cfg)`` -> ``RunSettings``.

``cfg`` is the composed config as a plain nested mapping (``OmegaConf.to_container(cfg, resolve=True)``);
a key that is absent or null takes verl 0.9.1's default. What the estimate does not model (sequence
parallelism, LoRA, ``reshard_after_forward=False``, an unknown optimizer, attention other than flash-attn
over packed sequences) becomes a note printed with the estimate; what it cannot estimate at all (a
strategy other than fsdp / fsdp2, an unknown dtype, no per-GPU token budget) raises
``MemoryEstimateError``. Where verl uses each setting: gpu.py's docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rpg.backends.gpu.preflight import ATTN_KEY, FLASH_ATTN
from rpg.config import RESETTING_MODES, ReferenceSettings
from rpg.memory.sizes import MemoryEstimateError


_DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2, "float": 4}
_OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "adamwschedulefree": 2, "_adamw": 2}


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
    # trainer.v1.trainer_mode=separate_async: the standalone rollout pool (rollout.nnodes, rollout.n_gpus_per_node)
    # and its checkpoint engine; (0, 0) in the other modes
    rollout_pool: tuple[int, int] = (0, 0)
    sync_engine: str = "naive"
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
    attn = str(_get(cfg, ATTN_KEY, FLASH_ATTN))
    if attn != FLASH_ATTN and _get(cfg, "actor_rollout_ref.model.use_remove_padding", True):
        notes.append(f"attn_implementation={attn} over packed sequences (use_remove_padding) may build a T x T "
                     "attention mask or score matrix per forward: not modelled")
    vllm_len = _get(cfg, f"{ro}.max_model_len")
    mode = str(_get(cfg, "rpg.reference.mode", ReferenceSettings().mode))
    steps = _get(cfg, "trainer.total_training_steps")
    keep = _get(cfg, "trainer.max_actor_ckpt_to_keep")
    separate = _get(cfg, "trainer.v1.trainer_mode", "sync") == "separate_async"
    pool = (int(_get(cfg, f"{ro}.nnodes", 0)), int(_get(cfg, f"{ro}.n_gpus_per_node", 8))) if separate else (0, 0)
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
        reference_resets=mode in RESETTING_MODES,
        attn_implementation=attn,
        bucket_mb=int(_get(cfg, f"{ro}.checkpoint_engine.update_weights_bucket_megabytes", 2048)),
        enforce_eager=bool(_get(cfg, f"{ro}.enforce_eager", False)),
        entropy_compiled=bool(_get(cfg, f"{a}.fsdp_config.use_torch_compile", True)),
        vllm_max_model_len=None if vllm_len is None else int(vllm_len),
        rollout_pool=pool,
        sync_engine=str(_get(cfg, f"{ro}.checkpoint_engine.backend", "naive")),
        notes=tuple(notes),
    )
