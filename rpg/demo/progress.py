"""What a tiny-task run prints while it runs (the CPU demo's and the GPU smoke run's lines, each with its prefix).

* ``StartupProgress``: a line per start-up stage reached (the caller's list of output markers), one at least
  every ``HEARTBEAT_S`` seconds until the first metrics arrive, and the driver's resume decision;
* ``progress``: a line per training step (train accuracy, importance-ratio range, KL estimate, clipped share,
  time) and per validation;
* ``policy_stats``: the off-policy diagnostics of one step.
"""

from __future__ import annotations

import threading
import time

from rpg.launch.harness import resume_decision

VAL_PREFIX = "val-core/math_dapo/acc/mean@"
HEARTBEAT_S = 10.0


def val_acc(data: dict) -> float | None:
    keys = [k for k in data if k.startswith(VAL_PREFIX)]
    return float(data[keys[0]]) if keys else None


def policy_stats(data: dict) -> str:
    """Off-policy diagnostics of one step: importance-ratio range, KL estimate, clipped share."""
    parts = []
    if "actor/rpg/ratio_min" in data and "actor/rpg/ratio_max" in data:
        parts.append(f"ratio [{float(data['actor/rpg/ratio_min']):.2f}, {float(data['actor/rpg/ratio_max']):.2f}]")
    kl = data.get("actor/rpg/kl_estimate", data.get("actor/ppo_kl"))
    if kl is not None:
        parts.append(f"kl {float(kl):.1e}")
    clip = data.get("actor/rpg/clipfrac", data.get("actor/pg_clipfrac"))
    if clip is not None:
        parts.append(f"clipped {100 * float(clip):.1f}%")
    if "actor/kl_loss" in data:
        parts.append(f"kl_loss(ref) {float(data['actor/kl_loss']):.1e}")
    return "  ".join(parts)


class StartupProgress:
    """Prints a line per start-up stage reached, and one at least every HEARTBEAT_S seconds until
    the first metrics arrive (``on_line`` is called from the harness's reader thread)."""

    def __init__(self, stages: tuple[tuple[str, str], ...], prefix: str, heartbeat_s: float = HEARTBEAT_S):
        self.stages, self.prefix = stages, prefix
        self.t0 = time.time()
        self.stage = "importing verl and composing the config"
        self.next_stage = 0
        self.last_print = self.t0
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.heartbeat_s = heartbeat_s
        threading.Thread(target=self._heartbeat, daemon=True).start()

    def _say(self, text: str) -> None:
        with self.lock:
            self.last_print = time.time()
            print(f"{self.prefix} start-up {time.time() - self.t0:4.0f}s: {text}", flush=True)

    def on_line(self, line: str) -> None:
        if (decision := resume_decision(line)) is not None:  # the driver's, before Ray: where the user looks
            with self.lock:
                print(f"{self.prefix} {decision}", flush=True)
            return
        if self.done.is_set():
            return
        for i in range(self.next_stage, len(self.stages)):  # a stage may be skipped (other trainers)
            marker, stage = self.stages[i]
            if marker in line:
                self.next_stage, self.stage = i + 1, stage
                self._say(stage)
                return

    def _heartbeat(self) -> None:
        while not self.done.wait(1.0):
            if time.time() - self.last_print >= self.heartbeat_s:
                self._say(f"waiting ({self.stage})")

    def finish(self) -> None:
        self.done.set()


DIFF_KEY = "training/rollout_probs_diff_max"


def progress(total: int, prefix: str, startup: StartupProgress | None = None, show_diff: bool = False):
    """``on_metrics`` of a run: a line per training step (train accuracy, off-policy diagnostics, time) and per
    validation, each starting with ``prefix``."""
    t0 = time.time()

    def show(step: int, data: dict) -> None:
        if startup is not None:
            startup.finish()
        val = val_acc(data)
        if step == 0 and val is not None:
            print(f"{prefix} validation before training: acc {val:.3f}", flush=True)
            return
        if "critic/score/mean" in data:
            acc = (float(data["critic/score/mean"]) + 1) / 2
            diff = f"  rollout|actor dp {float(data[DIFF_KEY]):.1e}" if show_diff and DIFF_KEY in data else ""
            print(
                f"{prefix} step {step:3d}/{total}  train acc {acc:.3f}  {policy_stats(data)}{diff}"
                f"  {data.get('timing_s/step', float('nan')):.1f}s/step  elapsed {time.time() - t0:.0f}s",
                flush=True,
            )
        if val is not None:
            print(f"{prefix} validation at step {step}: acc {val:.3f}", flush=True)

    return show
