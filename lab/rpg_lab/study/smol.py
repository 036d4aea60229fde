"""The SmolLM2 comparisons (``python -m rpg_lab.study --model smol``): the paper's methods on SmolLM2-135M-Instruct and its
arithmetic task (``rpg.smol``, docs/smol.md) at the SmolLM2 run's sizes, each a declared design (``Comparison``):

* ``PILOT``, docs/study/smol/PLAN.md: GRPO, RPG-UFKL and RPG-REINFORCE-UFKL with RPG-Style Clip, 3 seeds
  (``--model smol``);
* ``rpg_lab.study.smol_paper.PAPER``, docs/study/smol-paper/PLAN.md: five of the paper's methods, 12 seeds
  (``--model smol --paper``);
* ``rpg_lab.study.smol_loss.LOSS``, docs/study/smol-loss/PLAN.md: six arms of one script differing in the loss (and the
  filter), seeds 101-112 (``--model smol --loss``).

A ``Comparison`` holds what its plan fixes (methods, cells, seeds, the run order's seed, sizes, budget, measured costs,
contrasts) and gives the study's interface (``rpg_lab.study.__main__``): ``grid``, ``DESIGN`` / ``chosen`` (what a grid
sets, ``rpg_lab.study.plan_and_results.Design``), ``cost_model``, ``csv_rows`` / ``write_csv`` / ``read_csv``
(``runs.csv``) and ``render`` (``results.md`` and the figure, from the CSV alone). ``plan_numbers``: the pilot plan's generated block.
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from rpg.smol import overrides as smol
from rpg.smol.task import N_VAL
from rpg_lab.study import plan_and_results, stats
from rpg_lab.study.costs import Costs, fmt_duration
from rpg_lab.study.plan_and_results import (DECLARED, CSVError, Contrast, Design, Schema,  # noqa: F401
                                        evaluated_steps, fmt, mean_of)
from rpg_lab.study.grid import (LR_ANCHOR, LR_KEY, ROLLOUT_SEED, RunSpec, SmolSizes, lr_scale,  # noqa: F401
                            run_order_key, smol_overrides)
from rpg_lab.study.methods import label_of, method_run, setting

UPDATES = smol.TRAIN_BATCH_SIZE // smol.MINI_BATCH_SIZE  # optimizer steps per rollout batch: 4
SMOL_TIMEOUT_S = 3600.0  # --timeout's default for this model: several times a run's estimate
BASE_ACC = 0.150  # the base model's accuracy on the 200 problems (the SmolLM2 run's validation before training)
POWER = 0.8


@dataclass(frozen=True)
class SmolCosts:
    """The measured figures a design's cost is estimated from (one run at a time, torch on both cores): the start-up
    to the trainer's workers ready, the shutdown, a step (generation, old log-probs and the 4 updates), one
    generation batch, one log-prob pass, the validation per problem, and DAPO's refills (generation batches beyond the
    first per step)."""

    startup_s: float
    shutdown_s: float
    step_s: float
    gen_s: float
    log_prob_s: float
    val_s_per_problem: float
    refill_batches: float
    source: str

    def method_step_s(self, name: str) -> float:
        """What a method's step adds to the measured one: a fixed reference's log-probs (one more forward over the
        batch, as the old log-probs), and DAPO's refills (``refill_batches`` more generation batches)."""
        extra = self.log_prob_s if setting(name, "rpg.reference.mode") == "fixed" else 0.0
        if setting(name, "algorithm.filter_groups.enable"):
            extra += self.gen_s * self.refill_batches
        return extra


@dataclass(frozen=True)
class Comparison:
    """One declared SmolLM2 comparison: ``methods`` (paper run names) and their ``cells`` (short names in the CSV and
    the contrasts), seeds 1..``seeds`` as blocks, the run order within a seed drawn from ``order_seed``, ``sizes``,
    the budget its estimate must fit, its measured ``costs`` and its declared ``contrasts`` ((Contrast, two-sided))."""

    name: str  # "the SmolLM2 comparison"
    title: str  # results.md's title
    flag: str  # the command line that runs it
    folder: str  # its plan, runs.csv and results.md, in the checkout
    methods: tuple[str, ...]
    cells: tuple[str, ...]
    seeds: int
    order_seed: int
    budget_s: float
    costs: SmolCosts
    contrasts: tuple[tuple[Contrast, bool], ...]
    sizes: SmolSizes = SmolSizes()
    figure: str = "smol.png"
    out_name: str = "study_smol"  # the default --out under outputs/
    plan_commits: tuple[str, ...] = ()  # Design.plan_commits
    first_seed: int = 1  # the seeds are first_seed .. first_seed + seeds - 1
    rollout_seed_is_seed: bool = False  # each run's rollout seed: its block's seed, else ROLLOUT_SEED for every run
    families: tuple[int, ...] = ()  # the contrasts' Holm families, as the sizes of consecutive runs; (): one family
    descriptive: tuple[Contrast, ...] = ()  # declared contrasts reported without a test: d_s per seed, mean and SD

    @property
    def plan(self) -> str:
        return f"{self.folder}/PLAN.md"

    @property
    def cell_of(self) -> dict[str, str]:
        return dict(zip(self.methods, self.cells))

    def options(self, seeds: int, methods: tuple[str, ...], s: SmolSizes) -> dict[str, object]:
        return {"--seeds": seeds, "--methods": methods, "--steps": s.steps, "--test-freq": s.test_freq,
                "--val-problems": s.val_problems}

    @functools.cached_property
    def DESIGN(self) -> Design:  # noqa: N802 (the study interface's name, as rpg_lab.study.lag.DESIGN)
        return Design(self.name, self.flag, self.plan, tuple(self.options(self.seeds, self.methods, self.sizes).items()),
                      tuple(_columns(self.sizes).items()), self.seeds, self.cells, self.plan_commits,
                      self.first_seed)

    SCHEMA = property(lambda self: SCHEMA)

    def chosen(self, specs: list[RunSpec]) -> dict[str, object]:
        """The design options of the grid ``specs`` (``DESIGN.options``' keys)."""
        names = {s.variant for s in specs}
        return self.options(len({s.seed for s in specs}), tuple(m for m in self.methods if m in names),
                            specs[0].sizes)

    def grid(self, seeds: int | None = None, sizes: SmolSizes | None = None, methods: tuple[str, ...] | None = None,
             order_seed: int | None = None) -> list[RunSpec]:
        """Each method x ``seeds`` seeds from ``first_seed`` on SmolLM2, seed-major (a seed's methods share its
        prompts, ``data.seed``), the methods of each seed in the order ``run_order_key`` draws from ``order_seed``."""
        seeds = self.seeds if seeds is None else seeds
        sizes, methods = sizes or self.sizes, self.methods if methods is None else methods
        order_seed = self.order_seed if order_seed is None else order_seed
        if seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {seeds}")
        bad = [m for m in methods if m not in self.methods]
        if bad or not methods or len(set(methods)) != len(methods):
            raise ValueError(f"--methods {','.join(bad) or ','.join(methods) or '(none)'}: {self.flag} compares some "
                             f"of {', '.join(self.methods)} (each once)")
        for m in methods:
            method_run(m)
        sizes.check((UPDATES,))
        return [RunSpec(m, UPDATES, seed, sizes, model="smol", rollout_seed=seed if self.rollout_seed_is_seed else None)
                for seed in range(self.first_seed, self.first_seed + seeds)
                for m in sorted(methods, key=lambda m: run_order_key(order_seed, seed, self.cell_of[m]))]

    def cost_model(self, val_problems: int | None = None) -> Costs:
        """The built-in costs of a run of this design, one at a time (every run has UPDATES updates per step: the
        measured step holds them); a validation's time in proportion to its responses (problems x ``sizes.val_n``)."""
        c = self.costs
        problems = self.sizes.val_problems if val_problems is None else val_problems
        return Costs(startup_s=c.startup_s + c.shutdown_s, step_s=c.step_s, update_s=0.0,
                     val_s=c.val_s_per_problem * problems * self.sizes.val_n, jobs=1,
                     method_step_s=tuple((m, c.method_step_s(m)) for m in self.methods), source=c.source)

    def csv_rows(self, out: Path, specs: list[RunSpec], records: list[dict], design: str = DECLARED) -> list[dict]:
        return csv_rows(self, out, specs, records, design)

    write_csv = staticmethod(lambda path, rows: write_csv(path, rows))
    read_csv = staticmethod(lambda path: read_csv(path))

    def tested(self, rows: list[dict]) -> list[plan_and_results.Tested]:
        """The declared contrasts tested (each interval at the level its seeds allow, Holm over them): results.md's and
        the Reading's."""
        return plan_and_results.test_family(rows, list(self.contrasts), interval_level, self.families)

    def render_tables(self, rows: list[dict], source: str = "runs.csv") -> str:
        return render_tables(self, rows, source)

    def render_figure(self, rows: list[dict], path: Path) -> Path:
        return render_figure(self, rows, path)

    def render(self, csv_path: Path, report_dir: Path) -> list[Path]:
        """results.md and the figure in ``report_dir`` from ``csv_path`` alone."""
        return plan_and_results.render_report(csv_path, report_dir, read_csv, self.render_tables, self.render_figure,
                                      self.figure)


def _columns(s: SmolSizes) -> dict[str, int]:
    """A run's design columns in runs.csv: its steps, evaluations and validation samples."""
    return {"steps": s.steps, "test_freq": s.test_freq, "val_problems": s.val_problems, "val_n": s.val_n}


def built() -> bool:
    """Whether SmolLM2's model and task files are built (a folder is published only when complete)."""
    from rpg.smol.build import planned_assets

    assets = planned_assets()
    return assets.model_dir.is_dir() and assets.task_complete()


def build_assets() -> None:
    """SmolLM2's model and task files, built once before the study's first run (``rpg.smol.SmolAssetError``, one
    line, when they cannot be)."""
    from rpg.smol import build_smol_assets

    build_smol_assets(prefix="[study]")


# ----------------------------------------------------------------------------- the pilot (docs/study/smol/PLAN.md)

# Measured on the SmolLM2 CPU run (bash recipe/rpg/smol/run_smol_cpu.sh: RPG-REINFORCE-UFKL with RPG-Style Clip at
# these sizes, torch on both cores; docs/smol/bf32b4a-run-metrics.jsonl: the computation before the actor's prefix
# tree and the HF rollout's own decode loop, about 5 times slower than today's, docs/smol.md Cost) on the 2-core
# development machine on 2026-11-26, alone: 36 s from the launch to the trainer's workers ready; steps 1-6 (medians):
# generation 39.9 s, old log-probs 21.1 s, update (4 mini-batches) 65.6 s, weight sync 2.2 s, the step 133.1 s; the
# three validations of the 200 problems 384, 357 and 367 s (their median). The shutdown (30 s) is assumed. DAPO's
# refills: measured on the pilot's first run (RPG-REINFORCE-UFKL, seed 1, started at 4 steps per run and stopped after
# step 2, before any validation, when its steps showed that 4 steps do not fit the budget; it started afresh): 3 and
# 2 refill batches (training/rpg/refill_gen_batches) at steps 1 and 2, their mean.
REFILL_BATCHES = 2.5
PILOT_COSTS = SmolCosts(startup_s=36.0, shutdown_s=30.0, step_s=133.1, gen_s=39.9, log_prob_s=21.1,
                        val_s_per_problem=367.0 / 200, refill_batches=REFILL_BATCHES,
                        source="built-in (the SmolLM2 run's measured start-up, step and validation; the methods' extra "
                               "passes and DAPO's refills derived, rpg_lab.study.smol)")

SMOL_ORDER_SEED = 60  # the declared seed of the run order within each seed (run_order_key)
# The declared comparisons (PLAN.md): d_s per seed; one-sided in the paper's direction where it has one
CONTRASTS: tuple[tuple[Contrast, bool], ...] = (
    (Contrast("C1", "RPG-REINFORCE-UFKL with RPG-Style Clip above GRPO", (("rpg-rf-clip", 1), ("grpo", -1))), False),
    (Contrast("C2", "RPG-UFKL above GRPO", (("rpg-ufkl", 1), ("grpo", -1))), False),
    (Contrast("C3", "RPG-REINFORCE-UFKL with RPG-Style Clip and RPG-UFKL differ",
              (("rpg-rf-clip", 1), ("rpg-ufkl", -1))), True),
)
PILOT = Comparison(
    "the SmolLM2 comparison", "SmolLM2 comparison", "--model smol", "docs/study/smol",
    methods=("run_grpo_7b", "run_rpg_7b_ufkl1e-4", "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28"),
    cells=("grpo", "rpg-ufkl", "rpg-rf-clip"), seeds=3, order_seed=SMOL_ORDER_SEED, budget_s=3 * 3600,
    costs=PILOT_COSTS, contrasts=CONTRASTS, plan_commits=("f3c4d4f", "d58c9b6", "f6d0da6"))
smol_costs = PILOT.cost_model  # the pilot's built-in costs (its PLAN.md names them so)


def interval_level(n: int) -> float:
    """The interval reported for n seeds: 95 %, or the widest level whose exact sign-flip interval is finite,
    1 - 2^(1 - n) (75 % with 3 seeds: the range of the d_s), when 95 % is not."""
    return min(0.95, 1 - 2.0 ** (1 - n))


def _fits(seeds: int, problems: int) -> tuple[int, float]:
    """The most steps (and their estimate) of the pilot with ``seeds`` and ``problems`` within its budget."""
    best = (0, 0.0)
    for steps in range(1, 100):
        sizes = SmolSizes(steps=steps, test_freq=steps, val_problems=problems)
        est = PILOT.cost_model(problems).grid_s(PILOT.grid(seeds, sizes), 1)
        if est > PILOT.budget_s:
            return best
        best = (steps, est)
    return best


def design_rows(study: Comparison, specs: list[RunSpec], val: str) -> list[str]:
    """A plan's first rows: the runs, the learning rates, and each method's run time from its costs (the validation's
    word and format ``val``, as each plan was committed: "validation(s) x {:.0f}" or "validation x {:.1f}")."""
    c = study.cost_model(specs[0].sizes.val_problems)
    lrs = ", ".join(f"{label_of(m)} {setting(m, LR_KEY) * lr_scale():g}" for m in study.methods)
    lines = ["| design | value |", "|---|---|",
             f"| methods x seeds = runs | {len(study.methods)} x {len({s.seed for s in specs})} = {len(specs)} |",
             f"| learning rate (paper x {lr_scale():g}) | {lrs} |"]
    for m in study.methods:
        spec = next(s for s in specs if s.variant == m)
        lines.append(f"| one run, {label_of(m)} | {c.run_s(spec):.0f} s = {c.startup_s:.0f} s start-up and shutdown + "
                     f"{spec.sizes.steps} steps x ({c.step_s:.1f} s + {study.costs.method_step_s(m):.1f} s) + "
                     f"{spec.sizes.validations} {val.format(c.val_s)} s |")
    return lines


def plan_numbers(seeds: int = PILOT.seeds, sizes: SmolSizes = PILOT.sizes,
                 sim: stats.PowerSim = stats.PowerSim()) -> str:
    """The pilot plan's budget, learning rates and precision, as markdown (docs/study/smol/PLAN.md holds it)."""
    specs, c = PILOT.grid(seeds, sizes), PILOT.cost_model(sizes.val_problems)
    total = c.grid_s(specs, 1)
    lines = design_rows(PILOT, specs, "validation(s) x {:.0f}")
    alpha = 2.0 ** -seeds
    sd1 = math.sqrt(BASE_ACC * (1 - BASE_ACC) / sizes.val_problems)
    lines += [
        f"| estimated time, one run at a time | {fmt_duration(total)} = {total / 3600:.2f} h (budget "
        f"{PILOT.budget_s / 3600:g} h) |",
        f"| smallest one-sided p, exact sign-flip test | {seeds} seeds: 1/{2 ** seeds} = {alpha:.4g} |",
        f"| widest finite exact interval | {seeds} seeds: {100 * interval_level(seeds):g} % |",
        f"| SD of one evaluation, binomial at p = {BASE_ACC:g}, {sizes.val_problems} problems | {sd1:.3f}; of the "
        f"difference of two independent evaluations {sd1 * math.sqrt(2):.3f} |",
        f"| effect detected with power {POWER:g} at p <= 1/{2 ** seeds} ({seeds} seeds, evaluation noise alone) | "
        f"{stats.min_detectable_effect(sd1 * math.sqrt(2), seeds, alpha, POWER, sim):.3f} |",
        "", "| seeds | problems per evaluation | most steps within the budget | estimate |", "|---|---|---|---|"]
    for n in (3, 4, 5):
        for problems in (100, N_VAL):
            steps, est = _fits(n, problems)
            lines.append(f"| {n} | {problems} | {steps} | {fmt_duration(est) if steps else '—'} |")
    lines += ["", f"Effect: the smallest true mean of d_s that the one-sided exact sign-flip test finds at p <= "
                  f"1/{2 ** seeds} with power {POWER:g}", f"({sim.sims} simulated data sets of normal d_s, seed "
                  f"{sim.seed}), from the binomial noise of the evaluations alone (a lower bound)."]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the CSV and its tables

# (column, metric key): per run the mean over its training steps
CODE_COLUMNS = ("commit", "changes")
DIAGNOSTICS: tuple[tuple[str, str], ...] = (
    ("train_score", "critic/score/mean"), ("response_length", "response_length/mean"),
    ("response_clip_ratio", "response_length/clip_ratio"), ("entropy", "actor/entropy"), ("ppo_kl", "actor/ppo_kl"),
    ("clipfrac", "actor/pg_clipfrac"), ("grad_norm", "actor/grad_norm"),
    ("refill_gen_batches", "training/rpg/refill_gen_batches"), ("step_s", "timing_s/step"))
COLUMNS = ("run_id", "cell", "method", "lr", "seed", "order", "status", "primary", *(d[0] for d in DIAGNOSTICS),
           "code", "settings", "threads", "load_start_1m", "load_end_1m", "cpu_count", "wall_time_s", "started", "design",
           *_columns(SmolSizes()), *plan_and_results.RAN_ON_COLUMNS, *CODE_COLUMNS)
# added after the pilot's runs: its runs.csv reads as the plan's design, threads, settings digest and what it ran on not
# recorded in it; the full commit and the uncommitted changes' digest (``rpg.run_record.code_state``) added during the
# loss comparison: a row kept when its folder is gone (``rpg_lab.study.records``) is compared by them
SCHEMA = Schema(COLUMNS, ints=("seed", "order", "cpu_count", *_columns(SmolSizes())),
                floats=("lr", "primary", *(d[0] for d in DIAGNOSTICS), "load_start_1m", "load_end_1m", "wall_time_s"),
                added=(("threads", None), ("settings", None), ("design", DECLARED), *PILOT.DESIGN.columns,
                       *((c, None) for c in (*plan_and_results.RAN_ON_COLUMNS, *CODE_COLUMNS))))


def csv_rows(study: Comparison, out: Path, specs: list[RunSpec], records: list[dict],
             design: str = DECLARED) -> list[dict]:
    """One row per run of ``specs`` (in run order), finished or not, from its folder's metrics and run.json;
    ``design``: the study's (``Design.label``)."""
    from rpg.trainer_process.run_dir import METRICS_FILE
    from rpg.reports.logs import read_run
    from rpg_lab.study.records import run_dir
    from rpg_lab.study.render import _val_key, metric_of

    rows = []
    for order, (spec, rec) in enumerate(zip(specs, records), 1):
        s = spec.sizes
        load_start, load_end = rec.get("load_start") or [None], rec.get("load_end") or [None]
        row = {"run_id": spec.run_id, "cell": study.cell_of[spec.variant], "method": spec.variant,
               "lr": setting(spec.variant, LR_KEY) * lr_scale(), "seed": spec.seed, "order": order,
               "status": rec.get("status", "todo"), "code": rec.get("code"),
               **{k: rec.get(k) for k in CODE_COLUMNS},
               "settings": plan_and_results.settings_digest(rec), "load_start_1m": load_start[0],
               "load_end_1m": load_end[0], "cpu_count": rec.get("cpu_count"), "wall_time_s": rec.get("wall_time_s"),
               "started": rec.get("started"), "threads": rec.get("threads"), "design": design, **_columns(s),
               **plan_and_results.ran_on_columns(rec)}
        if row["status"] == "done":
            with warnings.catch_warnings():  # without a validation before training, step 1 is the first by design
                if not s.val_before:
                    warnings.filterwarnings("ignore", r".*the log starts at step 1, not 0", UserWarning)
                m = read_run(run_dir(out, spec) / METRICS_FILE)
            val = {t: float(v) for t, v in m.get(_val_key(metric_of(spec)), {}).items()}
            row["primary"] = val.get(s.steps)  # the last evaluation's
            row.update({name: mean_of([float(v) for t, v in m.get(key, {}).items() if t >= 1])
                        for name, key in DIAGNOSTICS})
            row.update({f"{plan_and_results.VAL_PREFIX}{t}": val.get(t)
                        for t in evaluated_steps(s.steps, s.test_freq, s.val_before)})
        rows.append(row)
    return rows


def write_csv(path: Path, rows: list[dict]) -> Path:
    return plan_and_results.write_csv(path, rows, SCHEMA)


def read_csv(path: Path) -> list[dict]:
    return plan_and_results.read_csv(path, SCHEMA)


TABLE_STATS = (("train_score", "train score"), ("response_length", "length"), ("response_clip_ratio", "cut at limit"),
               ("entropy", "entropy"), ("ppo_kl", "KL(old‖new)"), ("clipfrac", "clip frac"),
               ("grad_norm", "grad norm"), ("refill_gen_batches", "refill batches"), ("step_s", "s/step"))


def render_tables(study: Comparison, rows: list[dict], source: str = "runs.csv") -> str:
    """results.md: the methods' table and the declared contrasts, from the CSV's rows alone."""
    unknown = sorted({r["cell"] for r in rows} - set(study.cells))
    if unknown:
        raise ValueError(f"{source}: cell(s) {', '.join(unknown)} are not in the plan's design")
    design = study.DESIGN.check_rows(rows, source)
    done = [r for r in rows if r["status"] == "done"]
    seeds = sorted({r["seed"] for r in rows})
    codes = sorted({r["code"] for r in done if r["code"]})
    model = plan_and_results.one_model(rows, source)
    out = [f"# {study.title}: {'results' if design == DECLARED else 'EXPLORATORY results'} (generated from "
           f"{source} by `python -m rpg_lab.study {study.flag} --render-only`; do not edit)", "", *study.DESIGN.note(design),
           f"{len(done)} of {len(rows)} runs finished; code: {', '.join(codes) or '—'}; model weights: "
           f"{model or 'not recorded'}.", "",
           *plan_and_results.unfinished_note(len(done), len(rows)),
           "## Methods (primary: held-out accuracy at the last evaluation; diagnostics: per-run means over the "
           "training steps, then the mean over the method's runs)", "",
           "| method | lr | runs | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± SD | "
           + " | ".join(c for _, c in TABLE_STATS) + " | load at start (mean, max) |",
           "|---|---|---|" + "---|" * (len(seeds) + 1 + len(TABLE_STATS)) + "---|"]
    for method in study.methods:
        mine = [r for r in rows if r["method"] == method]
        if not mine:
            continue
        ok = [r for r in mine if r["status"] == "done"]
        by_seed = {r["seed"]: r["primary"] for r in ok}
        prim = [v for v in by_seed.values() if v is not None]
        sd = statistics.stdev(prim) if len(prim) > 1 else None
        loads = [r["load_start_1m"] for r in mine if r["load_start_1m"] is not None]
        out.append(f"| {label_of(method)} | {fmt(mine[0]['lr'], 'g')} | {len(prim)}/{len(mine)} | "
                   + " | ".join(fmt(by_seed.get(s)) for s in seeds) + f" | {fmt(mean_of(prim))} ± {fmt(sd)} | "
                   + " | ".join(fmt(mean_of([r[k] for r in ok]), ".3g") for k, _ in TABLE_STATS)
                   + f" | {fmt(mean_of(loads), '.2f')}, {fmt(max(loads) if loads else None, '.2f')} |")
    tested = study.tested(rows)  # each contrast's interval at the level its own seeds allow
    n, holm = len(seeds), plan_and_results.holm_scope([c.name for c, _ in study.contrasts], study.families)
    small = f"the smallest one-sided p is 1/{2 ** n}"
    out += ["", f"## Declared contrasts (paired by seed; exact sign-flip tests; {holm}; "
                + (f"descriptive: with {n} seeds {small})" if 2.0 ** -n > 0.05 else f"with {n} seeds {small})"), "",
            "| contrast | claim | d_s | seeds | per seed | mean d_s [exact interval] | p | Holm p |",
            "|---|---|---|---|---|---|---|---|"]
    for t in tested:
        r = t.result
        level = f"{100 * t.level:g} % " if len(r.d) > 1 else ""
        ci = plan_and_results.fmt_ci(r.ci if len(r.d) > 1 else None)
        out.append(f"| {r.contrast.name} | {r.contrast.claim} | {r.contrast.formula()} | {len(r.d)} | "
                   f"{', '.join(fmt(x, '+.3f') for x in r.d) or '—'} | {fmt(r.mean)} {level}{ci} | "
                   f"{fmt(t.p, '.4g')} ({'two-sided' if t.two_sided else 'one-sided'}) | {fmt(t.holm, '.4g')} |")
    if study.descriptive:
        out += ["", "## Descriptive contrasts (declared in the plan without a test: no p-value, no interval)", "",
                "| contrast | what | d_s | seeds | per seed | mean d_s ± SD |", "|---|---|---|---|---|---|"]
        for c in study.descriptive:
            _, d = plan_and_results.paired(rows, c)
            out.append(f"| {c.name} | {c.claim} | {c.formula()} | {len(d)} | "
                       f"{', '.join(fmt(x, '+.3f') for x in d) or '—'} | {fmt(mean_of(list(d)), '+.3f')} ± "
                       f"{fmt(statistics.stdev(d) if len(d) > 1 else None)} |")
    missing = [f"* {label_of(r['method'])}, seed {r['seed']}: {r['status']}" for r in rows if r["status"] != "done"]
    missing += [f"* {label_of(r['method'])}, seed {r['seed']}: done without its primary metric (the held-out "
                f"accuracy at step {r['steps']})" for r in rows if r["status"] == "done" and r["primary"] is None]
    if missing:
        out += ["", "Runs not finished (their seeds leave the contrasts that need them):", ""] + missing
    return "\n".join(out) + "\n"


def render_figure(study: Comparison, rows: list[dict], path: Path) -> Path:
    """The figure (smol.png): each method's held-out accuracy at the last evaluation, a thin line per seed joining its methods
    (the pairs the contrasts compare) and each method's mean."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    methods = [m for m in study.methods if any(r["method"] == m for r in rows)]
    fig = Figure(figsize=(max(6.4, 1.25 * len(methods)), 4.2))
    ax = fig.subplots()
    done = {(r["method"], r["seed"]): r["primary"] for r in rows if r["status"] == "done" and r["primary"] is not None}
    for seed in sorted({r["seed"] for r in rows}):
        pts = [(i, done[(m, seed)]) for i, m in enumerate(methods) if (m, seed) in done]
        ax.plot([i for i, _ in pts], [v for _, v in pts], color="tab:gray", alpha=0.5, marker="o", linewidth=0.8)
    means = [(i, mean_of([v for (m2, _), v in done.items() if m2 == m])) for i, m in enumerate(methods)]
    means = [(i, v) for i, v in means if v is not None]
    ax.plot([i for i, _ in means], [v for _, v in means], color="tab:blue", marker="D", markersize=8, linestyle="none",
            label="mean over seeds")
    # the long names on two or three lines (RPG-REINFORCE-UFKL beside RPG-REINFORCE-URKL overlap on one)
    ax.set_xticks(range(len(methods)), [label_of(m).replace("REINFORCE-", "REINFORCE-\n").replace(", ", ",\n")
                                        for m in methods], fontsize=8)
    ax.set_xlim(-0.5, len(methods) - 0.5)
    ax.set_ylim(0, max([0.5, *(v + 0.05 for v in done.values())]))
    ax.set_ylabel("held-out accuracy, last evaluation")
    ax.set_title(f"SmolLM2-135M-Instruct: {len(done)} runs (a grey line per seed)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if study.DESIGN.check_rows(rows, str(path)) != DECLARED:
        fig.suptitle(f"EXPLORATORY, not the design of {study.plan}", color="tab:red")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return Path(path)


if __name__ == "__main__":  # the pilot plan's numbers
    print(plan_numbers())
    sys.exit(0)
