"""The machinery of a declared study (its PLAN.md committed before its runs): one CSV row per run, contrasts tested
per seed, and the plan's generated blocks; the lag study (``rpg_lab.study.lag``) and the SmolLM2 comparison
(``rpg_lab.study.smol``) each give their columns and contrasts.

* ``Design``: what the plan fixes; a study of other values is refused in one line naming the option and the declared
  value, or runs as exploratory (``--exploratory``), which every output says: the start's design line, each row's
  ``design`` column, results.md's header (no verdict).
* ``Schema`` / ``write_csv`` / ``read_csv``: ``runs.csv`` read back exactly (floats as repr, None as empty), one line
  naming the file and line for a bad file, and a finished run never dropped by a rewrite nor mixed with another
  design's. A file written before a column was added reads as the plan's value (``Schema.added``).
* ``Contrast`` / ``test_contrast``: a contrast over cells per seed, its exact sign-flip p-value and interval
  (``rpg_lab.study.stats``); ``test_family``: a declared family of them with Holm's adjusted p-values.
* ``generated_block``: the text between a plan's ``<!-- BEGIN name ... -->`` and ``<!-- END name -->`` markers.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from rpg_lab.study import stats

VAL_PREFIX = "val_acc_step_"  # then one column per evaluated step: the held-out accuracy there
DECLARED, EXPLORATORY = "declared", "exploratory"  # runs.csv's design column: DECLARED, or "exploratory: <how>"


class CSVError(ValueError):
    """runs.csv cannot be read: one line naming the file (and line) and what is wrong."""


@dataclass(frozen=True)
class Schema:
    """A study's CSV columns: every one in ``columns`` (in order), the integer and float ones typed on reading, then
    a ``VAL_PREFIX<step>`` column per evaluated step. ``added``: (column, value) of the columns added after files
    were written without them; such a file reads as it is, each of its rows with the value given here. ``finite``: the
    float columns that must hold a finite number (a run's primary metric is an accuracy: NaN or inf is a broken row,
    which the tables' means and SDs cannot take)."""

    columns: tuple[str, ...]
    ints: tuple[str, ...]
    floats: tuple[str, ...]
    added: tuple[tuple[str, object], ...] = ()
    finite: tuple[str, ...] = ("primary",)


def _shown(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _same(a, b) -> bool:
    """Option values compared as the plan reads them: names (a tuple) as a set, anything else as it is."""
    return set(a) == set(b) if isinstance(a, tuple) and isinstance(b, tuple) else a == b


@dataclass(frozen=True)
class Design:
    """What a declared study's plan fixes: ``options``, (command-line option, declared value) of every option that
    shapes its runs (a tuple of names compared as a set), and ``columns``, (runs.csv column, declared value) of every
    run; its runs are ``seeds`` x ``cells`` (runs.csv's seed and cell columns)."""

    name: str  # "the lag study"
    flag: str  # the command line's option that runs it: "--lag"
    plan: str  # the plan's path in the checkout
    options: tuple[tuple[str, object], ...]
    columns: tuple[tuple[str, object], ...]
    seeds: int
    cells: tuple[str, ...]
    # the commits that wrote the plan, oldest first: the declaration, then each change, every one after the first
    # named in the study's DEVIATIONS.md (tests/lab/study/test_declared_plans.py holds git's history of the file to it)
    plan_commits: tuple[str, ...] = ()
    first_seed: int = 1  # the seeds are first_seed .. first_seed + seeds - 1

    def deviations(self, chosen: dict[str, object]) -> list[tuple[str, object, object]]:
        """(option, chosen value, declared value) of each option ``chosen`` sets otherwise than the plan."""
        return [(opt, chosen[opt], value) for opt, value in self.options if not _same(chosen[opt], value)]

    def label(self, chosen: dict[str, object], exploratory: bool) -> str:
        """runs.csv's ``design`` value for a study of ``chosen``: DECLARED, or ``exploratory: <each option that
        differs>`` with ``exploratory``; ValueError (one line, naming the option and the declared value) for a
        design the plan does not declare without it."""
        devs = self.deviations(chosen)
        if devs and not exploratory:
            opt, value, declared = devs[0]
            raise ValueError(f"{opt} {_shown(value)}: {self.name} declares {_shown(declared)} ({self.plan}); run the "
                             "declared design, or add --exploratory (its plan line, runs.csv and results.md then say "
                             "so; no verdict)")
        if not exploratory:
            return DECLARED
        how = "; ".join(f"{o} {_shown(v)} (declared {_shown(d)})" for o, v, d in devs) or "the declared values"
        return f"{EXPLORATORY}: {how}"

    def line(self, label: str) -> str:
        """The start's design line (``--dry-run`` prints it too)."""
        if label == DECLARED:
            return f"design: declared ({self.plan})"
        return (f"design: EXPLORATORY, not a test of {self.plan}: {label.split(': ', 1)[1]}; runs.csv and results.md "
                "say so and give no verdict")

    def check_rows(self, rows: list[dict], source: str) -> str:
        """The one design of runs.csv's ``rows`` (their ``design`` column); ValueError (one line) for rows of two
        designs, or rows called declared that are not the plan's ``seeds`` x ``cells`` at its ``columns``' values."""
        labels = sorted({str(r["design"]) for r in rows})
        if len(labels) > 1:
            raise ValueError(f"{source}: rows of {len(labels)} designs ({' | '.join(labels)}): one runs.csv holds one")
        label = labels[0] if labels else DECLARED
        if label != DECLARED:
            if not label.startswith(f"{EXPLORATORY}: "):
                raise ValueError(f"{source}: design {label!r}: expected {DECLARED} or '{EXPLORATORY}: ...'")
            return label
        for col, value in self.columns:
            bad = next((r for r in rows if r[col] != value), None)
            if bad is not None:
                raise ValueError(f"{source}: run {bad['run_id']} has {col} {bad[col]}, not the declared {value} "
                                 f"({self.plan}), yet its design is {DECLARED}")
        runs = sorted((r["seed"], r["cell"]) for r in rows)
        want = sorted((s, c) for s in range(self.first_seed, self.first_seed + self.seeds) for c in self.cells)
        if runs != want:
            raise ValueError(f"{source}: {len(runs)} rows called {DECLARED}, not the {len(want)} runs the plan "
                             f"declares ({self.seeds} seeds x {len(self.cells)} cells, {self.plan}), each once")
        return label

    def note(self, label: str) -> list[str]:
        """results.md's lines under its title: none for the declared design, else what makes it exploratory."""
        if label == DECLARED:
            return []
        return [f"**EXPLORATORY, not the declared design** of {self.plan}: {label.split(': ', 1)[1]}. Every p-value "
                "below is descriptive: no test of the plan's hypotheses, no verdict.", ""]


def holm_scope(names: list[str], families: tuple[int, ...] = ()) -> str:
    """results.md's words for the correction: "Holm over the four", or "Holm within each family (L1-L3; F1-F3)"
    for ``families`` (``test_family``)."""
    if len(families) < 2:
        return f"Holm over the {('two', 'three', 'four', 'five', 'six')[len(names) - 2]}"
    ends = list(itertools.accumulate(families))
    return "Holm within each family (" + "; ".join(f"{names[e - k]}-{names[e - 1]}"
                                                   for e, k in zip(ends, families)) + ")"


def evaluated_steps(steps: int, test_freq: int, before: bool = True) -> list[int]:
    """Steps verl validates at: 0 (before training, when ``before``), every test_freq, and the last."""
    return sorted({*((0,) if before else ()), steps, *range(test_freq, steps + 1, test_freq)})


def _cell_text(value) -> str:
    if value is None:
        return ""
    return repr(float(value)) if isinstance(value, float) else str(value)


def check_report(path: Path, schema: Schema, design: str, done: set[str]) -> None:
    """Whether runs.csv rows of ``design`` whose finished runs are ``done`` may replace ``path``: ValueError (one line)
    when it holds another design's rows, or a finished run not finished in ``done`` (a study rendered from the wrong
    --out would drop it). A study checks it before its runs with every run it plans as ``done``."""
    path = Path(path)
    if not path.is_file():
        return
    old = read_csv(path, schema)
    if old and design not in {r["design"] for r in old}:
        raise ValueError(f"{path} holds the runs of another design ({old[0]['design']}; this study: {design}): name "
                         "another --report-dir, or move the file away")
    lost = [r["run_id"] for r in old if r["status"] == "done" and r["run_id"] not in done]
    if lost:
        raise ValueError(f"{path} holds {len(lost)} finished run(s) that this study's --out lacks ({lost[0]}, "
                         "...): name the --out that holds them, or move the file away")


def write_csv(path: Path, rows: list[dict], schema: Schema) -> Path:
    """``rows`` as runs.csv (floats as repr: read back exactly; None as empty), after ``check_report``."""
    path = Path(path)
    designs = {r.get("design") for r in rows}
    if len(designs) > 1:
        raise ValueError(f"{path}: rows of {len(designs)} designs: one runs.csv holds one")
    if rows:
        check_report(path, schema, rows[0].get("design"), {r["run_id"] for r in rows if r.get("status") == "done"})
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
        added = dict(schema.added)
        missing = [c for c in schema.columns if c not in header and c not in added]
        unknown = [c for c in header if c not in schema.columns and not (c.startswith(VAL_PREFIX)
                                                                         and c[len(VAL_PREFIX):].isdecimal())]
        if missing or unknown:
            raise CSVError(f"{path}:1: " + (f"missing column(s) {', '.join(missing)}" if missing else
                                            f"unknown column(s) {', '.join(unknown)}"))
        rows = []
        for line, cells in enumerate(reader, 2):
            if len(cells) != len(header):
                raise CSVError(f"{path}:{line}: {len(cells)} values for {len(header)} columns")
            row = {c: added[c] for c in schema.columns if c not in header}
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
                if key in schema.finite and row[key] is not None and not math.isfinite(row[key]):
                    raise CSVError(f"{path}:{line}: {key}={text!r} is not a finite number")
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


def paired(rows: list[dict], contrast: Contrast) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The seeds whose runs of the contrast's cells all finished with a primary metric, and d_s for each."""
    by = {(r["cell"], r["seed"]): r["primary"] for r in rows if r["status"] == "done" and r["primary"] is not None}
    seeds = tuple(s for s in sorted({r["seed"] for r in rows}) if all((c, s) in by for c, _ in contrast.terms))
    return seeds, tuple(sum(a * by[(c, s)] for c, a in contrast.terms) for s in seeds)


def test_contrast(rows: list[dict], contrast: Contrast, level: float = 0.95) -> Result:
    """The contrast's per-seed values over the seeds whose runs of its cells all finished with a primary metric,
    its exact one-sided sign-flip p-value and the ``level`` interval of the mean shift (``rpg_lab.study.stats``)."""
    seeds, d = paired(rows, contrast)
    if not d:
        return Result(contrast, seeds, d, None, None)
    return Result(contrast, seeds, d, stats.sign_flip_p(d), stats.sign_flip_ci(d, level))


@dataclass(frozen=True)
class Tested:
    """A declared hypothesis's result: its contrast's ``Result`` (the interval at ``level``), its p-value (one- or
    two-sided, as declared) and its Holm-adjusted p within the family."""

    result: Result
    p: float | None
    holm: float | None
    level: float
    two_sided: bool = False


def test_family(rows: list[dict], family: list[tuple[Contrast, bool]], level_of=lambda n: 0.95,
                families: tuple[int, ...] = ()) -> list[Tested]:
    """A declared family of contrasts (each with whether its test is two-sided), tested on runs.csv's rows: each its
    exact sign-flip p (two-sided: min(1, 2 min(p(d), p(-d)))), its interval at ``level_of(its number of seeds)``, and
    Holm over the family (a contrast with no seeds counts as p = 1 there and gets no adjusted p), or within each of
    ``families`` (the sizes of consecutive families). What results.md prints and docs/study.md's Readings quote
    (tests/lab/study/test_study_readings.py compares them)."""
    out, ps = [], []
    for contrast, two_sided in family:
        n = len(test_contrast(rows, contrast).d)
        level = level_of(max(2, n))
        r = test_contrast(rows, contrast, level)
        p = None if r.p is None else (
            min(1.0, 2 * min(r.p, stats.sign_flip_p([-x for x in r.d]))) if two_sided else r.p)
        out.append((r, p, level, two_sided))
        ps.append(p)
    ends = list(itertools.accumulate(families or (len(ps),)))
    adjusted = [a for e, k in zip(ends, families or (len(ps),))
                for a in stats.holm([1.0 if p is None else p for p in ps[e - k:e]])]
    return [Tested(r, p, None if p is None else adj, level, two) for (r, p, level, two), adj in zip(out, adjusted)]


# what each run ran on (``rpg.run_record``), as runs.csv records it; a CSV written before these columns reads them as
# not recorded (None)
RAN_ON_COLUMNS = ("model_sha256", "torch", "transformers", "verl", "kernels")


def settings_digest(rec: dict) -> str | None:
    """runs.csv's ``settings`` of a run's record: 12 hex digits of the sha256 of its identity (its settings wherever
    its folders are, ``rpg_lab.study.identity``); None for a record without one (a run not started)."""
    ident = rec.get("identity")
    return None if ident is None else hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:12]


def ran_on_columns(rec: dict) -> dict:
    """runs.csv's ``RAN_ON_COLUMNS`` of a run's record (its ``ran_on``: the weights' digest, 12 hex digits; the
    libraries; the CPU's kernel path, with the variable that chose it when one did)."""
    ran = rec.get("ran_on") or {}
    libs, kernels = ran.get("libraries") or {}, ran.get("kernels") or {}
    chosen = kernels.get("ATEN_CPU_CAPABILITY")
    return {"model_sha256": (ran.get("weights_sha256") or "")[:12] or None, "torch": libs.get("torch"),
            "transformers": libs.get("transformers"), "verl": libs.get("verl"),
            "kernels": (f"{kernels['capability']}" + (f" (ATEN_CPU_CAPABILITY={chosen})" if chosen else ""))
            if kernels.get("capability") else None}


def one_model(rows: list[dict], source: str) -> str | None:
    """The one model build the finished rows of ``rows`` ran on (None: not recorded); ValueError (one line naming
    ``source`` and the builds) when they ran on several: a study compares runs of one model, as of one code."""
    builds = sorted({r.get("model_sha256") for r in rows if r["status"] == "done"}, key=str)
    if len(builds) > 1:
        raise ValueError(f"{source}: the finished runs ran on {len(builds)} model builds "
                         f"({', '.join(b or 'not recorded' for b in builds)}); a study compares runs of one build: "
                         f"run the others again on one (--rerun-other-code)")
    return builds[0] if builds else None


def unfinished_note(done: int, runs: int) -> list[str]:
    """results.md's lines while a declared study is under way (none once every run finished): its plan reads no
    result before then, so the tests below are no result yet."""
    if done >= runs:
        return []
    return [f"**Under way: {runs - done} of {runs} runs not finished.** The plan reads no result before all of its "
            "runs finish (no interim analysis): the tests below are the code's output on the runs so far, not a "
            "result.", ""]


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
