"""Build a cached folder once (the tiny and SmolLM2 assets): ``build_once``.

Concurrent callers (pytest-xdist workers, two launchers started together) are safe: one process builds, under an
exclusive ``flock`` on ``<cache_root>/.build.lock`` (released by the kernel if it dies), into a temporary folder
``<cache_root>/.rpg-build-*`` published by one rename; the others wait for the lock and then find the build complete.
Without the lock each would spend a build's CPU, and one finishing late could delete a build another process was
already using. Every build under one cache root takes the same lock, so the leftovers of a builder that was killed
(``.rpg-build-`` and mkdtemp's 8 characters, nothing else: a cache root may be a shared folder) can be
removed by whoever holds it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

LOCK_FILE = ".build.lock"
TMP_PREFIX = ".rpg-build-"  # a build's temporary folder: TMP_PREFIX and tempfile.mkdtemp's 8 characters


@contextlib.contextmanager
def build_lock(cache_root: Path, log: Callable[[str], None], what: str):
    """An exclusive ``flock`` on ``cache_root/.build.lock`` (blocking; one line when it has to wait)."""
    import fcntl

    with open(cache_root / LOCK_FILE, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"before building {what}: waiting for another process's build in this cache to end "
                f"({cache_root / LOCK_FILE})")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_once(cache_root: Path, target: Path, complete: Callable[[], bool], build_into: Callable[[Path], None],
               log: Callable[[str], None], what: str, force: bool = False) -> None:
    """Make ``target`` (a folder under ``cache_root``) complete: nothing when ``complete()`` already holds (unless
    ``force``), else ``build_into(tmp)`` and ``tmp`` renamed to ``target`` (module docstring). An exception in
    the build leaves no partial ``target``."""
    if complete() and not force:
        return
    cache_root.mkdir(parents=True, exist_ok=True)
    with build_lock(cache_root, log, what):
        if complete() and not force:  # built by the process we waited for
            return
        for stale in cache_root.glob(f"{TMP_PREFIX}*"):  # left by a builder that was killed (we hold the lock)
            if re.fullmatch(re.escape(TMP_PREFIX) + r"[a-z0-9_]{8}", stale.name) and stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=cache_root))
        log(f"building {what} once (cached in {target})")
        try:
            build_into(tmp)
            if target.exists():  # an incomplete or forced-out build (no one else builds: the lock)
                shutil.rmtree(target)
            os.replace(tmp, target)  # atomic publish
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
