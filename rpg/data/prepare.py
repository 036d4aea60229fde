"""Build one verl parquet file from a preset (rpg.data.hub_datasets) and a local file or the hub.

Output: ``out`` (parquet, atomic; an existing directory or a path ending in ``/`` receives
``<dataset>.parquet``) and, when rows were rejected, ``<out stem>.rejects.jsonl`` with one
``{"index": i, ["line": l,] "reason": ...}`` per rejected input row (``line``: JSONL inputs); a stale
one is removed otherwise. ``<out stem>.rejects.jsonl`` always belongs to the parquet file beside it: when
every row is rejected nothing is written but ``<out stem>.failed.rejects.jsonl`` (``NoValidRows`` gives the
counts per reason and the rejected rows; the previous run's output and rejects file are kept, and said so).
Neither output may be the input file. The ``data_source`` written must be one a reward function scores
(``rpg.reward.scored_sources``), unless ``any_data_source``; input rows labelled with a ``data_source`` of another
benchmark (``rpg.data.hub_datasets.benchmark_named``; a training set's: of any benchmark) are refused unless
``relabel`` (the reports would file their results under the written one's column).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rpg.data.io import HubLoader, read_hub, read_local, write_parquet_atomic, write_text_atomic
from rpg.data.rows import (EVAL_OVERLAP, NUMBER_ANSWER, Layout, Reject, build_rows, dedup_key, resolve_layout,
                           select_problems)
from rpg.data.hub_datasets import benchmark_named, get_source
from rpg.reward.scored_sources import rpg_scorer

_ANY_HINT = "pass --any-data-source when your own reward.custom_reward_function scores it"


@dataclass
class Summary:
    dataset: str
    source: str
    out: str
    rows_read: int
    problems: int
    rows_written: int
    rejects: list[Reject] = field(default_factory=list)
    columns: str = ""  # the columns read (``Layout.describe``)
    keys: frozenset[str] = frozenset()  # the ``dedup_key`` of each problem written
    numbers: list[float] = field(default_factory=list)  # answers stored as integral floats (written as integers)
    relabelled: dict[str, int] = field(default_factory=dict)  # {input data_source: rows} written as another (relabel)
    data_source: str = ""  # the data_source written

    def line(self) -> str:
        """One summary line: rows read (and the columns used), written, rejected with reasons (and where they all are)."""
        where = f"; every rejected row in {rejects_path(Path(self.out))}" if self.rejects else ""
        columns = f" ({self.columns})" if self.columns else ""
        n, first = len(self.numbers), self.numbers[0] if self.numbers else None
        numbers = f"; answers stored as integral numbers, written as integers: {n} ({first!r} -> '{int(first)}')" if n else ""
        return (
            f"{self.dataset}: read {self.rows_read} rows from {self.source}{columns}, wrote {self.rows_written} rows "
            f"({self.problems} problems) to {self.out}, rejected {len(self.rejects)} ({reason_counts(self.rejects)})"
            f"{where}{numbers}"
        )


    def relabel_line(self) -> str | None:
        """The line that says the input's rows were relabelled (``relabel``); None when none was."""
        if not self.relabelled:
            return None
        return (f"{self.dataset}: relabelled the rows of {self.source} labelled {_labels(self.relabelled)} as "
                f"data_source {self.data_source!r} (--relabel): their results count as this benchmark's")


class NoValidRows(ValueError):
    """Every input row was rejected: nothing written but the rejects file; ``summary`` holds the rejects."""

    def __init__(self, message: str, summary: Summary):
        super().__init__(message)
        self.summary = summary


def reason_class(reason: str) -> str:
    """Reason without row-specific detail, for the counts per reason."""
    if reason.startswith("duplicate of "):
        return "duplicate with a different answer" if "different answer" in reason else "duplicate"
    for prefix in ("invalid JSON", "invalid UTF-8", "lone surrogate", EVAL_OVERLAP, NUMBER_ANSWER):
        if reason.startswith(prefix):
            return prefix
    return reason.split(" (")[0]


def reason_counts(rejects: list[Reject]) -> str:
    counts = Counter(reason_class(r.reason) for r in rejects)
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none"


def rejects_path(out: Path) -> Path:
    return out.with_name(out.stem + ".rejects.jsonl")


def failed_rejects_path(out: Path) -> Path:
    """Where a run that rejected every row puts its rejects (``rejects_path`` belongs to the parquet beside it)."""
    return out.with_name(out.stem + ".failed.rejects.jsonl")


def check_data_source(data_source: str) -> None:
    """ValueError (one line) when no reward function scores ``data_source`` (``rpg.reward.compute_score``'s routes,
    then verl's ``default_compute_score``: what the recipe's runs score with)."""
    scorer = rpg_scorer(_ANY_HINT)
    if scorer.unscored([data_source]):
        raise ValueError(f"--data-source {data_source}: no reward function scores it: {scorer.name} handles "
                         f"{scorer.allowed}; {scorer.hint}")


def _labels(counts: dict[str, int]) -> str:
    return ", ".join(f"{v!r} ({benchmark_named(v) or 'no benchmark'}, {n} rows)" for v, n in counts.items())


def foreign_sources(records, columns, written: str, split: str) -> dict[str, int]:
    """{data_source: rows} of the input rows labelled for another benchmark than the ``written`` data_source names
    (a training set's: for any benchmark); a value equal to ``written`` (any case) or naming the same benchmark
    (the authors' ``math_dapo`` AIME24 file for ``aime2024``, ``amc_23`` for ``amc2023``) is its own."""
    if "data_source" not in columns:
        return {}
    want = benchmark_named(written) if split == "test" else None
    found = Counter(r["data_source"] for r in records if isinstance(r, dict) and isinstance(r.get("data_source"), str))
    return {v: n for v, n in found.items() if v.lower() != written.lower() and benchmark_named(v) != want}


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
    any_data_source: bool = False,
    exclude: Mapping[str, str] | None = None,
    relabel: bool = False,
) -> Summary:
    """Read, check, deduplicate and write one dataset. Local ``input_path`` wins over the hub. ``exclude``:
    ``{dedup_key: file}`` of evaluation sets' problems, rejected from this (training) set. ``relabel``: write rows
    labelled for another benchmark (``foreign_sources``) as this one (else ValueError, one line)."""
    spec = get_source(dataset)
    if not str(out).strip():
        raise ValueError("--out is an empty path; give a .parquet file or a directory")
    if data_source is not None and not any_data_source:
        check_data_source(data_source)
    if Path(out).is_dir() or str(out).endswith(("/", os.sep)):
        out = Path(out) / f"{dataset}.parquet"
    out = Path(out)
    if out.suffix != ".parquet":
        raise ValueError(f"--out must end in .parquet, got {str(out)!r}")
    rp, failed = rejects_path(out), failed_rejects_path(out)
    if input_path is not None:
        _check_not_the_input(out, rp, Path(input_path))
        records, columns, lines = read_local(input_path)
        source = str(input_path)
    else:
        name = hf_name or spec.hf_name
        records, columns = read_hub(name, hf_config or spec.hf_config, hf_split or spec.hf_split, hub_loader)
        source, lines = f"hf:{name}", None
    written = data_source or spec.data_source
    foreign = foreign_sources(records, columns, written, spec.split)
    if foreign and not relabel:
        what = benchmark_named(written) if spec.split == "test" else "a training set"
        raise ValueError(f"{source}: its rows are labelled data_source {_labels(foreign)}, but {dataset} writes "
                         f"{written!r} ({what}); prepare their benchmark's preset (python -m rpg.data list), or pass "
                         f"--relabel to write them as {written!r}")
    try:
        layout = resolve_layout(columns, spec.problem_keys, spec.answer_keys, problem_key, answer_key)
    except ValueError as err:
        if columns:
            raise ValueError(f"{source}: {err}") from None
        # no row is an object with keys (a JSONL of invalid lines, of lists, of strings): each row is
        # rejected with its own reason and line below
        layout = Layout("plain", problem_key or spec.problem_keys[0], answer_key or spec.answer_keys[0])
    problems, rejects, n_read = select_problems(records, layout, spec.english_only, lines, exclude)
    if not problems:
        if rejects:
            _write_rejects(rejects, failed)
        kept = [str(p) for p in (out, rp) if p.exists()]
        raise NoValidRows(
            f"{dataset}: no valid rows in {source} ({len(rejects)} rejected: {reason_counts(rejects)}); "
            f"nothing written" + (f" ({' and '.join(kept)} of the previous run kept)" if kept else "")
            + (f"; every rejected row in {failed}" if rejects else ""),
            Summary(dataset, source, str(out), n_read, 0, 0, rejects, layout.describe()))
    rows = build_rows(problems, written, spec.split, spec.default_copies if copies is None else copies)
    write_parquet_atomic(rows, out)
    if rejects:
        _write_rejects(rejects, rp)
    for stale in ([] if rejects else [rp]) + [failed]:
        if stale.exists():
            stale.unlink()
    return Summary(dataset, source, str(out), n_read, len(problems), len(rows), rejects, layout.describe(),
                   frozenset(dedup_key(p.problem) for p in problems),
                   [p.number for p in problems if p.number is not None], foreign, written)


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
    for side in (rejects, failed_rejects_path(out)):
        if same(side, input_path):
            raise ValueError(f"{side} (the rejects file of {out}) is the input file; write the output elsewhere")


def _write_rejects(rejects: list[Reject], path: Path) -> None:
    def record(r: Reject) -> dict:
        return {"index": r.index, **({"line": r.line} if r.line is not None else {}), "reason": r.reason}

    write_text_atomic("".join(json.dumps(record(r), ensure_ascii=False) + "\n" for r in rejects), path)
