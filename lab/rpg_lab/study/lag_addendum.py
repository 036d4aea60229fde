"""The lag study's addendum (``python -m rpg_lab.study --lag --addendum``, docs/study/lag-addendum/PLAN.md): the lag-0
cell with RPG-Style Clip that the lag study did not run, and the three cells it is compared with, rerun on one commit
of today's code, 12 seeds, so that the lag's harm with the clip, and the clip's effect on the lag's harm, are
estimated.

* ``ADDENDUM``: the design (a ``rpg_lab.study.lag.LagStudy``: cells, hypotheses A1-A2, secondary contrasts, collapses);
* ``measured_sds``: the SDs of d_s the power computation assumes, from the lag study's committed runs.csv;
  ``plan_numbers``: the plan's generated block (``python -m rpg_lab.study.lag_addendum`` prints it).
"""

from __future__ import annotations

import math
import statistics
import sys

from rpg.paths.checkout import CHECKOUT
from rpg_lab.study import stats
from rpg_lab.study.plan_and_results import Contrast, Design
from rpg_lab.study.grid import (ADDENDUM_CELLS, ADDENDUM_ORDER_SEED, LAG_COSTS, LAG_SEEDS, LAG_SIZES, fmt_duration,
                            lag_grid)
from rpg_lab.study.lag import ALPHA, POWER, LagStudy, _columns, _options, read_csv

ROOT = CHECKOUT
LAG_CSV = ROOT / "docs" / "study" / "lag" / "runs.csv"
NAMES = tuple(c.name for c in ADDENDUM_CELLS)

HYPOTHESES: tuple[Contrast, ...] = (
    Contrast("A1", "with RPG-Style Clip and the exact weights, the lag still hurts",
             (("lag0-clip-token", 1), ("lag1-clip-token", -1))),
    Contrast("A2", "RPG-Style Clip reduces the lag's harm (interaction)",
             (("lag0-noclip-token", 1), ("lag1-noclip-token", -1), ("lag0-clip-token", -1), ("lag1-clip-token", 1))),
)
SECONDARY: tuple[Contrast, ...] = (
    Contrast("R1", "the lag hurts the unclipped importance-weighted loss (the lag study's H4, rerun)",
             (("lag0-noclip-token", 1), ("lag1-noclip-token", -1))),
    Contrast("R2", "RPG-Style Clip helps at lag 0 too", (("lag0-clip-token", 1), ("lag0-noclip-token", -1))),
    Contrast("R3", "RPG-Style Clip helps at lag 1 (the exact weights in both)",
             (("lag1-clip-token", 1), ("lag1-noclip-token", -1))),
)
COLLAPSE_TESTS: tuple[tuple[str, str], ...] = (("lag1-noclip-token", "lag0-noclip-token"),
                                               ("lag1-clip-token", "lag0-clip-token"))

DESIGN = Design("the lag addendum", "--lag --addendum", "docs/study/lag-addendum/PLAN.md",
                tuple(_options(LAG_SEEDS, NAMES, LAG_SIZES).items()), tuple(_columns(LAG_SIZES).items()), LAG_SEEDS,
                NAMES, plan_commits=("f6efe9a",))
ADDENDUM = LagStudy(DESIGN, ADDENDUM_CELLS, HYPOTHESES, SECONDARY, COLLAPSE_TESTS, "Lag addendum", "lag-addendum.png")


def addendum_grid(seeds: int = LAG_SEEDS, sizes=None, names: tuple[str, ...] = NAMES):
    """The addendum's runs: its cells x seeds 1..seeds, seed-major, the cells of a seed in the order
    ``run_order_key`` draws from ADDENDUM_ORDER_SEED."""
    return lag_grid(seeds, sizes, tuple(c for c in ADDENDUM_CELLS if c.name in names),
                    order_seed=ADDENDUM_ORDER_SEED)


def measured_sds() -> tuple[float, float]:
    """(SD of d_s for two clipped cells, SD of the lag study's H4 d_s), from its runs.csv: the first pooled over the
    three contrasts of its clipped lag-1 cells (clip-token, clip-none, naive-ppo; sqrt of the mean variance), the
    second H4's (lag0-noclip-token − lag1-noclip-token, its collapses included)."""
    rows = read_csv(LAG_CSV)
    y = {(r["cell"], r["seed"]): r["primary"] for r in rows}
    seeds = sorted({r["seed"] for r in rows})

    def var(a: str, b: str) -> float:
        return statistics.variance([y[(a, s)] - y[(b, s)] for s in seeds])

    clipped = ("lag1-clip-token", "lag1-clip-none", "lag1-naive-ppo")
    pooled = statistics.fmean([var(a, b) for i, a in enumerate(clipped) for b in clipped[i + 1:]])
    return round(math.sqrt(pooled), 3), round(math.sqrt(var("lag0-noclip-token", "lag1-noclip-token")), 3)


def plan_numbers(sim: stats.PowerSim = stats.PowerSim()) -> str:
    """The plan's budget and power, as markdown (docs/study/lag-addendum/PLAN.md holds it)."""
    specs = addendum_grid()
    c, m = LAG_COSTS, len(HYPOTHESES)
    clip_sd, h4_sd = measured_sds()
    walls = [r["wall_time_s"] for r in read_csv(LAG_CSV) if r["wall_time_s"] is not None]
    sds = {"A1": clip_sd, "A2": math.sqrt(h4_sd ** 2 + clip_sd ** 2)}
    lines = ["| design | value |", "|---|---|",
             f"| cells x seeds = runs | {len(ADDENDUM_CELLS)} x {LAG_SEEDS} = {len(specs)} |",
             f"| one run (the lag study's built-in costs, 2 at a time) | {c.run_s(specs[0]):.0f} s; the lag study's "
             f"runs took {statistics.fmean(walls):.0f} s on average |",
             f"| estimated time, --jobs 2 | {fmt_duration(c.grid_s(specs, 2))} (at the lag study's mean run time "
             f"{fmt_duration(statistics.fmean(walls) * len(specs) / 2)}) |",
             f"| SD of d_s, two clipped cells (the lag study's three clipped lag-1 contrasts, pooled) | {clip_sd:.3f} |",
             f"| SD of d_s, the lag study's H4 (lag0-noclip-token - lag1-noclip-token) | {h4_sd:.3f} |",
             "", f"| hypothesis | contrast d_s | SD of d_s assumed | MDE at alpha {ALPHA / m:g} (Holm's first step) | "
                 f"MDE at alpha {ALPHA:g} (Holm's last) |", "|---|---|---|---|---|"]
    for h in HYPOTHESES:
        sd = sds[h.name]
        mde = [stats.min_detectable_effect(sd, LAG_SEEDS, a, POWER, sim) for a in (ALPHA / m, ALPHA)]
        lines.append(f"| {h.name} | {h.formula()} | {sd:.3f} | {mde[0]:.3f} | {mde[1]:.3f} |")
    lines += ["", f"MDE: the smallest true mean of d_s that the one-sided exact sign-flip test detects with power "
                  f"{POWER:g} ({sim.sims} simulated data sets of normal d_s, seed {sim.seed}); A2's SD is "
                  "sqrt(H4's^2 + the clipped one's^2)."]
    return "\n".join(lines)


if __name__ == "__main__":  # the plan's numbers
    print(plan_numbers())
    sys.exit(0)
