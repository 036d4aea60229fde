"""Read a run's scalar metrics from verl's file logger (JSONL), a W&B CSV export or TensorBoard.

All readers return ``{metric_name: {step: value}}`` with int steps and finite float values.

* verl file logger (``trainer.logger=[...,'file']``, verl/utils/tracking.py ``FileLogger``): one
  line per step, ``{"step": s, "data": {"val-core/aime2024/acc/mean@32": ..., ...}}``. A flat
  ``{"step": s, key: value, ...}`` line is accepted too. A truncated *last* line (run killed while
  writing) is skipped with a warning; any other unparsable line is an error.
* W&B CSV export: a step column (``_step``, ``Step``, ``step``, ``global_step`` or
  ``trainer/global_step``) plus one column per metric. Panel exports prefix columns with
  ``"<run name> - "``; the prefix is removed and ``__MIN``/``__MAX`` columns are ignored. One run per
  file: several run prefixes are an error.
* TensorBoard: an event file or a directory of event files (verl's ``tensorboard`` logger writes
  scalars with ``add_scalar(key, value, step)``).

When a step is logged twice, the later value wins. A ``.jsonl`` path also reads the segments that
resumed runs wrote next to it and joins them; every run's history is checked for a missing start
and gaps in the validation steps (warnings; ``rpg.reports.history``).
"""

from __future__ import annotations

import csv
import json
import math
import re
import warnings
from pathlib import Path

from rpg.reports.history import history_warnings, read_segments

Metrics = dict[str, dict[int, float]]

_STEP_COLUMNS = ("_step", "Step", "step", "global_step", "trainer/global_step")
_WANDB_SKIP = {"_runtime", "_timestamp", "_wall_time", "Wall time"}


def _num(value) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        v = float(value)
    elif isinstance(value, str) and value.strip():
        try:
            v = float(value)
        except ValueError:
            return None
    else:
        return None
    return v if math.isfinite(v) else None


def _put(metrics: Metrics, key: str, step: int, value) -> None:
    v = _num(value)
    if v is not None:
        metrics.setdefault(key, {})[step] = v


def _step(value, where: str) -> int:
    v = _num(value)
    if v is None or v != int(v):
        raise ValueError(f"{where}: step must be an integer, got {value!r}")
    return int(v)


def read_file_logger(path: str | Path) -> Metrics:
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    metrics: Metrics = {}
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            if i == last:
                warnings.warn(f"{path}:{i + 1}: skipping truncated last line ({err.msg})", stacklevel=2)
                continue
            raise ValueError(f"{path}:{i + 1}: not a JSON line ({err.msg})") from None
        if not isinstance(obj, dict) or "step" not in obj:
            raise ValueError(f"{path}:{i + 1}: expected an object with a 'step' key")
        step = _step(obj["step"], f"{path}:{i + 1}")
        data = obj["data"] if isinstance(obj.get("data"), dict) else {k: v for k, v in obj.items() if k != "step"}
        for key, value in data.items():
            _put(metrics, key, step, value)
    return metrics


def read_wandb_csv(path: str | Path) -> Metrics:
    path = Path(path)
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        step_col = next((c for c in _STEP_COLUMNS if c in header), None)
        if step_col is None:
            raise ValueError(f"{path}: no step column; expected one of {list(_STEP_COLUMNS)}, got {header}")
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
        metrics: Metrics = {}
        for n, row in enumerate(reader, start=2):
            if _num(row.get(step_col)) is None:
                continue
            step = _step(row[step_col], f"{path}:{n}")
            for col, name in columns.items():
                _put(metrics, name, step, row.get(col))
    return metrics


def read_tensorboard(path: str | Path) -> Metrics:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    metrics: Metrics = {}
    for tag in tags.get("scalars", []):
        for ev in acc.Scalars(tag):
            _put(metrics, tag, int(ev.step), ev.value)
    for tag in tags.get("tensors", []):
        for ev in acc.Tensors(tag):
            arr = tensor_util.make_ndarray(ev.tensor_proto)
            if arr.size == 1 and arr.dtype.kind in "fiu":
                _put(metrics, tag, int(ev.step), float(arr.reshape(())))
    return metrics


def read_run(path: str | Path) -> Metrics:
    """Dispatch on the path: ``*.jsonl`` file logger, ``*.csv`` W&B export, event file or directory -> TensorBoard."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"run log not found: {path}")
    notes: list[str] = []
    if path.is_dir() or "tfevents" in path.name:
        if path.is_dir() and not any(path.glob("*tfevents*")):
            raise ValueError(f"{path}: directory holds no TensorBoard event files")
        metrics = read_tensorboard(path)
    elif path.suffix == ".jsonl":  # + the segments written after resumes (rpg.reports.history)
        metrics, notes = read_segments(path, read_file_logger)
    elif path.suffix == ".csv":
        metrics = read_wandb_csv(path)
    else:
        raise ValueError(f"{path}: unknown log format; expected .jsonl (verl file logger), .csv (W&B) or TensorBoard events")
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
