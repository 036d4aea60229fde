"""Read a run's scalar metrics from verl's file logger (JSONL), a W&B CSV export or TensorBoard.

All readers return ``{metric_name: {step: value}}`` with int steps and float values *as logged*:
NaN and ±inf are kept (tables show ``nan`` / ``inf`` / ``-inf``, figures leave those points out
and say so) and ``read_run`` names every such value in one warning line. Nothing is rewritten.

* verl file logger (``trainer.logger=[...,'file']``, verl/utils/tracking.py ``FileLogger``): one
  line per step, ``{"step": s, "data": {"val-core/aime2024/acc/mean@32": ..., ...}}``, read by the
  rules of ``rpg.metrics_log.file`` (the harness reads its runs by them too): a flat
  ``{"step": s, key: value, ...}`` line is accepted too; a truncated *last* line (run killed while
  writing) is skipped with a warning. A W&B run history exported as JSONL reads the same way: a record's
  step is its first step key (``rpg.metrics_log.file.STEP_KEYS``, the CSV reader's step columns: ``_step``
  ...), W&B's own keys (``_runtime``, ``_timestamp``) are not metrics. Any other unparsable line, a record
  without a step, a step that is not an integer below 2**63 in size is an error naming the file and
  line. verl writes with orjson,
  which turns NaN and ±inf into ``null``: a ``null`` value is read as NaN (and named so in the warning).
* W&B CSV export: a step column (``STEP_KEYS``: ``_step``, ``Step``, ``step``, ``global_step`` or
  ``trainer/global_step``) plus one column per metric; an empty cell is "not logged at this step".
  Panel exports prefix columns with ``"<run name> - "``; the prefix is removed and
  ``__MIN``/``__MAX`` columns are ignored. One run per file: several run prefixes are an error, and so
  are identical column headers (a panel export of two runs with one display name, e.g. a resumed run).
* TensorBoard: an event file or a directory of event files (verl's ``tensorboard`` logger writes
  scalars with ``add_scalar(key, value, step)``), read with TensorBoard's ``EventAccumulator``,
  which returns every event, also those a restarted writer logged again (torch's writer logs no
  restart marker for it to purge on).

A step logged twice *within one file* (JSONL lines, CSV rows; TensorBoard: a key with two events at
a step, e.g. after a restart) is reported in one warning line naming the lines and every value
that differs; the later value is kept. A value that is not a number, of a key logged as a number
elsewhere in the file, and a CSV row with values but no step are named in one warning line each
(not read). A ``.jsonl`` path also reads the segments that resumed runs wrote next to it and joins
them (a later segment legitimately replaces the steps redone after a resume; one warning line names
those steps and the values logged again at the restart step); every run's history is checked for
a missing start and gaps in the validation steps (warnings; ``rpg.metrics_log.history``). A file that
is not UTF-8 is an error naming it.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import sys
import warnings
from pathlib import Path

from rpg.metrics_log.history import history_warnings, read_segments, segments
from rpg.metrics_log.file import STEP_KEYS, records, step_of, utf8_text

Metrics = dict[str, dict[int, float]]

_WANDB_SKIP = {"_runtime", "_timestamp", "_wall_time", "Wall time", "_wandb"}  # W&B's own, not metrics


_NULL = object()  # a JSON null value in the file logger (orjson's NaN / ±inf)
_FLOAT_MAX_INT = int(sys.float_info.max)


def _num(value) -> float | None:
    """A logged value as a float (NaN and ±inf kept), or None for a non-numeric one."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):  # a JSON integer beyond a float's range (float() would raise OverflowError)
        return float(value) if abs(value) <= _FLOAT_MAX_INT else (math.inf if value > 0 else -math.inf)
    if isinstance(value, float):
        return value
    if isinstance(value, str) and value.strip():
        try:
            return float(value)
        except ValueError:
            return None
    return None


def same_value(a: float, b: float) -> bool:
    """Equal, NaN counting as equal to NaN (a value logged twice unchanged)."""
    return a == b or (math.isnan(a) and math.isnan(b))


class _Reader:
    """Collects one file's metrics and says, one warning line each: the steps recorded twice (with
    the values that differ), the values that are not numbers, the rows without a step, and the
    NaN / ±inf values (JSON nulls read as NaN named so).

    ``records``: the file is made of records holding several keys (JSONL lines, CSV rows), each
    named by its ``line``; else (TensorBoard) every value is its own event and a step counts as
    logged twice only when a key has two values there.
    """

    def __init__(self, path: Path, records: bool = True):
        self.path, self.records, self.metrics, self.nulls = path, records, {}, set()
        self._lines: dict[int, list[int | None]] = {}  # step -> lines of its records
        self._where: dict[tuple[str, int], int | None] = {}  # (key, step) -> line of the value kept
        self.twice: set[int] = set()  # steps with a key logged twice (TensorBoard)
        self.differ: list[tuple[str, int, float, int | None, float, int | None]] = []
        self.unread: list[tuple[str, int, object, int | None]] = []
        self.stepless: list[int] = []

    def record(self, step: int, items, line: int | None = None) -> None:
        """One record (JSONL line, CSV row, TensorBoard event) of ``(key, value)`` pairs at ``step``."""
        self._lines.setdefault(step, []).append(line)
        for key, value in items:
            if value is _NULL:
                v = math.nan
                self.nulls.add((key, step))
            else:
                v = _num(value)
            if v is None:
                if value is not None and value != "":  # not logged at this step: no value, an empty CSV cell
                    self.unread.append((key, step, value, line))
                continue
            series = self.metrics.setdefault(key, {})
            if step in series:
                self.twice.add(step)
                if not same_value(series[step], v):
                    self.differ.append((key, step, series[step], self._where[(key, step)], v, line))
            series[step] = v
            self._where[(key, step)] = line

    def done(self) -> Metrics:
        for line in (self._twice_line(), self._stepless_line(), self._unread_line(),
                     nonfinite_warning(self.path, self.metrics, self.nulls)):
            if line:
                warnings.warn(line, stacklevel=3)
        return self.metrics

    def _twice_line(self, show: int = 8) -> str | None:
        if self.records:
            steps = {s: lines for s, lines in self._lines.items() if len(lines) > 1}
            listed = ", ".join(f"{s} (lines {', '.join(map(str, lines))})" for s, lines in sorted(steps.items()))
            head = f"{self.path}: steps logged more than once in this file: {listed}"
        else:
            steps = self.twice
            head = f"{self.path}: steps logged more than once: {', '.join(map(str, sorted(steps)))}"
        if not steps:
            return None
        if not self.differ:
            return head + "; no value differs"

        def at(line):
            return "" if line is None else f" (line {line})"

        pairs = [f"{k} at step {s}: {a!r}{at(la)}, {b!r}{at(lb)}" for k, s, a, la, b, lb in self.differ]
        more = f", ... {len(pairs) - show} more" if len(pairs) > show else ""
        return f"{head}; values that differ (the later is kept): {', '.join(pairs[:show])}{more}"

    def _stepless_line(self, show: int = 8) -> str | None:
        if not self.stepless:
            return None
        more = f", ... {len(self.stepless) - show} more" if len(self.stepless) > show else ""
        return f"{self.path}: rows without a step not read: line {', '.join(map(str, self.stepless[:show]))}{more}"

    def _unread_line(self, show: int = 8) -> str | None:
        """The values that are not numbers, of keys logged as numbers elsewhere in the file (a key that
        is never a number, e.g. a text column, is not a metric)."""
        bad = [(k, s, v, line) for k, s, v, line in self.unread if k in self.metrics]
        if not bad:
            return None
        listed = ", ".join(f"{k} at step {s} ({'' if line is None else f'line {line}: '}{v!r:.40})"
                           for k, s, v, line in bad[:show])
        more = f", ... {len(bad) - show} more" if len(bad) > show else ""
        return f"{self.path}: {len(bad)} values that are not numbers not read: {listed}{more}"


def nonfinite_warning(path, metrics: Metrics, nulls=frozenset(), show: int = 8) -> str | None:
    """One line naming the NaN / ±inf values of a file (key, step, value), in step order."""
    bad = sorted(((s, k, v) for k, series in metrics.items() for s, v in series.items() if not math.isfinite(v)),
                 key=lambda t: (t[0], t[1]))
    if not bad:
        return None

    def one(s, k, v):
        what = ("null: verl's file logger writes NaN and ±inf as null; read as nan" if (k, s) in nulls
                else "nan" if math.isnan(v) else f"{v:g}")
        return f"{k} at step {s} ({what})"

    listed = ", ".join(one(*t) for t in bad[:show]) + (f", ... {len(bad) - show} more" if len(bad) > show else "")
    return (f"{path}: {len(bad)} non-finite values kept as logged (tables show nan/inf/-inf, figures leave them "
            f"out): {listed}")


def read_file_logger(path: str | Path) -> Metrics:
    """One file-logger JSONL file (``rpg.metrics_log.file.records``), its values read as numbers."""
    path = Path(path)
    reader = _Reader(path)

    def cut(line: int, why: str) -> None:
        warnings.warn(f"{path}:{line}: skipping truncated last line ({why})", stacklevel=4)

    for line, step, data in records(path, cut):
        reader.record(step, ((k, _NULL if v is None else v) for k, v in data.items() if k not in _WANDB_SKIP), line)
    return reader.done()


def read_wandb_csv(path: str | Path) -> Metrics:
    path = Path(path)
    with io.StringIO(utf8_text(path), newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        same_header(path, header)
        step_col = next((c for c in STEP_KEYS if c in header), None)
        if step_col is None:
            raise ValueError(f"{path}: no step column; expected one of {list(STEP_KEYS)}, got {header}")
        columns: dict[str, str] = {}
        prefixes = set()
        for col in header:
            if col == step_col or col in _WANDB_SKIP or col.endswith(("__MIN", "__MAX")):
                continue
            name = col
            if " - " in col:
                prefix, name = col.split(" - ", 1)
                prefixes.add(prefix)
            columns[col] = name
        if len(prefixes) > 1:
            raise ValueError(f"{path}: several runs in one export {sorted(prefixes)}; export one run per file")
        if len(set(columns.values())) != len(columns):
            dup = sorted({n for n in columns.values() if list(columns.values()).count(n) > 1})
            raise ValueError(f"{path}: metrics {dup} appear in several columns")
        out = _Reader(path)
        for row in reader:
            n = reader.line_num  # the file line (csv skips blank lines; a quoted cell may span lines)
            if _num(row.get(step_col)) is None:
                if any(row.get(col) not in (None, "") for col in columns):
                    out.stepless.append(n)
                continue
            step = step_of(row[step_col], f"{path}:{n}", cell=True)
            out.record(step, ((name, row.get(col)) for col, name in columns.items()), n)
    return out.done()


def same_header(path: Path, header: list[str]) -> None:
    """ValueError naming the identical column headers of a CSV file (``csv.DictReader`` keeps the last
    of them, so the values of the others would be dropped without a word)."""
    columns: dict[str, list[int]] = {}
    for i, col in enumerate(header, 1):
        columns.setdefault(col, []).append(i)
    same = [f"{col!r} (columns {', '.join(map(str, at))})" for col, at in columns.items() if len(at) > 1]
    if same:
        raise ValueError(f"{path}: identical column headers: {', '.join(same)}: csv keeps one of them; a W&B panel "
                         "export names its columns by run display name (two runs of one name: a resumed run?): "
                         "export each run on its own")


def read_tensorboard(path: str | Path) -> Metrics:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    reader = _Reader(Path(path), records=False)
    for tag in tags.get("scalars", []):
        for ev in acc.Scalars(tag):
            reader.record(int(ev.step), [(tag, float(ev.value))])
    for tag in tags.get("tensors", []):
        for ev in acc.Tensors(tag):
            arr = tensor_util.make_ndarray(ev.tensor_proto)
            if arr.size == 1 and arr.dtype.kind in "fiu":
                reader.record(int(ev.step), [(tag, float(arr.reshape(())))])
    return reader.done()


def tensorboard_runs(logdir: str | Path) -> list[Path]:
    """The folders under ``logdir`` (at any depth, not ``logdir`` itself) that hold TensorBoard event files:
    the runs of TensorBoard's ``--logdir`` layout ``LOGDIR/RUN/events.*`` (an event file's name holds
    ``tfevents``, tensorboard's ``io_wrapper.IsTensorFlowEventsFile``), in the order of their names."""
    logdir = Path(logdir)
    found = [Path(folder) for folder, _, files in os.walk(logdir)
             if Path(folder) != logdir and any("tfevents" in f for f in files)]
    return sorted(found, key=lambda run: run_name(logdir, run))


def run_name(logdir: Path, run: Path) -> str:
    """A run's name in a log folder, as TensorBoard names it: its path under the folder."""
    return run.relative_to(logdir).as_posix()


def log_files(path: str | Path) -> list[Path]:
    """The files ``read_run(path)`` reads, resolved: a ``.jsonl`` file and its resume segments, a
    folder's event files, or the file itself."""
    path = Path(path)
    if path.is_dir():
        files = [p for p in path.iterdir() if "tfevents" in p.name and p.is_file()]
    elif path.suffix == ".jsonl":
        files = segments(path) or [path]
    else:
        files = [path]
    return sorted(p.resolve() for p in files)


def read_run(path: str | Path) -> Metrics:
    """Dispatch on the path: ``*.jsonl`` file logger, ``*.csv`` W&B export, event file or directory -> TensorBoard."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"run log not found: {path}")
    notes: list[str] = []
    if path.is_dir() or "tfevents" in path.name:
        if path.is_dir() and not any(path.glob("*tfevents*")):
            if runs := tensorboard_runs(path):
                names = ", ".join(run_name(path, r) for r in runs)
                raise ValueError(f"{path}: a TensorBoard log folder of {len(runs)} runs ({names}), not one run: "
                                 f"pass one ({runs[0]}); python -m rpg.reports reads each as a run")
            logs = sorted(p.name for p in path.iterdir() if p.suffix in (".jsonl", ".csv") and p.is_file()
                          and not re.search(r"\.part\d+\.jsonl$", p.name))
            hint = (f"; it holds {', '.join(logs)}: pass {'that file' if len(logs) == 1 else 'one of those files'} "
                    "(its .partN.jsonl segments are joined)") if logs else ""
            raise ValueError(f"{path}: directory holds no TensorBoard event files{hint}")
        metrics = read_tensorboard(path)
        if path.is_dir() and (runs := tensorboard_runs(path)):  # TensorBoard reads them as runs beside this one
            notes.append(f"{path}: its sub-folders hold TensorBoard runs of their own, not read with it: "
                         f"{', '.join(run_name(path, r) for r in runs)}; pass each as a run to report it")
    elif path.suffix == ".jsonl":  # + the segments written after resumes (rpg.metrics_log.history)
        metrics, notes = read_segments(path, read_file_logger)
    elif path.suffix == ".csv":
        metrics = read_wandb_csv(path)
    else:
        raise ValueError(f"{path}: unknown log format ({path.suffix or 'no suffix'}); read are: .jsonl (verl's file "
                         "logger, or a W&B run history exported one JSON object per line), .csv (a W&B run-history "
                         "or panel export) and TensorBoard event files or folders; export the W&B history as CSV "
                         "or JSONL")
    if not metrics:
        raise ValueError(f"{path}: no numeric metrics found")
    for line in notes + history_warnings(path, metrics):
        warnings.warn(line, stacklevel=2)
    return metrics


def val_metrics(metrics: Metrics, section: str = "val-core") -> set[str]:
    """Metric names logged as ``{section}/<data_source>/<metric>`` (e.g. ``acc/mean@32``)."""
    out = set()
    for key in metrics:
        parts = key.split("/", 2)
        if len(parts) == 3 and parts[0] == section and parts[1]:
            out.add(parts[2])
    return out


def check_metric(runs: list[tuple[str, Metrics]], metric: str | set[str]) -> None:
    """ValueError naming the ``--metric`` to use when a run logs validation but not ``metric`` (or
    none of a set of metrics, e.g. a table's per-benchmark defaults).

    The authors' evaluation layout (32 copies of each problem, ``val_kwargs.n=1``) makes verl log
    ``acc/mean@1`` (whose value is mean@32); our layout (one row per problem, ``n=32``) logs
    ``acc/mean@32``. A run with no validation keys at all passes (its panels/cells stay empty).
    """
    wanted = {metric} if isinstance(metric, str) else set(metric)
    metric = " or ".join(sorted(wanted))
    for label, metrics in runs:
        have = val_metrics(metrics)
        if not have or wanted & have:
            continue
        means = sorted((m for m in have if re.fullmatch(r"acc/mean@\d+", m)), key=lambda m: int(m.rsplit("@", 1)[1]))
        if "acc/mean@1" in have and metric.endswith("mean@32"):
            hint = ("it holds acc/mean@1: the authors' layout (32 copies per problem, val_kwargs.n=1, "
                    "whose mean@1 is mean@32); use --metric acc/mean@1")
        elif means:
            hint = f"use --metric {means[-1]} (validation metrics logged: {', '.join(means)})"
        else:
            hint = f"validation metrics logged: {', '.join(sorted(have)[:8])}"
        raise ValueError(f"run {label!r} has no val-core/<data_source>/{metric}; {hint}")
