"""Tables and figures of the study, drawn by ``rpg.reports`` (the code that renders the paper's tables).

Written to the report directory:

* ``table.md`` / ``table.tex``: Last / Best validation accuracy (mean ± std over seeds) of every
  method at the main grid's steps per batch, and of the stress methods (those run at more than one
  steps-per-batch value) at each value.
* ``curves.png`` / ``.svg``: the methods' training dynamics (Fig. 4 layout, 2 x 3 panels).
* ``stress.png`` / ``.svg``: clipped vs unclipped RPG-REINFORCE at each steps-per-batch value.
* ``weights.md`` (behaviour-weight arms only, ``--async-weights``): per arm, what the stale sampler
  and the loss's weights were: staleness, behaviour KL, the applied weights' range, the capped share.
* ``staleness.md``, ``staleness.png`` / ``.svg`` (the staleness study, ``--staleness``): per method x arm x staleness
  the final accuracy, behaviour KL, largest applied weight, gradient norm, observed staleness and collapses (the
  criterion ``rpg_lab.study.grid.collapsed``, declared before the runs); the figure: final accuracy and behaviour KL
  against staleness, one line per arm, RPG-Style Clip on / off side by side.
* ``runs.md``: every run of the grid with its status, wall time and directory; failed and missing
  runs are listed, never dropped silently.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from rpg.trainer_process.run_dir import METRICS_FILE
from rpg.reports.figures import ENTROPY_KEY, LENGTH_KEY, REWARD_KEY, Panel, plot_curves
from rpg.reports.logs import Metrics, check_metric, read_run
from rpg.reports.published import TableLayout
from rpg.reports.tables import build_table, render_latex, render_markdown
from rpg_lab.study.grid import COLLAPSE_FRACTION, RunSpec, collapsed, fmt_duration
from rpg_lab.study.records import run_dir
from rpg.tiny.task import DATA_SOURCE

VAL_COLUMN = "tiny val acc"
KL_KEY = "actor/ppo_kl"          # mean of log pi_old - log pi over the update's tokens (how far off-policy)
CLIPFRAC_KEY = "actor/pg_clipfrac"  # fraction of tokens where the clip binds (0 for unclipped losses)


def metric_of(spec: RunSpec) -> str:
    return f"acc/mean@{spec.sizes.val_n}"


def panels(metric: str) -> tuple[Panel, ...]:
    k = metric.rsplit("/", 1)[-1]
    return (
        Panel(f"(a) Validation accuracy {k}", key=f"val-core/{DATA_SOURCE}/{metric}", ylabel=f"held-out accuracy {k}"),
        Panel("(b) Reward (critic score)", key=REWARD_KEY, ylabel=f"reward ({REWARD_KEY})"),
        Panel("(c) Entropy", key=ENTROPY_KEY, ylabel=f"entropy ({ENTROPY_KEY})"),
        Panel("(d) Response length", key=LENGTH_KEY, ylabel=f"tokens ({LENGTH_KEY})"),
        Panel("(e) Off-policy distance", key=KL_KEY, ylabel=f"KL(old || new) k1 ({KL_KEY})"),
        Panel("(f) Clipped fraction", key=CLIPFRAC_KEY, ylabel=f"fraction of tokens ({CLIPFRAC_KEY})"),
    )


def stress_label(spec: RunSpec) -> str:
    return f"{spec.label}, {spec.updates} step{'s' if spec.updates > 1 else ''}/batch"


def stress_styles(specs: list[RunSpec]) -> dict[str, dict]:
    """One colour per steps-per-batch value; solid = clipped, dashed = unclipped (the method compared)."""
    from rpg_lab.study.methods import clipped

    ks = sorted({s.updates for s in specs})
    palette = ("tab:blue", "tab:orange", "tab:red", "tab:green", "tab:purple", "tab:brown")
    return {stress_label(s): {"color": palette[ks.index(s.updates) % len(palette)],
                              "linestyle": "-" if clipped(s.variant) else "--"} for s in specs}


def _layout(title: str) -> TableLayout:
    return TableLayout("tiny", title, (VAL_COLUMN,), sources={VAL_COLUMN: DATA_SOURCE})


def load(out: Path, specs: list[RunSpec], records: list[dict]) -> tuple[dict[str, Metrics], list[str]]:
    """{run_id: metrics} of the finished runs, and notes on the runs that are not (failed, missing)."""
    runs, notes = {}, []
    for spec, rec in zip(specs, records):
        if rec.get("status") != "done":
            what = rec.get("status", "todo")
            extra = f" at step {rec.get('last_step')}: {rec.get('error', '')}" if what == "failed" else ""
            notes.append(f"{spec.label} k={spec.updates} seed {spec.seed}: {what}{extra}")
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runs[spec.run_id] = read_run(run_dir(out, spec) / METRICS_FILE)
        notes += [f"{spec.run_id}: {w.message}" for w in caught]
    return runs, notes


def render(out: Path, report: Path, specs: list[RunSpec], records: list[dict], main_updates: int,
           command: str = "") -> list[Path]:
    """Write the table, figures and run list for the finished runs; returns the written paths."""
    report = Path(report)
    report.mkdir(parents=True, exist_ok=True)
    runs, notes = load(out, specs, records)
    metric = metric_of(specs[0])
    sizes = specs[0].sizes
    stale = any(s.staleness for s in specs)  # the staleness study: its own table and figure, no curves
    main = [(s.label, runs[s.run_id]) for s in specs if (stale or s.updates == main_updates) and s.run_id in runs]
    stress_specs = [] if stale else [s for s in specs
                                     if any(o.variant == s.variant and o.updates != s.updates for o in specs)]
    stress = [(stress_label(s), runs[s.run_id])
              for s in sorted(stress_specs, key=lambda s: (s.updates, "(no clip)" in s.label)) if s.run_id in runs]
    check_metric(main + stress, metric)
    written: list[Path] = []
    partial = len(runs) < len(specs)

    flag = f" (PARTIAL: {len(runs)} of {len(specs)} runs finished)" if partial else ""
    md, tex, warns = [], [], []
    main_title = ("staleness study: separate-async trainer, staleness = optimizer updates per weight sync"
                  if stale else f"tiny task on CPU, {main_updates} optimizer steps per rollout batch")
    for title, rows in (
        (f"{main_title}{flag}", main),
        (f"off-policy stress: RPG-REINFORCE-UFKL with and without RPG-Style Clip{flag}", stress),
    ):
        if not rows:
            continue
        if partial:  # rows may rest on different numbers of seeds: say so in each row's name
            rows = _with_seed_counts(rows)
        td = build_table(rows, _layout(title), metric=metric, last_step=sizes.steps)
        md.append(render_markdown(td))
        tex.append(render_latex(td))
        warns += td.warnings
    for name, text in (("table.md", "\n".join(md)), ("table.tex", "\n".join(tex))):
        (report / name).write_text(text, encoding="utf-8")
        written.append(report / name)
    for name, rows, title in (
        ("curves", main, f"Tiny task, {main_updates} optimizer steps per rollout batch{flag}"),
        ("stress", stress, f"RPG-REINFORCE-UFKL, clipped vs unclipped, by optimizer steps per rollout batch{flag}"),
    ):
        if rows and not stale:
            styles = stress_styles(stress_specs) if name == "stress" else None
            paths, fig_warns = plot_curves(rows, report / name, metric, panels=panels(metric), last_step=sizes.steps,
                                           title=title, styles=styles, dpi=100)  # small files for docs/
            written += paths
            warns += fig_warns
    if stale:
        written.append(staleness_md(report / "staleness.md", runs, specs, metric))
        written += staleness_figure(report / "staleness", runs, specs, metric)
    elif any(s.arm for s in specs):
        written.append(weights_md(report / "weights.md", runs, specs))
    written.append(_runs_md(report / "runs.md", out, specs, records, notes + warns + eval_noise(runs, specs, metric, val_problem_count(out, specs, records)),
                            command))
    return written


# per-step statistics of the behaviour-weight arms: (key as logged, column, how the steps >= 2 reduce)
BEHAVIOR_STATS = (
    ("training/off_policy/trajectory_staleness/mean", "staleness (versions), step mean", None),
    ("actor/rpg/behavior_kl", "behaviour KL(mu ‖ pi_old) k1, step mean", None),
    ("actor/rpg/behavior_kl", "behaviour KL, step max", max),
    ("actor/rpg/behavior_weight_min", "applied weight min", min),
    ("actor/rpg/behavior_weight_max", "applied weight max", max),
    ("actor/rpg/behavior_weight_capped_frac", "capped share, step mean", None),
)


def behavior_summary(m: Metrics, key: str, reduce) -> float | None:
    """One run's ``key`` over steps >= 2 (step 1 trains on samples of the current policy): ``reduce`` of the
    per-step values, or their mean when ``reduce`` is None; None when the run did not log it."""
    vals = [float(v) for s, v in sorted(m.get(key, {}).items()) if s >= 2]
    if not vals:
        return None
    return sum(vals) / len(vals) if reduce is None else reduce(vals)


def weights_md(path: Path, runs: dict[str, Metrics], specs: list[RunSpec]) -> Path:
    """``weights.md``: per arm, each statistic of BEHAVIOR_STATS as the mean over seeds and the seeds' range."""
    arms = list(dict.fromkeys(s.arm for s in specs if s.arm))
    lines = ["# Behaviour weights per arm (steps >= 2; mean over seeds [min, max over seeds])", "",
             "| arm | seeds | " + " | ".join(col for _, col, _ in BEHAVIOR_STATS) + " |",
             "|---|---|" + "---|" * len(BEHAVIOR_STATS)]
    for arm in arms:
        done = [runs[s.run_id] for s in specs if s.arm == arm and s.run_id in runs]
        cells = []
        for key, _, reduce in BEHAVIOR_STATS:
            xs = [x for x in (behavior_summary(m, key, reduce) for m in done) if x is not None]
            cells.append(f"{sum(xs) / len(xs):.3g} [{min(xs):.3g}, {max(xs):.3g}]" if xs else "not logged")
        lines.append(f"| {arm} | {len(done)} | " + " | ".join(cells) + " |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# the staleness study's per-run statistics over steps >= 2: (key as logged, column, how the steps reduce)
STALENESS_STATS = (
    ("actor/rpg/behavior_kl", "behaviour KL(mu ‖ pi_old) k1, step mean", None),
    ("actor/rpg/behavior_weight_max", "largest applied weight", max),
    ("actor/grad_norm", "grad norm, step mean", None),
    ("actor/grad_norm", "grad norm, step max", max),
    ("training/off_policy/trajectory_staleness/mean", "observed staleness (versions), step mean", None),
)


def _val_key(metric: str) -> str:
    return f"val-core/{DATA_SOURCE}/{metric}"


def staleness_rows(runs: dict[str, Metrics], specs: list[RunSpec], metric: str) -> list[dict]:
    """One row per (method, arm, staleness) in grid order: the finished seeds' final accuracies, each statistic of
    STALENESS_STATS per seed, and the collapses (``collapsed``: reason per collapsed seed)."""
    import statistics

    groups: dict[tuple[str, str, int], list[RunSpec]] = {}
    for s in specs:
        groups.setdefault((s.variant, s.arm, s.staleness), []).append(s)
    rows = []
    for (variant, arm, stale), members in groups.items():
        done = [runs[s.run_id] for s in members if s.run_id in runs]
        last = members[0].sizes.steps
        finals = [float(m[_val_key(metric)][last]) for m in done if last in m.get(_val_key(metric), {})]
        stats = {col: [x for x in (behavior_summary(m, key, red) for m in done) if x is not None]
                 for key, col, red in STALENESS_STATS}
        why = [collapsed(m.get(_val_key(metric), {}), m.get("actor/grad_norm", {})) for m in done]
        rows.append({"label": members[0].label.split(", staleness")[0], "variant": variant, "arm": arm,
                     "staleness": stale, "seeds": len(members), "done": len(done), "finals": finals,
                     "final_mean": statistics.fmean(finals) if finals else None,
                     "final_std": statistics.stdev(finals) if len(finals) > 1 else 0.0 if finals else None,
                     "stats": stats, "collapses": [w for w in why if w]})
    return rows


def staleness_md(path: Path, runs: dict[str, Metrics], specs: list[RunSpec], metric: str) -> Path:
    """``staleness.md``: the table (mean ± std of the final accuracy over seeds; each statistic's mean over seeds
    [min, max over seeds]; collapses k/n) and the reason of each collapse."""
    def cell(xs: list[float]) -> str:
        return f"{sum(xs) / len(xs):.3g} [{min(xs):.3g}, {max(xs):.3g}]" if xs else "not logged"

    rows = staleness_rows(runs, specs, metric)
    lines = [f"# Staleness study ({metric} at the last step; statistics over steps >= 2: mean over seeds "
             "[min, max over seeds])", "",
             f"Collapse (declared before the runs): a non-finite gradient norm, a validation below "
             f"{COLLAPSE_FRACTION:g} x the step-0 accuracy, or a final accuracy below it.", "",
             "| method | weights | staleness | final acc (mean ± std) | "
             + " | ".join(c for _, c, _ in STALENESS_STATS) + " | collapses |",
             "|---|---|---|---|" + "---|" * len(STALENESS_STATS) + "---|"]
    reasons = []
    for r in rows:
        acc = f"{r['final_mean']:.3f} ± {r['final_std']:.3f}" if r["finals"] else "—"
        cells = " | ".join(cell(r["stats"][c]) for _, c, _ in STALENESS_STATS)
        seeds = f" ({r['done']} of {r['seeds']} finished)" if r["done"] < r["seeds"] else ""
        lines.append(f"| {r['label']} | {r['arm']} | {r['staleness']} | {acc}{seeds} | {cells} | "
                     f"{len(r['collapses'])}/{r['done']} |")
        reasons += [f"* {r['label']}, {r['arm']}, staleness {r['staleness']}: {w}" for w in r["collapses"]]
    if reasons:
        lines += ["", "Collapses:", ""] + reasons
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def staleness_figure(out: Path, runs: dict[str, Metrics], specs: list[RunSpec], metric: str) -> list[Path]:
    """``staleness.png`` / ``.svg``: final accuracy (mean ± std over seeds, top) and behaviour KL (mean over seeds,
    bottom) against staleness (log2 axis), one line per arm; one column per method (RPG-Style Clip on / off), the
    columns on the same y-axis per row."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    rows = staleness_rows(runs, specs, metric)
    labels = list(dict.fromkeys(r["label"] for r in rows))
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    fig = Figure(figsize=(5.5 * len(labels), 7.5))
    axes = fig.subplots(2, len(labels), squeeze=False, sharey="row")  # one accuracy axis, one KL axis
    kl_col = STALENESS_STATS[0][1]
    for j, label in enumerate(labels):
        for arm in arms:
            pts = sorted((r["staleness"], r) for r in rows if r["label"] == label and r["arm"] == arm)
            acc = [(s, r["final_mean"], r["final_std"]) for s, r in pts if r["finals"]]
            if acc:
                axes[0][j].errorbar([a[0] for a in acc], [a[1] for a in acc], yerr=[a[2] for a in acc], marker="o",
                                    capsize=3, label=arm)
            kl = [(s, sum(r["stats"][kl_col]) / len(r["stats"][kl_col])) for s, r in pts if r["stats"][kl_col]]
            if kl:
                axes[1][j].plot([k[0] for k in kl], [k[1] for k in kl], marker="o", label=arm)
        axes[0][j].set_title(label)
        axes[0][j].set_ylabel(f"final held-out accuracy {metric.rsplit('/', 1)[-1]}")
        axes[1][j].set_ylabel("behaviour KL(mu ‖ pi_old), step mean")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r["staleness"] for r in rows}))
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.set_xlabel("staleness (optimizer updates per weight sync)")
            ax.grid(alpha=0.3)
        axes[0][j].legend(title="behaviour weight")
    fig.tight_layout()
    paths = []
    for ext in ("png", "svg"):
        fig.savefig(out.with_suffix(f".{ext}"), dpi=100)
        paths.append(out.with_suffix(f".{ext}"))
    return paths


def eval_noise(runs: dict[str, Metrics], specs: list[RunSpec], metric: str, val_problems: int | None) -> list[str]:
    """What one evaluation's noise is, measured on the validation before training (step 0).

    Every run validates the same initial model at step 0 with the rollout's sampling seed = the
    run's seed, and the CPU rollout draws each sample from its own seeded generator. So (a) runs of
    the same seed must log the same step-0 value (a determinism check: the spread within a seed is
    reported), and (b) the spread of the step-0 values *between* seeds (one value per seed) is the
    sampling noise of one evaluation of a fixed model. (c) The binomial standard error
    sqrt(p (1 - p) / (problems x samples)) at the step-0 accuracy bounds that noise from above for
    this fixed problem set (its variance is mean_i p_i (1 - p_i) / (problems x samples) <= p (1 - p) /
    (problems x samples), p (1 - p) being concave); the noise over a new draw of problems is larger.
    """
    import statistics

    key = f"val-core/{DATA_SOURCE}/{metric}"
    by_seed: dict[int, list[float]] = {}
    for spec in specs:
        m = runs.get(spec.run_id)
        if m is not None and 0 in m.get(key, {}):
            by_seed.setdefault(spec.seed, []).append(float(m[key][0]))
    if not by_seed:
        return ["evaluation noise: no run validated before training"]
    spread = max(max(v) - min(v) for v in by_seed.values())
    n_runs = sum(len(v) for v in by_seed.values())
    notes = [f"determinism: the validation before training is {'identical' if spread == 0 else 'NOT identical'} "
             f"across the runs of each seed (largest spread within a seed {spread:.3f}; {n_runs} runs, "
             f"{len(by_seed)} seed(s))"]
    firsts = [v[0] for _, v in sorted(by_seed.items())]
    text = ("evaluation noise: the validation before training (the same initial model; only the sampling seed "
            f"differs) gives {', '.join(f'{x:.3f}' for x in firsts)} for seeds {', '.join(map(str, sorted(by_seed)))}")
    if len(firsts) > 1:
        text += f" (std {statistics.stdev(firsts):.3f})"
    if val_problems:
        p, k = statistics.fmean(firsts), val_problems * specs[0].sizes.val_n
        text += (f"; the binomial standard error at accuracy {p:.3f} over {val_problems} problems x "
                 f"{specs[0].sizes.val_n} samples is {(p * (1 - p) / k) ** 0.5:.3f} (an upper bound on the sampling noise "
                 "over these problems; a new draw of problems would add more)")
    notes.append(text + "; differences between methods of this size are not evidence")
    return notes


def val_problem_count(out: Path, specs: list[RunSpec], records: list[dict]) -> int | None:
    """Rows of the held-out file(s) the runs validated on (``data.val_files`` of the first run that sets it,
    read as Hydra reads it: one path or a list)."""
    from rpg.override_lists import OverrideSyntaxError, values

    for spec, rec in zip(specs, records):
        try:
            files = values(rec.get("overrides") or []).get("data.val_files")
        except OverrideSyntaxError:
            return None
        if files is None:
            continue
        try:
            import pyarrow.parquet as pq

            return sum(pq.ParquetFile(Path(f)).metadata.num_rows for f in ([files] if isinstance(files, str) else files))
        except (OSError, ImportError, ValueError, TypeError):
            return None
    return None


def _with_seed_counts(rows: list[tuple[str, Metrics]]) -> list[tuple[str, Metrics]]:
    counts = {label: sum(1 for lab, _ in rows if lab == label) for label, _ in rows}
    return [(f"{label} [{counts[label]} seed{'s' if counts[label] > 1 else ''}]", m) for label, m in rows]


def _runs_md(path: Path, out: Path, specs: list[RunSpec], records: list[dict], notes: list[str], command: str) -> Path:
    lines = ["# Runs of the study", ""]
    if command:
        lines += ["Command:", "", "```bash", command, "```", ""]
    s = specs[0].sizes
    lines += [f"Each run: {s.steps} steps of {s.prompts} prompts x {s.n} responses; validation every {s.test_freq} "
              f"steps and at the last ({s.val_n} samples per held-out problem, temperature 1).", "",
              "| # | method | steps/batch | seed | status | wall time | started | code | run directory |",
              "|---|---|---|---|---|---|---|---|---|"]
    for i, (spec, rec) in enumerate(zip(specs, records), 1):
        wall = fmt_duration(rec["wall_time_s"]) if rec.get("wall_time_s") is not None else "—"
        lines.append(f"| {i} | {spec.label} | {spec.updates} | {spec.seed} | {rec.get('status', 'todo')} | {wall} | "
                     f"{rec.get('started', '—')} | {rec.get('code', '—')} | `runs/{spec.run_id}` |")
    done = [r for r in records if r.get("status") == "done"]
    if done:
        total = sum(r["wall_time_s"] for r in done)
        lines += ["", f"{len(done)} of {len(specs)} runs finished; their summed wall time: {fmt_duration(total)}."]
    if notes:
        lines += ["", "Notes:", ""] + [f"* {n}" for n in notes]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
