"""Host RAM per node of a composed run config (verl 0.9.1, FSDP + vLLM 0.24, Ray 2.x), with its own verdict.

Pure Python like the rest of this package, built on its settings, architectures and units (run_settings.py,
architecture.py, sizes.py); formatting.py's ``report`` prints it between the per-GPU table and the
checkpoint-disk lines: ``estimate_host(host_settings_from_config(cfg), arch, host_gib)``. One node holds
G = ``trainer.n_gpus_per_node`` trainer processes and G vLLM GPU workers, plus the per-node terms; the
driver and the rollout batch are counted on every node (they live on the head node, the fullest one).
P parameters, F the FSDP shard group, b bytes per actor parameter (``model_dtype``), k optimizer states,
TP vLLM's tensor parallel size. Paths under ``verl/`` are verl 0.9.1's; ``vllm/`` vLLM 0.24's; ``ray/`` Ray's.

From the code::

  reference shard      P * bytes(ref model_dtype) / F per trainer process, pinned: a forward-only engine
                       is built with FSDP2 CPUOffloadPolicy(pin_memory=True) / FSDP1 CPUOffload
                       (workers/engine/fsdp/transformer_impl.py FSDPEngine._build_fsdp_module).
  offloaded actor      param_offload: P*b/F (utils/fsdp_utils.py offload_fsdp2_model_to_cpu: pinned copies);
                       optimizer_offload: k*P*b/F (offload_fsdp_optimizer); FSDP2 offload_policy keeps
                       parameters, gradients and states on the CPU, pinned: (2 + k)*P*b/F.
  checkpoint save      FSDP1 gathers each rank's model and optimizer shard to CPU before torch.save
                       (utils/checkpoint/fsdp_checkpoint_manager.py save_checkpoint, offload_to_cpu=True):
                       (1 + k)*P*b/F per process while saving. FSDP2 serialises one tensor at a time: ~0.
  vLLM sleep backup    level 1 copies vLLM's bf16 weights to pinned CPU memory, P*2/TP per GPU worker
                       (vllm/v1/worker/gpu_worker.py Worker.sleep, offload_tags=("weights",)); verl sleeps
                       at level 2 (weights discarded, buffers only) unless LoRA adapters or an MTP rollout
                       (workers/rollout/vllm_rollout/vllm_async_server.py _resolve_sleep_level).
  weight-sync bucket   on the GPU (CUDA IPC), not on the host, unless CUDA IPC is unsupported
                       (workers/rollout/vllm_rollout/vllm_rollout.py: use_shm = not is_support_ipc()).
  Ray object store     ray_kwargs.ray_init.object_store_memory, else 30% of the node's memory capped at
                       200 GB (ray/_private/utils.py resolve_object_store_memory,
                       ray_constants.DEFAULT_OBJECT_STORE_MEMORY_PROPORTION); counted at its cap.

Assumed (no code fixes them; labelled "assumed" in the output)::

  process footprints   TRAINER_PROCESS_GIB per trainer process, VLLM_PROCESS_GIB per GPU for vLLM's
                       server, engine core and worker processes (Python, torch, CUDA runtime, NCCL),
                       SMALL_WORKER_GIB per dataloader / agent-loop / reward worker, DRIVER_GIB for the
                       driver, RAY_DAEMONS_GIB for raylet, GCS and dashboard.
  rollout batch        train_batch_size * rollout.n * (prompt + response) * BATCH_BYTES_PER_TOKEN
                       (~8 per-token int64/fp32 fields: ids, positions, masks, log-probs, advantages).
  host size            DEFAULT_HOST_MEM_GIB: 8 x H100 servers (DGX H100, cloud 8-GPU H100 instances)
                       have 2 TiB; `free -g` reports about 2000. Override: --host-mem-gib / RPG_HOST_MEM_GIB.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rpg.memory.architecture import Architecture
from rpg.memory.sizes import GB, GIB, HEADROOM_FRACTION, MemoryEstimateError, parse_gib
from rpg.memory.run_settings import RunSettings, _get

DEFAULT_HOST_MEM_GIB = 2000.0   # assumed: an 8 x H100 node (2 TiB installed, ~2000 GiB reported by free -g)
HOST_MEM_ENV = "RPG_HOST_MEM_GIB"
TRAINER_PROCESS_GIB = 4.0       # assumed
VLLM_PROCESS_GIB = 4.0          # assumed, per GPU
SMALL_WORKER_GIB = 0.5          # assumed
DRIVER_GIB = 4.0                # assumed
RAY_DAEMONS_GIB = 2.0           # assumed
BATCH_BYTES_PER_TOKEN = 64      # assumed
RAY_OBJECT_STORE_FRACTION = 0.3           # ray_constants.DEFAULT_OBJECT_STORE_MEMORY_PROPORTION
RAY_OBJECT_STORE_CAP_BYTES = 200 * GB     # ray_constants.DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES


@dataclass(frozen=True)
class HostSettings:
    """The host-memory-relevant part of a composed config, beside the GPU settings."""

    run: RunSettings
    gpus_per_node: int
    sleep_level: int                 # 1: vLLM keeps a CPU copy of its weights while asleep; 2: it does not
    object_store_bytes: int | None   # ray_kwargs.ray_init.object_store_memory (None: Ray's default)
    batch_tokens: int                # train_batch_size * n * (prompt + response)
    small_workers: int               # dataloader + agent-loop + reward workers


def host_settings_from_config(cfg: Mapping[str, Any], run: RunSettings) -> HostSettings:
    ro, model = "actor_rollout_ref.rollout", "actor_rollout_ref.model"
    lora_adapter = int(_get(cfg, f"{model}.lora_rank", 0)) > 0 and not _get(cfg, f"{model}.lora.merge", False)
    mtp_rollout = bool(_get(cfg, f"{model}.mtp.enable", False)) and bool(_get(cfg, f"{model}.mtp.enable_rollout", False))
    store = _get(cfg, "ray_kwargs.ray_init.object_store_memory")
    if store is not None and (not isinstance(store, int | float) or store <= 0):
        raise MemoryEstimateError(f"ray_kwargs.ray_init.object_store_memory={store!r}: expected bytes > 0")
    per_prompt = int(_get(cfg, "data.max_prompt_length", 0)) + int(_get(cfg, "data.max_response_length", 0))
    return HostSettings(
        run=run, gpus_per_node=int(_get(cfg, "trainer.n_gpus_per_node", 1)),
        sleep_level=1 if (lora_adapter or mtp_rollout) else 2,
        object_store_bytes=None if store is None else int(store),
        batch_tokens=int(_get(cfg, "data.train_batch_size", 0)) * int(_get(cfg, f"{ro}.n", 1)) * per_prompt,
        small_workers=int(_get(cfg, "data.dataloader_num_workers", 0)) + int(_get(cfg, f"{ro}.agent.num_workers", 0))
        + int(_get(cfg, "reward.num_workers", 0)),
    )


@dataclass(frozen=True)
class HostEstimate:
    host_gib: float
    gpus_per_node: int
    terms: tuple[tuple[str, float], ...]   # (what, GiB per node)

    @property
    def total_gib(self) -> float:
        return sum(g for _, g in self.terms)

    @property
    def headroom_gib(self) -> float:
        return self.host_gib - self.total_gib

    @property
    def required_headroom_gib(self) -> float:
        return HEADROOM_FRACTION * self.host_gib

    @property
    def fits(self) -> bool:
        return self.headroom_gib >= self.required_headroom_gib


def object_store_gib(h: HostSettings, host_gib: float) -> float:
    """Ray's object store on this node: the configured size, else 30% of RAM capped at 200 GB."""
    if h.object_store_bytes is not None:
        return h.object_store_bytes / GIB
    return min(RAY_OBJECT_STORE_FRACTION * host_gib, RAY_OBJECT_STORE_CAP_BYTES / GIB)


def estimate_host(h: HostSettings, arch: Architecture, host_gib: float = DEFAULT_HOST_MEM_GIB) -> HostEstimate:
    """Host RAM of one node: G x the per-GPU-process terms + the per-node terms (module docstring)."""
    if not host_gib > 0:
        raise MemoryEstimateError(f"host memory must be > 0 GiB, got {host_gib}")
    s, G = h.run, h.gpus_per_node
    shard = arch.params * s.param_bytes / s.fsdp_size / GIB
    per_gpu: list[tuple[str, float]] = [(f"trainer process (assumed {TRAINER_PROCESS_GIB:g} GiB)", TRAINER_PROCESS_GIB)]
    if s.reference:
        per_gpu.append(("reference shard, pinned", arch.params * s.ref_param_bytes / s.fsdp_size / GIB))
    if s.offload_policy:
        per_gpu.append((f"FSDP2 offload_policy: parameters + gradients + {s.optimizer_states} states, pinned",
                        (2 + s.optimizer_states) * shard))
    else:
        if s.param_offload:
            per_gpu.append(("param_offload: parameter shard", shard))
        if s.optimizer_offload:
            per_gpu.append((f"optimizer_offload: {s.optimizer_states} state shards", s.optimizer_states * shard))
    if not s.fsdp2:
        per_gpu.append(("FSDP1 checkpoint save: model + optimizer shard on CPU", (1 + s.optimizer_states) * shard))
    per_gpu.append((f"vLLM processes (assumed {VLLM_PROCESS_GIB:g} GiB per GPU)", VLLM_PROCESS_GIB))
    if h.sleep_level == 1 and s.free_cache_engine:
        per_gpu.append(("vLLM sleep level 1: bf16 weights backed up, pinned", arch.params * 2 / s.rollout_tp / GIB))
    terms = [(f"{G} x {what}", G * gib) for what, gib in per_gpu]
    store = "configured" if h.object_store_bytes is not None else f"{RAY_OBJECT_STORE_FRACTION:.0%} of RAM, cap 200 GB"
    terms += [
        (f"Ray object store ({store}; counted at its cap)", object_store_gib(h, host_gib)),
        (f"rollout batch ({h.batch_tokens} tokens x {BATCH_BYTES_PER_TOKEN} B; assumed)",
         h.batch_tokens * BATCH_BYTES_PER_TOKEN / GIB),
        (f"driver (assumed {DRIVER_GIB:g}) + Ray daemons (assumed {RAY_DAEMONS_GIB:g})", DRIVER_GIB + RAY_DAEMONS_GIB),
        (f"{h.small_workers} dataloader / agent-loop / reward workers (assumed {SMALL_WORKER_GIB:g} GiB each)",
         h.small_workers * SMALL_WORKER_GIB),
    ]
    return HostEstimate(host_gib=host_gib, gpus_per_node=G, terms=tuple(terms))


def host_mem_gib(raw: str | None, source: str) -> float:
    """Parse a host-size override (``--host-mem-gib`` / ``RPG_HOST_MEM_GIB``); empty = the default."""
    return parse_gib(raw, source, DEFAULT_HOST_MEM_GIB, "the node's RAM in GiB, e.g. 2000 or 1024")
