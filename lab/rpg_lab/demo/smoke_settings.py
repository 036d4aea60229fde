"""The GPU smoke run's settings: its Hydra overrides and their validation (one source; the backend's
environment is ``rpg.backends.gpu.env_overrides``).

The run is the tiny task (rpg.tiny), or SmolLM2's (rpg.smol), through verl's real GPU path, in the regime the
paper's runs use and nothing on CPU exercises: vLLM rollouts that sleep and wake around every update, with the
actor's weights synced into them after every step; an FSDP2 actor computing in bf16 (verl's
default mixed precision, float32 master weights); the actor's parameters and optimizer state
offloaded to the CPU between uses (``offload=True``); the reference on the CPU whatever ``offload``
says (verl 0.9.1 builds it forward-only and FSDP2 keeps it there with ``CPUOffloadPolicy(pin_memory=True)``,
verl/workers/engine/fsdp/transformer_impl.py:459-463; ``ref.fsdp_config.param_offload`` is not read); several
mini-batches per rollout batch (off-policy after the first); a reference reset every
``REFERENCE_EVERY`` steps; schedule-free AdamW; a checkpoint and a resume.
"""

from __future__ import annotations

from collections.abc import Mapping


ROLLOUTS = ("vllm", "hf")
MODEL_PATH_KEY = "actor_rollout_ref.model.path"
REFERENCE_EVERY = 2  # rpg.reference.update_every: the first reset happens at step 2
# vLLM's share of each GPU (weights + KV cache of a 0.4 M-parameter model: a few MiB; SmolLM2-135M in bf16: 0.27 GB
# of weights, 1.9 GB for 256 sequences of 320 tokens at 30 layers x 3 KV heads x 64; the rest is headroom); a
# fraction, so it also fits a GPU that another process is using
GPU_MEMORY_UTILIZATION = 0.3

# What the smoke run exercises on top of the tiny demo's RPG algorithm (rpg.tiny.overrides).
ALGORITHM = [
    "rpg.reference.mode=periodic",
    f"rpg.reference.update_every={REFERENCE_EVERY}",
    "rpg.reference.log_weight_diff=True",  # rpg/ref_actor_{weight,logit}_diff_{pre,post}: what the copy did
    "rpg.optimizer=schedulefree",
]


def smoke_sizes(model: str) -> dict[str, int]:
    """The rollout batch (``train_batch_size`` prompts x ``n``), mini-batch and, for SmolLM2, micro-batch token
    budget of the smoke run on ``model`` (``rpg.launch.rehearsal.CpuModel``'s name): the tiny demo's sizes, or
    ``rpg.smol.overrides.GPU_SIZES``; keywords of the model's task overrides."""
    if model == "smol":
        from rpg.smol.overrides import GPU_SIZES

        return dict(GPU_SIZES)
    from rpg.tiny.overrides import MINI_BATCH_SIZE, ROLLOUT_N, TRAIN_BATCH_SIZE

    return {"train_batch_size": TRAIN_BATCH_SIZE, "n": ROLLOUT_N, "mini_batch_size": MINI_BATCH_SIZE}


class SmokeSettingsError(ValueError):
    """A bad smoke-run setting (one line naming it and what is allowed)."""


def head_dim(hf_config: Mapping) -> int:
    """The attention head size of a HF config (``head_dim``, else hidden_size / num_attention_heads)."""
    return int(hf_config.get("head_dim") or hf_config["hidden_size"] // hf_config["num_attention_heads"])


def head_dim_problem(size: int) -> str | None:
    """Why the GPU kernels would refuse a head size, or None. vLLM's FlashAttention backend takes
    multiples of 8 up to 256 (on Hopper its FA3 kernels round sizes <= 64 up to 64), its Triton
    backend sizes >= 32, flash-attn 2 (the actor's attention) multiples of 8 up to 256
    (docs/gpu-smoke.md); the tiny model's 128 / 4 = 32 satisfies all three."""
    if size % 8 or not 32 <= size <= 256:
        return f"head size {size}: the GPU attention kernels need a multiple of 8 in [32, 256]"
    return None


def check_settings(rollout: str, gpus: int, steps: int, resume_steps: int, mini_batch_size: int, n: int) -> None:
    """Raise SmokeSettingsError (one line) for a value the run cannot take, before anything starts."""
    if rollout not in ROLLOUTS:
        raise SmokeSettingsError(f"ROLLOUT={rollout!r} is invalid: expected one of {ROLLOUTS}")
    if gpus < 1:
        raise SmokeSettingsError(f"GPUS={gpus} is invalid: expected an integer >= 1")
    if steps < REFERENCE_EVERY:
        raise SmokeSettingsError(
            f"STEPS={steps} is invalid: expected >= {REFERENCE_EVERY} (the reference is reset every {REFERENCE_EVERY} steps)")
    if resume_steps < 0:
        raise SmokeSettingsError(
            f"RESUME_STEPS={resume_steps} is invalid: expected an integer >= 0 (0: no resumed run)")
    if (mini_batch_size * n) % gpus:
        raise SmokeSettingsError(
            f"GPUS={gpus} is invalid: a mini-batch of {mini_batch_size} prompts x {n} samples = "
            f"{mini_batch_size * n} sequences must split evenly over the GPUs (expected a divisor of {mini_batch_size * n})")


def gpu_overrides(rollout: str, gpus: int, *, offload: bool = True, mini_batch_size: int, n: int,
                  train_batch_size: int) -> list[str]:
    """Hydra overrides that put the task on ``gpus`` GPUs of one node (after the task's own).

    Per-GPU micro-batches: one mini-batch (``mini_batch_size * n`` sequences) split evenly over the
    data-parallel ranks, one micro-batch each; the log-prob passes take the whole batch per rank (SmolLM2's task
    micro-batches by a token budget instead: ``use_dynamic_bsz``, which verl then reads in place of these).
    """
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    ov = [
        "trainer.device=cuda",
        "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={gpus}",
        f"{r}.name={rollout}",
        f"{r}.mode=async",
        f"{r}.tensor_model_parallel_size=1",  # one replica per GPU: data parallel = gpus
        f"{r}.gpu_memory_utilization={GPU_MEMORY_UTILIZATION}",
        f"{r}.free_cache_engine=True",  # sleep (free weights + KV cache) while the actor trains
        f"{a}.ppo_micro_batch_size_per_gpu={mini_batch_size * n // gpus}",
        f"{r}.log_prob_micro_batch_size_per_gpu={-(-train_batch_size * n // gpus)}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={-(-train_batch_size * n // gpus)}",
    ]
    if offload:
        ov += [
            f"{a}.fsdp_config.param_offload=True",
            f"{a}.fsdp_config.optimizer_offload=True",
        ]  # no ref.fsdp_config.param_offload: verl 0.9.1 does not read it (module docstring)
    return ov
