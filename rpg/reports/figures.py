"""Training-dynamics figure: mean@32 on AIME24 / AIME25, reward, entropy and response length vs step.

One line per run; written as ``<out>.png`` and ``<out>.svg`` with matplotlib's Agg backend (no
display needed; no pyplot global state). The training keys are verl 0.9.1's:
``critic/score/mean`` (sequence score = ±1 + overlong penalty, the paper's "critic score"),
``actor/entropy`` and ``response_length/mean``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rpg.reports.benchmarks import benchmark_series
from rpg.reports.logs import Metrics

REWARD_KEY = "critic/score/mean"
ENTROPY_KEY = "actor/entropy"
LENGTH_KEY = "response_length/mean"


@dataclass(frozen=True)
class Panel:
    title: str
    benchmark: str | None = None  # validation panel (mean@k of this benchmark)
    key: str | None = None        # training metric key


def default_panels(metric: str = "acc/mean@32", reward_key=REWARD_KEY, entropy_key=ENTROPY_KEY, length_key=LENGTH_KEY):
    k = metric.rsplit("/", 1)[-1]
    return (
        Panel(f"AIME24 {k}", benchmark="AIME24"),
        Panel(f"AIME25 {k}", benchmark="AIME25"),
        Panel(f"Reward ({reward_key})", key=reward_key),
        Panel(f"Entropy ({entropy_key})", key=entropy_key),
        Panel(f"Response length ({length_key})", key=length_key),
    )


def plot_curves(
    runs: list[tuple[str, Metrics]],
    out: str | Path,
    metric: str = "acc/mean@32",
    source_map: dict[str, str] | None = None,
    panels: tuple[Panel, ...] | None = None,
) -> tuple[list[Path], list[str]]:
    """Draw the figure; returns ([png, svg] paths, warnings about missing series)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    panels = panels or default_panels(metric)
    warnings: list[str] = []
    fig = Figure(figsize=(4.0 * len(panels), 3.4), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel in zip(axes, panels):
        drawn = 0
        for label, metrics in runs:
            if panel.benchmark is not None:
                series = benchmark_series(metrics, metric, source_map).get(panel.benchmark, (None, {}))[1]
            else:
                series = metrics.get(panel.key, {})
            if not series:
                warnings.append(f"run {label!r}: no data for panel {panel.title!r}")
                continue
            steps = sorted(series)
            ax.plot(steps, [series[s] for s in steps], label=label, linewidth=1.4,
                    marker="o" if panel.benchmark else None, markersize=2.5)
            drawn += 1
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        if not drawn:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6), fontsize=8)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stem = out.with_suffix("") if out.suffix in (".png", ".svg") else out
    paths = [stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".svg")]
    with matplotlib.rc_context({"svg.hashsalt": "rpg-figure"}):
        fig.savefig(paths[0], dpi=150, metadata={"Software": None})
        fig.savefig(paths[1], metadata={"Date": None, "Creator": None})
    return paths, warnings
