"""Run verl's real trainer on the CPU backend in a subprocess and return its per-step metrics.

    from rpg.backends.cpu.harness import run_trainer
    run = run_trainer(overrides, output_dir=tmp_path)           # raises TrainerRunError on failure
    run.metrics[2]["training/global_step"]                       # step -> merged metrics dict

The subprocess is ``python -m verl.trainer.main_ppo`` (or any ``entry``: a module name or a
``.py`` path such as ``recipe/rpg/main_rpg.py``) with ``cpu_env()`` and ``cpu_overrides()`` from
settings.py, the caller's overrides appended (later values win), ``trainer.logger`` including
``file`` and ``VERL_FILE_LOGGER_PATH`` pointing at ``<output_dir>/metrics.jsonl``: verl's
FileLogger writes one JSON line ``{"step": s, "data": {...}}`` per ``logger.log`` call (the
validation before training is logged at step 0).

Clean-up: the trainer runs in its own session with a private Ray temp dir, so every process of
the run (driver, GCS, raylet, workers) is identifiable. After the run, whatever its outcome, any
of them still alive 30 s after the driver exited is terminated, and ``TrainerRun.leftover_pids``
lists them (empty
in a clean run). A failed or timed-out run raises ``TrainerRunError`` with the log's tail.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rpg.backends.cpu.settings import cpu_env, cpu_overrides, merge_overrides, override_key

DEFAULT_ENTRY = "verl.trainer.main_ppo"
METRICS_FILE = "metrics.jsonl"
LOG_FILE = "trainer.log"
PSS_EVERY_S = 10.0  # seconds between PSS samples (peak_pss_bytes); memory plateaus last far longer


class TrainerRunError(RuntimeError):
    """The trainer subprocess failed or timed out; the message ends with the log's tail."""

    def __init__(self, message: str, run: "TrainerRun"):
        super().__init__(message)
        self.run = run


@dataclass
class TrainerRun:
    returncode: int | None
    wall_time_s: float
    output_dir: Path
    log_file: Path
    metrics_file: Path
    command: list[str]
    metrics: dict[int, dict] = field(default_factory=dict)  # step -> merged metrics of that step
    peak_rss_bytes: int = 0  # max over time of the summed RSS of all processes of the run (counts shared pages repeatedly)
    peak_pss_bytes: int = 0  # max over time of the summed PSS (shared pages split between processes): the run's RAM
    peak_system_used_bytes: int = 0  # max over time of (MemTotal - MemAvailable) minus the value at start
    leftover_pids: list[int] = field(default_factory=list)  # run processes alive 30 s after the driver exited (then killed)
    timed_out: bool = False
    stopped: bool = False  # terminated because the caller's ``stop`` event was set

    @property
    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def series(self, key: str) -> list[tuple[int, float]]:
        """[(step, value)] for the steps that logged ``key``."""
        return [(s, d[key]) for s, d in sorted(self.metrics.items()) if key in d]

    def last_step(self) -> int:
        return max(self.metrics) if self.metrics else -1

    def val_keys(self, prefix: str = "val-core/") -> list[str]:
        return sorted({k for d in self.metrics.values() for k in d if k.startswith(prefix)})

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.splitlines()[-n:])


def read_metrics(path: Path) -> dict[int, dict]:
    """Parse verl's FileLogger JSONL into {step: merged data}."""
    out: dict[int, dict] = {}
    if not Path(path).exists():
        return out
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        out.setdefault(int(rec["step"]), {}).update(rec["data"])
    return out


def _entry_argv(entry: str) -> list[str]:
    """``-m module`` or an absolute script path (the run's cwd is its output directory)."""
    if not entry.endswith(".py"):
        return ["-m", entry]
    script = Path(entry).expanduser().resolve()
    if not script.is_file():
        raise ValueError(f"entry script not found: {entry!r} (resolved to {script})")
    return [str(script)]


def _with_file_logger(overrides: list[str]) -> list[str]:
    for ov in overrides:
        if override_key(ov) == "trainer.logger":
            if "file" not in ov.split("=", 1)[1]:
                raise ValueError(f"trainer.logger must include 'file' for the harness to read metrics, got {ov!r}")
            return overrides
    return overrides + ["trainer.logger=['console','file']"]


def build_command(
    overrides: Iterable[str] = (),
    entry: str = DEFAULT_ENTRY,
    extra_modules: Iterable[str] = (),
    base_env: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(argv, env) for a CPU run of ``entry`` with ``overrides`` (no process started)."""
    base_env = dict(os.environ if base_env is None else base_env)
    env = {**base_env, **cpu_env(extra_modules, base=base_env)}
    ov = _with_file_logger(merge_overrides(cpu_overrides(env), list(overrides)))
    return [sys.executable, *_entry_argv(entry), *ov], env


def run_trainer(
    overrides: Iterable[str] = (),
    *,
    output_dir: Path | str,
    entry: str = DEFAULT_ENTRY,
    extra_modules: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    timeout_s: float = 900.0,
    echo: bool = False,
    on_metrics: Callable[[int, dict], None] | None = None,
    on_line: Callable[[str], None] | None = None,
    check: bool = True,
    cwd: Path | str | None = None,
    reap_after_s: float = 30.0,
    stop: threading.Event | None = None,
) -> TrainerRun:
    """Run the trainer on CPU to completion and collect its metrics.

    Args:
        overrides: Hydra overrides appended after the CPU ones (later values win).
        output_dir: receives ``trainer.log``, ``metrics.jsonl`` and is the default cwd
            (so relative paths such as ``trainer.default_local_dir`` land there).
        entry: module name (``verl.trainer.main_ppo``) or script path (``recipe/rpg/main_rpg.py``).
        extra_modules: appended to VERL_USE_EXTERNAL_MODULES (loaded in every process).
        env: extra environment variables for the run.
        echo: copy the trainer's output to this process's stdout.
        on_metrics: called as ``on_metrics(step, data)`` for every new FileLogger record.
        on_line: called with every line of the trainer's output (from a reader thread).
        check: raise TrainerRunError on a non-zero exit or timeout.
        reap_after_s: processes of the run still alive this long after the driver exited are
            reported in ``leftover_pids`` and terminated.
        stop: when set (from another thread), the run is terminated and cleaned up like a timeout
            and raises TrainerRunError saying it was stopped (``TrainerRun.stopped``).
    """
    out = Path(output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    metrics_file, log_file = out / METRICS_FILE, out / LOG_FILE
    metrics_file.unlink(missing_ok=True)
    base = {**os.environ, **(env or {})}
    ray_tmp = tempfile.mkdtemp(prefix="rpgray")  # short: Ray's socket paths are length-limited
    argv, run_env = build_command(
        [*overrides, f"+ray_kwargs.ray_init._temp_dir={ray_tmp}"], entry, extra_modules, base
    )
    run_env["VERL_FILE_LOGGER_PATH"] = str(metrics_file)
    run_env["PYTHONUNBUFFERED"] = "1"

    run = TrainerRun(None, 0.0, out, log_file, metrics_file, argv)
    if stop is not None and stop.is_set():  # stopped before it started: start nothing
        shutil.rmtree(ray_tmp, ignore_errors=True)
        run.stopped = True
        raise TrainerRunError("trainer stopped by the caller before it started", run)
    t0 = time.time()
    restore = raise_on_sigterm()  # so that `finally` below also cleans up when we are terminated
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(
            argv, cwd=str(cwd or out), env=run_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        pump = threading.Thread(target=_pump, args=(proc.stdout, log, echo, t0, on_line), daemon=True)
        pump.start()
        monitor = _Monitor(proc.pid, ray_tmp, metrics_file, on_metrics)
        try:
            while proc.poll() is None:
                monitor.sample()
                if time.time() - t0 > timeout_s:
                    run.timed_out = True
                    break
                if stop is not None and stop.is_set():
                    run.stopped = True
                    break
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                _terminate_group(proc)
            pump.join(timeout=10)
            monitor.sample()
            run.leftover_pids = _cleanup(monitor.seen, ray_tmp, reap_after_s)
            shutil.rmtree(ray_tmp, ignore_errors=True)
            restore()
    run.returncode = proc.returncode
    run.wall_time_s = time.time() - t0
    run.metrics = read_metrics(metrics_file)
    run.peak_rss_bytes = monitor.peak_rss
    run.peak_pss_bytes = monitor.peak_pss
    run.peak_system_used_bytes = monitor.peak_sys
    if check and (run.timed_out or run.stopped or run.returncode != 0):
        why = (f"timed out after {timeout_s:.0f} s" if run.timed_out else "stopped by the caller" if run.stopped
               else f"exited with code {run.returncode}")
        raise TrainerRunError(f"trainer {why}; log: {log_file}\n--- last lines ---\n{run.tail()}", run)
    return run


def raise_on_sigterm() -> Callable[[], None]:
    """In the main thread, turn SIGTERM into SystemExit for the duration of a run."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _pump(stream, log, echo: bool, t0: float, on_line: Callable[[str], None] | None = None) -> None:
    """Copy the trainer's output to the log file, each line prefixed with the seconds since start."""
    for line in iter(stream.readline, b""):
        log.write(f"[{time.time() - t0:7.1f}s] ".encode() + line)
        log.flush()
        if echo:
            sys.stdout.write(line.decode(errors="replace"))
            sys.stdout.flush()
        if on_line is not None:
            on_line(line.decode(errors="replace"))


class _Monitor:
    """Samples memory of the run's processes and forwards new metric records."""

    def __init__(self, root_pid: int, ray_tmp: str, metrics_file: Path, on_metrics):
        import psutil

        self.psutil = psutil
        self.root_pid, self.ray_tmp = root_pid, ray_tmp
        self.metrics_file, self.on_metrics = metrics_file, on_metrics
        self.seen: set[int] = {root_pid}
        self.peak_rss = 0
        self.peak_pss = 0
        self._last_pss = 0.0
        self.sys0 = self._sys_used()
        self.peak_sys = 0
        self._offset = 0
        self._last_scan = 0.0

    def _sys_used(self) -> int:
        vm = self.psutil.virtual_memory()
        return int(vm.total - vm.available)

    def procs(self) -> list:
        ps = []
        try:
            root = self.psutil.Process(self.root_pid)
            ps = [root, *root.children(recursive=True)]
        except self.psutil.NoSuchProcess:
            pass
        if time.time() - self._last_scan > 5:  # Ray daemons may re-parent; find them by temp dir
            self._last_scan = time.time()
            ps += _procs_using(self.psutil, self.ray_tmp)
        return ps

    def sample(self) -> None:
        rss = pss = 0
        # PSS reads every mapping of every process (/proc/<pid>/smaps): ~20-40 ms per verl process,
        # 0.3-0.7 s of CPU for a run's ~19 processes, i.e. a third of a core if sampled every 2 s on a
        # 2-core machine. RSS (cheap) is sampled every 0.5 s, PSS every PSS_EVERY_S.
        with_pss = time.time() - self._last_pss > PSS_EVERY_S
        for p in {p.pid: p for p in self.procs()}.values():
            self.seen.add(p.pid)
            try:
                if with_pss:
                    info = p.memory_full_info()
                    rss, pss = rss + info.rss, pss + getattr(info, "pss", info.rss)
                else:
                    rss += p.memory_info().rss
            except (self.psutil.NoSuchProcess, self.psutil.AccessDenied):
                pass
        if with_pss:
            self._last_pss = time.time()
            self.peak_pss = max(self.peak_pss, pss)
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_sys = max(self.peak_sys, self._sys_used() - self.sys0)
        if self.on_metrics is not None and self.metrics_file.exists():
            with open(self.metrics_file, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1
            self._offset += end
            for line in chunk[:end].splitlines():
                if line.strip():
                    rec = json.loads(line)
                    self.on_metrics(int(rec["step"]), rec["data"])


def _procs_using(psutil, marker: str) -> list:
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(marker in a for a in (p.info["cmdline"] or [])):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def _terminate_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=15)


def _cleanup(seen: set[int], ray_tmp: str, grace_s: float = 30.0) -> list[int]:
    """Terminate processes of this run that outlived the driver by ``grace_s``; return their pids."""
    import psutil

    deadline = time.time() + grace_s  # a clean exit lets Ray stop its own daemons first
    while True:
        alive = [p for p in _alive(psutil, seen | {p.pid for p in _procs_using(psutil, ray_tmp)}) if p.pid != os.getpid()]
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


def _alive(psutil, pids: Iterable[int]) -> list:
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out
