"""The lag study's declared analysis (docs/study/lag/PLAN.md): hypotheses, power, the per-run CSV, tables and figure.

* ``plan_numbers``: the plan's budget and power table (``python -m rpg_lab.study.lag`` prints it; the plan holds it).
* ``DESIGN`` / ``chosen``: what the plan fixes, and what a grid of runs sets (``rpg_lab.study.plan_and_results.Design``).
* ``csv_rows`` / ``write_csv`` / ``read_csv``: one row per run of the design (``runs.csv``), from the run folders.
* ``render``: ``results.md`` (per-cell table, the hypotheses' tests, secondary contrasts, collapses) and ``lag.png``,
  from the CSV alone.
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from rpg_lab.study import plan_and_results, stats
from rpg_lab.study.plan_and_results import (DECLARED, VAL_PREFIX, Contrast, CSVError, Design, Result,  # noqa: F401
                                Schema, evaluated_steps, test_contrast)
from rpg_lab.study.plan_and_results import fmt as _f, fmt_ci as _ci, mean_of as _mean
from rpg_lab.study.methods import clipped
from rpg_lab.study.grid import (LAG_BUDGET_S, LAG_CELLS, LAG_COSTS, LAG_SEEDS, LAG_SIZES, LagCell, RunSpec, Sizes,
                            collapsed, fmt_duration, lag_cell, lag_grid)

ALPHA = 0.05  # family-wise, one-sided, Holm over the primary hypotheses
POWER = 0.8
PRIMARY_EVALS = 3  # the primary metric: mean held-out accuracy over the last three evaluations

# Noise, measured on the pilot (the staleness study's 96 runs, docs/study.md): residual SD of one evaluation of
# PILOT_SAMPLES samples (30 problems x 4) after the cell and seed effects, at accuracies around PILOT_ACC.
PILOT_SD = 0.064
PILOT_SAMPLES = 120
PILOT_ACC = 0.6
VAL_PROBLEMS = 30


def _options(seeds: int, cells: tuple[str, ...], s: Sizes) -> dict[str, object]:
    return {"--seeds": seeds, "--cells": cells, "--steps": s.steps, "--test-freq": s.test_freq, "--prompts": s.prompts,
            "--n": s.n, "--val-n": s.val_n}


def _columns(s: Sizes) -> dict[str, int]:
    """A run's design columns in runs.csv: its steps, evaluations and validation samples."""
    return {"steps": s.steps, "test_freq": s.test_freq, "val_problems": VAL_PROBLEMS, "val_n": s.val_n}


DESIGN = Design("the lag study", "--lag", "docs/study/lag/PLAN.md",
                tuple(_options(LAG_SEEDS, tuple(c.name for c in LAG_CELLS), LAG_SIZES).items()),
                tuple(_columns(LAG_SIZES).items()), LAG_SEEDS, tuple(c.name for c in LAG_CELLS),
                plan_commits=("84e82d6", "bb4f5ec"))


def chosen(specs: list[RunSpec], cells: tuple[LagCell, ...] = LAG_CELLS) -> dict[str, object]:
    """The design options of the grid ``specs`` of ``cells`` (``DESIGN.options``' keys)."""
    names = {lag_cell(s, cells).name for s in specs}
    return _options(max(s.seed for s in specs), tuple(c.name for c in cells if c.name in names), specs[0].sizes)


HYPOTHESES: tuple[Contrast, ...] = (
    Contrast("H1", "a one-version lag hurts the arm with neither weights nor clip",
             (("lag0-noclip-token", 1), ("lag1-noclip-none", -1))),
    Contrast("H2", "exact per-token weights repair (part of) it",
             (("lag1-noclip-token", 1), ("lag1-noclip-none", -1))),
    Contrast("H3", "the weights help more without RPG-Style Clip than with it",
             (("lag1-noclip-token", 1), ("lag1-noclip-none", -1), ("lag1-clip-token", -1), ("lag1-clip-none", 1))),
    Contrast("H4", "the lag hurts the unclipped importance-weighted loss (thinking-machines-lab/tinker-cookbook#822)",
             (("lag0-noclip-token", 1), ("lag1-noclip-token", -1))),
)
SECONDARY: tuple[Contrast, ...] = (
    Contrast("S1", "naive PPO beats the unclipped importance-weighted loss at lag 1",
             (("lag1-naive-ppo", 1), ("lag1-noclip-token", -1))),
    Contrast("S2", "weights + clip around pi_old (decoupled PPO) beat naive PPO at lag 1",
             (("lag1-clip-token", 1), ("lag1-naive-ppo", -1))),
    Contrast("S3", "RPG-Style Clip helps the arm without weights at lag 1",
             (("lag1-clip-none", 1), ("lag1-noclip-none", -1))),
)
# collapse rates, Fisher one-sided: (cell expected to collapse more, control)
COLLAPSE_TESTS: tuple[tuple[str, str], ...] = (("lag1-noclip-none", "lag0-noclip-token"),
                                               ("lag1-noclip-token", "lag0-noclip-token"))


def primary_sd() -> tuple[float, float]:
    """(conservative, decomposed) SD of one run's primary metric.

    Conservative: the pilot's PILOT_SD, not reduced by the larger and averaged evaluations. Decomposed: PILOT_SD^2 =
    var_train + p (1 - p) / PILOT_SAMPLES (the binomial variance of the samples, an upper bound, at p = PILOT_ACC);
    the primary metric keeps var_train (consecutive evaluations of one run taken as fully correlated) and averages
    the sampling variance over PRIMARY_EVALS evaluations of VAL_PROBLEMS x val_n samples.
    """
    binom = PILOT_ACC * (1 - PILOT_ACC)
    var_train = PILOT_SD ** 2 - binom / PILOT_SAMPLES
    samples = VAL_PROBLEMS * LAG_SIZES.val_n * PRIMARY_EVALS
    return PILOT_SD, math.sqrt(var_train + binom / samples)


def plan_numbers(seeds: int = LAG_SEEDS, sim: stats.PowerSim = stats.PowerSim()) -> str:
    """The plan's budget and power, as markdown (what docs/study/lag/PLAN.md holds between its markers)."""
    specs, c, s = lag_grid(seeds), LAG_COSTS, LAG_SIZES
    run_s, grid_s = c.run_s(specs[0]), c.grid_s(specs, 2)
    sd_hi, sd_lo = primary_sd()
    m = len(HYPOTHESES)
    lines = [
        "| design | value |", "|---|---|",
        f"| cells x seeds = runs | {len(LAG_CELLS)} x {seeds} = {len(specs)} |",
        f"| one run (built-in costs, 2 at a time) | {run_s:.0f} s = {c.startup_s:.1f} s start-up + {s.steps} steps x "
        f"({c.step_s:.1f} s + {specs[0].updates - 1} x {c.update_s:.2f} s) + {s.validations} validations x "
        f"{c.val_s:.1f} s |",
        f"| estimated time, --jobs 2 | {fmt_duration(grid_s)} = {grid_s / 3600:.2f} h "
        f"(budget {LAG_BUDGET_S / 3600:g} h) |",
        f"| smallest one-sided p, exact sign-flip test | {seeds} seeds: 1/{2 ** seeds} = {2.0 ** -seeds:.5f}; "
        f"3 seeds: 1/8 = 0.125 |",
        f"| SD of a run's primary metric | {sd_hi:.3f} (conservative) / {sd_lo:.3f} (decomposed) |",
        f"| standardised MDE (in SDs of d_s), power {POWER:g}, {seeds} seeds | "
        f"{stats.min_detectable_effect(1.0, seeds, ALPHA / m, POWER, sim):.2f} at alpha {ALPHA / m:g}, "
        f"{stats.min_detectable_effect(1.0, seeds, ALPHA, POWER, sim):.2f} at alpha {ALPHA:g} |",
        f"| collapse rate 0.5 vs 0.03, Fisher one-sided at alpha {ALPHA:g} | power "
        f"{stats.fisher_power(0.5, 0.03, seeds, ALPHA):.2f} at {seeds} runs per cell, "
        f"{stats.fisher_power(0.5, 0.03, 3, ALPHA):.2f} at 3 |",
        "", f"| hypothesis | contrast d_s | SD of d_s | MDE at alpha {ALPHA / m:g} (Holm's first step) | "
            f"MDE at alpha {ALPHA:g} (Holm's last) |", "|---|---|---|---|---|",
    ]
    for h in HYPOTHESES:
        f = h.sd_factor()
        mde = [stats.min_detectable_effect(f * sd, seeds, a, POWER, sim) for a in (ALPHA / m, ALPHA)
               for sd in (sd_hi, sd_lo)]
        lines.append(f"| {h.name} | {h.formula()} | {f:.3g} x SD | {mde[0]:.3f} ({mde[1]:.3f}) | "
                     f"{mde[2]:.3f} ({mde[3]:.3f}) |")
    lines += ["", f"MDE: the smallest true mean of d_s that the one-sided exact sign-flip test detects with power "
                  f"{POWER:g}",
              f"({sim.sims} simulated data sets of normal d_s, seed {sim.seed}), at the conservative SD (the "
              "decomposed one in brackets)."]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the CSV


# (column, how the per-step values of steps >= 2 reduce: None = mean, max; the metric keys it is read from, first
# found wins): the diagnostics of every run
DIAGNOSTICS: tuple[tuple[str, object, tuple[str, ...]], ...] = (
    ("behavior_ess", None, ("actor/rpg/behavior_ess",)),
    ("behavior_log_w_m2", None, ("actor/rpg/behavior_log_w_m2",)),
    ("behavior_weight_max", max, ("actor/rpg/behavior_weight_max",)),
    ("behavior_kl_k3", None, ("actor/rpg/behavior_kl_k3",)),
    ("clipfrac", None, ("actor/pg_clipfrac",)),
    ("ratio_max", max, ("actor/rpg/ratio_max",)),
    ("grad_norm", None, ("actor/grad_norm",)),
    ("grad_norm_max", max, ("actor/grad_norm",)),
    ("lag_versions", None, ("training/rpg/lag_versions", "training/rpg/lag_versions/mean",
                            "training/rpg/lag_versions_mean")),
    ("lag_versions_max", max, ("training/rpg/lag_versions_max", "training/rpg/lag_versions/max")),
    ("lag_updates", None, ("training/rpg/lag_updates", "training/rpg/lag_updates/mean",
                           "training/rpg/lag_updates_mean")),
    ("staleness_versions", None, ("training/off_policy/trajectory_staleness/mean",)),
)
INT_COLUMNS = ("lag", "clip", "seed", "order", "collapsed", "cpu_count")
FLOAT_COLUMNS = ("primary", "final_acc", *(d[0] for d in DIAGNOSTICS), "load_start_1m", "load_end_1m", "wall_time_s")
COLUMNS = ("run_id", "cell", "lag", "weights", "clip", "seed", "order", "status", "primary", "final_acc", "collapsed",
           "collapse_reason", *(d[0] for d in DIAGNOSTICS), "code", "threads", "load_start_1m", "load_end_1m",
           "cpu_count", "wall_time_s", "started", "design", *(c for c, _ in DESIGN.columns),
           *plan_and_results.RAN_ON_COLUMNS)
# added after the study's runs: its runs.csv reads as the plan's design, threads and what it ran on not recorded
SCHEMA = Schema(COLUMNS, (*INT_COLUMNS, *(c for c, _ in DESIGN.columns)), FLOAT_COLUMNS,
                added=(("threads", None), ("design", DECLARED), *DESIGN.columns,
                       *((c, None) for c in plan_and_results.RAN_ON_COLUMNS)))


def primary_metric(val: dict[int, float], steps: int, test_freq: int) -> float | None:
    """Mean held-out accuracy over the last PRIMARY_EVALS evaluations; None when one of them is missing."""
    last = evaluated_steps(steps, test_freq)[-PRIMARY_EVALS:]
    if any(t not in val for t in last):
        return None
    return sum(float(val[t]) for t in last) / len(last)


def _diagnostic(m: dict, keys: tuple[str, ...], reduce) -> float | None:
    from rpg_lab.study.render import behavior_summary

    for key in keys:
        if key in m:
            return behavior_summary(m, key, reduce)
    return None


def csv_rows(out: Path, specs: list[RunSpec], records: list[dict], design: str = DECLARED,
             cells: tuple[LagCell, ...] = LAG_CELLS) -> list[dict]:
    """One row per run of ``specs`` (in run order, each of one of ``cells``), finished or not, from its folder's
    metrics and run.json; ``design``: the study's (``Design.label``)."""
    from rpg.trainer_process.run_dir import METRICS_FILE
    from rpg.reports.logs import read_run
    from rpg_lab.study.render import _val_key, metric_of
    from rpg_lab.study.records import run_dir

    rows = []
    for order, (spec, rec) in enumerate(zip(specs, records), 1):
        s = spec.sizes
        load_start, load_end = rec.get("load_start") or [None], rec.get("load_end") or [None]
        row = {"run_id": spec.run_id, "cell": lag_cell(spec, cells).name, "lag": spec.lag, "weights": spec.arm,
               "clip": int(clipped(spec.variant)), "seed": spec.seed, "order": order,
               "status": rec.get("status", "todo"), "code": rec.get("code"), "load_start_1m": load_start[0],
               "load_end_1m": load_end[0], "cpu_count": rec.get("cpu_count"), "wall_time_s": rec.get("wall_time_s"),
               "started": rec.get("started"), "threads": rec.get("threads"), "design": design, **_columns(s),
               **plan_and_results.ran_on_columns(rec)}
        if row["status"] == "done":
            m = read_run(run_dir(out, spec) / METRICS_FILE)
            val = {t: float(v) for t, v in m.get(_val_key(metric_of(spec)), {}).items()}
            why = collapsed(val, m.get("actor/grad_norm", {}))
            row.update(primary=primary_metric(val, s.steps, s.test_freq), final_acc=val.get(s.steps),
                       collapsed=int(bool(why)), collapse_reason=why or None)
            row.update({name: _diagnostic(m, keys, red) for name, red, keys in DIAGNOSTICS})
            row.update({f"{VAL_PREFIX}{t}": val.get(t) for t in evaluated_steps(s.steps, s.test_freq)})
        rows.append(row)
    return rows


def write_csv(path: Path, rows: list[dict]) -> Path:
    """``rows`` as the lag study's runs.csv (``rpg_lab.study.plan_and_results.write_csv``)."""
    return plan_and_results.write_csv(path, rows, SCHEMA)


def read_csv(path: Path) -> list[dict]:
    """The lag study's runs.csv, typed (``rpg_lab.study.plan_and_results.read_csv``)."""
    return plan_and_results.read_csv(path, SCHEMA)


# ----------------------------------------------------------------------------- analysis


CELL_STATS = (("behavior_ess", "ESS"), ("behavior_log_w_m2", "M2 of log w"), ("behavior_weight_max", "max weight"),
              ("ratio_max", "max ratio"), ("clipfrac", "clip frac"), ("behavior_kl_k3", "k3 KL(mu‖pi_old)"),
              ("grad_norm", "grad norm"), ("lag_versions", "lag (versions)"), ("lag_updates", "lag (updates)"),
              ("staleness_versions", "verl staleness"))


@dataclass(frozen=True)
class LagStudy:
    """A declared study of lag cells: the lag study (``LAG``) or its addendum (``rpg_lab.study.lag_addendum.ADDENDUM``):
    its design, cells, hypotheses (Holm over them), secondary contrasts, collapse tests (cell, control), results.md's
    title and the figure's name; the study interface of ``rpg_lab.study.__main__``."""

    DESIGN: Design
    cells: tuple[LagCell, ...]
    hypotheses: tuple[Contrast, ...]
    secondary: tuple[Contrast, ...]
    collapse_tests: tuple[tuple[str, str], ...]
    title: str
    figure: str

    SCHEMA = property(lambda self: SCHEMA)
    write_csv = staticmethod(lambda path, rows: write_csv(path, rows))
    read_csv = staticmethod(lambda path: read_csv(path))

    def chosen(self, specs: list[RunSpec]) -> dict[str, object]:
        return chosen(specs, self.cells)

    def csv_rows(self, out: Path, specs: list[RunSpec], records: list[dict], design: str = DECLARED) -> list[dict]:
        return csv_rows(out, specs, records, design, self.cells)

    def render_tables(self, rows: list[dict], source: str = "runs.csv") -> str:
        return render_tables(rows, source, self)

    def tested(self, rows: list[dict]) -> list[plan_and_results.Tested]:
        """The declared hypotheses tested (one-sided, 95 % intervals, Holm over them): results.md's and the Reading's."""
        return plan_and_results.test_family(rows, [(h, False) for h in self.hypotheses])

    def render(self, csv_path: Path, report_dir: Path) -> list[Path]:
        return render(csv_path, report_dir, self)


def render_tables(rows: list[dict], source: str = "runs.csv", study: LagStudy | None = None) -> str:
    """results.md: every table and test of the plan, from the CSV's rows alone."""
    study = study or LAG
    cells = [c.name for c in study.cells]
    unknown = sorted({r["cell"] for r in rows} - set(cells))
    if unknown:
        raise ValueError(f"{source}: cell(s) {', '.join(unknown)} are not in the plan's design")
    design = study.DESIGN.check_rows(rows, source)
    out = [f"# {study.title}: {'results' if design == DECLARED else 'EXPLORATORY results'} (generated from {source} "
           f"by `python -m rpg_lab.study {study.DESIGN.flag} --render-only`; do not edit)", "", *study.DESIGN.note(design)]
    done = [r for r in rows if r["status"] == "done"]
    codes = sorted({r["code"] for r in done if r["code"]})
    model = plan_and_results.one_model(rows, source)
    out += [f"{len(done)} of {len(rows)} runs finished; code: {', '.join(codes) or '—'}; model weights: "
            f"{model or 'not recorded'}.", "",
            *plan_and_results.unfinished_note(len(done), len(rows)),
            "## Cells (primary: mean held-out accuracy over the last three evaluations; diagnostics: per-run means "
            "over steps >= 2, maxima for max weight and max ratio, then the mean over the cell's runs)", "",
            "| cell | runs | primary mean ± SD | final acc | collapses | " + " | ".join(c for _, c in CELL_STATS)
            + " | load at start (mean, max) |",
            "|---|---|---|---|---|" + "---|" * len(CELL_STATS) + "---|"]
    for name in cells:
        mine = [r for r in rows if r["cell"] == name]
        ok = [r for r in mine if r["status"] == "done"]
        prim = [r["primary"] for r in ok if r["primary"] is not None]
        sd = statistics.stdev(prim) if len(prim) > 1 else None
        loads = [r["load_start_1m"] for r in mine if r["load_start_1m"] is not None]
        diag = " | ".join(_f(_mean([r[k] for r in ok]), ".3g") for k, _ in CELL_STATS)
        out.append(f"| {name} | {len(ok)}/{len(mine)} | {_f(_mean(prim))} ± {_f(sd)} | "
                   f"{_f(_mean([r['final_acc'] for r in ok]))} | {sum(r['collapsed'] or 0 for r in ok)}/{len(ok)} | "
                   f"{diag} | {_f(_mean(loads), '.2f')}, {_f(max(loads) if loads else None, '.2f')} |")
    tested = study.tested(rows)
    out += ["", f"## Hypotheses (one-sided exact sign-flip tests on the per-seed contrasts d_s; Holm over "
                f"{len(study.hypotheses)} at family-wise alpha {ALPHA:g}; interval: 95 %, the inverted sign-flip test)",
            "",
            "| hypothesis | claim | d_s | seeds | mean d_s [95 % CI] | p | Holm p | verdict |",
            "|---|---|---|---|---|---|---|---|"]
    for t in tested:
        r = t.result
        verdict = ("—" if t.p is None else "none (exploratory)" if design != DECLARED else "supported"
                   if t.holm <= ALPHA else "not supported")
        out.append(f"| {r.contrast.name} | {r.contrast.claim} | {r.contrast.formula()} | {len(r.d)} | "
                   f"{_f(r.mean)} {_ci(r.ci)} | {_f(t.p, '.4g')} | {_f(t.holm, '.4g')} | {verdict} |")
    out += ["", "## Secondary contrasts (exploratory: unadjusted one-sided p)", "",
            "| contrast | claim | d_s | seeds | mean d_s [95 % CI] | p |", "|---|---|---|---|---|---|"]
    for c in study.secondary:
        r = test_contrast(rows, c)
        out.append(f"| {c.name} | {c.claim} | {c.formula()} | {len(r.d)} | {_f(r.mean)} {_ci(r.ci)} | "
                   f"{_f(r.p, '.4g')} |")
    out += ["", "## Collapses (criterion `rpg_lab.study.grid.collapsed`; Fisher exact, one-sided)", "",
            "| cell | control | collapses | control's | p |", "|---|---|---|---|---|"]
    for cell, control in study.collapse_tests:
        k = [[r["collapsed"] or 0 for r in done if r["cell"] == c] for c in (cell, control)]
        p = stats.fisher_greater(sum(k[0]), len(k[0]), sum(k[1]), len(k[1])) if k[0] and k[1] else None
        out.append(f"| {cell} | {control} | {sum(k[0])}/{len(k[0])} | {sum(k[1])}/{len(k[1])} | {_f(p, '.4g')} |")
    reasons = [f"* {r['cell']}, seed {r['seed']}: {r['collapse_reason']}" for r in done if r["collapsed"]]
    if reasons:
        out += [""] + reasons
    missing = [f"* {r['cell']}, seed {r['seed']}: {r['status']}" for r in rows if r["status"] != "done"]
    if missing:
        out += ["", "Runs not finished (their seeds leave the contrasts that need them):", ""] + missing
    return "\n".join(out) + "\n"


def render_figure(rows: list[dict], path: Path, study: LagStudy | None = None) -> Path:
    """lag.png: held-out accuracy against step, one panel per cell on one shared y-axis (0-1), a thin line per seed
    and the cell's mean over its finished runs."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    study = study or LAG
    cells = [c.name for c in study.cells]
    cols = 3
    fig = Figure(figsize=(4.2 * cols, 3.4 * math.ceil(len(cells) / cols)))
    axes = fig.subplots(math.ceil(len(cells) / cols), cols, squeeze=False, sharex=True, sharey=True)
    steps = sorted({int(k[len(VAL_PREFIX):]) for r in rows for k in r if k.startswith(VAL_PREFIX)})
    for i, name in enumerate(cells):
        ax = axes[i // cols][i % cols]
        ok = [r for r in rows if r["cell"] == name and r["status"] == "done"]
        for r in ok:
            pts = [(t, r.get(f"{VAL_PREFIX}{t}")) for t in steps if r.get(f"{VAL_PREFIX}{t}") is not None]
            ax.plot([t for t, _ in pts], [v for _, v in pts], color="tab:gray", alpha=0.35, linewidth=0.8)
        means = [(t, _mean([r.get(f"{VAL_PREFIX}{t}") for r in ok])) for t in steps]
        means = [(t, v) for t, v in means if v is not None]
        if means:
            ax.plot([t for t, _ in means], [v for _, v in means], color="tab:blue", linewidth=2.2, label="mean")
        ax.set_title(f"{name} ({len(ok)} runs)", fontsize=10)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        if i % cols == 0:
            ax.set_ylabel("held-out accuracy")
        if i // cols == math.ceil(len(cells) / cols) - 1:
            ax.set_xlabel("step")
    if study.DESIGN.check_rows(rows, str(path)) != DECLARED:
        fig.suptitle(f"EXPLORATORY, not the design of {study.DESIGN.plan}", color="tab:red")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return Path(path)


def render(csv_path: Path, report_dir: Path, study: LagStudy | None = None) -> list[Path]:
    """results.md and the figure (lag.png) in ``report_dir`` from ``csv_path`` alone."""
    study = study or LAG
    return plan_and_results.render_report(csv_path, report_dir, read_csv,
                                          lambda rows, src: render_tables(rows, src, study),
                                          lambda rows, path: render_figure(rows, path, study), study.figure)


LAG = LagStudy(DESIGN, LAG_CELLS, HYPOTHESES, SECONDARY, COLLAPSE_TESTS, "Lag study", "lag.png")


if __name__ == "__main__":  # the plan's numbers
    print(plan_numbers())
    sys.exit(0)
