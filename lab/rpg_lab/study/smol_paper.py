"""The paper's comparison on SmolLM2 (``python -m rpg_lab.study --model smol --paper``, docs/study/smol-paper/PLAN.md):
five of the paper's methods (Table 3's GRPO, DAPO, RPG-UFKL, RPG-REINFORCE-UFKL and RPG-REINFORCE-URKL, the last two
with RPG-Style Clip) on SmolLM2-135M-Instruct at the pilot's sizes (``rpg_lab.study.smol.PILOT``: 3 steps, one
validation of the 200 held-out problems), 12 seeds as blocks, four one-sided hypotheses under Holm.

* ``PAPER``: the design (a ``rpg_lab.study.smol.Comparison``), its costs measured on today's computation;
* ``pilot_paired_sd``: the SD of a paired difference the power computation assumes, from the pilot's committed
  runs.csv; ``plan_numbers``: the plan's generated block (``python -m rpg_lab.study.smol_paper`` prints it);
* ``without_pilot_seeds``: the hypotheses tested on seeds 4-12 alone (not the pilot's).
"""

from __future__ import annotations

import json
import math
import statistics
import sys

from rpg.paths.checkout import CHECKOUT
from rpg_lab.study import stats
from rpg_lab.study.costs import fmt_duration
from rpg_lab.study.plan_and_results import Contrast
from rpg_lab.study.smol import PILOT, POWER, Comparison, SmolCosts, design_rows, read_csv

ROOT = CHECKOUT
# the committed data the costs and the power computation read (docs/smol.md, Cost; docs/study/smol/)
DEFAULT_RUN = ROOT / "docs" / "smol" / "default-run-metrics.jsonl"
PILOT_CSV = ROOT / PILOT.folder / "runs.csv"


def _median_of_steps(key: str) -> float:
    """The median over the training steps of ``key`` in the SmolLM2 run's committed metrics."""
    records = [json.loads(line) for line in DEFAULT_RUN.read_text(encoding="utf-8").splitlines() if line.strip()]
    return round(statistics.median(r["data"][key] for r in records if r["step"] >= 1 and key in r["data"]), 2)


def pilot_refills() -> float:
    """DAPO's refills per step (generation batches beyond the first), the mean over the pilot's RPG runs
    (``refill_gen_batches``, itself the mean over a run's steps): the same filter at the same sizes."""
    rows = [r for r in read_csv(PILOT_CSV) if r["refill_gen_batches"] is not None]
    return round(statistics.fmean(r["refill_gen_batches"] for r in rows), 2)


def pilot_paired_sd() -> float:
    """The SD of a paired difference d_s, pooled over the pilot's three contrasts: sqrt(mean of their variances),
    each with 2 degrees of freedom (3 seeds), so 6 in all."""
    rows = read_csv(PILOT_CSV)
    by = {(r["cell"], r["seed"]): r["primary"] for r in rows if r["status"] == "done"}
    seeds = sorted({r["seed"] for r in rows})
    variances = []
    for c, _ in PILOT.contrasts:
        d = [sum(a * by[(cell, s)] for cell, a in c.terms) for s in seeds]
        variances.append(statistics.variance(d))
    return round(math.sqrt(statistics.fmean(variances)), 3)


# Measured on the SmolLM2 CPU run of today's computation (docs/smol/default-run-metrics.jsonl: RPG-REINFORCE-UFKL with
# RPG-Style Clip at these sizes, 10 steps, torch on both cores, the 2-core development machine alone; medians of its
# steps): the step (one generation batch, old log-probs, 4 updates, the weight sync), one generation batch, the old
# log-probs, the validation of the 200 problems (the median of its two timed ones). The start-up (44 s) was measured
# on a SmolLM2 study run of this computation (RPG-REINFORCE-UFKL, seed 1, 3 steps: the launch to step 1's record less
# step 1) on a machine with other work (load about 2); the shutdown (30 s) is assumed, as the pilot's. DAPO's refills:
# the pilot's (``pilot_refills``).
PAPER_COSTS = SmolCosts(startup_s=44.0, shutdown_s=30.0, step_s=_median_of_steps("timing_s/step"),
                        gen_s=_median_of_steps("timing_s/gen"), log_prob_s=_median_of_steps("timing_s/old_log_prob"),
                        val_s_per_problem=_median_of_steps("timing_s/testing") / 200, refill_batches=pilot_refills(),
                        source="built-in (the SmolLM2 run's measured step and validation, a study run's start-up; "
                               "the methods' extra passes and DAPO's refills derived, rpg_lab.study.smol_paper)")

GRPO, DAPO, UFKL, RF_UFKL, RF_URKL = "grpo", "dapo", "rpg-ufkl", "rpg-rf-ufkl", "rpg-rf-urkl"
PAPER = Comparison(
    "the paper's comparison on SmolLM2", "The paper's comparison on SmolLM2", "--model smol --paper",
    "docs/study/smol-paper",
    methods=("run_grpo_7b", "run_dapo_7b", "run_rpg_7b_ufkl1e-4", "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28",
             "run_rpg_7b_urkl1e-4_rf_clip_ppo_0.2_0.28"),
    cells=(GRPO, DAPO, UFKL, RF_UFKL, RF_URKL), seeds=12, order_seed=67, budget_s=4 * 3600, costs=PAPER_COSTS,
    contrasts=(
        (Contrast("H1", "RPG-REINFORCE-URKL with RPG-Style Clip above GRPO", ((RF_URKL, 1), (GRPO, -1))), False),
        (Contrast("H2", "RPG-REINFORCE-UFKL with RPG-Style Clip above GRPO", ((RF_UFKL, 1), (GRPO, -1))), False),
        (Contrast("H3", "RPG-UFKL above GRPO", ((UFKL, 1), (GRPO, -1))), False),
        (Contrast("H4", "RPG-REINFORCE-URKL with RPG-Style Clip above DAPO", ((RF_URKL, 1), (DAPO, -1))), False),
    ), figure="smol-paper.png", out_name="study_smol_paper", plan_commits=("9200f68",))

PILOT_SEEDS = (1, 2, 3)  # the pilot's seeds, whose results motivated the hypotheses (PLAN.md, Question)


def without_pilot_seeds(rows: list[dict]) -> list:
    """The declared family tested on the seeds after the pilot's (4-12) alone, as results.md tests all 12 (Holm over
    H1-H4): whether the result rests on the seeds that motivated it (docs/study.md's Reading quotes it)."""
    return PAPER.tested([r for r in rows if r["seed"] not in PILOT_SEEDS])


SEED_CHOICES = (10, 11, 12, 13, 14)  # the power table's rows
SD_CHOICES = (1.0, 1.5, 2.0)  # the assumed SD, and 1.5 and 2 times it: what is detectable if it is larger


def plan_numbers(sim: stats.PowerSim = stats.PowerSim()) -> str:
    """The plan's costs, learning rates and power, as markdown (docs/study/smol-paper/PLAN.md holds it)."""
    specs, c = PAPER.grid(), PAPER.cost_model()
    total = c.grid_s(specs, 1)
    sd, family = pilot_paired_sd(), len(PAPER.contrasts)
    lines = design_rows(PAPER, specs, "validation x {:.1f}")
    lines += [
        f"| estimated time, one run at a time, 2 idle cores | {fmt_duration(total)} = {total / 3600:.2f} h (budget "
        f"{PAPER.budget_s / 3600:g} h) |",
        f"| DAPO's refills per step (the pilot's RPG runs, mean) | {PAPER.costs.refill_batches:g} generation batches |",
        f"| SD of a paired difference (the pilot's three contrasts, pooled, 6 degrees of freedom) | {sd:.3f} |",
        f"| smallest one-sided p, exact sign-flip test, {PAPER.seeds} seeds | 1/{2 ** PAPER.seeds} |",
        "", f"Effect detected with power {POWER:g} by the one-sided exact sign-flip test, at Holm's first step "
            f"0.05/{family} (what the smallest p must meet) and at 0.05 (Holm's last step), for SD of d_s the pilot's "
            "and larger:", "",
        "| seeds | " + " | ".join(f"SD {sd * k:.3f}: 0.05/{family} | SD {sd * k:.3f}: 0.05" for k in SD_CHOICES) + " |",
        "|---|" + "---|---|" * len(SD_CHOICES)]
    for n in SEED_CHOICES:
        cells = [f"{stats.min_detectable_effect(sd * k, n, a, POWER, sim):.3f}" for k in SD_CHOICES
                 for a in (0.05 / family, 0.05)]
        est = c.grid_s(PAPER.grid(seeds=n), 1)
        lines.append(f"| {n} ({fmt_duration(est)}) | " + " | ".join(cells) + " |")
    lines += ["", f"({sim.sims} simulated data sets of normal d_s per cell, seed {sim.seed}; the estimate beside each "
                  "number of seeds is the grid's on 2 idle cores.)"]
    return "\n".join(lines)


if __name__ == "__main__":  # the plan's numbers
    print(plan_numbers())
    sys.exit(0)
