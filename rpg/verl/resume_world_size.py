"""Resuming at another world size, decided before Ray from the disk only (no tensor read; no torch import).

verl 0.9.1 names an FSDP checkpoint's files by the world size that saved them and loads only its own
(``{model,optim,extra_state}_world_size_S_rank_r.pt``); this recipe's workers load another world size's resharded
(``rpg.verl.reshard``). ``world_size_change`` says before Ray whether that can work, in one line added to the resume
decision: resharded for an FSDP2 save (DTensor shards that carry their placement; verl's ``fsdp_config.json`` says
``FSDP_version`` 2) loaded by an FSDP2 run with every saved rank's files and reference shards present, the per-rank
RNG state not restored; refused, naming both world sizes and the way out, for FSDP1 on either side (flat
parameters laid out by the world size), a saved rank's file missing, a critic, or reference shards without their
placement.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path

_SHARD_FILE = re.compile(r"(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt")
KINDS = ("model", "optim", "extra_state")
REFERENCE_FILE = re.compile(r"reference_rank_(\d+)\.pt")
# the module DTensors are pickled from (a DTensor saved by torch.save names its class's module in data.pkl)
_DTENSOR_MODULE = b"torch.distributed.tensor"


def shard_file(folder: str | os.PathLike, kind: str, world_size: int, rank: int) -> str:
    """verl's name of a rank's checkpoint file (fsdp_checkpoint_manager.py): kind in ``KINDS``."""
    return os.path.join(folder, f"{kind}_world_size_{world_size}_rank_{rank}.pt")


def saved_world_sizes(folder: str | os.PathLike) -> set[int]:
    """The world sizes whose model files are in ``folder`` (an ``actor`` directory)."""
    if not os.path.isdir(folder):
        return set()
    return {int(m.group(2)) for f in os.listdir(folder) if (m := _SHARD_FILE.fullmatch(f)) and m.group(1) == "model"}


def holds_dtensors(path: str | os.PathLike) -> bool:
    """Whether a torch.save file pickles DTensors (its pickle names their module; no tensor is read)."""
    with zipfile.ZipFile(path) as zf:
        pkl = next((n for n in zf.namelist() if n.endswith("/data.pkl")), None)
        return pkl is not None and _DTENSOR_MODULE in zf.read(pkl)


def world_size(n_gpus_per_node, nnodes) -> int | None:
    """``n_gpus_per_node * nnodes``; None unless both are integers >= 1 (then not compared here: the driver's
    rules on those keys refuse them in their own line)."""
    values = (n_gpus_per_node, nnodes)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        return None
    return n_gpus_per_node * nnodes


RESHARD_STRATEGY = "fsdp2"  # the actor strategy whose checkpoints load at another world size


def reshard_problem(strategy: str, critic: bool) -> str | None:
    """Why a run with the actor's ``strategy`` (and a critic or not) cannot resume at another world size, or None."""
    if strategy != RESHARD_STRATEGY:
        return (f"actor_rollout_ref.actor.strategy={strategy}: only {RESHARD_STRATEGY} checkpoints load at another "
                "world size")
    if critic:
        return ("a critic (algorithm.adv_estimator=gae): its checkpoint is not resharded (only the actor and the "
                "reference are)")
    return None


def world_size_change(folder: str | os.PathLike, current: int, strategy: str = "fsdp2") -> tuple[str | None, str | None]:
    """(problem, note) of resuming checkpoint ``folder`` (a ``global_step_N``) at world size ``current`` with
    the actor's ``strategy``: (None, None) when it was saved at ``current`` (or holds no sharded actor);
    (None, what is done) when the workers reshard it; (one line: why not and the way out, None) otherwise."""
    folder = Path(folder)
    actor = folder / "actor"
    sizes = saved_world_sizes(actor)
    if not sizes or sizes == {current}:
        return None, None
    if len(sizes) > 1:
        return f"{actor} holds model files of world sizes {sorted(sizes)}: one save per directory expected", None
    saved = sizes.pop()
    both = f"{folder} was saved at world size {saved}, this run has world size {current}"
    way_out = (f"resume at world size {saved} (trainer.n_gpus_per_node x trainer.nnodes = {saved}), or train a new "
               f"run from its Hugging Face model (python -m verl.model_merger merge --backend fsdp --local_dir {actor} "
               f"--target_dir <dir>; actor_rollout_ref.model.path=<dir>)")
    version = _fsdp_version(actor)
    if version not in (None, 2) or strategy != RESHARD_STRATEGY:
        what = f"saved by FSDP{version}" if version not in (None, 2) else f"this run's actor strategy is {strategy}"
        return f"{both} and {what}: only FSDP2 checkpoints (DTensor shards) load at another world size; {way_out}", None
    # a kind saved by some rank must be there for every rank (a kind nobody saved is verl's own business)
    saved_kinds = [k for k in KINDS if any(os.path.isfile(shard_file(actor, k, saved, r)) for r in range(saved))]
    missing = [Path(shard_file(actor, k, saved, r)).name for k in saved_kinds for r in range(saved)
               if not os.path.isfile(shard_file(actor, k, saved, r))]
    if missing:
        return f"{both}, but {actor} lacks {', '.join(missing[:3])}: the full tensors cannot be rebuilt; {way_out}", None
    if saved > 1 and not holds_dtensors(shard_file(actor, "model", saved, 0)):
        return f"{both}, but its model shards were saved without their placement (not FSDP2 DTensors); {way_out}", None
    if (folder / "critic").is_dir():
        return f"{both}, and its critic/ is not resharded (only the actor and the RPG reference are); {way_out}", None
    parts = "model, optimizer state, lr schedule"
    ref_dir = folder / "rpg_reference"
    if ref_dir.is_dir():
        ranks = sorted(int(m.group(1)) for p in ref_dir.iterdir() if (m := REFERENCE_FILE.fullmatch(p.name)))
        if ranks != list(range(saved)):
            return f"{both}, but {ref_dir} holds reference shards of ranks {ranks}, not 0..{saved - 1}; {way_out}", None
        if saved > 1 and not all(holds_dtensors(ref_dir / f"reference_rank_{r}.pt") for r in ranks):
            return (f"{both}, but its reference shards in {ref_dir} were saved without their placement (before "
                    f"reference shards were DTensors); {way_out}"), None
        parts += ", reference"
    return None, (f"{both}: {parts} are resharded as the workers load them (full tensors rebuilt from the "
                  f"shards of {saved} saved rank{'s' if saved > 1 else ''}); the per-rank RNG state is not restored (no counterpart at another world size)")


def _fsdp_version(actor: Path) -> int | None:
    """``FSDP_version`` of verl's ``fsdp_config.json`` beside the shards (None: absent or unreadable)."""
    try:
        return int(json.loads((actor / "fsdp_config.json").read_text())["FSDP_version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
