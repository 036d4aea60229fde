"""Measure, on the tiny CPU run, the cost of RPG's sampler anchor and of the recipe's glue.

Three runs of verl's real trainer on the CPU backend (rpg.launch.harness), identical
settings (tiny model and task, batch 8 prompts x 8 responses, one mini-batch per step, no
validation) except for the variant:

  rpg_sampler   recipe/rpg/main_rpg.py, RPG-REINFORCE-UFKL + RPG-Style Clip, anchor = pi_old
                (no reference model is built)
  grpo_ref      recipe/rpg/main_rpg.py, rpg.loss.name=verl: verl's GRPO loss with a k3 KL loss
                against a fixed reference model
  grpo_stock    python -m verl.trainer.main_ppo with grpo_ref's verl settings (no recipe code
                in the loop, only the plugin's registrations)

Step time = median of verl's ``timing_s/step`` over steps 2..N of all rounds (step 1 includes
warm-up); the update/old-log-prob/reference phases likewise. Peak memory = the harness's peak
summed PSS of all processes of the run (median over rounds), and the peak system-wide
used-memory increase. Printed ratios:

  rpg_sampler / grpo_ref   step time and peak memory (what dropping the reference model saves)
  grpo_ref / grpo_stock    step time and peak memory (the recipe's overhead over verl)

    python benchmarks/bench_trainer_cpu.py [--steps 6] [--repeats 2] [--out DIR] [--json FILE]

Numbers from a shared 2-core machine are noisy (other processes compete); compare within one
invocation only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = str(ROOT / "recipe" / "rpg" / "main_rpg.py")

COMMON = [
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "trainer.val_before_train=False",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
]
GRPO = [  # tiny_overrides' defaults already are GRPO + fixed reference + k3 KL loss; made explicit
    "algorithm.adv_estimator=grpo",
    "algorithm.norm_adv_by_std_in_grpo=True",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.kl_loss_coef=0.01",
]
VARIANTS = {
    "rpg_sampler": (RECIPE, ["algorithm.adv_estimator=rpg", "algorithm.norm_adv_by_std_in_grpo=False",
                             "actor_rollout_ref.actor.use_kl_loss=False", "rpg.loss.name=rpg",
                             "rpg.loss.form=reinforce", "rpg.loss.divergence=ufkl", "rpg.reference.mode=sampler"]),
    "grpo_ref": (RECIPE, [*GRPO, "rpg.loss.name=verl", "rpg.reference.mode=fixed"]),
    "grpo_stock": ("verl.trainer.main_ppo", GRPO),
}


def measure(name: str, steps: int, out: Path) -> dict:
    """One run of ``name``; per-step timings of steps 2..N and the run's peak memory."""
    from rpg.launch.harness import run_trainer
    from rpg.tiny import build_tiny_assets
    from rpg.tiny.overrides import tiny_overrides

    entry, extra = VARIANTS[name]
    run = run_trainer([*tiny_overrides(build_tiny_assets(), steps=steps), *COMMON, *extra],
                      output_dir=out, entry=entry, cwd=ROOT, timeout_s=1200)

    def steps_of(key):
        return [t for s, t in run.series(key) if s >= 2]

    return {
        "wall_s": run.wall_time_s,
        "step_s": steps_of("timing_s/step"),
        "update_actor_s": steps_of("timing_s/update_actor"),
        "old_log_prob_s": steps_of("timing_s/old_log_prob"),
        "ref_s": steps_of("timing_s/ref"),
        "peak_pss_gb": getattr(run, "peak_pss_bytes", run.peak_rss_bytes) / 2**30,
        "peak_sys_gb": run.peak_system_used_bytes / 2**30,
    }


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2, help="rounds; the variant order rotates each round")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.steps < 3:
        ap.error("--steps must be >= 3 (step 1 is excluded from the step time)")
    out = args.out or Path(tempfile.mkdtemp(prefix="rpg-bench-"))
    names = list(VARIANTS)
    raw: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            raw[name].append(measure(name, args.steps, out / f"{name}_{r}"))
    res = {n: summarize(raw[n]) for n in names}
    print(f"medians over {args.repeats} run(s) x steps 2..{args.steps}")
    print(f"{'variant':12s} {'wall s':>7s} {'step s':>7s} {'update':>7s} {'oldlp':>6s} {'ref s':>6s} "
          f"{'PSS GB':>7s} {'sys GB':>7s}")
    for n, r in res.items():
        print(f"{n:12s} {r['wall_s']:7.1f} {r['step_s']:7.2f} {r['update_actor_s']:7.2f} {r['old_log_prob_s']:6.2f} "
              f"{r['ref_s']:6.2f} {r['peak_pss_gb']:7.2f} {r['peak_sys_gb']:7.2f}")
    a, b, c = res["rpg_sampler"], res["grpo_ref"], res["grpo_stock"]
    ratios = {
        "step_time rpg_sampler/grpo_ref": a["step_s"] / b["step_s"],
        "peak_pss rpg_sampler/grpo_ref": a["peak_pss_gb"] / b["peak_pss_gb"],
        "step_time grpo_ref/grpo_stock (recipe overhead)": b["step_s"] / c["step_s"],
        "update_actor grpo_ref/grpo_stock (recipe overhead)": b["update_actor_s"] / c["update_actor_s"],
        "peak_pss grpo_ref/grpo_stock (recipe overhead)": b["peak_pss_gb"] / c["peak_pss_gb"],
    }
    for k, v in ratios.items():
        print(f"{k:52s} {v:6.3f}")
    if args.json:
        args.json.write_text(json.dumps({"steps": args.steps, "raw": raw, "medians": res, "ratios": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
