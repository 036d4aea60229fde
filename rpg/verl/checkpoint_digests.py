"""Checkpoint digests computed by the rank that wrote the bytes (torch-free: the worker and the trainer both read it).

A save's files are written by several processes: each FSDP rank writes its own ``actor/{model,optim,extra_state}
_world_size_W_rank_r.pt`` and ``rpg_reference/reference_rank_r.pt``; rank 0 also everything else under ``actor/``
(``huggingface/``, ``fsdp_config.json``, ``lora_train_meta.json``); the trainer (verl's TaskRunner) writes
``data.pt``, the RPG JSON files and what its other actors wrote (``transfer_queue/``). Each rank hashes the files it
wrote (``rank_entries``, called on every rank by ``RPGActorRolloutRefWorker.rpg_checkpoint_digests`` after verl's
save returned: no collective, so no barrier waits on it), from its own node's page cache, with its own ``os.stat``
size; the trainer joins the ranks' reports (``join_reports``) and hashes only the files nobody claimed
(``rpg.verl.checkpoints.write_marker(..., known=...)``). The marker is the same as when one process hashed
everything (``rpg.verl.checkpoints``: same names, sizes and SHA-256 digests); the resume's check is unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

from rpg.verl.checkpoints import DIGEST, digests
from rpg.verl.resume_world_size import KINDS, shard_file

ACTOR_DIR = "actor"  # verl's FSDP checkpoint manager's folder in global_step_N (trainer_base._save_checkpoint)
REFERENCE_DIR = "rpg_reference"  # rpg.verl.trainer.REFERENCE_WEIGHTS_DIR (the trainer imports torch; this does not)


def reference_file(rank: int) -> str:
    """The name ``save_reference`` gives a rank's reference shards (``rpg.verl.resume_world_size.REFERENCE_FILE``)."""
    return f"reference_rank_{rank}.pt"


def rank_files(folder: str | os.PathLike, rank: int, world_size: int) -> list[str]:
    """The files of checkpoint ``folder`` (a ``global_step_N``) that rank ``rank`` of ``world_size`` wrote, as
    paths relative to ``folder`` (those present): its shards, its reference shards and, on rank 0, every other
    file under ``actor/`` (what verl's manager writes on rank 0 only)."""
    folder = Path(folder)
    actor = folder / ACTOR_DIR
    own = [Path(shard_file(actor, kind, world_size, rank)) for kind in KINDS]
    own.append(folder / REFERENCE_DIR / reference_file(rank))
    if rank == 0 and actor.is_dir():
        every_rank = {Path(shard_file(actor, kind, world_size, r)) for kind in KINDS for r in range(world_size)}
        own += [p for p in sorted(actor.rglob("*")) if p.is_file() and p not in every_rank]
    return [p.relative_to(folder).as_posix() for p in own if p.is_file()]


def rank_entries(folder: str | os.PathLike, rank: int, world_size: int) -> dict[str, dict]:
    """{relative path: {"size", DIGEST}} of ``rank_files``: this process's ``os.stat`` size and the digest of the
    bytes (read back right after the save: from this node's page cache, where the rank wrote them)."""
    folder = Path(folder)
    rels = rank_files(folder, rank, world_size)
    paths = [folder / rel for rel in rels]
    return {rel: {"size": p.stat().st_size, DIGEST: d} for rel, p, d in zip(rels, paths, digests(paths))}


def join_reports(reports: list[dict[str, dict]]) -> dict[str, dict]:
    """One {relative path: entry} of the ranks' ``rank_entries`` (in rank order); two different entries for one
    file raise ``ValueError`` naming it (two ranks claimed the same file: never written to a marker)."""
    joined: dict[str, dict] = {}
    for rank, report in enumerate(reports):
        for rel, entry in report.items():
            if joined.setdefault(rel, entry) != entry:
                raise ValueError(f"{rel}: two ranks reported different digests ({joined[rel]} and rank {rank}'s "
                                 f"{entry}); no completion marker written")
    return joined
