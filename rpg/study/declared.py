"""The machinery of a declared study (its PLAN.md committed before its runs): one CSV row per run, contrasts tested
per seed, and the plan's generated blocks; the lag study (``rpg.study.lag``) and the SmolLM2 comparison
(``rpg.study.smol``) each give their columns and contrasts.

* ``Schema`` / ``write_csv`` / ``read_csv``: ``runs.csv`` read back exactly (floats as repr, None as empty), one line
  naming the file and line for a bad file, and a finished run never dropped by a rewrite.
* ``Contrast`` / ``test_contrast``: a contrast over cells per seed, its exact sign-flip p-value and interval
  (``rpg.study.stats``).
* ``generated_block``: the text between a plan's ``<!-- BEGIN name ... -->`` and ``<!-- END name -->`` markers.
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from rpg.study import stats

VAL_PREFIX = "val_acc_step_"  # then one column per evaluated step: the held-out accuracy there


class CSVError(ValueError):
    """runs.csv cannot be read: one line naming the file (and line) and what is wrong."""


@dataclass(frozen=True)
class Schema:
    """A study's CSV columns: every one in ``columns`` (in order), the integer and float ones typed on reading, then
    a ``VAL_PREFIX<step>`` column per evaluated step."""

    columns: tuple[str, ...]
    ints: tuple[str, ...]
    floats: tuple[str, ...]


def evaluated_steps(steps: int, test_freq: int, before: bool = True) -> list[int]:
    """Steps verl validates at: 0 (before training, when ``before``), every test_freq, and the last."""
    return sorted({*((0,) if before else ()), steps, *range(test_freq, steps + 1, test_freq)})


def _cell_text(value) -> str:
    if value is None:
        return ""
    return repr(float(value)) if isinstance(value, float) else str(value)


def write_csv(path: Path, rows: list[dict], schema: Schema) -> Path:
    """``rows`` as runs.csv (floats as repr: read back exactly; None as empty). A finished run the file already
    holds must be finished in ``rows`` too: ValueError otherwise (a study rendered from the wrong --out would
    drop it)."""
    path = Path(path)
    if path.is_file():
        done = {r["run_id"] for r in rows if r.get("status") == "done"}
        lost = [r["run_id"] for r in read_csv(path, schema) if r["status"] == "done" and r["run_id"] not in done]
        if lost:
            raise ValueError(f"{path} holds {len(lost)} finished run(s) that this study's --out lacks ({lost[0]}, "
                             "...): name the --out that holds them, or move the file away")
    steps = sorted({int(k[len(VAL_PREFIX):]) for r in rows for k in r if k.startswith(VAL_PREFIX)})
    header = [*schema.columns, *(f"{VAL_PREFIX}{t}" for t in steps)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(header)
        for r in rows:
            w.writerow([_cell_text(r.get(k)) for k in header])
    tmp.replace(path)
    return path


def read_csv(path: Path, schema: Schema) -> list[dict]:
    """runs.csv's rows with typed values (int / float columns, None for empty cells); CSVError naming the file and
    line for an unknown or missing column, a row of the wrong length or a value of the wrong type."""
    path = Path(path)
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise CSVError(f"{path}: empty (expected the header {','.join(schema.columns[:3])},...)")
        missing = [c for c in schema.columns if c not in header]
        unknown = [c for c in header if c not in schema.columns and not (c.startswith(VAL_PREFIX)
                                                                         and c[len(VAL_PREFIX):].isdigit())]
        if missing or unknown:
            raise CSVError(f"{path}:1: " + (f"missing column(s) {', '.join(missing)}" if missing else
                                            f"unknown column(s) {', '.join(unknown)}"))
        rows = []
        for line, cells in enumerate(reader, 2):
            if len(cells) != len(header):
                raise CSVError(f"{path}:{line}: {len(cells)} values for {len(header)} columns")
            row = {}
            for key, text in zip(header, cells):
                try:
                    if text == "":
                        row[key] = None
                    elif key in schema.ints:
                        row[key] = int(text)
                    elif key in schema.floats or key.startswith(VAL_PREFIX):
                        row[key] = float(text)
                    else:
                        row[key] = text
                except ValueError:
                    raise CSVError(f"{path}:{line}: {key}={text!r} is not a number") from None
            rows.append(row)
    return rows


@dataclass(frozen=True)
class Contrast:
    """A hypothesis as a contrast: per seed s, d_s = sum over cells of coefficient x primary metric; the claim is
    mean(d_s) > 0 (one-sided)."""

    name: str
    claim: str
    terms: tuple[tuple[str, int], ...]  # (cell name, coefficient)

    def sd_factor(self) -> float:
        """SD of d_s / SD of one run's metric, runs independent given the seed: sqrt(sum of coefficients^2)."""
        return math.sqrt(sum(a * a for _, a in self.terms))

    def formula(self) -> str:
        return " ".join(f"{'+' if a > 0 else '-'} {c}" if abs(a) == 1 else f"{a:+d} {c}" for c, a in self.terms
                        ).lstrip("+ ")


@dataclass(frozen=True)
class Result:
    contrast: Contrast
    seeds: tuple[int, ...]  # the seeds with every cell of the contrast finished
    d: tuple[float, ...]
    p: float | None
    ci: tuple[float, float] | None

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.d) if self.d else None


def test_contrast(rows: list[dict], contrast: Contrast, level: float = 0.95) -> Result:
    """The contrast's per-seed values over the seeds whose runs of its cells all finished with a primary metric,
    its exact one-sided sign-flip p-value and the ``level`` interval of the mean shift (``rpg.study.stats``)."""
    by = {(r["cell"], r["seed"]): r["primary"] for r in rows if r["status"] == "done" and r["primary"] is not None}
    seeds = sorted({r["seed"] for r in rows})
    seeds = tuple(s for s in seeds if all((c, s) in by for c, _ in contrast.terms))
    d = tuple(sum(a * by[(c, s)] for c, a in contrast.terms) for s in seeds)
    if not d:
        return Result(contrast, seeds, d, None, None)
    return Result(contrast, seeds, d, stats.sign_flip_p(d), stats.sign_flip_ci(d, level))


def fmt(x, spec: str = ".3f") -> str:
    """A table cell: ``x`` formatted, or an em dash for a missing or NaN value."""
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def fmt_ci(ci) -> str:
    return "—" if ci is None else f"[{fmt(ci[0])}, {fmt(ci[1])}]"


def mean_of(xs: list) -> float | None:
    """The mean of the values that are not None (None when there are none)."""
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def generated_block(text: str, name: str) -> str | None:
    """The lines between ``<!-- BEGIN name...-->`` and ``<!-- END name -->`` in a plan's text (None without them):
    what the code that generates it must print exactly (the plan's test)."""
    found = re.search(rf"<!-- BEGIN {re.escape(name)}\b[^\n]*-->\n(.*?)\n<!-- END {re.escape(name)} -->", text, re.S)
    return found[1] if found else None


def render_report(csv_path: Path, report_dir: Path, read, tables, figure, figure_name: str) -> list[Path]:
    """A declared study's ``results.md`` (``tables(rows, csv name)``) and figure (``figure(rows, path)``) in
    ``report_dir``, from the rows ``read(csv_path)`` returns alone."""
    rows = read(csv_path)
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    md = report_dir / "results.md"
    md.write_text(tables(rows, Path(csv_path).name), encoding="utf-8")
    return [md, figure(rows, report_dir / figure_name)]
