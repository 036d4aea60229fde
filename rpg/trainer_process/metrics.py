"""A run's metrics in its output directory: read, folded across resumes, checked.

An output directory is never wiped: each trainer start logs to the next free segment of ``metrics.jsonl``
(``rpg.metrics_log.history.claim_segment``), folded into ``metrics.jsonl`` when the run ends (``fold_segments``:
one record per step, in order; a restart at step s replaces what was logged after s; it returns the line
naming what a restart replaced). ``read_metrics`` reads the joined history as ``{step: merged data}``;
``history_notes`` names the training steps without metrics, a history that does not start at step 0, missing
validation steps (``rpg.metrics_log.history``). Those lines are ``TrainerRun.notes``.

Each file is read by ``rpg.metrics_log.file``'s rules (the reports' too), values kept as logged: a broken
line before the last, or any record that is not one, is a ``MetricsFileError`` naming the file and line,
never folded away (the fold leaves every file as it is); a cut last line is skipped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rpg.metrics_log import history
from rpg.metrics_log.file import records


def _read_one(path: Path) -> dict[str, dict[int, object]]:
    """One FileLogger file as {key: {step: value}} (``rpg.metrics_log.history``'s shape; values kept as logged)."""
    out: dict[str, dict[int, object]] = {}
    if not Path(path).exists():
        return out
    for _, step, data in records(path):  # a cut last line (being written, or cut by a kill) is skipped
        for key, value in data.items():
            out.setdefault(key, {})[step] = value
    return out


def _by_step(metrics: dict[str, dict[int, object]]) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for key, series in metrics.items():
        for step, value in series.items():
            out.setdefault(step, {})[key] = value
    return dict(sorted(out.items()))


def read_metrics(path: Path) -> dict[int, dict]:
    """verl's FileLogger JSONL at ``path`` and the segments later starts wrote next to it, joined
    (``rpg.metrics_log.history.join``: a restart at step s replaces what was logged after s), as
    {step: merged data}."""
    return _by_step(history.join([_read_one(p) for p in history.segments(Path(path)) or [Path(path)]]))


def fold_segments(path: Path) -> str | None:
    """Rewrite ``path`` as the joined history of its segments (one record per step, in order; written
    to a temporary file and renamed, then the later segments are removed: a fold interrupted
    anywhere folds again to the same result). Returns ``rpg.metrics_log.history.replaced_line``: which
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


def history_notes(metrics_file: Path, test_freq: int | None = None) -> list[str]:
    """``rpg.metrics_log.history.history_warnings`` on the run's metrics: lost training steps, a history
    that does not start at step 0, validation steps missing from the ``test_freq`` cadence (inferred
    when not given; a resume's own validation at its first step is not part of the cadence)."""
    joined = {}
    for step, data in read_metrics(metrics_file).items():
        for key, value in data.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                joined.setdefault(key, {})[step] = value
    return history.history_warnings(metrics_file, joined, test_freq)
