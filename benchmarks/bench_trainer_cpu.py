"""Measure, on the tiny CPU run, the cost of RPG's sampler anchor and of the recipe's glue.

Three runs of verl's real trainer on the CPU backend (rpg.trainer_process), identical
settings (tiny model and task, batch 8 prompts x 8 responses, one mini-batch per step, no
validation) except for the algorithm (``VARIANTS``, from the tiny demo's ``TINY_ALGORITHMS``):

  rpg_sampler   recipe/rpg/main_rpg.py, RPG-REINFORCE-UFKL + RPG-Style Clip, anchor = pi_old
                (no reference model is built)
  grpo_ref      recipe/rpg/main_rpg.py, rpg.loss.name=verl: verl's GRPO loss with a k3 KL loss
                against a fixed reference model
  grpo_stock    python -m verl.trainer.main_ppo with grpo_ref's verl settings (no recipe code
                in the loop, only the plugin's registrations; no rpg.* keys, verl has no such group)

Step time = median of verl's ``timing_s/step`` over steps 2..N of all rounds (step 1 includes
warm-up; a 1-step run, the smoke test's, times step 1 and says so); the update/old-log-prob/reference
phases likewise. Peak memory = the harness's peak summed PSS of all processes of the run (median over
rounds), and the peak system-wide used-memory increase. Printed ratios:

  rpg_sampler / grpo_ref   step time and peak memory (what dropping the reference model saves)
  grpo_ref / grpo_stock    step time and peak memory (the recipe's overhead over verl)

    python benchmarks/bench_trainer_cpu.py [--steps 6] [--repeats 2] [--arms A,B] [--out DIR] [--json FILE]
    python benchmarks/bench_trainer_cpu.py --steps 1 --repeats 1 --arms grpo_ref,grpo_stock   # smoke
        (tests/benchmarks/test_bench_trainer.py; rpg_sampler is bench_async_cpu.py's rpg_sync, run by its smoke test)

Numbers from a shared 2-core machine are noisy (other processes compete); compare within one
invocation only. Figures: benchmarks/README.md#bench_trainer_cpupy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STOCK = "verl.trainer.main_ppo"
MINI_BATCH = 8  # prompts per optimizer step: the whole rollout batch, one (on-policy) update per step

COMMON = [
    "trainer.val_before_train=False",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
]
# name -> (trainer entry, demo algorithm of rpg.tiny.overrides.TINY_ALGORITHMS, overrides on top). The
# "grpo" algorithm is verl's GRPO (its loss, group-normalised advantage, fixed reference, k3 KL loss),
# run through the recipe with rpg.loss.name=verl; the stock arm runs the same settings through verl's
# own entry, which has no ``rpg`` config group: its rpg.* keys are left out (``overrides``).
VARIANTS = {
    "rpg_sampler": (None, "rpg", ["algorithm.norm_adv_by_std_in_grpo=False"]),
    "grpo_ref": (None, "grpo", []),
    "grpo_stock": (STOCK, "grpo", []),
}
FIRST_TIMED = 2  # step 1 includes warm-up; a 1-step (smoke) run times its step 1


def overrides(name: str, steps: int, variants: dict = VARIANTS) -> tuple[str, list[str]]:
    """(trainer entry, Hydra overrides) of one arm: the tiny task, the arm's algorithm, COMMON."""
    from rpg.tiny import build_tiny_assets
    from rpg.tiny.overrides import RECIPE_ENTRY, tiny_algorithm, tiny_task_overrides

    entry, algo, extra = variants[name]
    algorithm = tiny_algorithm(algo)[1]
    if entry == STOCK:
        algorithm = [o for o in algorithm if not o.startswith("rpg.")]
    task = tiny_task_overrides(build_tiny_assets(), steps=steps, mini_batch_size=MINI_BATCH)
    return (str(ROOT / RECIPE_ENTRY) if entry is None else entry), [*task, *algorithm, *COMMON, *extra]


def first_timed(steps: int) -> int:
    return FIRST_TIMED if steps >= FIRST_TIMED else 1


def measure(name: str, steps: int, out: Path, variants: dict = VARIANTS) -> dict:
    """One run of ``name``; per-step timings of steps 2..N (step 1 in a 1-step run) and the run's peak memory."""
    from rpg.trainer_process import run_trainer

    entry, args = overrides(name, steps, variants)
    run = run_trainer(args, output_dir=out, entry=entry, cwd=ROOT, timeout_s=1200)

    def steps_of(key):
        return [t for s, t in run.series(key) if s >= first_timed(steps)]

    return {
        "wall_s": run.wall_time_s,
        "step_s": steps_of("timing_s/step"),
        "update_actor_s": steps_of("timing_s/update_actor"),
        "old_log_prob_s": steps_of("timing_s/old_log_prob"),
        "ref_s": steps_of("timing_s/ref"),
        "peak_pss_gb": getattr(run, "peak_pss_bytes", run.peak_rss_bytes) / 2**30,
        "peak_sys_gb": run.peak_system_used_bytes / 2**30,
    }


def timed_steps(steps: int) -> str:
    """What the medians cover, for the header line."""
    if steps < FIRST_TIMED:
        return "step 1 only (it includes warm-up: a smoke run, not a measurement)"
    return f"steps {FIRST_TIMED}..{steps}"


def check_sizes(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for flag in ("steps", "repeats"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")


def summarize(runs: list[dict]) -> dict:
    med = statistics.median
    flat = {k: [x for r in runs for x in r[k]] for k in ("step_s", "update_actor_s", "old_log_prob_s", "ref_s")}
    return {
        "runs": len(runs),
        "wall_s": med(r["wall_s"] for r in runs),
        "step_s": med(flat["step_s"]),
        "update_actor_s": med(flat["update_actor_s"]),
        "old_log_prob_s": med(flat["old_log_prob_s"]),
        "ref_s": med(flat["ref_s"]) if flat["ref_s"] else 0.0,
        "peak_pss_gb": med(r["peak_pss_gb"] for r in runs),
        "peak_sys_gb": med(r["peak_sys_gb"] for r in runs),
    }


RATIOS = {  # printed name -> (quantity, numerator arm, denominator arm)
    "step_time rpg_sampler/grpo_ref": ("step_s", "rpg_sampler", "grpo_ref"),
    "peak_pss rpg_sampler/grpo_ref": ("peak_pss_gb", "rpg_sampler", "grpo_ref"),
    "step_time grpo_ref/grpo_stock (recipe overhead)": ("step_s", "grpo_ref", "grpo_stock"),
    "update_actor grpo_ref/grpo_stock (recipe overhead)": ("update_actor_s", "grpo_ref", "grpo_stock"),
    "peak_pss grpo_ref/grpo_stock (recipe overhead)": ("peak_pss_gb", "grpo_ref", "grpo_stock"),
}


def arms(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in VARIANTS]
    if bad or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected distinct arms among {', '.join(VARIANTS)}, got {text!r}")
    return names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="training steps per run (1: a smoke run)")
    ap.add_argument("--repeats", type=int, default=2, help="rounds; the variant order rotates each round")
    ap.add_argument("--arms", type=arms, default=list(VARIANTS),
                    help=f"comma-separated arms to run (default all: {','.join(VARIANTS)}); a ratio needs both its arms")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    check_sizes(ap, args)
    out = args.out or Path(tempfile.mkdtemp(prefix="rpg-bench-"))
    names = args.arms
    raw: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            raw[name].append(measure(name, args.steps, out / f"{name}_{r}"))
    res = {n: summarize(raw[n]) for n in names}
    print(f"medians over {args.repeats} run(s) x {timed_steps(args.steps)}")
    print(f"{'variant':12s} {'wall s':>7s} {'step s':>7s} {'update':>7s} {'oldlp':>6s} {'ref s':>6s} "
          f"{'PSS GB':>7s} {'sys GB':>7s}")
    for n, r in res.items():
        print(f"{n:12s} {r['wall_s']:7.1f} {r['step_s']:7.2f} {r['update_actor_s']:7.2f} {r['old_log_prob_s']:6.2f} "
              f"{r['ref_s']:6.2f} {r['peak_pss_gb']:7.2f} {r['peak_sys_gb']:7.2f}")
    ratios = {k: res[a][q] / res[b][q] for k, (q, a, b) in RATIOS.items() if a in res and b in res}
    for k, v in ratios.items():
        print(f"{k:52s} {v:6.3f}")
    if args.json:
        args.json.write_text(json.dumps({"steps": args.steps, "raw": raw, "medians": res, "ratios": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
