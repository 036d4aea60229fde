"""The GPU kit: the project's first checks on a GPU node, prepared on a machine with the package registry
(``rpg_lab.gpu_kit.build``) and run in one time-boxed call on a node without network (``rpg_lab.gpu_kit.run``);
standard library and pip only (docs/gpu-smoke.md, "The GPU kit").
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rpg_lab import LAB_DIR

CARRY_DIR = ".gpu_kit"  # the carry, relative to the checkout (ignored by git; the device call carries it)
SITE_DIR = ".gpu_kit_site"  # where the run installs the carry (ignored; kept on a node between calls)
MANIFEST = "manifest.json"
CARRY_FILE = "wheels.tar.xz"
TARGET_PYTHON = "3.12"  # the node's Python (CPython)
# a device call's command: budget + 30 s; the default steps within it, with the machine's start within a lease (their
# times as measured: docs/gpu-smoke.md#the-gpu-kit)
DEFAULT_BUDGET_S = 450
# The kit's steps' vLLM variables (a value already set wins; with --installed too): the vLLM parts hold no FlashInfer
# kernels nor nvcc to compile them, so PyTorch's top-p/top-k sampling; vLLM's own start-up lines (model load,
# compilation, CUDA graphs, KV cache) in the trainer's log, which verl sets to WARN unless the variable is already set
# (trainer/constants_ppo.py get_ppo_ray_runtime_env): the H200's first vLLM smoke run logged nothing for its last
# 93 s before its box ended
KIT_VLLM_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_LOGGING_LEVEL": "INFO"}
# The interpreter of a kit command on a node, run in the checkout without an install of the project: ``python3 -m``
# puts the checkout (rpg) on the path, PYTHONPATH the lab's folder (rpg_lab)
NODE_PYTHON = f"PYTHONPATH={LAB_DIR} PYTHONUNBUFFERED=1 python3"
# A smoke call's end: a device call returns at most 8 files of $OUT (16 MiB each, 64 MiB in all), fewer than a
# stopped step leaves (its Ray logs alone): $OUT packed into 15 MiB pieces of one gzipped tar beside a copy of
# summary.json, the kit's exit code kept (here: cat out.tgz.* | tar xzf -). Each part only after the one before
# succeeded: a failed pack leaves $OUT as the kit wrote it, and says so; an unset OUT stops it before any removal
PACK = ('rc=$?; set -o pipefail; P=$(mktemp -d) && cp "${OUT:?}/summary.json" "$P"/ '
        '&& tar czf - -C "$OUT" . | split -b 15m - "$P"/out.tgz. && rm -rf "${OUT:?}"/* && mv "$P"/* "$OUT"/ '
        '|| echo "PACK failed: the output folder left as the kit wrote it" >&2; '
        '[ "$(ls "$OUT" | wc -l)" -le 5 ] || echo "PACK: over 4 pieces: more than the 64 MiB a call returns" >&2; '
        'ls -la "$OUT"; exit $rc')
SAMPLE_S = 20  # --sample-stacks of a smoke call: a slow phase's stacks every 20 s (docs/gpu-smoke.md)


def source_path(checkout: Path) -> list[str]:
    """The checkout's folders on the path of everything the kit runs: the recipe's (the checkout) and the lab's."""
    return [str(checkout), str(checkout / LAB_DIR)]


# pip, offline, for what the kit carries: no index, no dependencies (each build resolves its wheels as a whole), no
# bytecode compiled on the node
PIP_INSTALL = ["-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
               "--disable-pip-version-check"]


def say(prefix: str, text: str) -> None:
    """One progress line of a kit program, flushed at once (a device call's output is read as it comes)."""
    print(f"{prefix} {text}", flush=True)


def conclude(result: dict, path: Path | None, program: str, whole: bool = False) -> int:
    """A check's or an install's result: as JSON in ``path`` when given, each problem one line on stderr; on stdout
    the whole result as JSON (``whole``: a check's) or its summary line (an install's); exit 1 when there is any
    problem."""
    if path:
        path.write_text(json.dumps(result, indent=1) + "\n")
    if whole:
        print(json.dumps(result, indent=1))
    for line in result["problems"]:
        print(f"{program}: {line}", file=sys.stderr)
    if not whole and "line" in result:
        print(f"{program}: {result['line']}")
    return 1 if result["problems"] else 0


def merge_tree(src: Path, dst: Path) -> None:
    """Move every file of ``src`` to the same place under ``dst`` (folders merged, files replaced)."""
    for folder, _, files in os.walk(src):
        target = dst / Path(folder).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            os.replace(Path(folder) / name, target / name)


def install_wheels(wheels: list[Path], site: Path, python: str) -> str | None:
    """``wheels`` installed into a fresh folder inside ``site``, then merged into it (pip's ``--target --upgrade``
    would replace a folder that a wheel installed earlier shares: a namespace package); None, or the problem."""
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=site) as tmp:
        done = subprocess.run([python, *PIP_INSTALL, "--target", tmp, *map(str, wheels)], capture_output=True,
                              text=True)
        if done.returncode != 0:
            return f"pip install of {len(wheels)} wheels failed: {done.stderr.strip()[-1500:]}"
        merge_tree(Path(tmp), site)
    return None


def foreign(folder: Path, marker: str) -> str | None:
    """None when the kit may empty ``folder``: it does not exist, is empty, or holds ``marker`` (the state file the
    kit writes into a folder it made before anything else); else one line naming it and what is allowed."""
    if not folder.exists() and not folder.is_symlink():
        return None
    allowed = f"give a new or empty folder, or one the kit made (it holds {marker})"
    if not folder.is_dir():
        return f"{folder}: not a folder; {allowed}"
    try:
        if (folder / marker).is_file() or next(folder.iterdir(), None) is None:
            return None
    except OSError as e:
        return f"{folder}: cannot be read ({e.strerror}); {allowed}"
    return f"{folder}: not empty and no {marker} in it (not a folder the kit made): left as it is; {allowed}"


def foreign_files(folder: Path, kit_paths: str) -> str | None:
    """None when a build may replace ``folder``: it does not exist, or every path in it (relative, with ``/``)
    matches the regular expression ``kit_paths`` (what the build writes there); else one line naming the first
    other one and what is allowed."""
    if not folder.exists() and not folder.is_symlink():
        return None
    allowed = "give a new or empty folder, or one the build wrote"
    if not folder.is_dir():
        return f"{folder}: not a folder; {allowed}"
    try:
        other = next((p for p in folder.rglob("*") if not re.fullmatch(kit_paths, p.relative_to(folder).as_posix())),
                     None)
    except OSError as e:
        return f"{folder}: cannot be read ({e.strerror}); {allowed}"
    if other is None:
        return None
    return f"{folder}: holds {other.relative_to(folder)}, which the build does not write: left as it is; {allowed}"


def emptied(folder: Path, marker: str) -> str | None:
    """``folder`` made, or emptied of all it holds when ``foreign`` allows (the folder itself is kept: a lock on it
    holds); else ``foreign``'s line, nothing touched."""
    problem = foreign(folder, marker)
    if problem:
        return problem
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for child in folder.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    except OSError as e:
        return f"{folder}: cannot be made or emptied ({e.filename}: {e.strerror})"
    return None


def lock_folder(folder: Path) -> int | None:
    """An exclusive lock on ``folder`` itself (``flock`` on its descriptor, which no child inherits): the descriptor
    to close when done, or None while another process holds it. The kernel drops it when its holder ends, so a
    killed holder leaves no stale lock."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
