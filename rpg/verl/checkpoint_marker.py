"""The completion marker of a checkpoint (``MARKER``): every file with its size and digest, written last by the trainer
(``rpg.verl.trainer``) once verl's save and the recipe's files are whole; ``rpg.verl.checkpoints`` reads it before a
resume."""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rpg.run_record import file_sha256

logger = logging.getLogger(__name__)

MARKER = "rpg_checkpoint_complete.json"
# hashlib's SHA-256: the fastest stdlib digest on CPUs with SHA extensions (docs/verl-integration.md,
# "Resume", gives the measured cost per GiB); files are read in 4 MiB blocks, several files at once
# (hashlib releases the GIL while it hashes)
DIGEST = "sha256"


def file_digest(path: str | os.PathLike) -> str:
    """Hex ``DIGEST`` of the file's bytes (``rpg.run_record.file_sha256``: 4 MiB blocks)."""
    return file_sha256(path)


def digests(paths: list[Path]) -> list[str]:
    """``file_digest`` of each path, several files at once."""
    if not paths:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1, len(paths)))) as pool:
        return list(pool.map(file_digest, paths))


def _files(folder: Path) -> list[Path]:
    return [p for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.startswith(MARKER)]


def manifest(folder: str | os.PathLike, known: dict[str, dict] | None = None) -> dict[str, dict]:
    """{relative path: {"size": bytes, DIGEST: hex}} of every file under ``folder`` except the marker.

    ``known``: entries already computed where the files were written (each rank's,
    ``rpg.verl.checkpoint_digests``): taken as they are, never read again here; listed even when this
    process's listing misses them (a stale directory cache on shared storage). Only the other files are hashed.
    A known entry whose size differs from what this process sees is kept (the writer's size) and logged."""
    folder = Path(folder)
    known = dict(known or {})
    sizes = {str(p.relative_to(folder)): p.stat().st_size for p in _files(folder)}
    for rel in sorted(set(known) & set(sizes)):
        if known[rel].get("size") != sizes[rel]:
            logger.warning(f"{folder / rel}: {sizes[rel]} bytes seen here, {known[rel].get('size')} where it was written "
                           "(recorded as written; the resume's check compares both)")
    todo = [rel for rel in sizes if rel not in known]
    found = {rel: {"size": sizes[rel], DIGEST: d} for rel, d in zip(todo, digests([folder / rel for rel in todo]))}
    return {**{rel: found.get(rel) or known[rel] for rel in sizes}, **{rel: e for rel, e in known.items() if rel not in sizes}}


def write_marker(folder: str | os.PathLike, step: int, settings: dict | None = None,
                 known: dict[str, dict] | None = None, last_step: int | None = None) -> Path:
    """Declare ``folder`` complete: the marker (step, manifest with digests, the run's RPG settings, the run's
    last training step when known: ``is_last_step``), written to a temporary name and renamed. Call it once the
    save has returned (the files are whole). ``known``: digests computed where the files were written
    (``manifest``)."""
    folder = Path(folder)
    tmp, final = folder / f"{MARKER}.tmp", folder / MARKER
    record = {"global_step": step, "digest": DIGEST, "files": manifest(folder, known), "settings": settings,
              "last_step": last_step}
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, final)
    return final
