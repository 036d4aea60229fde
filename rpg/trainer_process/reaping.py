"""Ending every process of a trainer run, and only those: the process group, leftover processes, /dev/shm files.

The trainer runs in its own session with a private Ray temp dir, so every process of the run (driver, GCS,
raylet, workers) is identifiable. Each is recorded by its pid and start time (psutil's ``create_time``), and
only a process that still has both is ever signalled: a pid reused by another process after a run's process
ended is left alone. After the run, whatever its outcome, any of them still alive 30 s after the driver
exited is terminated (``cleanup``), and ``TrainerRun.leftover_pids`` lists them (empty in a clean run).
Shared-memory files in ``/dev/shm`` that a process of the run mapped and that outlived it (vLLM's message
queues when its processes are killed at shutdown) are removed then too (``unlink_left``), and listed in
``TrainerRun.leftover_shm``; vLLM's socket files live in the private Ray temp dir (``VLLM_RPC_BASE_PATH``),
removed with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable


def procs_using(psutil, marker: str) -> list:
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(marker in a for a in (p.info["cmdline"] or [])):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


# Shared-memory files a run may leave in /dev/shm when its processes are killed: Python's unnamed
# ``multiprocessing.shared_memory`` segments (``psm_*``; vLLM's message queues, unlinked only by their
# creator's ``__del__``: vllm/distributed/device_communicators/shm_broadcast.py) and verl's weight-sync
# buckets (``verl_weights_*``, bucketed_weight_transfer.py). Only files mapped by a process of THIS run are
# ever removed (seen in /proc/<pid>/maps while it ran), never another run's.
SHM_DIR = "/dev/shm"
SHM_PREFIXES = ("psm_", "verl_weights_")


def shm_present() -> set[str]:
    """Names of the ``SHM_PREFIXES`` files in ``SHM_DIR`` now (a listing: far cheaper than reading mappings)."""
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(SHM_PREFIXES)}
    except OSError:
        return set()


def shm_mapped(pids: Iterable[int]) -> set[str]:
    """Names of the ``SHM_PREFIXES`` files in ``SHM_DIR`` that any of ``pids`` maps."""
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    path = line.rstrip("\n").split(None, 5)[-1]
                    if path.startswith(SHM_DIR + "/"):
                        name = path[len(SHM_DIR) + 1:].removesuffix(" (deleted)")
                        if name.startswith(SHM_PREFIXES) and "/" not in name:
                            found.add(name)
        except OSError:
            pass
    return found


def unlink_left(names: Iterable[str]) -> list[str]:
    """Remove the run's shared-memory files still present once every process of the run has ended."""
    left = sorted(n for n in names if os.path.exists(os.path.join(SHM_DIR, n)))
    for name in left:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, name))
    return left


def terminate_group(proc: subprocess.Popen, wait_s: float = 15.0) -> None:
    """Stop the trainer, then the rest of its process group.

    SIGTERM goes to the trainer alone first: the RPG driver's handler (``rpg.verl.main.stop_on_signals``)
    shuts its Ray cluster down and prints its stop line. Signalling the whole group at once also ended
    Ray's raylet and GCS under the driver, whose core worker, blocked in a ``ray.get``, could end the
    process before the handler ran (seen once in a suite run: no "Ray shut down" line in trainer.log).
    Once the trainer has exited, or after ``wait_s``, the group gets SIGTERM (stragglers), and SIGKILL if
    the trainer is still running; the trainer is reaped only after that, so its pid, the group's id, is
    never another process's when signalled."""
    os.kill(proc.pid, signal.SIGTERM)  # not Popen.send_signal: its poll() could reap the trainer first
    exited = exited_unreaped(proc.pid, wait_s)
    if exited is not None:  # None: reaped elsewhere, its pid no longer ours to signal
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM if exited else signal.SIGKILL)
    proc.wait(timeout=wait_s)


def exited_unreaped(pid: int, wait_s: float) -> bool | None:
    """Whether child ``pid`` exits within ``wait_s``, left unreaped (``waitid`` with ``WNOWAIT``, so its pid
    stays taken); None if it was reaped already."""
    deadline = time.time() + wait_s
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return None
        if time.time() >= deadline:
            return False
        time.sleep(0.05)


def identities(pids: Iterable[int]) -> list[tuple[int, float]]:
    """(pid, start time) of each of ``pids`` still running: what identifies a process, a pid alone does not."""
    import psutil

    out = []
    for pid in pids:
        try:
            out.append((pid, psutil.Process(pid).create_time()))
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            pass
    return out


def cleanup(seen: set[tuple[int, float]], ray_tmp: str, grace_s: float = 30.0) -> list[int]:
    """Terminate processes of this run (``seen``: (pid, start time) of each) that outlived the driver by
    ``grace_s``; return their pids. A pid now held by a process with another start time is not the run's."""
    import psutil

    deadline = time.time() + grace_s  # a clean exit lets Ray stop its own daemons first
    while True:
        found = set(identities(p.pid for p in procs_using(psutil, ray_tmp)))
        alive = [p for p in _alive(psutil, seen | found) if p.pid != os.getpid()]
        if not alive or time.time() > deadline:
            break
        time.sleep(0.5)
    left_behind = sorted(p.pid for p in alive)
    for p in alive:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(alive, timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return left_behind


def _alive(psutil, identities: Iterable[tuple[int, float]]) -> list:
    """The processes of ``identities`` ((pid, start time)) still running as themselves (not zombies). The
    psutil objects returned check the identity again before each signal (psutil refuses a reused pid)."""
    out = []
    for pid, started in identities:
        try:
            p = psutil.Process(pid)
            if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out
