"""Measure, on the tiny CPU run, what a second FSDP rank costs: per-step time and peak memory per rank at world
size 1 vs 2 (benchmarks/world_size.md has the figures).

Two runs of verl's real trainer on the CPU backend (rpg.trainer_process), identical settings (tiny model and
task, the tiny demo's RPG algorithm, 8 prompts x 8 responses per step, 4 mini-batches, no validation, no
checkpoint), except ``trainer.n_gpus_per_node`` (and the per-rank micro-batches: the same global
mini-batch split over the ranks, ``rpg.tiny.overrides.tiny_overrides(world_size=...)``).

* step time: the median of verl's ``timing_s/step`` over steps 2..N (step 1 includes warm-up; with
  ``--steps 1``, step 1's), and likewise the actor update and the old-log-prob forward;
* peak memory per rank: each FSDP rank's (verl's ``WorkerDict`` Ray actor: actor, rollout and reference
  of that rank) peak resident set, the kernel's high-water mark ``VmHWM`` of ``/proc/<pid>/status``, read
  every 0.5 s while the run lasts (it only grows); it counts the shared libraries (torch alone ~0.5 GiB)
  in every rank; ranks told apart by the ``RANK`` verl puts in each worker's environment;
* the run's peak summed PSS over all its processes (the harness's: Ray's daemons, the driver, the ranks).

Printed: one line per world size, then the ratios ws2/ws1. On a 2-core machine the two ranks share the
two cores with Ray and the rollout, so the step time does not halve; compare within one invocation only
(a shared machine is noisy).

    python benchmarks/bench_world_size.py [--steps 4] [--out DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = str(ROOT / "recipe" / "rpg" / "main_rpg.py")
WORLD_SIZES = (1, 2)
COMMON = ["trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1"]


class RankPeaks(threading.Thread):
    """Polls the kernel's peak RSS (``VmHWM``) of every ``WorkerDict`` process under this process."""

    def __init__(self, every_s: float = 0.5):
        super().__init__(daemon=True)
        self.every_s, self.peaks, self.stop = every_s, {}, threading.Event()

    def run(self) -> None:
        import psutil

        me = psutil.Process(os.getpid())
        while not self.stop.wait(self.every_s):
            for p in me.children(recursive=True):
                try:
                    if "WorkerDict" not in " ".join(p.cmdline()):
                        continue
                    rank = int(p.environ().get("RANK", -1))
                    with open(f"/proc/{p.pid}/status") as f:
                        hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
                    self.peaks[(rank, p.pid)] = max(self.peaks.get((rank, p.pid), 0), hwm)
                except (psutil.Error, OSError, ValueError, StopIteration):
                    continue


def measure(world_size: int, steps: int, out: Path) -> dict:
    """One run at ``world_size``: per-step timings and memory."""
    from rpg.trainer_process import run_trainer
    from rpg.tiny import build_tiny_assets
    from rpg.tiny.overrides import tiny_overrides

    peaks = RankPeaks()
    peaks.start()
    try:
        # the tiny task's batches (8 prompts x 8 responses, mini-batches of 2 prompts), the micro-batches
        # split over the ranks by tiny_overrides; the harness gives the private Ray one logical GPU per rank
        run = run_trainer([*tiny_overrides(build_tiny_assets(), steps=steps, algo="rpg", world_size=world_size),
                           *COMMON, f"trainer.n_gpus_per_node={world_size}"], output_dir=out, entry=RECIPE,
                          cwd=ROOT, timeout_s=1200)
    finally:
        peaks.stop.set()
        peaks.join()
    first = 2 if steps >= 2 else 1

    def steps_of(key):
        return [t for s, t in run.series(key) if s >= first]

    ranks = sorted(peaks.peaks.items())
    if [r for (r, _), _ in ranks] != list(range(world_size)):
        raise RuntimeError(f"world size {world_size}: found ranks {[r for (r, _), _ in ranks]} (pid: peak RSS)")
    return {
        "world_size": world_size, "steps": steps, "wall_s": run.wall_time_s, "step_s": steps_of("timing_s/step"),
        "update_actor_s": steps_of("timing_s/update_actor"), "old_log_prob_s": steps_of("timing_s/old_log_prob"),
        "rank_peak_rss_gb": [b / 2**30 for _, b in ranks], "peak_pss_gb": run.peak_pss_bytes / 2**30,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4, help="steps per run (step time: median over 2..N)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be >= 1")
    out = args.out or Path(tempfile.mkdtemp(prefix="rpg-bench-ws-"))
    res = {ws: measure(ws, args.steps, out / f"ws{ws}") for ws in WORLD_SIZES}
    med = statistics.median
    steps = f"steps 2..{args.steps}" if args.steps >= 2 else "step 1 (warm-up included)"
    print(f"tiny RPG run (8 prompts x 8 responses per step), medians over {steps}")
    print(f"{'world size':>10s} {'wall s':>7s} {'step s':>7s} {'update s':>8s} {'oldlp s':>7s} "
          f"{'peak RSS per rank GiB':>22s} {'run PSS GiB':>11s}")
    for ws, r in res.items():
        per_rank = " ".join(f"{g:.2f}" for g in r["rank_peak_rss_gb"])
        print(f"{ws:10d} {r['wall_s']:7.1f} {med(r['step_s']):7.2f} {med(r['update_actor_s']):8.2f} "
              f"{med(r['old_log_prob_s']):7.2f} {per_rank:>22s} {r['peak_pss_gb']:11.2f}")
    one, two = res[1], res[2]
    ratios = {
        "step time ws2/ws1": med(two["step_s"]) / med(one["step_s"]),
        "actor update ws2/ws1": med(two["update_actor_s"]) / med(one["update_actor_s"]),
        "peak RSS per rank ws2 (max)/ws1": max(two["rank_peak_rss_gb"]) / one["rank_peak_rss_gb"][0],
        "run peak PSS ws2/ws1": two["peak_pss_gb"] / one["peak_pss_gb"],
    }
    for k, v in ratios.items():
        print(f"{k:34s} {v:6.3f}")
    if args.json:
        args.json.write_text(json.dumps({"results": res, "ratios": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
