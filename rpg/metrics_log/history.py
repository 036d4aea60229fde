"""A run's metrics history across resumes: one file-logger segment per trainer start, joined on read.

verl 0.9.1's ``FileLogger`` opens its JSONL with ``"wb"``: a run restarted with
``trainer.resume_mode=auto`` (every launch script) would truncate the history and a report would
take Best over the resumed part only. verl is not patched; its public ``VERL_FILE_LOGGER_PATH``
variable (read when verl's ``Tracking`` is built, at the start of ``fit``) is set per segment:

* writer (``rpg.verl.main.RPGTaskRunner`` before ``fit``, via ``claim_segment``): the base path —
  ``VERL_FILE_LOGGER_PATH`` if the user set it, else verl's ``<VERL_FILE_LOGGER_ROOT or .>/
  <project>/<experiment>.jsonl`` — when it is absent or empty, else the first absent or empty
  ``<experiment>.part2.jsonl``, ``.part3.jsonl``, ...;
* reader (``rpg.reports.logs.read_run`` on the base path, via ``read_segments``): segments in
  order; a segment whose first step is ``s`` replaces what earlier segments logged after ``s``
  (the steps redone after the last checkpoint, or a restarted run) and is merged key by key at
  ``s`` (a resume's validation at the checkpoint step joins the training metrics logged there);
  ``replaced_line`` names every step and value so replaced.

``history_warnings`` checks any run (JSONL, W&B, TensorBoard): one line when the history does not
start at step 0 (Best would cover a part of the run only), one line listing training steps without
metrics (verl saves a step's checkpoint before it logs the step: a run stopped in between and
resumed never logs that step) and one line listing the gaps in the validation steps (``val-*`` /
``val/*`` keys). ``replaced_line`` says which steps and values a restart replaced (the CPU harness folds the
segments of its output directory into one file with it, ``rpg.trainer_process``).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from rpg.metrics_log.file import readable_records

Metrics = dict[str, dict[int, float]]

PATH_ENV, ROOT_ENV = "VERL_FILE_LOGGER_PATH", "VERL_FILE_LOGGER_ROOT"
VALIDATION_PREFIXES = ("val-", "val/")
TRAINING_STEP_KEY = "training/global_step"  # verl logs it with every training step's metrics


def logs_to_file(loggers) -> bool:
    """Whether ``trainer.logger`` (a string or a list, as Hydra gives it) includes verl's file logger."""
    return "file" in ([loggers] if isinstance(loggers, str) else list(loggers or ()))


def base_path(project: str, experiment: str, environ: Mapping[str, str] = os.environ) -> Path:
    """Where verl's FileLogger writes (verl/utils/tracking.py ``FileLogger.__init__``)."""
    if environ.get(PATH_ENV):
        return Path(environ[PATH_ENV])
    return Path(os.path.expanduser(environ.get(ROOT_ENV, "."))) / project / f"{experiment}.jsonl"


def segment_path(base: Path, n: int) -> Path:
    """Segment ``n`` (1-based) of the history whose first segment is ``base``."""
    return base if n == 1 else base.with_name(f"{base.stem}.part{n}{base.suffix}")


def _segment_number(base: Path, path: Path) -> int | None:
    if path == base:
        return 1
    m = re.fullmatch(re.escape(base.stem) + r"\.part(\d+)" + re.escape(base.suffix), path.name)
    return int(m.group(1)) if m and int(m.group(1)) >= 2 else None


def segments(base: Path) -> list[Path]:
    """Existing segments of ``base``, in order."""
    base = Path(base)
    if not base.parent.is_dir():
        return []
    found = [(n, p) for p in base.parent.iterdir() if p.is_file() and (n := _segment_number(base, p))]
    return [p for _, p in sorted(found)]


def claim_segment(base: Path) -> Path:
    """The path the next trainer start logs to: the first segment that is absent or empty."""
    n = 1
    while (p := segment_path(Path(base), n)).exists() and p.stat().st_size > 0:
        n += 1
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def join(parts: list[Metrics]) -> Metrics:
    """Join segments in order (see the module docstring)."""
    joined: Metrics = {}
    for part in parts:
        steps = [s for series in part.values() for s in series]
        if not steps:
            continue
        start = min(steps)
        for series in joined.values():
            for s in [s for s in series if s > start]:
                del series[s]
        for key, series in part.items():
            joined.setdefault(key, {}).update(series)
    return {k: dict(sorted(v.items())) for k, v in joined.items() if v}


def restarts(parts: list[Metrics]) -> list[tuple[int, list[int], list[tuple[str, float, float]]]]:
    """For each segment after the first that logged anything: (its first step, the steps of the
    segments before it that ``join`` drops, i.e. logged after that step before the restart, and the
    ``(key, earlier, new)`` values it logged again at its first step with another value)."""
    out, joined = [], {}
    for part in parts:
        steps = {s for series in part.values() for s in series}
        if not steps:
            continue
        start = min(steps)
        if joined:
            later = sorted({s for series in joined.values() for s in series if s > start})
            again = [(k, joined[k][start], series[start]) for k, series in sorted(part.items())
                     if start in series and start in joined.get(k, {})
                     and not _same(joined[k][start], series[start])]
            out.append((start, later, again))
        joined = join([joined, part])
    return out


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)  # NaN logged again is not another value


SHOW_AGAIN = 3  # values named per restart step; a validation step re-logs ~50 keys, the rest are counted


def replaced_line(name: str | Path, parts: list[Metrics]) -> str | None:
    """One line naming the steps whose earlier records a restart replaced (re-run) or dropped (not re-run
    yet), and the values logged again at a restart step with another value (the first ``SHOW_AGAIN`` by
    name, the others counted); None when no record was replaced."""
    latest = {s for series in join(parts).values() for s in series}
    said = []
    for start, steps, again in restarts(parts):
        rerun, dropped = [s for s in steps if s in latest], [s for s in steps if s not in latest]
        what = [f"{w} {_ranges(xs)}" for w, xs in (("re-ran", rerun), ("dropped (not re-run yet)", dropped)) if xs]
        if again:
            what = [", ".join(what)] if what else []
            shown = ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in again[:SHOW_AGAIN])
            more = f" and {len(again) - SHOW_AGAIN} more values" if len(again) > SHOW_AGAIN else ""
            what.append(f"logged again at step {start}: {shown}{more}")
        if what:
            said.append(f"restart at step {start}: " + "; ".join(what))
    if not said:
        return None
    return (f"{name}: earlier records replaced by the resumed run ({'; '.join(said)}): those steps were trained "
            "after the checkpoint the run resumed from")


def _ranges(steps: list[int]) -> str:
    """[1, 2, 3, 7] -> 'steps 1-3, 7'."""
    runs: list[list[int]] = []
    for s in sorted(steps):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return "steps " + ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def read_segments(base: Path, read_one) -> tuple[Metrics, list[str]]:
    """``read_one`` on every segment of ``base``, joined; plus a note when there were several, naming the
    restart steps and the segments without a readable record (a start that ended before it logged a step,
    or whose only line was cut off)."""
    paths = segments(base) or [Path(base)]
    parts = [read_one(p) for p in paths]
    notes = []
    if len(paths) > 1:
        starts = [start for start, _, _ in restarts(parts)]
        said = f" (restarted at steps {', '.join(map(str, starts))})" if starts else ""
        empty = [p.name for p, m in zip(paths, parts) if not m]
        if empty:
            said += f"; no readable record in {', '.join(empty)} (a start that ended before it logged a step)"
        notes.append(f"{base}: joined {len(paths)} log segments{said}")
        if (line := replaced_line(base, parts)) is not None:
            notes.append(line)
    return join(parts), notes


def validation_steps(metrics: Metrics) -> list[int]:
    return sorted({s for k, series in metrics.items() if k.startswith(VALIDATION_PREFIXES) for s in series})


def history_warnings(name: str | Path, metrics: Metrics, interval: int | None = None) -> list[str]:
    """One line if the history starts after step 1 (steps 1 to it missing); one line listing the training steps without
    metrics (``TRAINING_STEP_KEY`` missing between the first step, at least 1, and the last training
    step); one line listing gaps in the validation steps.

    ``interval``: the run's ``trainer.test_freq`` when the caller knows it (the CPU harness): a gap is
    then a multiple of it, up to the last training step, without validation metrics. A resumed run
    also validates where it resumed and verl at the final step; those extra steps are no evidence of
    the interval. Otherwise the interval is inferred: the most common spacing of consecutive
    validation steps (ties: the smaller; the last spacing is left out of the vote, verl also
    validates at the final step), and a gap is a spacing larger than that.
    """
    out = []
    steps = [s for series in metrics.values() for s in series]
    # a run logs step 0 only when it validates before training (trainer.val_before_train) and every training step
    # from 1 on; a resumed run logs from its checkpoint's step: a log from step 1 on is a whole run
    if steps and min(steps) > 1:
        first = min(steps)
        out.append(f"{name}: the log starts at step {first}, not 0: steps before {first} are missing (a resumed "
                   f"run whose earlier history was overwritten?); Best and curves cover steps >= {first} only")
    trained = sorted(metrics.get(TRAINING_STEP_KEY, {}))
    if trained:
        lost = sorted(set(range(max(1, min(steps)), trained[-1] + 1)) - set(trained))
        if lost:
            out.append(f"{name}: no training metrics for {_ranges(lost)} (a run stopped after a checkpoint was "
                       "saved and before that step's metrics were logged, then resumed after it?)")
    val = validation_steps(metrics)
    if interval is not None and interval > 0:
        last = trained[-1] if trained else max(steps, default=0)
        missing = [s for s in range(interval, last + 1, interval) if s >= min(steps) and s not in set(val)]
        if missing:
            out.append(f"{name}: no validation metrics at step{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
                       f"(trainer.test_freq={interval}); "
                       "a lost log segment? Best covers the logged steps only")
        return out
    diffs = [b - a for a, b in zip(val, val[1:])]
    vote = diffs[:-1] if len(diffs) > 1 else diffs
    if vote:
        counts = Counter(vote)
        interval = min(d for d in counts if counts[d] == max(counts.values()))
        gaps = [(a, b) for a, b in zip(val, val[1:]) if b - a > interval]
        if gaps:
            listed = ", ".join(f"{a} -> {b}" for a, b in gaps)
            out.append(f"{name}: gaps in the validation steps (every {interval} steps elsewhere): {listed}; "
                       "a lost log segment? Best covers the logged steps only")
    return out


# ----------------------------------------------------------------------------- a step saved but never logged
STEP_RECORD = "rpg_step_metrics.json"  # in a checkpoint folder: the step's metrics when it was saved


def write_step_record(folder: str | os.PathLike, step: int, metrics: Mapping) -> Path:
    """Keep step ``step``'s metrics known at its checkpoint (the training metrics: verl saves a step before it
    validates and logs it) in the checkpoint ``folder``, as one FileLogger record ``{"step", "data"}``; numbers
    only. ``restore_step_record`` logs it when the run stopped before the step's own record was written."""
    import json
    import numbers

    data = {k: float(v) for k, v in metrics.items() if isinstance(v, numbers.Real) and not isinstance(v, bool)}
    data[TRAINING_STEP_KEY] = float(step)
    path = Path(folder) / STEP_RECORD
    path.write_text(json.dumps({"step": step, "data": data}) + "\n")
    return path


def logged_training_steps(base: Path) -> set[int]:
    """The steps with a training record in any segment of the history at ``base`` (``rpg.metrics_log.file``;
    what is not a record is skipped: the readers report it)."""
    steps = set()
    for path in segments(base):
        steps |= {step for step, data in readable_records(path)[0] if TRAINING_STEP_KEY in data}
    return steps


def restore_step_record(base: Path, folder: str | os.PathLike | None) -> str | None:
    """Before a resume from checkpoint ``folder`` logs anything: if its step has no training record in the
    history at ``base`` (the run stopped after saving the step and before logging it: a lost node, a crash in the
    validation that follows the save), log the step's saved record (``write_step_record``) as a segment of its
    own, so that the history has every trained step. Returns the note to print, or None."""
    record = Path(folder) / STEP_RECORD if folder else None
    if record is None or not record.is_file():
        return None
    import json

    step = json.loads(record.read_text()).get("step")
    if not isinstance(step, int) or step in logged_training_steps(base):
        return None
    target = claim_segment(base)
    target.write_text(record.read_text())
    return (f"step {step} was saved but its metrics were never logged (the run stopped between its checkpoint and "
            f"its log): its training metrics, kept with the checkpoint, are logged to {target}")
