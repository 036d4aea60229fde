"""Training-dynamics figure in the layout of the paper's Fig. 4.

Six panels on a 2 x 3 grid: mean@32 on AIME24, AIME25 and AMC23 (top row), reward, entropy and
response length (bottom row), each with its y-axis label and "Step" on the x-axis. One line per
run label; runs sharing a label are seeds of one method and are drawn as their mean with a shaded
band of ± one sample standard deviation (where at least two runs have the step). Seeds that end at
different steps say so in the legend (``RPG (n=1 after step 120)``: each point after step 120 is one run's)
and in a warning naming each run's last step.

The x-axis ends at the Last step (``last_step``, default: the largest step any run logged; later
points are not drawn) and that step is marked with a dotted vertical line; on the validation panels each label's value at
that step (the table's "Last") is marked with a diamond. Written as ``<out>.png`` and
``<out>.svg`` with matplotlib's Agg backend (no display; no pyplot global state). The training
keys are verl 0.9.1's: ``critic/score/mean`` (sequence score = ±1 + overlong penalty, the paper's
"critic score"), ``actor/entropy`` and ``response_length/mean``. NaN and ±inf values cannot be
drawn: they are left out with a warning naming the run, panel and steps.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from rpg.data.io import make_parent
from rpg.reports.benchmarks import benchmark_series
from rpg.reports.logs import Metrics

REWARD_KEY = "critic/score/mean"
ENTROPY_KEY = "actor/entropy"
LENGTH_KEY = "response_length/mean"
NCOLS = 3  # the paper's Fig. 4: 2 rows x 3 columns


@dataclass(frozen=True)
class Panel:
    title: str
    benchmark: str | None = None  # validation panel (mean@k of this benchmark)
    key: str | None = None        # training metric key (or any exact key, e.g. val-core/<ds>/acc/mean@4)
    ylabel: str = ""

    @property
    def validation(self) -> bool:
        return self.benchmark is not None or (self.key or "").startswith("val-")


def default_panels(metric: str = "acc/mean@32", reward_key=REWARD_KEY, entropy_key=ENTROPY_KEY, length_key=LENGTH_KEY):
    k = metric.rsplit("/", 1)[-1]
    return (
        Panel(f"(a) AIME24 {k}", benchmark="AIME24", ylabel=f"AIME24 {k}"),
        Panel(f"(b) AIME25 {k}", benchmark="AIME25", ylabel=f"AIME25 {k}"),
        Panel(f"(c) AMC23 {k}", benchmark="AMC23", ylabel=f"AMC23 {k}"),
        Panel("(d) Reward (critic score)", key=reward_key, ylabel=f"reward ({reward_key})"),
        Panel("(e) Entropy", key=entropy_key, ylabel=f"entropy ({entropy_key})"),
        Panel("(f) Response length", key=length_key, ylabel=f"tokens ({length_key})"),
    )


def seed_band(series_list: list[dict[int, float]]) -> tuple[list[int], list[float], list[float | None]]:
    """(steps, mean, std) over the runs of one label at each step any of them logged; std is None
    where fewer than two runs have the step (sample std, ddof 1)."""
    steps = sorted({s for series in series_list for s in series})
    means, stds = [], []
    for s in steps:
        vals = [series[s] for series in series_list if s in series]
        means.append(statistics.fmean(vals))
        stds.append(statistics.stdev(vals) if len(vals) > 1 else None)
    return steps, means, stds


def fewer_runs(ends: list[int]) -> str | None:
    """``"n=2 after step 120, n=1 after step 200"``: how many of a label's runs each stretch of its line averages,
    from each run's last drawn step; None when they all end at one step."""
    cuts = sorted(set(ends))[:-1]
    return ", ".join(f"n={sum(e > c for e in ends)} after step {c}" for c in cuts) or None


def drop_nonfinite(series: dict[int, float]) -> tuple[dict[int, float], list[str]]:
    """(the finite points, ``"step S (nan|inf|-inf)"`` for each point left out): a line cannot show
    NaN or ±inf, and matplotlib would leave them out without a word."""
    kept = {s: v for s, v in series.items() if math.isfinite(v)}
    return kept, [f"step {s} ({'nan' if math.isnan(v) else f'{v:g}'})" for s, v in sorted(series.items()) if s not in kept]


def _series(metrics: Metrics, panel: Panel, metric: str, source_map) -> dict[int, float]:
    if panel.benchmark is not None:
        return benchmark_series(metrics, metric, source_map).get(panel.benchmark, (None, {}))[1]
    return metrics.get(panel.key, {})


def plot_curves(
    runs: list[tuple[str, Metrics]],
    out: str | Path,
    metric: str = "acc/mean@32",
    source_map: dict[str, str] | None = None,
    panels: tuple[Panel, ...] | None = None,
    last_step: int | None = None,
    title: str | None = None,
    styles: dict[str, dict] | None = None,
    dpi: int = 150,
) -> tuple[list[Path], list[str]]:
    """Draw the figure; returns ([png, svg] paths, warnings about missing series).

    ``styles`` ({label: matplotlib line keywords, e.g. color, linestyle}) overrides a label's
    default style (a tab10 colour by label order, solid line).
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    panels = panels or default_panels(metric)
    warnings: list[str] = []
    labels: dict[str, list[Metrics]] = {}
    for label, metrics in runs:
        labels.setdefault(label, []).append(metrics)
    data = {}  # (panel, label) -> {run index: its finite points}
    for p in panels:
        for lab, ms in labels.items():
            kept = {}
            for k, series in enumerate(_series(m, p, metric, source_map) for m in ms):
                finite, dropped = drop_nonfinite(series)
                if dropped:
                    warnings.append(f"run {lab!r}: panel {p.title!r}: non-finite values not drawn: {', '.join(dropped)}")
                if finite:
                    kept[k] = finite
            data[(p, lab)] = kept
    if last_step is None:
        last_step = max((max(s) for sl in data.values() for s in sl.values()), default=None)
    else:  # the axis ends at the Last step: later points are not drawn
        data = {key: {k: c for k, c in ((k, {s: v for s, v in series.items() if s <= last_step})
                                        for k, series in sl.items()) if c}
                for key, sl in data.items()}
    ends: dict[str, dict[int, int]] = {}  # label -> {run index: its last drawn step, over the panels}
    for lab, ms in labels.items():
        drawn = [(k, [max(data[(p, lab)][k]) for p in panels if k in data[(p, lab)]]) for k in range(len(ms))]
        ends[lab] = {k: max(last) for k, last in drawn if last}
    fewer = {lab: fewer_runs(list(e.values())) for lab, e in ends.items()}
    for lab, note in fewer.items():
        if note is not None:
            runs_at = ", ".join(f"#{k + 1} at step {e}" for k, e in ends[lab].items())
            warnings.append(f"run {lab!r}: its runs end at different steps ({runs_at}); its line averages fewer runs "
                            f"after the earliest ({note}: the legend says so)")

    ncols = min(NCOLS, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(4.2 * ncols, 3.3 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    colors = matplotlib.colormaps["tab10"].colors
    seeds = {len(ms) for ms in labels.values()}
    same_seeds = len(seeds) == 1 and seeds != {1}  # say "mean ± std over N seeds" once, in the legend title
    handles: dict[str, object] = {}
    for ax, panel in zip(axes, panels):
        drawn = 0
        for i, (label, ms) in enumerate(labels.items()):
            series_list = list(data[(panel, label)].values())
            if len(series_list) < len(ms):
                warnings.append(f"run {label!r}: no data for panel {panel.title!r}"
                                + (f" in {len(ms) - len(series_list)} of {len(ms)} runs" if len(ms) > 1 else ""))
            if not series_list:
                continue
            steps, mean, std = seed_band(series_list)
            style = {"color": colors[i % len(colors)], **(styles or {}).get(label, {})}
            color = style["color"]
            says = ([] if len(ms) == 1 or same_seeds else [f"mean ± std, {len(ms)} seeds"]) + [fewer[label] or ""]
            name = f"{label} ({'; '.join(filter(None, says))})" if any(says) else label
            (line,) = ax.plot(steps, mean, linewidth=1.4, label=name,
                              marker="o" if panel.validation else None, markersize=2.5, **style)
            handles.setdefault(name, line)
            band = [(s, m, d) for s, m, d in zip(steps, mean, std) if d is not None]
            if band:
                bs, bm, bd = zip(*band)
                ax.fill_between(bs, [m - d for m, d in zip(bm, bd)], [m + d for m, d in zip(bm, bd)],
                                color=color, alpha=0.18, linewidth=0)
            if panel.validation and last_step in steps:
                ax.plot([last_step], [mean[steps.index(last_step)]], marker="D", color=color, markersize=5,
                        markeredgecolor="black", markeredgewidth=0.6, linestyle="none")
            drawn += 1
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel("Step")
        ax.set_ylabel(panel.ylabel or panel.title, fontsize=8)
        ax.grid(alpha=0.3, linestyle="--")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if last_step is not None:
            first = min((min(s) for sl in data.values() for s in sl.values()), default=0)
            ax.set_xlim(min(0, first), last_step + 0.02 * max(1, last_step - min(0, first)))  # room for the marker
            ax.axvline(last_step, color="0.35", linestyle=":", linewidth=1.0)
        if not drawn:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    if last_step is not None:
        from matplotlib.lines import Line2D

        handles[f"Last (step {last_step})"] = Line2D([], [], color="0.35", linestyle=":", marker="D",
                                                     markerfacecolor="white", markeredgecolor="black")
    if handles:
        ncol = min(len(handles), 4 if max(map(len, handles)) <= 28 else 3 if max(map(len, handles)) <= 45 else 2)
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=ncol, fontsize=8,
                   title=f"mean ± std over {seeds.pop()} seeds" if same_seeds else None, title_fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    out = Path(out)
    stem = out.with_suffix("") if out.suffix in (".png", ".svg") else out
    paths = [stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".svg")]
    make_parent(paths[0])
    with matplotlib.rc_context({"svg.hashsalt": "rpg-figure"}):
        fig.savefig(paths[0], dpi=dpi, metadata={"Software": None})
        fig.savefig(paths[1], metadata={"Date": None, "Creator": None})
    return paths, warnings
