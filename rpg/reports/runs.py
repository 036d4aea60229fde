"""The runs of a report's command line: ``[LABEL=]PATH`` arguments -> ``(label, metrics)``, nothing counted twice.

* A RUN argument is ``PATH`` or ``LABEL=PATH``; the label (default: the file stem or the directory's name)
  is the table row and legend name. Runs sharing a label given as ``LABEL=PATH`` are seeds of one method.
  Default labels are never merged: a run whose default label another run also has (every run folder
  holds ``metrics.jsonl``) is labelled by its folder (``a/metrics.jsonl`` -> ``a``; more of the folder's
  path where folders share a name too; the argument as written for two logs of one folder), and one
  warning line names the labels it got.
* A TensorBoard log folder in TensorBoard's layout (``LOGDIR/RUN/events.*``, any depth; verl's
  ``tensorboard_log/<project>/<experiment>``) holds several runs: as TensorBoard does, each folder with
  event files is a run named by its path under LOGDIR; ``LABEL=LOGDIR`` reads them as seeds of LABEL.
  One warning line names the runs and what they were read as.
* A log is read once: an argument that reads a file another argument reads (the same path written
  twice, ``./x.jsonl`` and ``x.jsonl``, a resume segment ``x.part2.jsonl`` next to its joined base
  ``x.jsonl``, an event file and its folder) is an error naming both, before any file is read.
* Identical metrics (every value at every step) under one label are an error: two seeds never log the
  same values, so it is one run given twice (a copy), and its row would be a mean over "seeds" with
  std 0. Under two labels they are a warning: the table shows one run's numbers twice, which a user
  may mean (the same baseline under two names) but rarely does.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from rpg.reports.logs import Metrics, log_files, read_run, run_name, tensorboard_runs


@dataclass(frozen=True)
class RunArg:
    label: str
    path: Path
    text: str  # how the user wrote it (for messages): the argument, and the run's name in a log folder
    named: bool = True  # the label was given (LABEL=PATH): runs sharing it are seeds of one method

    def reads(self) -> list[Path]:
        return log_files(self.path)


def _split(arg: str) -> tuple[str | None, Path]:
    """``LABEL=PATH`` -> (LABEL, PATH); ``PATH`` -> (None, PATH) (a path that exists, '=' and all, is a path)."""
    if "=" in arg and not Path(arg).exists():
        label, path = arg.split("=", 1)
        if not label:
            raise ValueError(f"empty label in run argument {arg!r}")
        return label, Path(path)
    return None, Path(arg)


def parse_run(arg: str) -> tuple[str, Path]:
    """(label, path) of one argument; the default label is the file stem or the directory's name."""
    label, path = _split(arg)
    return label or (path.name if path.is_dir() else path.stem), path


def run_args(args: list[str]) -> list[RunArg]:
    """The runs the arguments name: one per argument, or one per run of a TensorBoard log folder (with a
    warning naming them)."""
    out = []
    for arg in args:
        label, path = _split(arg)
        runs = tensorboard_runs(path) if path.is_dir() and not any(path.glob("*tfevents*")) else []
        if not runs:  # a file, a folder that is one run, or one read_run explains
            out.append(RunArg(label or parse_run(arg)[0], path, arg, named=label is not None))
            continue
        names = [run_name(path, r) for r in runs]
        what = (f"read as {len(runs)} seeds of {label}" if label else
                f"each is a run named by its folder (LABEL={arg} reads them as seeds of LABEL)")
        warnings.warn(f"{arg}: a TensorBoard log folder of {len(runs)} runs: {', '.join(names)}; {what}", stacklevel=2)
        out += [RunArg(label or name, r, f"{arg} (run {name})", named=label is not None) for name, r in zip(names, runs)]
    return out


def _folder_label(run: RunArg, depth: int) -> str:
    """The last ``depth`` parts of the run's folder: the file's folder, or the run's own folder."""
    path = run.path.resolve()
    folder = path if path.is_dir() else path.parent
    return "/".join(folder.parts[-depth:]).lstrip("/") or str(folder)


def tell_apart(runs: list[RunArg]) -> list[RunArg]:
    """The runs, each default label that another run also has replaced by the run's folder, with as many
    of the folder's parts as make the labels distinct (a warning names them); given labels are kept."""
    count: dict[str, int] = {}
    for run in runs:
        count[run.label] = count.get(run.label, 0) + 1
    clash = [i for i, run in enumerate(runs) if not run.named and count[run.label] > 1]
    if not clash:
        return runs
    kept = {run.label for i, run in enumerate(runs) if i not in clash}
    depth = dict.fromkeys(clash, 1)
    deepest = max(len(runs[i].path.resolve().parts) for i in clash)
    while True:
        label = {i: _folder_label(runs[i], depth[i]) if depth[i] <= deepest else runs[i].text for i in clash}
        seen = [*kept, *label.values()]
        dup = [i for i in clash if seen.count(label[i]) > 1]
        if not dup or all(depth[i] > deepest for i in dup):
            break
        for i in dup:  # more of the folder's path; past its root, the argument as written
            depth[i] += 1
    if dup:
        raise ValueError(f"cannot tell apart the runs {', '.join(runs[i].text for i in dup)}: label each as METHOD=PATH")
    labels = [label[i] for i in clash]
    out = list(runs)
    for i, label in zip(clash, labels):
        out[i] = RunArg(label, runs[i].path, runs[i].text, named=False)
    shared = ", ".join(repr(label) for label in dict.fromkeys(runs[i].label for i in clash))
    names = ", ".join(f"{runs[i].text} as {label!r}" for i, label in zip(clash, labels))
    warnings.warn(f"runs without a label share the default label {shared}: different runs, not seeds of one method; "
                  f"each labelled by its folder: {names} (METHOD=PATH labels runs as seeds of METHOD)", stacklevel=2)
    return out


def check_once(runs: list[RunArg]) -> None:
    """ValueError when two arguments read one file (see the module docstring)."""
    seen: dict[Path, RunArg] = {}
    for run in runs:
        for f in run.reads():
            first = seen.setdefault(f, run)
            if first is run:
                continue
            own = {first.path.resolve(), run.path.resolve()}
            joined = " (its resume segments are joined)" if f.suffix == ".jsonl" and own != {f} else ""
            raise ValueError(f"{run.text} reads {f}, as {first.text} does{joined}: give each log once")


def _fingerprint(metrics: Metrics) -> tuple:
    """Every value at every step, comparable (NaN equal to NaN: ``repr``)."""
    return tuple(sorted((k, tuple(sorted((s, repr(v)) for s, v in series.items()))) for k, series in metrics.items()))


def load_runs(args: list[str]) -> list[tuple[str, Metrics]]:
    """``(label, metrics)`` per run; warnings printed as ``warning: ...`` lines on stderr; ValueError /
    FileNotFoundError (one line) for a run that cannot be read, a file read twice or a copy under one label."""
    runs, seen = [], {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        entries = run_args(args)
        check_once(entries)
        entries = tell_apart(entries)
        for run in entries:
            metrics = read_run(run.path)
            first = seen.setdefault(_fingerprint(metrics), run)
            if first is not run:
                same = f"{run.text} holds the same metrics as {first.text} (every value at every step)"
                if first.label == run.label:
                    raise ValueError(f"{same}: one run given twice counts as two seeds (std 0); give it once")
                warnings.warn(f"{same}: one run under two labels?", stacklevel=2)
            runs.append((run.label, metrics))
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    return runs
