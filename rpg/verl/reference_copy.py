"""Shard-local reference <- actor copies for FSDP1 / FSDP2 modules, and what the reference computes.

Pure torch (no verl import), used by ``rpg.verl.worker`` on every rank and tested on a 2-rank gloo group
(tests/verl/test_verl_reference_fsdp.py). A copy goes into each rank's local shards, after ``release_gathered_params``
has put every FSDP unit back into its sharded state (a no-grad forward leaves some gathered); ``max_shard_diff``,
``probe_logits`` and ``next_token_nll`` measure actor and reference on their shards and on a fixed probe sequence.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist

PROBE_LENGTH = 32
PROBE_SEED = 20260101


def local_shard(p: torch.Tensor) -> torch.Tensor:
    """The rank-local storage of a parameter: the DTensor shard (FSDP2) or the tensor itself."""
    return p._local_tensor if hasattr(p, "_local_tensor") else p.data


def release_gathered_params(module: torch.nn.Module) -> int:
    """Reshard every FSDP1/FSDP2 unit of ``module`` and free its gathered parameters.

    A forward leaves some units unsharded: FSDP1 never frees the root unit's gathered flat parameter (it expects a
    backward; the root holds the embeddings, final norm and lm_head), and with ``reshard_after_forward=False`` no
    unit frees its own (FSDP1 SHARD_GRAD_OP, FSDP2). The reference runs no-grad forwards only, so nothing frees
    them: FSDP1 would reuse the stale gathered buffer (a copy into the shards would not reach the outputs), FSDP2
    registers the full tensors as the parameters (the "shards" would have the full shapes). FSDP2: the public
    ``FSDPModule.reshard``; FSDP1: the unit's flat-parameter handle, as verl's engine does for the root after an eval
    forward. Idempotent; a no-op for units that are already sharded. Returns the number of units visited.
    """
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    units = 0
    for m in module.modules():
        if isinstance(m, FSDPModule):  # FSDP2 (fully_shard); the method is not recursive
            m.reshard()
            units += 1
        elif isinstance(m, FSDP):
            handle = m._handle  # None for a unit that owns no parameters
            if handle is not None and handle.uses_sharded_strategy:
                handle.reshard(True)  # point at the local shard and free the gathered buffer
            units += 1
    return units


def wait_for_offload_copies() -> None:
    """Block until the accelerator has finished its queued work (no-op without an accelerator).

    verl offloads parameters and optimizer states to the CPU with *non-blocking* device-to-host
    copies (``verl.utils.fsdp_utils.offload_fsdp2_model_to_cpu``, ``offload_fsdp_optimizer``): the
    host tensors are not safe to read or write on the host until those copies have landed. Every
    host access to shards that may be offloaded (the reference copy, its diagnostics, save and
    load; the schedule-free train/eval switch) calls this first; otherwise a copy into an offloaded
    reference could be overwritten by an in-flight offload, or read a half-written actor shard.
    """
    if torch.accelerator.is_available():
        torch.accelerator.synchronize()


def paired_local_shards(actor: torch.nn.Module, ref: torch.nn.Module) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, actor local shard, reference local shard) for every parameter, both modules resharded,
    every pending offload copy landed (``wait_for_offload_copies``).

    Names and shard shapes are checked (never assumed) so that a mismatch is one clear error.
    """
    wait_for_offload_copies()
    release_gathered_params(actor)
    release_gathered_params(ref)
    actor_params = dict(actor.named_parameters())
    ref_params = dict(ref.named_parameters())
    if actor_params.keys() != ref_params.keys():
        only = sorted(set(actor_params) ^ set(ref_params))[:3]
        raise ValueError(f"actor and reference parameters differ in names (e.g. {only}); same strategy needed")
    pairs = []
    for name, p_act in actor_params.items():
        a, r = local_shard(p_act), local_shard(ref_params[name])
        if a.shape != r.shape:
            raise ValueError(f"actor/reference shard shapes differ for {name}: {tuple(a.shape)} vs {tuple(r.shape)}")
        pairs.append((name, a, r))
    return pairs


@torch.no_grad()
def copy_actor_to_reference(actor: torch.nn.Module, ref: torch.nn.Module) -> int:
    """reference <- actor, local shard by local shard (in the reference's dtype). Returns #tensors."""
    pairs = paired_local_shards(actor, ref)
    for _, a, r in pairs:
        r.copy_(a.to(device=r.device, dtype=r.dtype))
    if dist.is_initialized():
        dist.barrier()
    return len(pairs)


@torch.no_grad()
def max_shard_diff(actor: torch.nn.Module, ref: torch.nn.Module) -> float:
    """max over this rank's local shards of |actor - reference| (in the reference's dtype)."""
    diff = 0.0
    for _, a, r in paired_local_shards(actor, ref):
        if a.numel():
            diff = max(diff, float((a.to(device=r.device, dtype=r.dtype) - r).abs().max()))
    return diff


def probe_token_ids(vocab_size: int, length: int = PROBE_LENGTH, seed: int = PROBE_SEED) -> torch.Tensor:
    """A fixed token sequence [1, length] (same on every rank, every run)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (1, length), generator=gen)


@torch.no_grad()
def probe_logits(module: torch.nn.Module, ids: torch.Tensor, device: str | torch.device = "cpu",
                 autocast_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Logits [1, L, V] (float32) of one unpadded sequence, computed like verl's engine forward
    (``use_cache=False``, explicit position ids, autocast unless float32); then the gathered
    parameters are released again. Every rank of the FSDP group must call it (collective)."""
    ids = ids.to(device)
    pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
    autocast = (nullcontext() if autocast_dtype in (None, torch.float32)
                else torch.autocast(device_type=torch.device(device).type, dtype=autocast_dtype))
    try:
        with autocast:
            out = module(input_ids=ids, position_ids=pos, use_cache=False)
    finally:
        release_gathered_params(module)
    logits = getattr(out, "logits", None)
    if logits is None:
        raise RuntimeError("the model returned no logits (fused kernels?); rpg.reference.log_weight_diff needs them")
    return logits.float()


def next_token_nll(logits: torch.Tensor, ids: torch.Tensor) -> float:
    """mean_t -log p(ids[t+1] | ids[:t+1]) of the probe sequence (float64)."""
    logp = torch.log_softmax(logits[0, :-1].double(), dim=-1)
    target = ids[0, 1:].to(logp.device)
    return float(-logp.gather(-1, target[:, None]).mean())
