"""Paper tables (Tables 3, 5, 6, 7, 8) from run logs: Last / Best per benchmark, ours vs published.

* Last = the value at ``last_step`` (400, the paper's final step). If that step was not evaluated
  the cell is empty and a warning names the last evaluated step: no silent substitution.
  ``last_step=None`` means "the final evaluated step of each run".
* Best = max over evaluated steps <= last_step (all steps when last_step is None), including
  step 0 (``val_before_train``). The paper does not define Best; this is the spec's reading (§6.2).
* Δ = ours − paper. A run is matched to a published row by its label (case-insensitive method
  name, e.g. ``RPG-REINFORCE-URKL``); unmatched runs get empty paper cells and a warning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rpg.reports.benchmarks import PAPER_METRIC, benchmark_series
from rpg.reports.logs import Metrics
from rpg.reports.published import PublishedValue, get_layout, load_published, methods_of

STATS = ("last", "best")


@dataclass
class Cell:
    ours: float | None
    paper: PublishedValue | None

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


def last_and_best(series: dict[int, float], last_step: int | None) -> tuple[float | None, float | None]:
    """(value at last_step or None, max over steps <= last_step or None); last_step None = final step."""
    if not series:
        return None, None
    if last_step is None:
        last_step = max(series)
    eligible = [v for s, v in series.items() if s <= last_step]
    return series.get(last_step), (max(eligible) if eligible else None)


def build_table(
    runs: list[tuple[str, Metrics]],
    table: str,
    metric: str | None = None,
    last_step: int | None = 400,
    source_map: dict[str, str] | None = None,
    published: dict | None = None,
) -> TableData:
    """``metric`` None = the paper's statistic per benchmark (``PAPER_METRIC``: acc/mean@32 on AIME/AMC,
    acc/mean@1 on Minerva/OlympiadBench); a string = that metric for every benchmark."""
    layout = get_layout(table)
    published = load_published() if published is None else published
    methods = {m.lower(): m for m in methods_of(layout.number, published)}
    metric_of = {bench: metric or PAPER_METRIC[bench] for bench in layout.benchmarks}
    td = TableData(layout.number, layout.title, layout.benchmarks, _metric_label(metric_of), last_step)
    flagged = {}
    for label, metrics in runs:
        method = methods.get(label.lower())
        if method is None:
            td.warnings.append(
                f"run {label!r} is not a method of Table {layout.number}; no published numbers "
                f"(label runs as METHOD=PATH, methods: {', '.join(methods.values())})"
            )
        series = {m: benchmark_series(metrics, m, source_map) for m in sorted(set(metric_of.values()))}
        cells: dict[tuple[str, str], Cell] = {}
        for bench in layout.benchmarks:
            ds, s = series[metric_of[bench]].get(bench, (None, {}))
            if ds is None:
                td.warnings.append(f"run {label!r}: no val-core/<data_source>/{metric_of[bench]} for {bench}")
            last, best = last_and_best(s, last_step)
            if s and last is None:
                td.warnings.append(
                    f"run {label!r}: {bench} ({ds}) has no value at step {last_step}; "
                    f"last evaluated step is {max(s)}"
                )
            for stat, ours in zip(STATS, (last, best)):
                paper = published.get((layout.number, method, bench, stat)) if method else None
                cells[(bench, stat)] = Cell(ours, paper)
                if paper is not None and paper.flag:
                    flagged[(method, bench, stat)] = paper
        td.rows.append((label, cells))
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


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:.4f}"


def _fmt_delta(v: float | None) -> str:
    return "—" if v is None else f"{v:+.4f}"


def _fmt_paper(p: PublishedValue | None, flag_mark: str) -> str:
    if p is None:
        return "—"
    return f"{p.value:.4f}" + (flag_mark if p.flag else "")


def _caption(td: TableData) -> str:
    last = f"step {td.last_step}" if td.last_step is not None else "the final evaluated step"
    upto = f" <= {td.last_step}" if td.last_step is not None else ""
    return (
        f"Table {td.number} ({td.title}): {td.metric}; Last = {last}, Best = max over evaluated steps{upto}; "
        "ours | paper | Δ = ours − paper"
    )


def render_markdown(td: TableData) -> str:
    head = ["Method"]
    for bench in td.benchmarks:
        for stat in STATS:
            head += [f"{bench} {stat.capitalize()}", "paper", "Δ"]
    lines = [f"**{_caption(td)}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, cells in td.rows:
        out = [label.replace("|", "\\|")]
        for bench in td.benchmarks:
            for stat in STATS:
                c = cells[(bench, stat)]
                out += [_fmt(c.ours), _fmt_paper(c.paper, " ⚠"), _fmt_delta(c.delta)]
        lines.append("| " + " | ".join(out) + " |")
    if td.notes:
        lines.append("")
        lines += [f"⚠ {n}" for n in td.notes]
    return "\n".join(lines) + "\n"


_LATEX_ESCAPES = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_ESCAPES.get(ch, ch) for ch in text)


def render_latex(td: TableData) -> str:
    """A booktabs table (needs ``\\usepackage{booktabs}``)."""
    ncols = 1 + 3 * len(STATS) * len(td.benchmarks)
    groups, rules, sub = [], [], []
    col = 2
    for bench in td.benchmarks:
        for stat in STATS:
            groups.append(rf"\multicolumn{{3}}{{c}}{{{latex_escape(bench)} {stat.capitalize()}}}")
            rules.append(rf"\cmidrule(lr){{{col}-{col + 2}}}")
            sub += ["ours", "paper", r"$\Delta$"]
            col += 3
    caption = latex_escape(_caption(td)).replace("Δ", r"$\Delta$").replace("−", "-").replace("<=", r"$\le$")
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\scriptsize",
        rf"\caption{{{caption}}}",
        r"\begin{tabular}{l" + "r" * (ncols - 1) + "}",
        r"\toprule",
        "Method & " + " & ".join(groups) + r" \\",
        " ".join(rules),
        " & " + " & ".join(sub) + r" \\",
        r"\midrule",
    ]
    for label, cells in td.rows:
        out = [latex_escape(label)]
        for bench in td.benchmarks:
            for stat in STATS:
                c = cells[(bench, stat)]
                out += [
                    _fmt(c.ours).replace("—", "--"),
                    _fmt_paper(c.paper, r"$^\dagger$").replace("—", "--"),
                    _fmt_delta(c.delta).replace("—", "--"),
                ]
        lines.append(" & ".join(out) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if td.notes:
        lines.append(r"\par\smallskip\footnotesize")
        lines += [r"$^\dagger$ " + latex_escape(n) + r"\par" for n in td.notes]
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"
