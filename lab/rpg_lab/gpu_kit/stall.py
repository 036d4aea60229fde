"""Where a GPU kit step was when it ran out of time: its processes' Python stacks, Ray's logs, vLLM's last phase.

* ``hook_env``: a step's environment with ``stack_hook/`` first on PYTHONPATH, whose ``sitecustomize`` makes every
  Python process of the step (the driver, Ray's workers, vLLM's engine core and workers) register ``faulthandler``
  for SIGUSR1 into ``<stacks folder>/<pid>.txt``; ``PYTHONFAULTHANDLER`` dumps them on a crash too.
* ``before_stop``: called by ``rpg_lab.gpu_kit.run`` before it stops a step's process group (its box ended, or the kit
  was stopped): SIGUSR1 to each process of the step (its descendants and its process group) that registered and
  still catches it, the dumps gathered into ``OUT/<step>.<run id>.stacks.txt``; the Ray session folders those
  processes name (``--session-dir``, ``--session_dir`` ...) have their logs (raylet, GCS, each worker's stdout and
  stderr: vLLM's server, engine core and workers print there) copied into ``OUT/<step>.<run id>.ray/``.
* ``sample`` and ``gather`` (the kit's ``--sample-stacks SECONDS``): while a step runs, every SECONDS each of its
  processes that registered is asked for its stacks, after a line ``# kit sample at N s`` in its file; when the step
  ends, passed or not, the files with a sample are gathered into ``OUT/<step>.<run id>.samples.txt``: where a slow
  phase of a step that passed spent its time.
* ``phases``: the vLLM start-up phases a step's logs show, in the order vLLM reaches them (``PHASES``), each with
  its first line and, from a trainer log's ``[  125.4s]`` prefix, when; ``last`` is the furthest reached.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

STACKS_ENV = "RPG_GPU_KIT_STACKS"
HOOK_DIR = Path(__file__).with_name("stack_hook")
STACKS_S = 5.0  # the end of a box kept for the dumps and the copies
RAY_LOG_CAP_BYTES = 2**20  # each Ray log copied: its first 256 KiB and its end
RAY_LOGS_CAP_BYTES = 24 * 2**20  # all of them
RAY_LOG_NAMES = ("raylet.out", "raylet.err", "gcs_server.out", "gcs_server.err", "worker-*.out", "worker-*.err",
                 "python-core-driver-*.log")
SESSION = re.compile(r"(/[^\s'\"=]*/session_\d[^/\s'\"]*)")

# (phase, pattern): vLLM 0.24's INFO lines (logged when VLLM_LOGGING_LEVEL=INFO reaches its processes) and the
# smoke run's own (rpg_lab.demo.gpu_smoke's progress; verl's console metrics)
PHASES = (
    # vLLM's server, about to start its engine core process (a WARNING: logged at verl's WARN level too), or the
    # engine core's own lines
    ("engine spawned", re.compile(r"We must use the `spawn` multiprocessing start method|EngineCore(?:_DP\d+)? pid=|"
                                  r"Initializing a V1 LLM engine|Waiting for init message from front-end")),
    ("weights loaded", re.compile(r"Loading weights took|Model loading took")),
    ("compile started", re.compile(r"Start compiling function|Dynamo bytecode transform time|Compiling a graph for")),
    ("compile ended", re.compile(r"torch\.compile (?:takes?|and initial profiling/warmup run together took) "
                                 r"[\d.]+ s in total")),  # vLLM before 0.24; 0.24 (monitor.py)
    ("KV cache allocated", re.compile(r"GPU KV cache size:|Available KV cache memory")),
    ("graphs captured", re.compile(r"Graph capturing finished")),
    ("engine ready", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
    # the validation before training, or the first step: vLLM generated
    ("first request served", re.compile(r"validation before training: acc|\[gpu-smoke\] step +1/|val-core/")),
)
ELAPSED = re.compile(r"^\[\s*([\d.]+)s\]")


def hook_env(env: dict[str, str], stacks: Path) -> dict[str, str]:
    """``env`` with the stack hook on PYTHONPATH (first) and its folder ``stacks`` (created here)."""
    stacks.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(p for p in (str(HOOK_DIR), env.get("PYTHONPATH")) if p)
    return {**env, "PYTHONPATH": path, STACKS_ENV: str(stacks), "PYTHONFAULTHANDLER": "1"}


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, pgrp, session) of a live process, None when gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else (int(fields[1]), int(fields[2]), int(fields[3]))


def step_processes(root: int) -> list[int]:
    """The live processes of the step whose process (and group, and session) is ``root``: its descendants, and what
    is left in its group or session (a child whose parent exited)."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdecimal() and (s := _stat(int(entry.name))) is not None:
            stats[int(entry.name)] = s
    found = {root} if root in stats else set()
    found |= {pid for pid, (_, pgrp, sid) in stats.items() if root in (pgrp, sid)}
    grew = True
    while grew:
        more = {pid for pid, (ppid, _, _) in stats.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return sorted(found)


def _catches_sigusr1(pid: int) -> bool:
    """The process has a handler for SIGUSR1 (/proc's SigCgt mask): signalled otherwise, it would end."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGUSR1 - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _ask(pid: int, stacks: Path, mark: str) -> tuple[Path, int] | None:
    """SIGUSR1 to ``pid`` when it registered in ``stacks`` and catches it, after the line ``mark`` in its file (opened
    for appending by it and by this): (its file, its size before the dump), or None when not asked (not registered,
    gone, its file unwritable)."""
    file = stacks / f"{pid}.txt"
    if not (file.is_file() and _catches_sigusr1(pid)):
        return None
    try:
        with open(file, "a") as f:
            f.write(f"{mark}\n")
        size = file.stat().st_size
        os.kill(pid, signal.SIGUSR1)
    except OSError:  # ProcessLookupError among them
        return None
    return file, size


def dump_stacks(pids: list[int], stacks: Path, dest: Path, wait_s: float = STACKS_S) -> dict:
    """SIGUSR1 to each of ``pids`` that registered in ``stacks`` and catches it; their dumps gathered into ``dest``
    (each headed by the process's command line now: vLLM names its processes ``VLLM::EngineCore`` ...)."""
    asked = {}
    for pid in pids:
        # after the samples' marks (--sample-stacks), this dump's own
        if (asked_at := _ask(pid, stacks, STOP_MARK)) is not None:
            asked[pid] = (*asked_at, _cmdline(pid))
    deadline = time.monotonic() + wait_s
    while asked and time.monotonic() < deadline and any(f.stat().st_size <= n for f, n, _ in asked.values()):
        time.sleep(0.1)
    time.sleep(0.2)  # a dump still being written
    dumped = [pid for pid, (f, n, _) in asked.items() if f.stat().st_size > n]
    if asked:
        with open(dest, "w") as out:
            for pid, (f, _, cmd) in asked.items():
                out.write(f"===== pid {pid}: {cmd[:1000]}\n{f.read_text(errors='replace')}\n")
    return {"stacks": dest.name if asked else None, "processes": len(pids), "asked": len(asked),
            "dumped": len(dumped)}


SAMPLE_MARK = "# kit sample at"
STOP_MARK = "# kit dump before the stop"


def sample(root: int, stacks: Path, at_s: float) -> int:
    """SIGUSR1 to each process of the step whose process is ``root`` that registered in ``stacks`` and catches it,
    after the line ``# kit sample at <at_s> s`` in its file (opened for appending by it and by this); how many were
    asked. The handler writes at once, in the process: nothing is waited for."""
    return sum(_ask(pid, stacks, f"{SAMPLE_MARK} {at_s:.0f} s") is not None for pid in step_processes(root))


def gather(stacks: Path, dest: Path) -> int:
    """Every process file in ``stacks`` with a sample, into ``dest`` (each headed by its pid); how many."""
    files = sorted((f for f in stacks.glob("*.txt") if SAMPLE_MARK in f.read_text(errors="replace")),
                   key=lambda f: int(f.stem) if f.stem.isdigit() else 0)
    if files:
        with open(dest, "w") as out:
            for f in files:
                out.write(f"===== pid {f.stem}\n{f.read_text(errors='replace')}\n")
    return len(files)


def ray_sessions(pids: list[int]) -> list[Path]:
    """The Ray session folders the command lines of ``pids`` name (Ray's raylet, GCS and workers pass theirs)."""
    found = set()
    for pid in pids:
        for m in SESSION.finditer(_cmdline(pid)):
            if Path(m.group(1), "logs").is_dir():
                found.add(Path(m.group(1)))
    return sorted(found)


def _capped(src: Path, limit: int) -> bytes:
    size = src.stat().st_size
    with open(src, "rb") as f:
        if size <= limit:
            return f.read()
        head = f.read(limit // 4)
        f.seek(size - (limit - limit // 4))
        return head + b"\n[... cut by rpg_lab.gpu_kit.stall ...]\n" + f.read()


def copy_ray_logs(sessions: list[Path], dest: Path) -> dict:
    """Each session's logs named in ``RAY_LOG_NAMES`` into ``dest`` (a session's own subfolder when there are
    several), each capped, until ``RAY_LOGS_CAP_BYTES``; what was left out is counted."""
    copied, left, total = 0, 0, 0
    for session in sessions:
        target = dest / session.name if len(sessions) > 1 else dest
        files = sorted({p for name in RAY_LOG_NAMES for p in (session / "logs").glob(name) if p.is_file()})
        for src in files:
            data = _capped(src, RAY_LOG_CAP_BYTES)
            if total + len(data) > RAY_LOGS_CAP_BYTES:
                left += 1
                continue
            target.mkdir(parents=True, exist_ok=True)
            (target / src.name).write_bytes(data)
            copied, total = copied + 1, total + len(data)
    return {"ray_logs": dest.name if copied else None, "ray_sessions": [str(s) for s in sessions],
            "ray_logs_copied": copied, "ray_logs_left_out": left}


def before_stop(pid: int, stacks: Path, out: Path, stem: str, wait_s: float = STACKS_S) -> dict:
    """Before the kit stops the step whose process is ``pid``: its stacks into ``out/<stem>.stacks.txt`` (waiting
    at most ``wait_s`` for them), its Ray logs into ``out/<stem>.ray/``. Never raises: what failed is named in the
    result."""
    try:
        pids = step_processes(pid)
        found = dump_stacks(pids, stacks, out / f"{stem}.stacks.txt", wait_s)
        found.update(copy_ray_logs(ray_sessions(pids), out / f"{stem}.ray"))
        return found
    except Exception as e:  # noqa: BLE001 - the step is stopped whatever this finds
        return {"problem": f"{type(e).__name__}: {e}"}


def phases(paths: list[Path]) -> dict:
    """The phases of ``PHASES`` that lines of ``paths`` show: {"reached": [{phase, line, at_s}], "last": name}."""
    first: dict[str, dict] = {}
    for path in paths:
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            for name, pattern in PHASES:
                if name not in first and pattern.search(line):
                    at = ELAPSED.match(line)
                    first[name] = {"phase": name, "line": line.strip()[:300],
                                   "at_s": float(at.group(1)) if at else None, "log": path.name}
    reached = [first[name] for name, _ in PHASES if name in first]
    return {"reached": reached, "last": reached[-1]["phase"] if reached else None}
