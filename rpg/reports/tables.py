"""Paper tables (Tables 3, 5, 6, 7, 8) from run logs: Last / Best per benchmark, ours vs published.

* Last = the value at ``last_step`` (400, the paper's final step). If that step was not evaluated
  the cell is empty and a warning names the last evaluated step: no silent substitution.
  ``last_step=None`` means "the final evaluated step of each run".
* Best = max over evaluated steps <= last_step (all steps when last_step is None), including
  step 0 (``val_before_train``). The paper does not define Best; this is the recipe's reading (docs/data-and-reports.md).
* Values are shown as logged: NaN and ±inf print as ``nan`` / ``inf`` / ``-inf`` (Best leaves NaN
  steps out, with a warning; a mean over seeds with a non-finite value is ±inf or nan, its std nan;
  NaN is never marked best).
* Δ = ours − paper. A run is matched to a published row by its label (case-insensitive method
  name, e.g. ``RPG-REINFORCE-URKL``); unmatched runs get empty paper cells and a warning.
* Runs sharing a label are seeds of one method (``rpg.reports.runs`` lets only a given label be
  shared; default labels are told apart): the row shows mean ± std (sample std, ddof 1)
  of the per-run Last / Best, and Δ is taken from the mean. Seeds that end at different steps (a run
  stopped at 120 beside one of 400: Last at ``final`` averages step 120 with step 400, Best a max over
  120 steps with one over 400) are refused in one line naming the runs and their last steps, unless
  ``allow_unequal_steps``: then each such cell is marked ‡ and a note names the steps.
* As in the paper, the best value of each of our columns is bold and the second best underlined
  (italic in Markdown, which has no underline); ties share the mark. A column needs two rows for
  a best mark and three for a second-best mark.
* ``table`` is a paper table number or a ``TableLayout``; a layout with ``sources`` reads its
  columns from exact data sources (``val-core/<source>/<metric>``), e.g. the tiny task's
  ``math_dapo`` in ``rpg_lab.study``; a table without published numbers has no paper / Δ columns.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from rpg.reports.benchmarks import PAPER_METRIC, benchmark_series
from rpg.reports.logs import Metrics
from rpg.reports.published import PublishedValue, TableLayout, get_layout, load_published, methods_of

STATS = ("last", "best")


@dataclass
class Cell:
    ours: float | None  # one run's value, or the mean over the runs of one label (seeds)
    paper: PublishedValue | None
    std: float | None = None  # sample std over the runs (None: a single run)
    n: int = 1  # runs with a value behind ``ours``
    steps: str | None = None  # the runs' last steps when they differ (allow_unequal_steps): the cell is marked

    @property
    def delta(self) -> float | None:
        return None if self.ours is None or self.paper is None else self.ours - self.paper.value


@dataclass
class TableData:
    number: str
    title: str
    benchmarks: tuple[str, ...]
    metric: str
    last_step: int | None
    rows: list[tuple[str, dict[tuple[str, str], Cell]]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    step_notes: list[str] = field(default_factory=list)  # the cells over runs at different steps (marked ‡)
    has_paper: bool = True  # the table has published numbers (paper and Δ columns are shown)

    def marks(self) -> dict[tuple[int, str, str], str]:
        """{(row index, bench, stat): "best" | "second"} over our values, per column (ties share)."""
        out = {}
        for bench in self.benchmarks:
            for stat in STATS:
                vals = [(i, cells[(bench, stat)].ours) for i, (_, cells) in enumerate(self.rows)]
                vals = [(i, v) for i, v in vals if v is not None and not math.isnan(v)]  # NaN is unranked
                ranked = sorted({v for _, v in vals}, reverse=True)
                for i, v in vals:
                    if len(vals) >= 2 and v == ranked[0]:
                        out[(i, bench, stat)] = "best"
                    elif len(vals) >= 3 and len(ranked) > 1 and v == ranked[1]:
                        out[(i, bench, stat)] = "second"
        return out


def last_and_best(series: dict[int, float], last_step: int | None) -> tuple[float | None, float | None]:
    """(value at last_step or None, max over steps <= last_step or None); last_step None = final step.

    Values are as logged: Last may be NaN or ±inf; Best is the max over the non-NaN values (NaN is
    unordered; +inf is the max when logged), NaN when every eligible value is NaN. ``nan_steps``
    names the NaN steps Best leaves out (the table warns).
    """
    if not series:
        return None, None
    if last_step is None:
        last_step = max(series)
    eligible = [v for s, v in series.items() if s <= last_step]
    ordered = [v for v in eligible if not math.isnan(v)]
    best = max(ordered) if ordered else (math.nan if eligible else None)
    return series.get(last_step), best


def nan_steps(series: dict[int, float], last_step: int | None) -> list[int]:
    """Steps <= last_step (all when None) whose value is NaN: left out of Best."""
    return sorted(s for s, v in series.items() if math.isnan(v) and (last_step is None or s <= last_step))


def _columns(metrics: Metrics, layout: TableLayout, metric: str, source_map) -> dict[str, tuple[str, dict[int, float]]]:
    """{column: (data_source, series)}: exact data sources of ``layout.sources``, else benchmarks by name."""
    if layout.sources is None:
        return benchmark_series(metrics, metric, source_map)
    out = {}
    for column, ds in layout.sources.items():
        if f"val-core/{ds}/{metric}" in metrics:
            out[column] = (ds, metrics[f"val-core/{ds}/{metric}"])
    return out


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample std; with a NaN or ±inf among the values, IEEE arithmetic (the mean is ±inf or
    NaN) and a NaN std: nothing non-finite is dropped or replaced."""
    if not values:
        return None, None
    if all(math.isfinite(v) for v in values):
        return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)
    return sum(values) / len(values), (math.nan if len(values) > 1 else None)


def end_step(series: dict[int, float], last_step: int | None) -> int | None:
    """The last evaluated step a run's Best covers (its Last's step when ``last_step`` is None)."""
    return max((s for s in series if last_step is None or s <= last_step), default=None)


def _unequal(ends: list[tuple[str, int]], stat: str, last_step: int | None) -> str | None:
    """``"#1 at step 400, #2 at step 120"`` when a cell's runs end at different steps; None when they agree. A
    Last at a fixed step is at that step in every run with a value (the others are left out, with a warning)."""
    if len({e for _, e in ends}) < 2 or (stat == "last" and last_step is not None):
        return None
    return ", ".join(f"{name} at step {e}" for name, e in ends)


def build_table(
    runs: list[tuple[str, Metrics]],
    table: str | TableLayout,
    metric: str | None = None,
    last_step: int | None = 400,
    source_map: dict[str, str] | None = None,
    published: dict | None = None,
    allow_unequal_steps: bool = False,
) -> TableData:
    """``metric`` None = the paper's statistic per benchmark (``PAPER_METRIC``: acc/mean@32 on AIME/AMC,
    acc/mean@1 on Minerva/OlympiadBench; acc/mean@32 for a column that is not a paper benchmark);
    a string = that metric for every column. ``allow_unequal_steps``: average seeds that end at different
    steps (cells marked); without it ValueError, one line."""
    layout = table if isinstance(table, TableLayout) else get_layout(table)
    published = load_published() if published is None else published
    methods = {m.lower(): m for m in methods_of(layout.number, published)}
    metric_of = {bench: metric or PAPER_METRIC.get(bench, "acc/mean@32") for bench in layout.benchmarks}
    td = TableData(layout.number, layout.title, layout.benchmarks, _metric_label(metric_of), last_step,
                   has_paper=bool(methods))
    flagged = {}
    unequal: dict[tuple[str, str], list[str]] = {}  # (label, the runs' steps) -> the cells
    by_label: dict[str, list[Metrics]] = {}
    for label, metrics in runs:  # runs sharing a label are seeds of one method (first-seen order)
        by_label.setdefault(label, []).append(metrics)
    for label, seed_runs in by_label.items():
        method = methods.get(label.lower())
        if method is None and methods:
            td.warnings.append(
                f"run {label!r} is not a method of Table {layout.number}; no published numbers "
                f"(label runs as METHOD=PATH, methods: {', '.join(methods.values())})"
            )
        values: dict[tuple[str, str], list[float]] = {(b, st): [] for b in layout.benchmarks for st in STATS}
        ends: dict[str, list[tuple[str, int]]] = {b: [] for b in layout.benchmarks}  # (run, end_step) per column
        for k, metrics in enumerate(seed_runs):
            name = label if len(seed_runs) == 1 else f"{label} #{k + 1}"
            series = {m: _columns(metrics, layout, m, source_map) for m in sorted(set(metric_of.values()))}
            for bench in layout.benchmarks:
                m = metric_of[bench]
                ds, s = series[m].get(bench, (None, {}))
                if ds is None:
                    where = f"val-core/{layout.sources[bench]}/{m}" if layout.sources else f"val-core/<data_source>/{m}"
                    td.warnings.append(f"run {name!r}: no {where} for {bench}")
                last, best = last_and_best(s, last_step)
                if (end := end_step(s, last_step)) is not None:
                    ends[bench].append((name, end))
                skipped = nan_steps(s, last_step)
                if skipped and best is not None and not math.isnan(best):
                    td.warnings.append(f"run {name!r}: {bench} ({ds}) is nan at step{'s' * (len(skipped) > 1)} "
                                       f"{', '.join(map(str, skipped))}: Best is over the other steps")
                if s and last is None:
                    td.warnings.append(
                        f"run {name!r}: {bench} ({ds}) has no value at step {last_step}; "
                        f"last evaluated step is {max(s)}"
                    )
                for stat, v in zip(STATS, (last, best)):
                    if v is not None:
                        values[(bench, stat)].append(v)
        cells: dict[tuple[str, str], Cell] = {}
        for (bench, stat), vals in values.items():
            paper = published.get((layout.number, method, bench, stat)) if method else None
            mean, std = _mean_std(vals)
            steps = _unequal(ends[bench], stat, last_step)
            cells[(bench, stat)] = Cell(mean, paper, std, len(vals), steps)
            if steps is not None:
                unequal.setdefault((label, steps), []).append(f"{bench} {stat.capitalize()}")
            if 0 < len(vals) < len(seed_runs):
                td.warnings.append(f"{label!r} {bench} {stat.capitalize()}: mean over {len(vals)} of {len(seed_runs)} runs")
            if paper is not None and paper.flag:
                flagged[(method, bench, stat)] = paper
        td.rows.append((label, cells))
    mixed = [f"{label!r} ({', '.join(where)}): {steps}" for (label, steps), where in unequal.items()]
    if mixed and not allow_unequal_steps:
        raise ValueError(f"runs of one label end at different steps, and their mean would mix them: {'; '.join(mixed)}; "
                         "pass --last-step N (a step every run evaluated), or --allow-unequal-steps to report them "
                         "(the cells marked ‡)")
    td.step_notes += [f"mean over runs that end at different steps: {m}" for m in mixed]
    td.warnings += td.step_notes
    for (method, bench, stat), p in flagged.items():
        td.notes.append(f"{method} {bench} {stat.capitalize()} = {p.value:.4f} [{p.flag}]: {p.note}")
    return td


def _metric_label(metric_of: dict[str, str]) -> str:
    """"acc/mean@32" when one metric serves every benchmark, else "acc/mean@32 (AIME24, ...); acc/mean@1 (...)"."""
    by_metric: dict[str, list[str]] = {}
    for bench, m in metric_of.items():
        by_metric.setdefault(m, []).append(bench)
    if len(by_metric) == 1:
        return next(iter(by_metric))
    return "; ".join(f"{m} ({', '.join(b)})" for m, b in by_metric.items())


def _nonfinite(v: float) -> str | None:
    """``nan``, ``inf``, ``-inf`` for a non-finite value (shown as logged), None otherwise."""
    return None if math.isfinite(v) else "nan" if math.isnan(v) else "inf" if v > 0 else "-inf"


def _fmt(v: float | None) -> str:
    return "—" if v is None else _nonfinite(v) or f"{v:.4f}"


def _fmt_delta(v: float | None) -> str:
    return "—" if v is None else _nonfinite(v) or f"{v:+.4f}"


def _fmt_paper(p: PublishedValue | None, flag_mark: str) -> str:
    if p is None:
        return "—"
    return f"{p.value:.4f}" + (flag_mark if p.flag else "")


def _fmt_ours(c: Cell, pm: str = " ± ", unequal: str = " ‡") -> str:
    """The value, with ± std when it is a mean over several runs, marked when they end at different steps."""
    return (_fmt(c.ours) + (f"{pm}{_fmt(c.std)}" if c.ours is not None and c.std is not None else "")
            + (unequal if c.steps is not None else ""))


def _caption(td: TableData) -> str:
    last = f"step {td.last_step}" if td.last_step is not None else "the final evaluated step"
    upto = f" <= {td.last_step}" if td.last_step is not None else ""
    runs = [c.n for _, cells in td.rows for c in cells.values()]
    seeds = "; mean ± std over seeds" if any(n > 1 for n in runs) else ""
    cols = "; ours | paper | Δ = ours − paper" if td.has_paper else ""
    head = f"Table {td.number} ({td.title})" if td.has_paper else td.title
    return (
        f"{head}: {td.metric}; Last = {last}, Best = max over evaluated steps{upto}"
        f"{seeds}{cols}; best of each column in bold, second best underlined"
    )


def render_markdown(td: TableData) -> str:
    """Markdown has no underline: the second best is in italics (the caption says underlined for LaTeX)."""
    head = ["Method"]
    for bench in td.benchmarks:
        for stat in STATS:
            name = f"{bench} {stat.capitalize()}"
            head += [name, "paper", "Δ"] if td.has_paper else [name]
    caption = _caption(td).replace("second best underlined", "second best in italics")
    lines = [f"**{caption}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    marks = td.marks()
    wrap = {"best": "**{}**", "second": "_{}_"}
    for i, (label, cells) in enumerate(td.rows):
        out = [label.replace("|", "\\|")]
        for bench in td.benchmarks:
            for stat in STATS:
                c = cells[(bench, stat)]
                ours = _fmt_ours(c)
                if (i, bench, stat) in marks:
                    ours = wrap[marks[(i, bench, stat)]].format(ours)
                out += [ours, _fmt_paper(c.paper, " ⚠"), _fmt_delta(c.delta)] if td.has_paper else [ours]
        lines.append("| " + " | ".join(out) + " |")
    if td.notes or td.step_notes:
        lines.append("")
        lines += [f"⚠ {n}" for n in td.notes] + [f"‡ {n}" for n in td.step_notes]
    return "\n".join(lines) + "\n"


_LATEX_ESCAPES = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_ESCAPES.get(ch, ch) for ch in text)


def render_latex(td: TableData) -> str:
    """A booktabs table scaled to the text width (needs ``\\usepackage{booktabs,graphicx}``)."""
    per = 3 if td.has_paper else 1
    ncols = 1 + per * len(STATS) * len(td.benchmarks)
    groups, rules, sub = [], [], []
    col = 2
    for bench in td.benchmarks:
        for stat in STATS:
            name = f"{latex_escape(bench)} {stat.capitalize()}"
            groups.append(rf"\multicolumn{{{per}}}{{c}}{{{name}}}" if per > 1 else name)
            rules.append(rf"\cmidrule(lr){{{col}-{col + per - 1}}}")
            sub += ["ours", "paper", r"$\Delta$"]
            col += per
    caption = (latex_escape(_caption(td)).replace("Δ", r"$\Delta$").replace("−", "-").replace("<=", r"$\le$")
               .replace("±", r"$\pm$"))
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\scriptsize",
        rf"\caption{{{caption}}}",
        r"\resizebox{\linewidth}{!}{%",
        r"\begin{tabular}{l" + "r" * (ncols - 1) + "}",
        r"\toprule",
        "Method & " + " & ".join(groups) + r" \\",
    ]
    if td.has_paper:
        lines += [" ".join(rules), " & " + " & ".join(sub) + r" \\"]
    lines.append(r"\midrule")
    marks = td.marks()
    wrap = {"best": r"\textbf{{{}}}", "second": r"\underline{{{}}}"}
    for i, (label, cells) in enumerate(td.rows):
        out = [latex_escape(label)]
        for bench in td.benchmarks:
            for stat in STATS:
                c = cells[(bench, stat)]
                ours = _fmt_ours(c, r" $\pm$ ", r"$^\ddagger$").replace("—", "--")
                if (i, bench, stat) in marks:
                    ours = wrap[marks[(i, bench, stat)]].format(ours)
                if td.has_paper:
                    out += [ours, _fmt_paper(c.paper, r"$^\dagger$").replace("—", "--"),
                            _fmt_delta(c.delta).replace("—", "--")]
                else:
                    out.append(ours)
        lines.append(" & ".join(out) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}}"]
    if td.notes or td.step_notes:
        lines.append(r"\par\smallskip\footnotesize")
        lines += [r"$^\dagger$ " + latex_escape(n) + r"\par" for n in td.notes]
        lines += [r"$^\ddagger$ " + latex_escape(n) + r"\par" for n in td.step_notes]
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"
