"""The paper's published mean@32 numbers (Tables 3, 5-8), read from ``published.csv`` in this package.

The CSV is long-format, one value per row: table, model, context, method, benchmark, stat
(``last``/``best``), value, mark (``bold``/``italic`` as marked in the PDF), flag and note.
``flag`` is ``typo_suspected`` for Table 3 RPG-URKL AIME25 Last (0.5261 > its Best 0.4938; do not
use as a target) and ``off_grid`` for the two values that are not multiples of 1/960 or 1/1280.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

PUBLISHED_CSV = Path(__file__).with_name("published.csv")


@dataclass(frozen=True)
class TableLayout:
    number: str
    title: str
    benchmarks: tuple[str, ...]  # column order as in the PDF
    sources: dict[str, str] | None = None  # {column: exact data_source}; None = paper benchmarks by name


TABLES: dict[str, TableLayout] = {
    "3": TableLayout("3", "Qwen3-4B, 8K context", ("AIME24", "AIME25", "AMC23")),
    "5": TableLayout("5", "Qwen3-4B, 4K context", ("AIME24", "AIME25", "AMC23")),
    "6": TableLayout("6", "Qwen3-4B, 2K context", ("AIME24", "AIME25")),
    "7": TableLayout("7", "Qwen3-4B, 4K context (Minerva-Math, OlympiadBench)", ("Minerva", "OlympiadBench")),
    "8": TableLayout("8", "Qwen2.5-7B-Instruct", ("AMC23", "AIME24", "AIME25")),
}


@dataclass(frozen=True)
class PublishedValue:
    value: float
    mark: str = ""
    flag: str = ""
    note: str = ""


def get_layout(table: str) -> TableLayout:
    try:
        return TABLES[str(table)]
    except KeyError:
        raise ValueError(f"unknown table {table!r}; allowed: {', '.join(TABLES)}") from None


def load_published(path: str | Path = PUBLISHED_CSV) -> dict[tuple[str, str, str, str], PublishedValue]:
    """{(table, method, benchmark, stat): PublishedValue}."""
    out = {}
    with open(path, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            key = (row["table"], row["method"], row["benchmark"], row["stat"])
            out[key] = PublishedValue(float(row["value"]), row["mark"], row["flag"], row["note"])
    return out


def methods_of(table: str, published: dict | None = None) -> list[str]:
    """Published method names of a table, in the paper's row order."""
    published = load_published() if published is None else published
    seen: dict[str, None] = {}
    for t, method, _, _ in published:
        if t == str(table):
            seen[method] = None
    return list(seen)
