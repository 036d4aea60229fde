"""The loss comparison on SmolLM2 (``python -m rpg_lab.study --model smol --loss``, docs/study/smol-loss/PLAN.md): one
script for every arm (``rpg_lab.study.loss_arms``), the arms differing only in the policy loss and its KL term (GRPO's,
DAPO's, RPG-REINFORCE-URKL's with RPG-Style Clip, RPG-UFKL's) and, for GRPO's and RPG-REINFORCE-URKL's loss, in DAPO's
filter and overlong penalty; 12 new seeds as blocks, 4 responses per validation problem, two families of hypotheses
each under Holm.

* ``LOSS``: the design (a ``rpg_lab.study.smol.Comparison``), its costs the paper comparison's measured ones;
* ``analogue_sds``: the SD of each declared contrast's nearest contrast in the paper comparison's committed runs.csv,
  and with its evaluation's binomial noise cut to 4 responses per problem; ``plan_numbers``: the plan's generated
  block (``python -m rpg_lab.study.smol_loss`` prints it);
* ``without_mixed_kernels``: the declared families tested without the seeds whose arms ran on two kinds of CPU
  kernels (a sensitivity check, not a test, as DEVIATIONS.md section 4 records it);
* ``reading_tables``: docs/study.md's Reading tables from runs.csv once every run is done
  (``python -m rpg_lab.study.smol_loss --reading`` prints them; refused while a run is unfinished).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from rpg.paths.checkout import CHECKOUT
from rpg_lab.study import stats
from rpg_lab.study.costs import fmt_duration
from rpg_lab.study.loss_arms import ARMS, method_name
from rpg_lab.study.lag import ALPHA  # family-wise 0.05, every declared study's
from rpg_lab.study.plan_and_results import DECLARED, Contrast, fmt_ci
from rpg_lab.study.smol import POWER, Comparison, SmolSizes, design_rows, read_csv
from rpg_lab.study.smol_paper import PAPER, PAPER_COSTS

ROOT = CHECKOUT
PAPER_CSV = ROOT / PAPER.folder / "runs.csv"  # the last study's runs: the measured SDs the power reads

GRPO, DAPO, RF_URKL, UFKL, GRPO_OFF, RF_URKL_OFF = (cell for cell, _, _ in ARMS)
STEPS = 6  # 24 optimizer updates per run, twice the paper comparison's 12 (PLAN.md, Power and budget)
VAL_N = 4  # responses per validation problem
FIRST_SEED = 101  # seeds 101..112: neither the pilot's (1-3) nor the paper comparison's (1-12)
LOSS_FAMILY = (
    (Contrast("L1", "RPG-REINFORCE-URKL's loss above GRPO's", ((RF_URKL, 1), (GRPO, -1))), False),
    (Contrast("L2", "RPG-UFKL's loss above GRPO's", ((UFKL, 1), (GRPO, -1))), False),
    (Contrast("L3", "RPG-REINFORCE-URKL's loss above DAPO's", ((RF_URKL, 1), (DAPO, -1))), False),
)
FILTER_FAMILY = (
    (Contrast("F1", "DAPO's filter and penalty change GRPO's loss's accuracy", ((GRPO, 1), (GRPO_OFF, -1))), True),
    (Contrast("F2", "DAPO's filter and penalty change RPG-REINFORCE-URKL's loss's accuracy",
              ((RF_URKL, 1), (RF_URKL_OFF, -1))), True),
    (Contrast("F3", "RPG-REINFORCE-URKL's loss above GRPO's without the filter and penalty",
              ((RF_URKL_OFF, 1), (GRPO_OFF, -1))), False),
)
# PLAN.md's descriptive contrasts (no p-value): the two loss differences it does not test, the interaction of the
# filter and penalty with the loss (F2 - F1) and the paper comparison's scripts' contrast rebuilt from these arms
DESCRIPTIVE = (
    Contrast("D1", "DAPO's loss against GRPO's", ((DAPO, 1), (GRPO, -1))),
    Contrast("D2", "RPG-UFKL's loss against RPG-REINFORCE-URKL's", ((UFKL, 1), (RF_URKL, -1))),
    Contrast("D3", "the filter and penalty's change of RPG-REINFORCE-URKL's loss less their change of GRPO's "
                   "(F2 - F1)", ((RF_URKL, 1), (RF_URKL_OFF, -1), (GRPO, -1), (GRPO_OFF, 1))),
    Contrast("D4", "the scripts' contrast of the paper comparison (RPG-REINFORCE-URKL's loss with the filter and "
                   "penalty against GRPO's without)", ((RF_URKL, 1), (GRPO_OFF, -1))),
)
LOSS = Comparison(
    "the loss comparison on SmolLM2", "The loss comparison on SmolLM2", "--model smol --loss", "docs/study/smol-loss",
    methods=tuple(method_name(cell) for cell, _, _ in ARMS), cells=tuple(cell for cell, _, _ in ARMS), seeds=12,
    order_seed=79, budget_s=9 * 3600, costs=PAPER_COSTS, contrasts=LOSS_FAMILY + FILTER_FAMILY,
    sizes=SmolSizes(steps=STEPS, test_freq=STEPS, val_n=VAL_N), figure="smol-loss.png", out_name="study_smol_loss",
    first_seed=FIRST_SEED, rollout_seed_is_seed=True, families=(len(LOSS_FAMILY), len(FILTER_FAMILY)),
    plan_commits=("ff62944",), descriptive=DESCRIPTIVE)


def mixed_kernel_seeds(rows: list[dict], source: str = "runs.csv") -> tuple[int, ...]:
    """The seeds whose finished runs record more than one kind of CPU kernels (runs.csv's ``kernels``): the machine
    was replaced between two arms of the seed (DEVIATIONS.md, section 4: seeds 104 and 107). A finished run without
    its kernels recorded is refused: the check cannot be made without them."""
    kinds: dict[int, set] = {}
    for r in rows:
        if r["status"] != "done":
            continue
        if not r.get("kernels"):
            raise ValueError(f"{source}: run {r['run_id']} finished without its CPU kernels recorded (kernels)")
        kinds.setdefault(r["seed"], set()).add(r["kernels"])
    return tuple(sorted(s for s, k in kinds.items() if len(k) > 1))


def without_mixed_kernels(rows: list[dict], source: str = "runs.csv") -> tuple[tuple[int, ...], list]:
    """The seeds left out and the declared families tested without them (Holm within each family, as results.md
    tests all 12): whether a result rests on the seeds whose arms ran on two kinds of kernels. A sensitivity check,
    not a test: the declared analysis is over every seed (docs/study.md's Reading quotes both)."""
    out = mixed_kernel_seeds(rows, source)
    return out, LOSS.tested([r for r in rows if r["seed"] not in out])


def _effect(t) -> str:
    return f"{t.result.mean:+.3f} {fmt_ci(t.result.ci)}"


def reading_tables(rows: list[dict], source: str = "runs.csv") -> str:
    """docs/study.md's Reading tables, from runs.csv's rows alone: each declared hypothesis (effect [95 % interval],
    p, Holm p within its family, verdict), then the same tests without the seeds of two kinds of kernels. Refused
    while a run of the plan is unfinished: the plan reads no result before all of its runs finish."""
    if LOSS.DESIGN.check_rows(rows, source) != DECLARED:  # one line for rows not the plan's 72, each once
        raise ValueError(f"{source}: an exploratory design: its p-values are descriptive, the Reading gives no verdict")
    open_runs = [r for r in rows if r["status"] != "done"]
    if open_runs:  # a failed run is rerun once (--retry-failed) first: PLAN.md, Missing data
        raise ValueError(f"{source}: {len(open_runs)} of {len(rows)} runs not done; the plan reads no result "
                         "before all of them finish")
    blank = next((r["run_id"] for r in rows if r["primary"] is None), None)
    if blank is not None:
        raise ValueError(f"{source}: run {blank} finished without its primary metric (primary)")
    out = ["| | claim | effect [95 % CI] | p | Holm p | |", "|---|---|---|---|---|---|"]
    for t in LOSS.tested(rows):
        side = "two-sided" if t.two_sided else "one-sided"
        out.append(f"| {t.result.contrast.name} | {t.result.contrast.claim} ({side}) | {_effect(t)} | {t.p:.3g} | "
                   f"{t.holm:.3g} | {'supported' if t.holm <= ALPHA else 'not supported'} |")
    left_out, tested = without_mixed_kernels(rows, source)
    out += ["", f"Without seeds {', '.join(map(str, left_out))} (a sensitivity check, not a test):", "",
            "| | seeds | contrast above 0 | effect [95 % CI] | p | Holm p |", "|---|---|---|---|---|---|"]
    for t in tested:
        n, up = len(t.result.d), sum(x > 0 for x in t.result.d)
        out.append(f"| {t.result.contrast.name} | {n} | {up} of {n} | {_effect(t)} | {t.p:.3g} | {t.holm:.3g} |")
    return "\n".join(out) + "\n"


# Each declared contrast's nearest one in the paper comparison (cells of docs/study/smol-paper/runs.csv): the same
# losses where it ran them; for the filter's contrasts, DAPO against GRPO, its one contrast across the filter and
# penalty (DAPO with them, GRPO without)
ANALOGUE: dict[str, tuple[str, str]] = {"L1": ("rpg-rf-urkl", "grpo"), "L2": ("rpg-ufkl", "grpo"),
                                        "L3": ("rpg-rf-urkl", "dapo"), "F1": ("dapo", "grpo"),
                                        "F2": ("dapo", "grpo"), "F3": ("rpg-rf-urkl", "grpo")}
NAMED_EFFECTS = (0.04, 0.06)  # PLAN.md: 0.06 about Table 3's RPG-REINFORCE-URKL over DAPO and the last study's H1


@dataclass(frozen=True)
class Analogue:
    name: str
    cells: tuple[str, str]
    sd: float  # the SD of the per-seed difference, measured (12 seeds, one response per problem)
    sd_k: float  # the same with the evaluation's binomial noise of VAL_N responses per problem (``with_responses``)


def with_responses(sd: float, p_a: float, p_b: float, k: int, problems: int) -> float:
    """The SD of a paired difference whose two evaluations take ``k`` responses per problem instead of one: the
    measured variance less the binomial variance of two single-response evaluations at accuracies ``p_a`` and
    ``p_b`` (p(1-p)/problems each: the most an evaluation's sampling adds), plus that variance / k. Taking the bound
    off makes it a lower estimate; the measured SD is the upper one (PLAN.md gives both)."""
    binomial = (p_a * (1 - p_a) + p_b * (1 - p_b)) / problems
    return math.sqrt(max(0.0, sd * sd - binomial) + binomial / k)


def analogue_sds(path: Path = PAPER_CSV) -> list[Analogue]:
    """Each declared contrast's analogue in the paper comparison's runs.csv, its measured SD and the SD with
    VAL_N responses per problem."""
    rows = [r for r in read_csv(path) if r["status"] == "done"]
    by = {(r["cell"], r["seed"]): r["primary"] for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    design = {(r["val_problems"], r["val_n"]) for r in rows}
    if len(design) != 1 or next(iter(design))[1] != 1:
        raise ValueError(f"{path}: runs of {sorted(design)} (problems, responses): one design of one response expected")
    problems = next(iter(design))[0]
    out = []
    for c, _ in LOSS.contrasts:
        a, b = ANALOGUE[c.name]
        d = [by[(a, s)] - by[(b, s)] for s in seeds]
        p_a, p_b = (statistics.fmean(by[(x, s)] for s in seeds) for x in (a, b))
        sd = statistics.stdev(d)
        out.append(Analogue(c.name, (a, b), sd, with_responses(sd, p_a, p_b, VAL_N, problems)))
    return out


def paper_pace(path: Path = PAPER_CSV) -> float:
    """The paper comparison's run time against its estimate: the sum of its runs' wall times (runs.csv) over its
    grid's estimate for 2 idle cores (the machine it ran on was shared)."""
    wall = sum(r["wall_time_s"] for r in read_csv(path) if r["status"] == "done")
    return wall / PAPER.cost_model().grid_s(PAPER.grid(), 1)


SEED_CHOICES = (12, 14, 16)


def plan_numbers(sim: stats.PowerSim = stats.PowerSim()) -> str:
    """The plan's runs, costs and power, as markdown (docs/study/smol-loss/PLAN.md holds it)."""
    specs, c = LOSS.grid(), LOSS.cost_model()
    total = c.grid_s(specs, 1)
    lines = design_rows(LOSS, specs, "validation x {:.1f}")
    lines += [
        f"| seeds | {FIRST_SEED}-{FIRST_SEED + LOSS.seeds - 1} (data.seed and the rollout's seed) |",
        f"| validation | after step {STEPS}, {LOSS.sizes.val_problems} problems x {VAL_N} responses (the estimate: "
        f"{VAL_N} x the measured time of one response each) |",
        f"| estimated time, one run at a time, 2 idle cores | {fmt_duration(total)} = {total / 3600:.2f} h (budget "
        f"{LOSS.budget_s / 3600:g} h) |",
        f"| the same at the paper comparison's measured pace (its runs' wall time / its estimate: "
        f"{paper_pace():.2f}) | {total * paper_pace() / 3600:.1f} h |",
        f"| smallest one-sided p, exact sign-flip test, {LOSS.seeds} seeds | 1/{2 ** LOSS.seeds} |",
        "", "Steps per run against the estimate (the declared design's other settings):", "",
        "| steps | updates | estimated time |", "|---|---|---|"]
    for steps in (3, 4, 5, 6, 8, 10):
        sizes = SmolSizes(steps=steps, test_freq=steps, val_n=VAL_N)
        est = c.grid_s(LOSS.grid(sizes=sizes), 1)
        lines.append(f"| {steps} | {4 * steps} | {fmt_duration(est)} = {est / 3600:.2f} h |")
    sds = analogue_sds()
    fam = {c.name: (two, len(LOSS_FAMILY) if c.name.startswith("L") else len(FILTER_FAMILY))
           for c, two in LOSS.contrasts}
    lines += ["", f"SD of each contrast's per-seed difference d_s, read off {PAPER.folder}/runs.csv (12 seeds, one "
                  f"response per problem: measured), and with {VAL_N} responses per problem (the binomial noise of "
                  "one response taken off, a quarter of it put back: a lower estimate); power of the exact sign-flip "
                  f"test with {LOSS.seeds} seeds at Holm's first step (0.05/3; two-sided: 0.025/3 a side) for the "
                  f"named effects, and the effect detected with power {POWER:g} there:", "",
            "| contrast | analogue | SD measured | SD, 4 responses | "
            + " | ".join(f"power at {e:g} (measured, 4 responses)" for e in NAMED_EFFECTS)
            + " | effect at power 0.8 (measured, 4 responses) |",
            "|---|---|---|---|" + "---|" * len(NAMED_EFFECTS) + "---|"]
    for a in sds:
        two, size = fam[a.name]
        alpha = 0.05 / size / (2 if two else 1)
        power = [f"{stats.sign_flip_power(e, a.sd, LOSS.seeds, alpha, sim):.2f}, "
                 f"{stats.sign_flip_power(e, a.sd_k, LOSS.seeds, alpha, sim):.2f}" for e in NAMED_EFFECTS]
        mde = (f"{stats.min_detectable_effect(a.sd, LOSS.seeds, alpha, POWER, sim):.3f}, "
               f"{stats.min_detectable_effect(a.sd_k, LOSS.seeds, alpha, POWER, sim):.3f}")
        lines.append(f"| {a.name} | {a.cells[0]} − {a.cells[1]} | {a.sd:.3f} | {a.sd_k:.3f} | " + " | ".join(power)
                     + f" | {mde} |")
    worst = max(a.sd for a in sds)
    lines += ["", f"Effect detected with power {POWER:g} at 0.05/3 one-sided by the number of seeds, at the largest "
                  f"measured SD ({worst:.3f}) and its value with {VAL_N} responses:", "",
              "| seeds | runs | estimated time | effect, measured SD | effect, 4 responses |", "|---|---|---|---|---|"]
    worst_k = max(a.sd_k for a in sds)
    for n in SEED_CHOICES:
        est = c.grid_s(LOSS.grid(seeds=n), 1)
        lines.append(f"| {n} | {n * len(LOSS.cells)} | {fmt_duration(est)} | "
                     f"{stats.min_detectable_effect(worst, n, 0.05 / 3, POWER, sim):.3f} | "
                     f"{stats.min_detectable_effect(worst_k, n, 0.05 / 3, POWER, sim):.3f} |")
    lines += ["", f"({sim.sims} simulated data sets of normal d_s per cell, seed {sim.seed}; the estimates are for 2 "
                  "idle cores.)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rpg_lab.study.smol_loss",
                                 description="The plan's numbers (PLAN.md's generated block), or with --reading the "
                                             "Reading's tables from runs.csv once all of its runs are done.")
    ap.add_argument("--reading", nargs="?", const=ROOT / LOSS.folder / "runs.csv", type=Path, metavar="RUNS_CSV",
                    help="print docs/study.md's Reading tables (default: the committed runs.csv)")
    args = ap.parse_args(argv)
    if args.reading is None:
        print(plan_numbers())
        return 0
    try:
        print(reading_tables(LOSS.read_csv(args.reading), str(args.reading)), end="")
    except (OSError, ValueError) as e:
        print(f"rpg_lab.study.smol_loss: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
