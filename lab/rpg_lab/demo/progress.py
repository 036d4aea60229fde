"""What a tiny-task run prints while it runs (the CPU demo's and the GPU smoke run's lines, each with its prefix).

* ``StartupProgress``: a line per start-up stage reached (the caller's list of output markers), one at least
  every ``HEARTBEAT_S`` seconds until the first metrics arrive, and the driver's resume decision;
* ``progress``: a line per training step (train accuracy, importance-ratio range, KL estimate, clipped share,
  time) and per validation;
* ``policy_stats``: the off-policy diagnostics of one step;
* ``val_accs`` / ``val_summary``: the validation accuracy of each data source a run validates on.
"""

from __future__ import annotations

import re
import threading
import time

from rpg.trainer_process import resume_decision

# verl 0.9.1 logs validation as val-core/<data source>/acc/mean@N, one key per data source (rpg.reports.benchmarks)
VAL_KEY = re.compile(r"val-core/(.+)/acc/mean@(\d+)")
HEARTBEAT_S = 10.0


def val_accs(data: dict) -> dict[str, float]:
    """{data source: validation accuracy} of one metrics record (``val-core/<data source>/acc/mean@N``; the
    largest N of a source that logs several), by data source name; empty when the record holds no validation."""
    found: dict[str, tuple[int, float]] = {}
    for key, value in data.items():
        m = VAL_KEY.fullmatch(key)
        if m and (m[1] not in found or int(m[2]) > found[m[1]][0]):
            found[m[1]] = (int(m[2]), float(value))
    return {source: acc for source, (_, acc) in sorted(found.items())}


def fmt_accs(accs: dict[str, float]) -> str:
    """``0.350`` for one data source, ``aime2024 0.100, aime2025 0.200`` for several."""
    if len(accs) == 1:
        return f"{next(iter(accs.values())):.3f}"
    return ", ".join(f"{source} {acc:.3f}" for source, acc in accs.items())


def val_summary(metrics: dict[int, dict]) -> tuple[dict, str]:
    """The validation of a run's records ``{step: data}``: ({data source: {"before": the step-0 accuracy, "after":
    the last validation's after step 0, "curve": [[step, accuracy], ...]}}, the line ``before X -> after Y`` with
    each data source named when there are several; ``n/a`` only for a value that was not logged)."""
    per: dict[str, dict] = {}
    for step, data in sorted(metrics.items()):
        for source, acc in val_accs(data).items():
            entry = per.setdefault(source, {"before": None, "after": None, "curve": []})
            entry["curve"].append([step, acc])
            entry["before" if step == 0 else "after"] = acc
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    if not per:
        return per, "before n/a -> after n/a (no val-core/<data source>/acc/mean@N logged)"
    parts = [(f"{source} " if len(per) > 1 else "") + f"before {fmt(e['before'])} -> after {fmt(e['after'])}"
             for source, e in per.items()]
    return per, "; ".join(parts)


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
        val = val_accs(data)
        if step == 0 and val:
            print(f"{prefix} validation before training: acc {fmt_accs(val)}", flush=True)
            return
        if "critic/score/mean" in data:
            acc = (float(data["critic/score/mean"]) + 1) / 2
            diff = f"  rollout|actor dp {float(data[DIFF_KEY]):.1e}" if show_diff and DIFF_KEY in data else ""
            print(
                f"{prefix} step {step:3d}/{total}  train acc {acc:.3f}  {policy_stats(data)}{diff}"
                f"  {data.get('timing_s/step', float('nan')):.1f}s/step  elapsed {time.time() - t0:.0f}s",
                flush=True,
            )
        if val:
            print(f"{prefix} validation at step {step}: acc {fmt_accs(val)}", flush=True)

    return show
