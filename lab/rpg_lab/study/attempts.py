"""A declared study's attempt log, ``attempts.csv`` beside its runs.csv: every start and end of the study's process,
so that each interruption and restart is on record (docs/study.md, Declared studies).

The log is append-only, one row per event: ``start`` when the process begins its runs, ``end`` when it returns or
is stopped (``how``: ``finished``, ``N runs not finished``, ``stopped by SIGTERM``, ``refused: ...``, ``error: ...``).
A process killed outright (SIGKILL, the machine lost) leaves a start without an end: ``summary`` says so. Appending
one short line per event keeps a second process's start (refused while the first holds the study) from overwriting
the first one's rows.
"""

from __future__ import annotations

import csv
import io
import os
import time
import uuid
from pathlib import Path

ATTEMPTS = "attempts.csv"
COLUMNS = ("time", "attempt", "event", "how", "code", "runs_done", "runs", "load_1m", "cpu_count", "command")
NO_END = "no end recorded (killed, or still running)"


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _append(path: Path, row: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    if new:
        writer.writeheader()
    writer.writerow({k: "" if row.get(k) is None else row[k] for k in COLUMNS})
    with open(path, "a", encoding="utf-8") as fh:  # one write of a few hundred bytes: O_APPEND keeps it whole
        fh.write(buf.getvalue())


def shown_command(command: str, cwd: str | None = None) -> str:
    """``command`` with each absolute path written relative to the folder it ran in (``cwd``, default the current
    one): the log is committed, and a machine's own layout does not belong in it."""
    import shlex

    here = cwd or os.getcwd()
    return shlex.join(os.path.relpath(w, here) if os.path.isabs(w) else w for w in shlex.split(command))


class Attempt:
    """One start of a declared study's process: ``begin`` appends its start row, ``end`` its end row."""

    def __init__(self, report_dir: Path, command: str, code: str | None, runs: int):
        self.path = Path(report_dir) / ATTEMPTS
        self.name = f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} pid {os.getpid()} {uuid.uuid4().hex[:6]}"
        self.command, self.code, self.runs = shown_command(command), code, runs

    def _row(self, event: str, how: str, done: int) -> dict:
        return {"time": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "attempt": self.name, "event": event,
                "how": how, "code": self.code, "runs_done": done, "runs": self.runs, "load_1m": _load(),
                "cpu_count": os.cpu_count(), "command": self.command}

    def begin(self, done: int) -> "Attempt":
        _append(self.path, self._row("start", "", done))
        return self

    def end(self, how: str, done: int) -> None:
        _append(self.path, self._row("end", how, done))


def read(path: Path) -> list[dict]:
    """The log's rows (empty when there is none); ValueError (one line) for a file that is not one."""
    path = Path(path)
    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path}: not an attempt log (columns {', '.join(reader.fieldnames or ())}; expected "
                             f"{', '.join(COLUMNS)})")
        return list(reader)


def summary(rows: list[dict]) -> list[dict]:
    """Per attempt, in order: its start and end times, how it ended (``NO_END`` without an end row), the runs
    finished at its start and at its end, and the gap since the previous attempt's end (seconds, None for the first
    or after one without an end)."""
    out: dict[str, dict] = {}
    for r in rows:
        a = out.setdefault(r["attempt"], {"attempt": r["attempt"], "start": None, "end": None, "how": NO_END,
                                          "done_start": None, "done_end": None, "code": r["code"]})
        if r["event"] == "start":
            a.update(start=r["time"], done_start=int(r["runs_done"]))
        else:
            a.update(end=r["time"], how=r["how"], done_end=int(r["runs_done"]))
    result, previous_end = [], None
    for a in out.values():
        a["gap_s"] = (None if previous_end is None or a["start"] is None
                      else time.mktime(time.strptime(a["start"], "%Y-%m-%d %H:%M:%S"))
                      - time.mktime(time.strptime(previous_end, "%Y-%m-%d %H:%M:%S")))
        previous_end = a["end"]
        result.append(a)
    return result
