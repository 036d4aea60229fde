"""What a trainer run of the harness leaves its caller: the ``TrainerRun`` record, the ``TrainerRunError`` a
failed, timed-out or stopped run raises, and a launcher's words about a run that did not finish.

A failed or timed-out run raises ``TrainerRunError`` with the log's tail. A run ended by SIGHUP, SIGINT or
SIGTERM to the launcher, or by an output that could not be written (a full disk), raises it with
``TrainerRun.stop_signal`` / ``TrainerRun.output_error`` set: ``report_failure`` prints the one stop line
(``report_stop``: log, last complete checkpoint, how to resume) and gives the exit code (128 + signum, 1), or
the driver's own line when it refused the config (exit 2). ``resume_decision`` picks the driver's resume line
out of the trainer's output for the launcher's terminal.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rpg.override_lists import values
from rpg.trainer_process.run_dir import default_checkpoint_dir


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
        path = default_checkpoint_dir(set_values["trainer.project_name"], set_values["trainer.experiment_name"])
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
    """Print ``harness_stop_line`` (to stderr; the terminal may be gone after SIGHUP) and append it to the log."""
    line = harness_stop_line(run, resume)
    with contextlib.suppress(OSError):  # nothing may be writable (a full disk)
        with open(run.log_file, "a") as log:
            log.write(line + "\n")
    with contextlib.suppress(OSError):
        print(f"{prefix} {line}", file=sys.stderr, flush=True)
    return line


def harness_stop_line(run: TrainerRun, resume: str) -> str:
    """The one line for a run ended by a stop signal or an unwritable output (a full disk): log, last complete
    checkpoint, and ``resume``: ``resume: `` and the resume command."""
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
