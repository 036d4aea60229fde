"""Loading an FSDP2 checkpoint saved at another world size (docs/verl-integration.md#resume-at-another-world-size).

verl 0.9.1's ``FSDPCheckpointManager`` saves per rank r of world size S
``{model,optim,extra_state}_world_size_S_rank_r.pt`` (DTensor state dicts) and loads only its own world size's.
``ReshardingCheckpointManager`` (installed by ``rpg.verl.worker``) loads another world size's without a collective:
it maps every saved rank's files (``torch.load(mmap=True)``), rebuilds each full tensor from the saved placements
(``full_tensor``), cuts this rank's piece on the CPU as ``distribute_tensor`` would on the current mesh
(``local_piece``; only that piece reaches the device) and hands verl's own ``load_state_dict`` calls state dicts of a
same-world-size layout: one full tensor at a time, no optimizer step (torch's ``set_*_state_dict`` with
``broadcast_from_rank0`` would hold the whole state on rank 0). The per-rank RNG states are not restored.
"""

from __future__ import annotations

import logging
import os

import torch
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

from rpg.verl.checkpoint_digests import reference_file
from rpg.verl.resume_world_size import REFERENCE_FILE, saved_world_sizes, shard_file

logger = logging.getLogger(__name__)


def _is_dtensor(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def full_tensor(pieces: list) -> torch.Tensor:
    """The full tensor of one state entry from every saved rank's value (``pieces[r]`` = rank r's).

    DTensors: the saved mesh's rank layout and placements say where each local tensor sits; mesh dims
    with ``Replicate`` are read at index 0, a ``Shard(d)`` dim is concatenated along ``d`` in mesh order.
    Plain tensors (buffers, a world-size-1 save, optimizer step counts) are the same on every rank: the
    first is returned.
    """
    from torch.distributed.tensor import Replicate, Shard

    first = pieces[0]
    if not _is_dtensor(first):
        return first
    mesh = first.device_mesh.mesh
    placements = first.placements
    shard_dims = [(i, p.dim) for i, p in enumerate(placements) if isinstance(p, Shard)]
    if len(shard_dims) > 1 or not all(isinstance(p, (Shard, Replicate)) for p in placements):
        raise ValueError(f"cannot rebuild a tensor with placements {placements} (one Shard(d) mesh dimension supported)")
    index = [0] * mesh.ndim
    if not shard_dims:
        return pieces[int(mesh[tuple(index)])].to_local()
    mesh_dim, tensor_dim = shard_dims[0]
    parts = []
    for i in range(mesh.shape[mesh_dim]):
        index[mesh_dim] = i
        parts.append(pieces[int(mesh[tuple(index)])].to_local())
    full = torch.cat(parts, dim=tensor_dim)
    if tuple(full.shape) != tuple(first.shape):
        raise ValueError(f"shards concatenate to {tuple(full.shape)}, the saved global shape is {tuple(first.shape)}")
    return full


def local_piece(full: torch.Tensor, target) -> torch.Tensor:
    """This rank's piece of ``full`` as the DTensor ``target`` (of the current world size) is cut, on the CPU where
    ``full`` lies; the piece alone is copied to the device of ``target``'s local tensor (the whole tensor never
    leaves the CPU). The cut is ``distribute_tensor``'s (tests/verl/test_reshard_cpu_cut.py compares them): for each
    mesh dimension in order, ``Shard(d)`` keeps this rank's coordinate's ``torch.chunk`` along ``d`` (empty past the
    last chunk), ``Replicate`` keeps all; the piece's shape must be ``target``'s local shape."""
    from torch.distributed.tensor import Replicate, Shard

    mesh, placements = target.device_mesh, target.placements
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise ValueError("this rank is not in the parameter's device mesh: it holds no piece")
    piece = full
    for mesh_dim, placement in enumerate(placements):
        if type(placement) is Shard:  # a subclass (_StridedShard: FSDP2 with tensor parallelism) cuts otherwise
            chunks = torch.chunk(piece, mesh.size(mesh_dim), dim=placement.dim)
            i = coordinate[mesh_dim]
            piece = chunks[i] if i < len(chunks) else piece.narrow(placement.dim, 0, 0)
        elif not isinstance(placement, Replicate):
            raise ValueError(f"cannot cut a tensor with placements {placements} (Shard(d) and Replicate supported)")
    local = target.to_local()
    if tuple(piece.shape) != tuple(local.shape):
        raise ValueError(f"this rank's piece of a {tuple(full.shape)} tensor is {tuple(piece.shape)}, its parameter's "
                         f"local shard {tuple(local.shape)}")
    return piece.to(local.device, copy=True)  # a copy of the piece (a view of ``full``): the full tensor is freed


def reshard_like(full: torch.Tensor, target) -> torch.Tensor:
    """``full`` cut like ``target`` (a DTensor of the current world size: its mesh and placements), this rank's
    piece (``local_piece``: cut on the CPU, only the piece moved to ``target``'s device), without communication; a
    plain ``target``: ``full``."""
    if not _is_dtensor(target):
        return full
    from torch.distributed.tensor import DTensor

    if tuple(full.shape) != tuple(target.shape):
        raise ValueError(f"saved tensor of shape {tuple(full.shape)} for a parameter of shape {tuple(target.shape)}")
    return DTensor.from_local(local_piece(full, target), target.device_mesh, target.placements, run_check=False,
                              shape=target.shape, stride=target.stride())


def load_all(folder: str, kind: str, world_size: int) -> list:
    """Every saved rank's ``kind`` file of ``world_size``, memory-mapped (rank order)."""
    return [torch.load(shard_file(folder, kind, world_size, r), map_location="cpu", mmap=True, weights_only=False)
            for r in range(world_size)]


def resharded_state_dict(saved: list[dict], current: dict) -> dict:
    """A module state dict for this rank from every saved rank's (same keys as ``current``)."""
    missing, extra = set(current) - set(saved[0]), set(saved[0]) - set(current)
    if missing or extra:
        raise ValueError(f"checkpoint keys differ from the module's: missing {sorted(missing)[:3]}, "
                         f"unexpected {sorted(extra)[:3]}")
    return {k: reshard_like(full_tensor([s[k] for s in saved]), current[k]) for k in current}


def _flat_params(optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def resharded_optimizer_state(saved: list[dict], optimizer) -> dict:
    """An ``optimizer.state_dict()``-layout dict for this rank from every saved rank's: parameter-index
    keys (the same order at every world size: the module's parameters), each sharded state cut like its
    parameter; scalars (``step``) and ``param_groups`` from rank 0 (equal on every rank)."""
    params = _flat_params(optimizer)
    state = {}
    for idx, entry in saved[0]["state"].items():
        if not 0 <= int(idx) < len(params):
            raise ValueError(f"optimizer state for parameter {idx}, the optimizer has {len(params)}")
        p = params[int(idx)]
        state[idx] = {name: (reshard_like(full_tensor([s["state"][idx][name] for s in saved]), p)
                             if _is_dtensor(value) else value) for name, value in entry.items()}
    return {"state": state, "param_groups": saved[0]["param_groups"]}


def load_resharded(manager, folder: str, saved_world_size: int) -> None:
    """What ``FSDPCheckpointManager.load_checkpoint`` does, from the files of ``saved_world_size``: every saved rank's
    files mapped, each entry's full tensor rebuilt and this rank's piece cut (``full_tensor``, ``local_piece``), then
    verl's own load calls. ``manager``: verl's manager (model, optimizer, lr scheduler, contents to load)."""
    if manager.should_load_model:
        saved = load_all(folder, "model", saved_world_size)
        manager.model.load_state_dict(resharded_state_dict(saved, manager.model.state_dict()))
        del saved
    if manager.should_load_optimizer and manager.optimizer is not None:
        saved = load_all(folder, "optim", saved_world_size)
        manager.optimizer.load_state_dict(resharded_optimizer_state(saved, manager.optimizer))
        del saved
    if manager.should_load_extra:
        extra = torch.load(shard_file(folder, "extra_state", saved_world_size, 0), map_location="cpu",
                           weights_only=False)
        if extra.get("lr_scheduler") is not None and manager.lr_scheduler is not None:
            manager.lr_scheduler.load_state_dict(extra["lr_scheduler"])
    logger.warning(f"rank {manager.rank}: loaded {folder} saved at world size {saved_world_size} into world size "
                   f"{manager.world_size} (resharded); the per-rank RNG state is not restored")
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def saved_shard(param, local: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``local`` (this rank's shard of ``param``), as a DTensor with ``param``'s mesh and
    placements when ``param`` is one (FSDP2), so that another world size can place it; else the copy. The DTensor
    is torch's own CPU copy of a DTensor (``DTensor.to("cpu")``, as torch.distributed.checkpoint's ``cpu_offload``
    makes it): its local tensor on the CPU, the mesh and placements kept; ``DTensor.from_local`` would move the
    copy to the mesh's device (a GPU copy of the shard at each save)."""
    if not _is_dtensor(param):
        return local.detach().to("cpu", copy=True)
    if local.shape != param.to_local().shape:
        raise ValueError(f"saved_shard: a local tensor of shape {tuple(local.shape)} for a parameter whose local shard "
                         f"is {tuple(param.to_local().shape)}")
    return param.detach().to("cpu", copy=True)  # the copy of its local tensor, which ``local`` is


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if _is_dtensor(t) else t


def reference_shards(directory: str, params: dict, names: list[str]) -> dict[str, torch.Tensor]:
    """{name: this rank's local shard} of the reference saved in ``directory`` (``reference_rank_<r>.pt``,
    one per saved rank). Saved at this world size: this rank's file; at another: cut from the full
    tensors like the current parameter ``params[name]`` (``full_tensor``, ``reshard_like``)."""
    import torch.distributed as dist

    rank, size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    saved = sum(1 for f in os.listdir(directory) if REFERENCE_FILE.fullmatch(f))

    def load(r):
        path = os.path.join(directory, reference_file(r))
        if not os.path.exists(path):
            raise FileNotFoundError(f"reference shard {path} is missing")
        return torch.load(path, map_location="cpu", mmap=True, weights_only=False)

    if saved == size:
        state = load(rank)
        if missing := [n for n in names if n not in state]:
            raise ValueError(f"reference shard of rank {rank} in {directory} lacks {missing[:3]}")
        return {n: _local(state[n]) for n in names}
    states = [load(r) for r in range(saved)]
    return {n: local_piece(full_tensor([s[n] for s in states]), params[n]) if _is_dtensor(params[n])
            else full_tensor([s[n] for s in states]) for n in names}


class ReshardingCheckpointManager(FSDPCheckpointManager):
    """verl's FSDP checkpoint manager; a checkpoint with no file of this world size is loaded resharded
    (``load_resharded``), one of this world size by verl's own ``load_checkpoint``."""

    @classmethod
    def like(cls, manager):
        """``manager`` (verl's ``FSDPCheckpointManager``) rebuilt as this class: the same model, optimizer,
        scheduler, tokenizer and contents. Any other manager (Megatron, ...) is returned unchanged."""
        if type(manager) is not FSDPCheckpointManager:
            return manager
        return cls(model=manager.model, optimizer=manager.optimizer, lr_scheduler=manager.lr_scheduler,
                   processing_class=manager.processing_class, checkpoint_config=manager.checkpoint_config,
                   trust_remote_code=manager.trust_remote_code)

    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        if local_path is None or os.path.exists(shard_file(local_path, "model", self.world_size, self.rank)):
            return super().load_checkpoint(local_path, hdfs_path, del_local_after_load)
        sizes = saved_world_sizes(local_path)
        if len(sizes) != 1:  # the driver refuses this before Ray (rpg.verl.resume_world_size)
            raise FileNotFoundError(f"{local_path}: model files of world sizes {sorted(sizes)}, none of {self.world_size}")
        load_resharded(self, local_path, sizes.pop())
