"""Build one verl parquet file from a preset (rpg.data.sources) and a local file or the hub.

Output: ``out`` (parquet, atomic; an existing directory or a path ending in ``/`` receives
``<dataset>.parquet``) and, when rows were rejected, ``<out stem>.rejects.jsonl`` with one
``{"index": i, ["line": l,] "reason": ...}`` per rejected input row (``line``: JSONL inputs); a stale
one is removed otherwise. The rejects file is written even when every row is rejected (then no
parquet is written and ``NoValidRows`` gives the counts per reason and the rejected rows). Neither
output may be the input file.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rpg.data.io import HubLoader, read_hub, read_local, write_parquet_atomic, write_text_atomic
from rpg.data.rows import Layout, Reject, build_rows, resolve_layout, select_problems
from rpg.data.sources import get_source


@dataclass
class Summary:
    dataset: str
    source: str
    out: str
    rows_read: int
    problems: int
    rows_written: int
    rejects: list[Reject] = field(default_factory=list)

    def line(self) -> str:
        """One summary line: rows read, written, rejected with reasons (and where they all are)."""
        where = f"; every rejected row in {rejects_path(Path(self.out))}" if self.rejects else ""
        return (
            f"{self.dataset}: read {self.rows_read} rows from {self.source}, wrote {self.rows_written} rows "
            f"({self.problems} problems) to {self.out}, rejected {len(self.rejects)} ({reason_counts(self.rejects)}){where}"
        )


class NoValidRows(ValueError):
    """Every input row was rejected: nothing written but the rejects file; ``summary`` holds the rejects."""

    def __init__(self, message: str, summary: Summary):
        super().__init__(message)
        self.summary = summary


def reason_class(reason: str) -> str:
    """Reason without row-specific detail, for the counts per reason."""
    if reason.startswith("duplicate of "):
        return "duplicate with a different answer" if "different answer" in reason else "duplicate"
    for prefix in ("invalid JSON", "invalid UTF-8", "lone surrogate"):
        if reason.startswith(prefix):
            return prefix
    return reason.split(" (")[0]


def reason_counts(rejects: list[Reject]) -> str:
    counts = Counter(reason_class(r.reason) for r in rejects)
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none"


def rejects_path(out: Path) -> Path:
    return out.with_name(out.stem + ".rejects.jsonl")


def prepare(
    dataset: str,
    out: str | Path,
    input_path: str | Path | None = None,
    hf_name: str | None = None,
    hf_config: str | None = None,
    hf_split: str | None = None,
    copies: int | None = None,
    data_source: str | None = None,
    problem_key: str | None = None,
    answer_key: str | None = None,
    hub_loader: HubLoader | None = None,
) -> Summary:
    """Read, check, deduplicate and write one dataset. Local ``input_path`` wins over the hub."""
    spec = get_source(dataset)
    if Path(out).is_dir() or str(out).endswith(("/", os.sep)):
        out = Path(out) / f"{dataset}.parquet"
    out = Path(out)
    if out.suffix != ".parquet":
        raise ValueError(f"--out must end in .parquet, got {str(out)!r}")
    rp = rejects_path(out)
    if input_path is not None:
        _check_not_the_input(out, rp, Path(input_path))
        records, columns, lines = read_local(input_path)
        source = str(input_path)
    else:
        name = hf_name or spec.hf_name
        records, columns = read_hub(name, hf_config or spec.hf_config, hf_split or spec.hf_split, hub_loader)
        source, lines = f"hf:{name}", None
    try:
        layout = resolve_layout(columns, spec.problem_keys, spec.answer_keys, problem_key, answer_key)
    except ValueError as err:
        if columns:
            raise ValueError(f"{source}: {err}") from None
        # no row is an object with keys (a JSONL of invalid lines, of lists, of strings): each row is
        # rejected with its own reason and line below
        layout = Layout("plain", problem_key or spec.problem_keys[0], answer_key or spec.answer_keys[0])
    problems, rejects, n_read = select_problems(records, layout, spec.english_only, lines)
    if not problems:
        if rejects:
            _write_rejects(rejects, rp)
        raise NoValidRows(
            f"{dataset}: no valid rows in {source} ({len(rejects)} rejected: {reason_counts(rejects)}); "
            f"nothing written" + (f"; every rejected row in {rp}" if rejects else ""),
            Summary(dataset, source, str(out), n_read, 0, 0, rejects))
    rows = build_rows(problems, data_source or spec.data_source, spec.split, spec.default_copies if copies is None else copies)
    write_parquet_atomic(rows, out)
    if rejects:
        _write_rejects(rejects, rp)
    elif rp.exists():
        rp.unlink()
    return Summary(dataset, source, str(out), n_read, len(problems), len(rows), rejects)


def _check_not_the_input(out: Path, rejects: Path, input_path: Path) -> None:
    """ValueError when writing ``out`` or its rejects file would replace the input file (the same
    directory entry, however spelled: ``os.replace`` replaces the entry, not a link's target)."""
    def same(a: Path, b: Path) -> bool:
        try:
            return a.name == b.name and os.path.samefile(a.parent, b.parent)
        except OSError:  # a directory that does not exist (yet) is not the input's
            return False

    if same(out, input_path):
        raise ValueError(f"{out} is both the input and the output file; write the output elsewhere")
    if same(rejects, input_path):
        raise ValueError(f"{rejects} (the rejects file of {out}) is the input file; write the output elsewhere")


def _write_rejects(rejects: list[Reject], path: Path) -> None:
    def record(r: Reject) -> dict:
        return {"index": r.index, **({"line": r.line} if r.line is not None else {}), "reason": r.reason}

    write_text_atomic("".join(json.dumps(record(r), ensure_ascii=False) + "\n" for r in rejects), path)
