"""Build one verl parquet file from a preset (rpg.data.sources) and a local file or the hub.

Output: ``out`` (parquet, atomic) and, when rows were rejected, ``<out stem>.rejects.jsonl`` with
one ``{"index": i, "reason": ...}`` per rejected input row (a stale one is removed otherwise).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rpg.data.io import HubLoader, read_hub, read_local, write_parquet_atomic, write_text_atomic
from rpg.data.rows import Reject, build_rows, resolve_layout, select_problems
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
        """One summary line: rows read, written, rejected with reasons."""
        counts = Counter(_reason_class(r.reason) for r in self.rejects)
        why = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none"
        return (
            f"{self.dataset}: read {self.rows_read} rows from {self.source}, wrote {self.rows_written} rows "
            f"({self.problems} problems) to {self.out}, rejected {len(self.rejects)} ({why})"
        )


def _reason_class(reason: str) -> str:
    """Reason without row-specific detail, for the counts in the summary line."""
    for prefix in ("duplicate of row", "invalid JSON line"):
        if reason.startswith(prefix):
            return prefix.replace(" of row", "").replace(" line", "")
    return reason.split(" (")[0]


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
    out = Path(out)
    if out.suffix != ".parquet":
        raise ValueError(f"--out must end in .parquet, got {str(out)!r}")
    if input_path is not None:
        records, columns = read_local(input_path)
        source = str(input_path)
    else:
        name = hf_name or spec.hf_name
        records, columns = read_hub(name, hf_config or spec.hf_config, hf_split or spec.hf_split, hub_loader)
        source = f"hf:{name}"
    layout = resolve_layout(columns, spec.problem_keys, spec.answer_keys, problem_key, answer_key)
    problems, rejects, n_read = select_problems(records, layout, spec.english_only)
    if not problems:
        raise ValueError(f"{dataset}: no valid rows in {source} ({len(rejects)} rejected); nothing written")
    rows = build_rows(problems, data_source or spec.data_source, spec.split, spec.default_copies if copies is None else copies)
    write_parquet_atomic(rows, out)
    rp = rejects_path(out)
    if rejects:
        write_text_atomic(
            "".join(json.dumps({"index": r.index, "reason": r.reason}, ensure_ascii=False) + "\n" for r in rejects), rp
        )
    elif rp.exists():
        rp.unlink()
    return Summary(dataset, source, str(out), n_read, len(problems), len(rows), rejects)
