"""Measure the tiny CPU run in verl's three trainer modes at the same global batch: step time, samples per second,
peak memory, and their ratios to sync, in one invocation.

One invocation runs verl's real trainer on the CPU backend once per mode per round (``--repeats``; the order
reverses each round), with the tiny demo's settings (``rpg.tiny.overrides``: tiny model and task, the demo's
RPG-REINFORCE-UFKL + RPG-Style Clip) and no validation. Every mode trains on the same global batch, 8 prompts x 8
responses per step, in 4 optimizer updates of 2 prompts (the demo's mini-batches); only the mode's own keys differ:

  sync             generate the step's batch, then 4 updates
  colocate_async   the same, one batch generated ahead on the same (colocated) pool
  separate_async   verl's standalone rollout pool of one rank (the CPU backend's ``SEPARATE_ASYNC_POOL``: one
                   more logical GPU), weights synced every ``parameter_sync_step`` = 8 / 2 = 4 updates (verl
                   requires ``train_batch_size = parameter_sync_step x ppo_mini_batch_size``), so one sync per step;
                   old log-probs per mini-batch (``tiny_task_overrides(trainer_mode=...)``)

Printed per mode (medians over steps 2..N of all rounds: step 1 includes warm-up; a 1-step run times step 1
and says so, and has no wall/step):

  step s       verl's ``timing_s/step``: the step as verl times it (waiting for samples, old log-probs, the
               updates, the weight sync; not the metrics and logging after it, nor colocate_async's generation
               ahead once the step has ended)
  wall/step s  the time between the console lines of consecutive steps (the harness stamps each line): all of
               a step's cost, whatever runs outside ``timing_s/step``
  samples/s    responses per step (prompts x n = 64) / wall/step s: the steady-state throughput
  peak PSS     the peak over the run of the summed PSS of all the run's processes (the trainer, its Ray
               workers, the rollout server(s) and Ray's daemons; shared pages split between them), sampled
               every 10 s by the harness (``rpg.trainer_process``): the run's RAM, not one process's

and each one's ratio to sync. On a 2-core machine the standalone pool's generation competes with training for
the same cores: the ratios say what the modes cost here, not the overlap a separate device gives.

Checked (exit 1 after the table when one fails; a failed run raises first): each run reaches step N; in
separate_async the rollout pool's weights equal the actor's at every sync (the actor's ``[rpg-weight-sync]
sent`` digest at the start and after each step equals the ``received_digest`` of the standalone rollout server's
line, ``pool=standalone``; the digest binds each tensor's name, shape and bytes: ``rpg.backends.weight_digest``;
its first 12 hex digits are the step's ``rpg/weight_sync_checksum``), and from step 2 on (after the first sync) the
trajectory staleness and the behaviour KL (``actor/rpg/behavior_kl_k3``) are logged and > 0.

    python benchmarks/bench_trainer_modes.py [--steps 6] [--repeats 1] [--out DIR] [--json FILE]
    python benchmarks/bench_trainer_modes.py --steps 2   # smoke (tests/benchmarks/test_bench_trainer_modes.py)

Numbers from a shared 2-core machine are noisy; compare within one invocation only. Figures:
benchmarks/README.md#bench_trainer_modespy.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_trainer_cpu as base  # noqa: E402
from bench_async_cpu import environment  # noqa: E402

MODES = ("sync", "colocate_async", "separate_async")
STALENESS = "training/off_policy/trajectory_staleness/max"
BEHAVIOR_KL = "actor/rpg/behavior_kl_k3"
SYNC_CHECKSUM = "rpg/weight_sync_checksum"  # rpg.backends.weight_digest.CHECKSUM_METRIC
STANDALONE_REPLICAS = 1  # the CPU backend's standalone pool (rpg.backends.cpu.world.SEPARATE_ASYNC_POOL): one rank
# verl's console line of each step, as the harness's log stamps it: "[  113.3s] (RPGTaskRunner pid=..) step:2 - ..."
_STEP_LINE = re.compile(r"^\[\s*([0-9.]+)s\] .*?\bstep:(\d+) - ", re.M)


def overrides(mode: str, steps: int) -> tuple[str, list[str]]:
    """(trainer entry, Hydra overrides) of one mode: the tiny task and demo algorithm, no validation, the mode."""
    from rpg.tiny import build_tiny_assets
    from rpg.tiny.overrides import MINI_BATCH_SIZE, TRAIN_BATCH_SIZE, tiny_algorithm, tiny_task_overrides

    entry, algorithm = tiny_algorithm("rpg")
    task = tiny_task_overrides(build_tiny_assets(), steps=steps, trainer_mode=mode)
    extra = [f"trainer.v1.trainer_mode={mode}"]
    if mode == "separate_async":  # verl's default is 4 too; stated, since the batch rule depends on it
        extra.append(f"trainer.v1.separate_async.parameter_sync_step={TRAIN_BATCH_SIZE // MINI_BATCH_SIZE}")
    return str(base.ROOT / entry), [*task, *algorithm, *base.COMMON, *extra]


def per_step() -> tuple[int, int]:
    """(responses, optimizer updates) per step, the same in every mode."""
    from rpg.tiny.overrides import MINI_BATCH_SIZE, ROLLOUT_N, TRAIN_BATCH_SIZE

    return TRAIN_BATCH_SIZE * ROLLOUT_N, TRAIN_BATCH_SIZE // MINI_BATCH_SIZE


def step_intervals(log: str, first: int) -> list[float]:
    """Seconds between the console lines of steps s-1 and s, for s >= max(first, 2): the wall time per step,
    including what runs outside verl's ``timing_s/step`` (colocate_async's generation ahead, metrics, logging)."""
    at = {int(s): float(t) for t, s in _STEP_LINE.findall(log)}
    return [at[s] - at[s - 1] for s in sorted(at) if s >= max(first, 2) and s - 1 in at]


def sync_problems(log: str, metrics: dict, steps: int) -> list[str]:
    """What is wrong with separate_async's weight syncs (``rpg.backends.weight_digest.sync_problems``): one at the
    start and one after each step, each loaded by the standalone rollout replica with the digest the actor sent,
    and logged as the step's ``rpg/weight_sync_checksum``."""
    from rpg.backends.weight_digest import sync_problems as problems

    return problems(log, metrics, steps, replicas=STANDALONE_REPLICAS)


def off_policy_problems(metrics: dict, steps: int) -> list[str]:
    """Steps 2..N of separate_async (after the first sync) must log a staleness and a behaviour KL > 0."""
    return [f"step {s}: {k}={metrics.get(s, {}).get(k)}, expected > 0 after the first weight sync"
            for s in range(2, steps + 1) for k in (STALENESS, BEHAVIOR_KL) if not metrics.get(s, {}).get(k, 0) > 0]


def measure(mode: str, steps: int, out: Path) -> dict:
    """One run of ``mode``: the timed steps, the peak PSS, the separate-async series and what its checks found."""
    from rpg.trainer_process import run_trainer

    entry, args = overrides(mode, steps)
    # RAY_DEDUP_LOGS=0: Ray would fold the rollout server's per-sync lines, whose numbers it masks
    run = run_trainer(args, output_dir=out, entry=entry, cwd=base.ROOT, timeout_s=1800, env={"RAY_DEDUP_LOGS": "0"})
    first = base.first_timed(steps)
    series = {k: {s: v for s, v in run.series(k)} for k in (STALENESS, BEHAVIOR_KL, SYNC_CHECKSUM)}
    problems = [] if run.last_step() == steps else [f"the run ended at step {run.last_step()}, expected {steps}"]
    if mode == "separate_async":
        problems += sync_problems(run.log, run.metrics, steps) + off_policy_problems(run.metrics, steps)
    return {
        "wall_s": run.wall_time_s,
        "step_s": [t for s, t in run.series("timing_s/step") if s >= first],
        "interval_s": step_intervals(run.log, first),
        "peak_pss_gb": run.peak_pss_bytes / 2**30,
        "series": series,
        "problems": problems,
    }


def summarize(runs: list[dict]) -> dict:
    med = statistics.median
    step = med(x for r in runs for x in r["step_s"])
    gaps = [x for r in runs for x in r["interval_s"]]
    interval = med(gaps) if gaps else math.nan  # a 1-step run has none
    return {"runs": len(runs), "wall_s": med(r["wall_s"] for r in runs), "step_s": step, "interval_s": interval,
            "samples_per_s": per_step()[0] / interval,
            "peak_pss_gb": med(r["peak_pss_gb"] for r in runs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="training steps per run (1: a smoke run, nothing checked "
                                                         "after the first sync)")
    ap.add_argument("--repeats", type=int, default=1, help="rounds; the order reverses each round")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    base.check_sizes(ap, args)
    out = args.out or Path(tempfile.mkdtemp(prefix="rpg-bench-modes-"))
    load = [os.getloadavg()[0]]  # the machine's 1-minute load average: how shared the cores were
    raw: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(args.repeats):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            raw[mode].append(measure(mode, args.steps, out / f"{mode}_{r}"))
    load.append(os.getloadavg()[0])
    res = {m: summarize(raw[m]) for m in MODES}
    ratios = {m: {q: res[m][q] / res["sync"][q] for q in ("step_s", "interval_s", "samples_per_s", "peak_pss_gb")}
              for m in MODES}
    print(f"{environment()}; load average {load[0]:.1f} at the start, {load[1]:.1f} at the end")
    print(f"medians over {args.repeats} run(s) x {base.timed_steps(args.steps)}; {per_step()[0]} responses "
          f"per step in {per_step()[1]} updates in every mode")
    print(f"{'mode':15s} {'step s':>6s} {'wall/step s':>11s} {'samples/s':>9s} {'peak PSS GiB':>12s} {'run s':>6s}  |"
          f" x sync: {'step':>6s} {'wall/step':>9s} {'samples/s':>9s} {'PSS':>6s}")
    for m, q in res.items():
        x = ratios[m]
        print(f"{m:15s} {q['step_s']:6.2f} {q['interval_s']:11.2f} {q['samples_per_s']:9.2f} {q['peak_pss_gb']:12.2f} "
              f"{q['wall_s']:6.1f}  |         {x['step_s']:6.3f} {x['interval_s']:9.3f} {x['samples_per_s']:9.3f} "
              f"{x['peak_pss_gb']:6.3f}")
    for key in (STALENESS, BEHAVIOR_KL):
        for m in ("colocate_async", "separate_async"):
            vals = [f"{v:.3g}" for s, v in sorted(raw[m][0]["series"][key].items())]
            print(f"{m} {key} per step (round 1): {', '.join(vals) or 'not logged'}")
    problems = [f"{m} round {r + 1}: {p}" for m in MODES for r, q in enumerate(raw[m]) for p in q["problems"]]
    for line in problems:
        print(f"check failed: {line}")
    if not problems:
        print(f"checked: every run reached step {args.steps}; separate_async's rollout weights equal the actor's at "
              f"each of its {args.steps + 1} syncs" + (", staleness and behaviour KL > 0 from step 2" if args.steps > 1
                                                        else " (a 1-step run has no step after the first sync)"))
    if args.json:
        args.json.write_text(json.dumps({"steps": args.steps, "environment": environment(), "load_average": load,
                                         "raw": raw, "medians": res, "ratios_to_sync": ratios, "problems": problems},
                                        indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
