"""pi_old snapshots that are real copies (``trainer.v1.trainer_mode=separate_async``).

verl's separate-async trainer recomputes pi_old for the 2nd..k-th mini-batch of a step from a host snapshot of the
actor taken at the step's start (``DetachActorWorker.save_model_to_cpu`` / ``restore_model_from_cpu``). Its FSDP2
helper takes ``param._local_tensor.detach().cpu()`` (verl/utils/fsdp_utils.py, ``fsdp2_sharded_save_to_cpu``):
on the CPU backend that tensor already lives on the host, ``.cpu()`` returns it unchanged, and the "snapshot"
shares storage with the live weights. Every optimizer step then moves it too, the restore is a no-op, and pi_old
silently becomes the latest weights. ``owned_snapshot`` clones exactly the tensors of a saved state that share
storage with a live parameter, so what is restored is what was saved (on a GPU nothing is shared, nothing cloned).
"""

from __future__ import annotations

import torch


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def live_storages(module: torch.nn.Module) -> set[int]:
    """The storages of the module's parameters (an FSDP2 DTensor's local shard)."""
    out = set()
    for p in module.parameters():
        local = getattr(p, "_local_tensor", p)
        if local.numel():
            out.add(_storage(local))
    return out


def owned_snapshot(saved, module: torch.nn.Module):
    """``saved`` (a snapshot structure of dicts, tuples and lists of tensors and specs) with every tensor that
    shares storage with one of ``module``'s parameters replaced by a clone."""
    live = live_storages(module)

    def own(x):
        if isinstance(x, torch.Tensor):
            return x.clone() if x.numel() and _storage(x) in live else x
        if isinstance(x, dict):
            return {k: own(v) for k, v in x.items()}
        if isinstance(x, (tuple, list)):
            return type(x)(own(v) for v in x)
        return x

    return own(saved)
