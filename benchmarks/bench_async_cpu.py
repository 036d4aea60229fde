"""Measure, on the tiny CPU run, the step time of the RPG loss in verl's sync and colocate-async trainers.

One invocation runs verl's real trainer on the CPU backend once per mode per round, back to back,
with identical settings (those of ``bench_trainer_cpu.py``: tiny model and task, 8 prompts x 8
responses, one mini-batch per step, no validation; RPG-REINFORCE-UFKL + RPG-Style Clip, sampler
anchor) except ``trainer.v1.trainer_mode``:

  rpg_sync             sync: generate, then train, every step
  rpg_colocate_async   colocate_async: one batch generated ahead (samples one update stale, weighted
                       by the exact pi_old/mu in the loss)

Step time = median of verl's ``timing_s/step`` over steps 2..N (step 1 includes warm-up;
``bench_trainer_cpu.summarize``; a 1-step run times step 1 and says so). Printed: the medians, the
ratio colocate_async / sync, and for the async run the staleness and behaviour KL it trained with. verl's colocate-async trainer aborts and
sleeps the rollout replicas after sampling and resumes them after the weight update
(``PPOTrainerColocateAsync.on_sample_end``/``on_step_end``), so on one colocated device pool
generation and training take turns in both modes; what differs is the one-batch lead (generation
that continues from the previous step's resume) and the replay buffer's bookkeeping.

    python benchmarks/bench_async_cpu.py [--steps 8] [--repeats 1] [--out DIR] [--json FILE]
    python benchmarks/bench_async_cpu.py --steps 1   # smoke: both modes run (tests/benchmarks/test_bench_async.py)

Numbers from a shared 2-core machine are noisy; compare within one invocation only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_trainer_cpu as base  # noqa: E402

ENTRY, ALGO, RPG = base.VARIANTS["rpg_sampler"]
VARIANTS = {
    "rpg_sync": (ENTRY, ALGO, [*RPG, "trainer.v1.trainer_mode=sync"]),
    "rpg_colocate_async": (ENTRY, ALGO, [*RPG, "trainer.v1.trainer_mode=colocate_async"]),
}
ASYNC_KEYS = ("training/off_policy/trajectory_staleness/min", "actor/rpg/behavior_kl")


def ratio(medians: dict) -> float:
    """colocate_async / sync median step time (> 1: the async trainer is slower per step)."""
    return medians["rpg_colocate_async"]["step_s"] / medians["rpg_sync"]["step_s"]


def series_range(runs: list[dict], key: str) -> tuple[float, float] | None:
    """(min, max) of ``key`` over steps 2..N of all runs, or None when no run logged it."""
    xs = [x for r in runs for x in r.get("series", {}).get(key, [])]
    return (min(xs), max(xs)) if xs else None


def environment() -> str:
    import torch
    import verl

    return (f"{os.cpu_count()} CPU core(s), {platform.processor() or platform.machine()}, Python "
            f"{platform.python_version()}, torch {torch.__version__}, verl {verl.__version__}")


def measure(name: str, steps: int, out: Path) -> dict:
    """``bench_trainer_cpu.measure`` plus the async keys' values at steps 2..N."""
    from rpg.trainer_process import METRICS_FILE, read_metrics

    res = base.measure(name, steps, out, VARIANTS)
    recs = read_metrics(out / METRICS_FILE)
    first = base.first_timed(steps)
    res["series"] = {k: [float(d[k]) for s, d in recs.items() if s >= first and k in d] for k in ASYNC_KEYS}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="training steps per run (1: a smoke run)")
    ap.add_argument("--repeats", type=int, default=1, help="rounds; the order alternates each round")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    base.check_sizes(ap, args)
    out = args.out or Path(tempfile.mkdtemp(prefix="rpg-bench-async-"))
    names = list(VARIANTS)
    raw: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            raw[name].append(measure(name, args.steps, out / f"{name}_{r}"))
    res = {n: base.summarize(raw[n]) for n in names}
    print(environment())
    print(f"medians over {args.repeats} run(s) x {base.timed_steps(args.steps)}")
    for n, r in res.items():
        print(f"{n:20s} step {r['step_s']:6.2f} s  update {r['update_actor_s']:6.2f} s  "
              f"old_log_prob {r['old_log_prob_s']:5.2f} s  wall {r['wall_s']:6.1f} s  "
              f"(timed steps: {min(x for q in raw[n] for x in q['step_s']):.2f}-"
              f"{max(x for q in raw[n] for x in q['step_s']):.2f} s)")
    for key in ASYNC_KEYS:
        rng = series_range(raw["rpg_colocate_async"], key)
        print(f"rpg_colocate_async {key}: " + ("not logged" if rng is None else f"{rng[0]:.3g}-{rng[1]:.3g}"))
    q = ratio(res)
    print(f"step_time colocate_async/sync {q:6.3f}")
    if args.json:
        args.json.write_text(json.dumps({"steps": args.steps, "environment": environment(), "raw": raw,
                                         "medians": res, "ratio_step_time_async_over_sync": q}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
