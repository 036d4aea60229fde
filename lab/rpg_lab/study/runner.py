"""Run the grid resumably through the same path as ``RPG_BACKEND=cpu``, printing progress.

Each run lives in ``<out>/runs/<run id>/`` (``metrics.jsonl``, ``trainer.log`` from the harness)
with ``run.json`` written last: ``status`` ``done`` (with wall time and measured step/validation
time) or ``failed`` (with the error's last line), the overrides as launched, the run's identity
(``rpg_lab.study.identity``: its settings, wherever its folders are), its code (commit and uncommitted changes) and torch
threads per process. A run whose ``run.json`` says ``done`` with the same identity, code and threads is not
repeated; one with the same identity made by other code or threads stops the start (``OtherRunsError``, one line)
unless ``rerun_other`` redoes it; a failed run is repeated only with ``retry_failed``; anything else
(interrupted, never started, settings changed since) runs from scratch: a folder with a ``run.json`` is first
moved to ``<out>/stale/`` (``rpg_lab.study.records``; never deleted), one without (an interrupted run) is removed.

One study per ``out`` at a time: ``run_grid`` holds ``<out>/.study.lock`` (an exclusive ``flock``) from
before it removes anything until it returns; a second study on the same ``out`` is refused with one line
(``StudyBusyError``) and touches nothing. (A run's own folder is locked by the harness only once its
trainer starts, after the folder was wiped for it: that lock alone let two studies remove each other's
runs.)
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path

from rpg.metrics_log.file import MetricsFileError, records, short
from rpg_lab.study.grid import Costs, RunSpec, fmt_duration, save_json, speedup
from rpg.override_lists import values
from rpg.run_record import code_state, ran_on
from rpg_lab.study.records import RUN_RECORD, move_aside, records_now, run_dir, run_env, survey, threads_of

STUDY_LOCK = ".study.lock"


class StudyBusyError(RuntimeError):
    """Another study holds the output directory (one line)."""


class OtherRunsError(RuntimeError):
    """Finished runs in the output directory were made by other code or threads (one line: ``Survey.refusal``)."""


def lock_study(out: Path):
    """The exclusive lock of a study on ``out`` (an open file: close it to release); StudyBusyError when
    another study holds it. The kernel releases it when the process ends, however it ends."""
    import fcntl

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fh = open(out / STUDY_LOCK, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise StudyBusyError(f"--out {out} is in use by another study (python -m rpg_lab.study); wait for it to end "
                             "or choose another --out") from None
    return fh


def _timing(metrics_file: Path) -> tuple[float, float, int]:
    """(summed timing_s/step, summed timing_s/testing, validations) from verl's file logger (none: zeros), read
    by ``rpg.metrics_log.file``'s rules (a cut last line is skipped). A line that is not a record, or a timing
    that is not a number of seconds (``null``: verl logged NaN or inf), is a ``MetricsFileError`` naming the
    file and line: a sum that skipped it would understate the run's cost."""
    step = val = 0.0
    vals = 0
    for n, _, data in records(metrics_file) if metrics_file.is_file() else ():
        step += _seconds(data, "timing_s/step", f"{metrics_file}:{n}")
        if "timing_s/testing" in data:
            val += _seconds(data, "timing_s/testing", f"{metrics_file}:{n}")
            vals += 1
    return step, val, vals


def _seconds(data: dict, key: str, where: str) -> float:
    """``data[key]`` (0 when absent) as seconds, else ``MetricsFileError`` starting ``where``."""
    value = data.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MetricsFileError(f"{where}: {key} must be a number of seconds, got {short(value)}")
    return float(value)


def machine_load() -> list[float] | None:
    """The machine's load averages over 1, 5 and 15 minutes (``os.getloadavg``), or None where there are none:
    a run's record holds them at its start and end, with ``cpu_count``, so that load is never an unseen condition."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


class Progress:
    """One line per training step and validation of every running run, with elapsed time and the grid's ETA.

    Thread-safe: with ``jobs`` > 1 several runs report at once. The ETA is the estimated cost of the
    runs not started plus what is left of the running ones, converted to ``jobs`` at a time.
    """

    def __init__(self, total_runs: int, costs: Costs, todo: list[RunSpec], jobs: int = 1, stream=None):
        self.total, self.costs, self.jobs, self.stream = total_runs, costs, jobs, stream
        self.queued: list[RunSpec] = list(todo)
        self.running: dict[str, tuple[RunSpec, int]] = {}  # run id -> (spec, last step reported)
        self.watches: dict[str, RunWatch] = {}  # running runs, for the concurrency each one experiences
        self.lock = threading.Lock()
        self.t0 = time.time()

    @property
    def remaining_s(self) -> float:
        return self.costs.grid_s(self.queued, self.jobs)

    def say(self, text: str) -> None:
        with self.lock:
            print(f"[study {time.strftime('%H:%M:%S')}] {text}", file=self.stream or sys.stdout, flush=True)

    def _tick(self) -> None:
        """(Under the lock) add (runs running) x (time since the last change) to every running run's area."""
        now = time.time()
        for w in self.watches.values():
            w.run_area += len(self.watches) * (now - w.last_change)
            w.last_change = now

    def start(self, index: int, spec: RunSpec) -> "RunWatch":
        watch = RunWatch(self, f"{index}/{self.total} {spec.label} k={spec.updates} seed {spec.seed}", spec)
        with self.lock:
            if spec in self.queued:
                self.queued.remove(spec)
            self.running[spec.run_id] = (spec, -1)
            self._tick()
            self.watches[spec.run_id] = watch
        return watch

    def finish(self, spec: RunSpec) -> None:
        with self.lock:
            self._tick()
            self.running.pop(spec.run_id, None)
            self.watches.pop(spec.run_id, None)

    def eta_s(self) -> float:
        """Estimated seconds left in the grid (queued runs + the rest of the running ones, ``jobs`` at a time)."""
        c = self.costs
        with self.lock:
            left = sum(c.run_s(s) for s in self.queued) + sum(c.remaining_s(sp, st) for sp, st in self.running.values())
            n_left = len(self.queued) + len(self.running)
        return left * speedup(c.jobs) / c.jobs / speedup(max(1, min(self.jobs, n_left)))


class RunWatch:
    """One running run: forwards its metric records to the progress line and keeps their arrival times."""

    def __init__(self, progress: Progress, tag: str, spec: RunSpec):
        self.progress, self.tag, self.spec = progress, tag, spec
        self.t_run = self.last_change = time.time()
        self.run_area = 0.0  # integral over the run's life of the number of runs running (itself included)
        self.arrivals: dict[int, float] = {}  # step -> seconds since the run started, when its record appeared

    def on_metrics(self, step: int, data: dict) -> None:
        p = self.progress
        self.arrivals.setdefault(step, time.time() - self.t_run)
        with p.lock:
            p.running[self.spec.run_id] = (self.spec, step)
        val = next((v for k, v in data.items() if k.startswith("val-core/") and "/acc/mean@" in k), None)
        parts = []
        if "critic/score/mean" in data:
            parts.append(f"reward {float(data['critic/score/mean']):+.3f}")
        if "actor/ppo_kl" in data:
            parts.append(f"kl(old,new) {float(data['actor/ppo_kl']):.1e}")
        if val is not None:
            parts.append(f"val acc {float(val):.3f}")
        if parts:
            elapsed = time.time() - p.t0
            p.say(f"{self.tag}: step {step}/{self.spec.sizes.steps}  {'  '.join(parts)}  "
                  f"(run {fmt_duration(time.time() - self.t_run)}, grid {fmt_duration(elapsed)} of "
                  f"~{fmt_duration(elapsed + p.eta_s())})")

    def concurrency(self) -> float:
        """Mean number of runs running (itself included) over this run's life so far."""
        with self.progress.lock:
            self.progress._tick()
            return self.run_area / max(1e-9, time.time() - self.t_run)

    def train_wall_s(self, fallback: float) -> float:
        """Wall time from the first record (validation before training) to the last: steps + validations + overhead."""
        a = self.arrivals
        return max(a.values()) - min(a.values()) if len(a) > 1 else fallback


def _failure(message: str) -> str:
    """Why the trainer failed (the harness's first line: exit code, timeout, signal) and the log's last line:
    ``exited with code 1: ValueError: loss is nan``; ``timed out after 1800 s: <the stop line>``."""
    lines = [ln for ln in message.splitlines() if ln.strip()]
    if not lines:
        return message[-400:]
    why = lines[0].split("; log: ")[0].removeprefix("trainer ")
    return (why if len(lines) == 1 else f"{why}: {lines[-1]}")[:400]


def run_grid(specs: list[RunSpec], out: Path, costs: Costs, *, retry_failed: bool = False, timeout_s: float = 1800.0,
             jobs: int = 1, stream=None, rerun_other: bool = False, outputs: tuple[Path, ...] = (),
             recorded: dict[str, dict] | None = None, keep_codes: tuple[str, ...] = ()) -> list[dict]:
    """Run every spec that is not finished, ``jobs`` at a time; returns the records of all specs.

    Runs start in grid order. An interrupt (Ctrl-C, SIGTERM, SIGHUP) or an unexpected error stops every
    running trainer (its processes are cleaned up by the harness) and leaves no record for it, so
    that the next call runs it again; finished runs keep their records. StudyBusyError (nothing touched)
    when another study runs on ``out``; OtherRunsError (nothing touched) when a finished run there was made by other
    code or threads and ``rerun_other`` is off. ``outputs``: the study's folders besides ``out`` (its report), which
    are no code (``rpg.run_record.code_state``). ``recorded``, ``keep_codes``: a declared study's finished runs.csv rows
    whose folders are gone, kept as recorded (``rpg_lab.study.records``); their records are ``recorded_record``'s.
    """
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    out = Path(out)
    study_lock = lock_study(out)  # before anything is read, wiped or run
    try:
        return _run_grid_locked(specs, out, costs, retry_failed, timeout_s, jobs, stream, rerun_other,
                                (out, *outputs), recorded or {}, keep_codes)
    finally:
        study_lock.close()


def _run_grid_locked(specs: list[RunSpec], out: Path, costs: Costs, retry_failed: bool, timeout_s: float, jobs: int,
                     stream, rerun_other: bool, outputs: tuple[Path, ...], recorded: dict[str, dict],
                     keep_codes: tuple[str, ...]) -> list[dict]:
    from rpg.stop_signals import raise_on_stop_signals

    found = survey(specs, out, retry_failed, rerun_other, outputs, recorded, keep_codes)
    if refusal := found.refusal():
        raise OtherRunsError(refusal)
    todo = [(specs[i], found.overrides[i], found.identities[i]) for i in found.todo]
    progress = Progress(len(specs), costs, [s for s, _, _ in todo], jobs, stream)
    progress.say(found.line(costs, jobs))
    for i, (spec, st) in enumerate(zip(specs, found.states)):
        if not found.runs(i):
            where = "its runs.csv row; no folder in --out" if st.startswith("recorded") else run_dir(out, spec)
            progress.say(f"skip {spec.label} k={spec.updates} seed {spec.seed}: {st} ({where})")
    for i in found.aside:
        spec = specs[i]
        why = {"done": "finished", "failed": "failed"}.get(found.before[i], f"{RUN_RECORD} unreadable")
        why += {"stale": ", settings changed", "other": f", {found.others[i]}"}.get(found.states[i], "")
        progress.say(f"moved {run_dir(out, spec)} ({why}) to {move_aside(out, spec)}")
    stop = threading.Event()
    restore = raise_on_stop_signals()
    try:
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="study-run") as pool:
            futures = []
            try:
                for spec, overrides, ident in todo:
                    futures.append(pool.submit(_run_one, spec, overrides, ident, specs.index(spec) + 1, out, progress,
                                               timeout_s, stop, outputs))
                finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
                for f in finished:
                    f.result()  # the first unexpected error (a failed trainer is a record, not an error)
            except BaseException:
                stop.set()  # every running trainer is terminated; queued runs do not start
                for f in futures:
                    f.cancel()
                wait(futures)
                raise
    finally:
        restore()
    return [rec or {"run_id": s.run_id, "status": "todo"} for s, rec in zip(specs, records_now(out, specs, recorded))]


def _run_one(spec: RunSpec, overrides: list[str], ident: list, index: int, out: Path, progress: Progress,
             timeout_s: float, stop: threading.Event, outputs: tuple[Path, ...]) -> None:
    """Run one spec through the CPU harness and write its ``run.json`` (not when it was stopped).

    An unexpected error sets ``stop`` before it propagates, so that no queued run starts after it.
    """
    try:
        _run_one_unguarded(spec, overrides, ident, index, out, progress, timeout_s, stop, outputs)
    except BaseException:
        stop.set()
        raise


def _run_one_unguarded(spec: RunSpec, overrides: list[str], ident: list, index: int, out: Path, progress: Progress,
                       timeout_s: float, stop: threading.Event, outputs: tuple[Path, ...]) -> None:
    from rpg import trainer_process as harness
    from rpg.paths.checkout import CHECKOUT, RECIPE_ENTRY

    if stop.is_set():
        return
    total = progress.total
    d = run_dir(out, spec)
    if (d / RUN_RECORD).exists():  # (moved at the start; a record is never deleted)
        progress.say(f"moved {d} to {move_aside(out, spec)}")
    elif d.exists():
        shutil.rmtree(d)  # interrupted (no record): start afresh
    d.mkdir(parents=True)
    progress.say(f"start {index}/{total} {spec.label} k={spec.updates} seed {spec.seed} -> {d}")
    env = run_env(spec, overrides)  # SmolLM2's threads
    record = {"run_id": spec.run_id, "variant": spec.variant, "label": spec.label, "updates": spec.updates,
              "seed": spec.seed, "steps": spec.sizes.steps, "validations": spec.sizes.validations,
              "val_before": spec.sizes.val_before, "model": spec.model,
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), **code_state(outputs), "threads": threads_of(env),
              "overrides": overrides, "identity": ident}
    record.update(cpu_count=os.cpu_count(), load_start=machine_load(),
                  ran_on=ran_on(values(overrides).get("actor_rollout_ref.model.path"), {**os.environ, **env}))
    watch = progress.start(index, spec)
    t0 = time.time()
    run = None
    try:
        run = harness.run_trainer(overrides, output_dir=d, entry=str(CHECKOUT / RECIPE_ENTRY), timeout_s=timeout_s,
                                  on_metrics=watch.on_metrics, stop=stop, env=env)
        step_s, val_s, _ = _timing(run.metrics_file)
        # runs at a time as this run experienced it (a lone last run of a --jobs 2 grid is 1, not 2)
        overlap = watch.concurrency()
        record.update(jobs=max(1, round(overlap)), concurrency=round(overlap, 2), status="done", wall_time_s=round(run.wall_time_s, 1), step_time_s=round(step_s, 1),
                      val_time_s=round(val_s, 1), train_wall_s=round(watch.train_wall_s(step_s + val_s), 1),
                      last_step=run.last_step(), leftover_pids=run.leftover_pids)
        if run.last_step() < spec.sizes.steps:  # a clean exit short of the design's steps is no finished run
            record.update(status="failed", error=f"the trainer exited with code 0 after step {run.last_step()} of "
                                                 f"{spec.sizes.steps}")
    except harness.TrainerRunError as err:
        if err.run.stopped:
            progress.say(f"stopped {index}/{total} {spec.label} k={spec.updates} seed {spec.seed} (no record: it runs "
                         "again next time)")
            return
        record.update(status="failed", wall_time_s=round(time.time() - t0, 1),
                      last_step=err.run.last_step(), error=_failure(str(err)))
    except MetricsFileError as err:  # its metrics.jsonl cannot be read (one line, file:line first): not usable
        record.update(status="failed", wall_time_s=round(time.time() - t0, 1),
                      last_step=run.last_step() if run is not None else -1, error=str(err)[:400])
    finally:
        progress.finish(spec)
    record["load_end"] = machine_load()
    save_json(d / RUN_RECORD, record)
    progress.say(f"{record['status']} {index}/{total} {spec.label} k={spec.updates} seed {spec.seed} "
                 f"in {fmt_duration(record['wall_time_s'])}" + (f": {record['error']}" if "error" in record else ""))
