"""Pack the GPU kit's carry: each wheel trimmed of what a run never loads and stored uncompressed, all of them in
one reproducible xz tar (one stream compresses about twice as well as the wheels' own zip), and its manifest.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import shutil
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from rpg_lab.gpu_kit import CARRY_FILE, MANIFEST, TARGET_PYTHON, foreign_files

CARRY_PATHS = f"{re.escape(MANIFEST)}|{re.escape(CARRY_FILE)}"  # what a carry's folder holds (write_carry)
# Members of a wheel a run never loads (fnmatch on the path in the wheel).
TRIM = {
    "ray": [
        "ray/jars/*",  # Java workers
        "ray/dashboard/client/build/*",  # the dashboard's web pages (the runs start no dashboard UI)
        # Ray's libraries verl does not import
        "ray/rllib/*", "ray/tune/*", "ray/train/*", "ray/serve/*", "ray/llm/*", "ray/data/*",
    ],
}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def restore(wheel: Path, drop: list[str]) -> list[str]:
    """Rewrite ``wheel`` in place with its members stored uncompressed, those matching ``drop`` removed and
    RECORD rewritten without them; returns the removed paths."""
    removed = []
    tmp = wheel.with_name(wheel.name + ".tmp")
    with zipfile.ZipFile(wheel) as z, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as out:
        for info in z.infolist():
            if any(fnmatch.fnmatch(info.filename, p) for p in drop):
                removed.append(info.filename)
        gone = set(removed)
        for info in z.infolist():
            if info.filename in gone:
                continue
            data = z.read(info.filename)
            if gone and info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(x for x in lines if x.split(",", 1)[0] not in gone).encode()
            out.writestr(info, data, compress_type=zipfile.ZIP_STORED)  # keeps the mode bits (executables)
    tmp.replace(wheel)
    return removed


def pack(wheels: list[Path], archive: Path, preset: int = 9) -> None:
    """The wheels in one xz-compressed tar, in name order, with fixed owners and times (same input, same bytes)."""
    with tarfile.open(archive, "w:xz", preset=preset) as tar:
        for w in sorted(wheels, key=lambda p: p.name):
            info = tar.gettarinfo(str(w), arcname=w.name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with open(w, "rb") as f:
                tar.addfile(info, f)


def write_carry(wheels: dict[str, Path], versions: dict[str, str], out: Path, manifest: dict, preset: int = 9,
                trim: dict[str, list[str]] = TRIM, carried_anyway: dict[str, str] | None = None) -> dict:
    """Trim and store each wheel (``restore``), pack them into ``out/wheels.tar.xz`` and write ``out/manifest.json``
    (``manifest`` plus the carry's file, size, sha256 and each wheel's sizes, ``carried_anyway``'s reason for a
    wheel the node has); ``out`` is replaced as a whole, when it holds only a carry (``foreign_files``; else
    FileExistsError with its line, nothing touched)."""
    refused = foreign_files(out, CARRY_PATHS)
    if refused:
        raise FileExistsError(f"--out {refused}")
    entries = {}
    for name, path in sorted(wheels.items()):
        size = path.stat().st_size
        removed = restore(path, trim.get(name, []))
        entries[name] = {"wheel": path.name, "version": versions[name], "wheel_bytes": size,
                         "stored_bytes": path.stat().st_size, "removed_members": len(removed)}
        if name in (carried_anyway or {}):
            entries[name]["carried_anyway"] = carried_anyway[name]
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".gpu_kit.", dir=out.parent))
    try:
        pack(list(wheels.values()), stage / CARRY_FILE, preset)
        archive = stage / CARRY_FILE
        manifest = {"target": {"python": TARGET_PYTHON, "implementation": "cp", "platform": "manylinux x86_64"},
                    "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **manifest,
                    "carry": {"file": CARRY_FILE, "bytes": archive.stat().st_size, "sha256": sha256(archive)},
                    "wheels": entries, "trim": trim}
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        stage.chmod(0o755)  # mkdtemp's folder is private; the carry is an ordinary folder
        stage.rename(out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return manifest
