"""Measure, on the tiny CPU run, the step time of the RPG loss in verl's sync and colocate-async trainers.

Two runs of verl's real trainer on the CPU backend per round, identical settings (those of
``bench_trainer_cpu.py``: tiny model and task, 8 prompts x 8 responses, one mini-batch per step, no
validation; RPG-REINFORCE-UFKL + RPG-Style Clip, sampler anchor) except ``trainer.v1.trainer_mode``:

  rpg_sync             sync: generate, then train, every step
  rpg_colocate_async   colocate_async: one batch generated ahead (samples one update stale, weighted
                       by the exact pi_old/mu in the loss)

Step time = median of verl's ``timing_s/step`` over steps 2..N (``bench_trainer_cpu.summarize``).
Printed: the medians and the ratio colocate_async / sync. verl's colocate-async trainer aborts and
sleeps the rollout replicas after sampling and resumes them after the weight update
(``PPOTrainerColocateAsync.on_sample_end``/``on_step_end``), so on one colocated device pool generation
and training take turns in both modes; what differs is the one-batch lead (generation that continues
from the previous step's resume) and the replay buffer's bookkeeping.

    python benchmarks/bench_async_cpu.py [--steps 6] [--repeats 1] [--out DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_trainer_cpu as base  # noqa: E402

RPG = base.VARIANTS["rpg_sampler"]
VARIANTS = {
    "rpg_sync": (RPG[0], [*RPG[1], "trainer.v1.trainer_mode=sync"]),
    "rpg_colocate_async": (RPG[0], [*RPG[1], "trainer.v1.trainer_mode=colocate_async"]),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=1, help="rounds; the order alternates each round")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.steps < 3:
        ap.error("--steps must be >= 3 (step 1 is excluded from the step time)")
    base.VARIANTS.update(VARIANTS)  # base.measure reads its variant table
    out = args.out or Path(tempfile.mkdtemp(prefix="rpg-bench-async-"))
    names = list(VARIANTS)
    raw: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            raw[name].append(base.measure(name, args.steps, out / f"{name}_{r}"))
    res = {n: base.summarize(raw[n]) for n in names}
    print(f"medians over {args.repeats} run(s) x steps 2..{args.steps}")
    for n, r in res.items():
        print(f"{n:20s} step {r['step_s']:6.2f} s  update {r['update_actor_s']:6.2f} s  "
              f"old_log_prob {r['old_log_prob_s']:5.2f} s  wall {r['wall_s']:6.1f} s")
    ratio = res["rpg_colocate_async"]["step_s"] / res["rpg_sync"]["step_s"]
    print(f"step_time colocate_async/sync {ratio:6.3f}")
    if args.json:
        args.json.write_text(json.dumps({"steps": args.steps, "raw": raw, "medians": res,
                                         "ratio_step_time_async_over_sync": ratio}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
