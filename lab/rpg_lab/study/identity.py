"""A run's identity: its settings, independent of where its folders are.

A run launches with absolute paths (its folder under ``--out``, the tiny assets' build in the cache), so its
override list changes whenever the study is copied or moved, run from another clone, or given another
``RPG_TINY_CACHE``. The identity is that list as Hydra reads it (``[prefix + key, value]`` per override, so a
value written bare or quoted is one setting) with every absolute path replaced by what it stands for:

* a path under the study's ``--out``: ``study:<path relative to it>`` (``study:runs/<run id>/ckpts``);
* a path under the tiny assets' build: ``tiny:<path relative to it>@sha256:<digest of its content>`` (a file's
  bytes; a folder's files: ``rpg.verl.checkpoints.manifest``), so the same assets anywhere are the same and
  a rebuilt model or task file is another setting; SmolLM2's model and task folders the same way, each under its
  own prefix (``smol-model:``, ``smol-task:``; ``rpg_lab.study.records``).

A record written before ``run.json`` held its identity (``legacy_identity``) names its folders by absolute
path: a path with ``runs/<run id>`` in it is read as that run's folder in the study, and a path inside a
folder named as the current build (its builder key, a hash of the builder's sources) as that file of the
current build.

The code a run was made by is recorded beside its identity (``rpg.run_record.code_state``: the commit and any uncommitted changes)
and compared by ``other_code``: a finished run of other code is not reused in silence (``rpg_lab.study.records``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from rpg.override_lists import parse_overrides

STUDY, TINY = "study:", "tiny:"

_DIGESTS: dict[tuple, str] = {}  # (path, (name, inode, size, mtime, ctime) of each file) -> content digest
RACY_S = 2.0  # a file changed this recently is hashed again each time (git's "racy clean" rule)


def content_digest(path: Path) -> str:
    """sha256 of a file's bytes, or of a folder's manifest (each file's relative path, size and sha256). Memoized
    by each file's inode, size and times; a file changed within ``RACY_S`` is never memoized, since a rewrite of the
    same size within one timestamp tick leaves them all as they were."""
    from rpg.verl.checkpoints import file_digest, manifest

    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    stats = [(str(p), p.stat()) for p in files]
    key = (str(path), tuple((name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) for name, st in stats))
    if key in _DIGESTS:
        return _DIGESTS[key]
    if path.is_dir():
        digest = hashlib.sha256(json.dumps(manifest(path), sort_keys=True).encode()).hexdigest()
    else:
        digest = file_digest(path)
    if all(time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_S * 1e9 for _, st in stats):
        _DIGESTS[key] = digest
    return digest


def _under(path: Path, folder: Path) -> str | None:
    """``path`` relative to ``folder`` (POSIX), or None when it is not inside it."""
    try:
        return path.relative_to(folder).as_posix()
    except ValueError:
        return None


def _walk(value: Any, fix) -> Any:
    """``value`` with ``fix`` applied to each absolute path string in it (lists and dicts walked)."""
    if isinstance(value, str):
        return fix(Path(value)) if os.path.isabs(value) else value
    if isinstance(value, list):
        return [_walk(v, fix) for v in value]
    if isinstance(value, dict):
        return {k: _walk(v, fix) for k, v in value.items()}
    return value


def _asset(path: Path, roots: dict[str, Path]) -> str | None:
    """``<prefix><path relative to its root>@sha256:<content digest>`` for an existing path under one of ``roots``
    (prefix -> folder), else None."""
    for prefix, root in roots.items():
        rel = _under(path, root)
        if rel is not None and path.exists():
            return f"{prefix}{rel}@sha256:{content_digest(path)}"
    return None


def _tiny(path: Path, assets_root: Path) -> str | None:
    return _asset(path, {TINY: assets_root})


def _settings(overrides: list[str], fix) -> list:
    """``[[prefix + key, value], ...]`` as Hydra reads them, each absolute path through ``fix``, JSON-normalised
    (what ``run.json`` holds and is compared against)."""
    pairs = [[p.prefix + p.key, _walk(p.value, fix)] for p in parse_overrides(overrides)]
    return json.loads(json.dumps(pairs))


def identity(overrides: list[str], out: Path, assets_root: Path | dict[str, Path]) -> list:
    """The identity of a run launched with ``overrides`` in the study ``out`` with the tiny assets' build at
    ``assets_root``, or the assets' folders by prefix (``{"smol-model:": folder, ...}``) (module docstring)."""
    out = Path(out).resolve()
    roots = ({k: Path(v).resolve() for k, v in assets_root.items()} if isinstance(assets_root, dict)
             else {TINY: Path(assets_root).resolve()})

    def fix(path: Path) -> str:
        path = path.resolve()
        if (asset := _asset(path, roots)) is not None:  # by content, even with the cache under --out
            return asset
        rel = _under(path, out)
        return str(path) if rel is None else STUDY + rel

    return _settings(overrides, fix)


def legacy_identity(overrides: list[str], run_id: str, assets_root: Path) -> list:
    """The identity of a run recorded with absolute paths only (module docstring): the folders it was run in
    need not exist any more."""
    assets_root = Path(assets_root).resolve()

    def fix(path: Path) -> str:
        parts = path.parts
        for i in range(len(parts) - 1):
            if parts[i] == "runs" and parts[i + 1] == run_id:
                return STUDY + "/".join(parts[i:])
        if assets_root.name in parts:  # the last folder named as the current build's key
            rest = parts[len(parts) - parts[::-1].index(assets_root.name):]
            return _tiny(assets_root.joinpath(*rest), assets_root) or str(path)
        return str(path)

    return _settings(overrides, fix)


# ----------------------------------------------------------------------------- the code a run was made by

def other_code(recorded: dict, now: dict) -> str | None:
    """Why a run recorded with ``recorded`` (a run.json) was made by other code than ``now`` (``code_state``), or
    None when it is the same code: the same commit with the same uncommitted changes, or none. A record from before
    the full commit was recorded (``code`` alone) is the same code only when it was clean, its abbreviated commit
    is this one's and the checkout is clean. Unknown code (no git) is never the same."""
    code, here = recorded.get("code") or "unknown", now.get("code") or "unknown"
    why = f"code {code}, this checkout {here}"
    if now.get("commit") is None:
        return why
    if recorded.get("commit") is not None:
        if recorded["commit"] != now["commit"]:
            return why if code != here else f"commit {recorded['commit']}, this checkout {now['commit']}"
        if recorded.get("changes") != now["changes"]:
            return why + (" (other uncommitted changes)" if code == here else "")
        return None
    short = code.rsplit("-g", 1)[-1]  # git describe: <tag>-<n>-g<hash>, or the hash alone
    clean = code != "unknown" and not code.endswith("+dirty") and now["changes"] is None
    return None if clean and len(short) >= 7 and now["commit"].startswith(short) else why
