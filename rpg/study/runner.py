"""Run the grid resumably through the same path as ``RPG_BACKEND=cpu``, printing progress.

Each run lives in ``<out>/runs/<run id>/`` (``metrics.jsonl``, ``trainer.log`` from the harness)
with ``run.json`` written last: ``status`` ``done`` (with wall time and measured step/validation
time) or ``failed`` (with the error's last line). A run whose ``run.json`` says ``done`` with the
same overrides is not repeated; a failed run is repeated only with ``retry_failed``; anything else
(interrupted, never started, overrides changed since) runs from scratch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rpg.study.grid import Costs, RunSpec, fmt_duration, save_json

RUN_RECORD = "run.json"


def run_dir(out: Path, spec: RunSpec) -> Path:
    return Path(out) / "runs" / spec.run_id


def read_record(out: Path, spec: RunSpec) -> dict | None:
    path = run_dir(out, spec) / RUN_RECORD
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def all_records(out: Path) -> list[dict]:
    """Records of every run under ``out`` (any grid): the measured costs for the time estimate."""
    recs = []
    for path in sorted((Path(out) / "runs").glob(f"*/{RUN_RECORD}")):
        try:
            recs.append(json.loads(path.read_text()))
        except json.JSONDecodeError:
            continue
    return recs


def plan_overrides(spec: RunSpec, out: Path) -> list[str]:
    """All overrides of one run: what ``RPG_BACKEND=cpu`` launches for the method, then the study's."""
    from rpg.launch import plan_overrides as launch_overrides
    from rpg.launch import project_root
    from rpg.tiny import build_tiny_assets
    from rpg.variants import parse

    d = run_dir(out, spec).resolve()
    env = {"LOGGER": "console,file", "PROJECT_NAME": "rpg_study", "EXP_NAME": spec.run_id,
           "CKPTS_DIR": str(d / "ckpts"), "VERL_FILE_LOGGER_ROOT": str(d / "logs"), "TENSORBOARD_DIR": str(d / "tb")}
    root = project_root()
    overrides, _ = launch_overrides(parse(spec.variant), env, spec.study_overrides(build_tiny_assets()),
                                    root=root, cwd=root, cpu=True)
    return overrides


def status(out: Path, spec: RunSpec, overrides: list[str] | None = None) -> str:
    """``done`` | ``failed`` | ``stale`` (done with other overrides) | ``todo``."""
    rec = read_record(out, spec)
    if rec is None:
        return "todo"
    if overrides is not None and rec.get("overrides") != overrides:
        return "stale"
    return rec.get("status", "todo")


def _timing(metrics_file: Path) -> tuple[float, float, int]:
    """(summed timing_s/step, summed timing_s/testing, validations) from verl's file logger."""
    step = val = 0.0
    vals = 0
    for line in metrics_file.read_text().splitlines() if metrics_file.is_file() else []:
        try:
            data = json.loads(line)["data"]
        except (json.JSONDecodeError, KeyError):
            continue
        step += float(data.get("timing_s/step", 0.0))
        if "timing_s/testing" in data:
            val += float(data["timing_s/testing"])
            vals += 1
    return step, val, vals


def _code_version() -> str:
    """``git describe`` of the checkout the run used (``+dirty`` with uncommitted changes), or ``unknown``."""
    from rpg.launch import project_root

    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty=+dirty"], cwd=project_root(),
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


class Progress:
    """One line per training step and validation, with the run's and the grid's elapsed time and ETA."""

    def __init__(self, total_runs: int, costs: Costs, remaining_s: float, stream=None):
        self.total, self.costs, self.remaining_s, self.stream = total_runs, costs, remaining_s, stream
        self.after_s = remaining_s  # estimated cost of the runs after the current one
        self.t0 = time.time()

    def say(self, text: str) -> None:
        print(f"[study {time.strftime('%H:%M:%S')}] {text}", file=self.stream or sys.stdout, flush=True)

    def callback(self, index: int, spec: RunSpec):
        t_run = time.time()
        self.after_s = max(0.0, self.after_s - self.costs.run_s(spec))
        tag = f"{index}/{self.total} {spec.label} k={spec.updates} seed {spec.seed}"
        steps = spec.sizes.steps

        self.arrivals: dict[int, float] = {}  # step -> seconds since the run started, when its record appeared

        def on_metrics(step: int, data: dict) -> None:
            self.arrivals.setdefault(step, time.time() - t_run)
            val = next((v for k, v in data.items() if k.startswith("val-core/") and "/acc/mean@" in k), None)
            parts = []
            if "critic/score/mean" in data:
                parts.append(f"reward {float(data['critic/score/mean']):+.3f}")
            if "actor/ppo_kl" in data:
                parts.append(f"kl(old,new) {float(data['actor/ppo_kl']):.1e}")
            if val is not None:
                parts.append(f"val acc {float(val):.3f}")
            if parts:
                elapsed = time.time() - self.t0
                self.say(f"{tag}: step {step}/{steps}  {'  '.join(parts)}  (run {fmt_duration(time.time() - t_run)}, "
                         f"grid {fmt_duration(elapsed)} of ~{fmt_duration(elapsed + self.eta_after(spec, step))})")

        return on_metrics

    def eta_after(self, spec: RunSpec, step: int) -> float:
        """Estimated seconds left in the grid after ``step`` of the current run."""
        s, c = spec.sizes, self.costs
        per_step = c.step_s + (spec.updates - 1) * c.update_s
        vals_left = sum(1 for t in range(step + 1, s.steps + 1) if t % s.test_freq == 0 or t == s.steps)
        return self.after_s + (s.steps - step) * per_step + vals_left * c.val_s  # (this run's shutdown not counted)


def run_grid(specs: list[RunSpec], out: Path, costs: Costs, *, retry_failed: bool = False, timeout_s: float = 1800.0,
             stream=None) -> list[dict]:
    """Run every spec that is not finished; returns the records of all specs (done, failed or skipped)."""
    from rpg.backends.cpu.harness import TrainerRunError, run_trainer
    from rpg.launch import ENTRY, project_root

    out = Path(out)
    plans = [(spec, plan_overrides(spec, out)) for spec in specs]
    todo = [(s, ov) for s, ov in plans if status(out, s, ov) not in ("done",) + (() if retry_failed else ("failed",))]
    progress = Progress(len(specs), costs, sum(costs.run_s(s) for s, _ in todo), stream)
    states = [status(out, s, ov) for s, ov in plans]
    kept_failed = 0 if retry_failed else states.count("failed")
    progress.say(f"{len(specs)} runs: {states.count('done')} finished, {kept_failed} failed (not retried without "
                 f"--retry-failed), {len(todo)} to run (estimate {fmt_duration(progress.remaining_s)}); output {out}")
    for spec, overrides in plans:
        if (spec, overrides) not in todo:
            st = status(out, spec, overrides)
            progress.say(f"skip {spec.label} k={spec.updates} seed {spec.seed}: {st} ({run_dir(out, spec)})")
    for spec, overrides in todo:
        index = specs.index(spec) + 1
        d = run_dir(out, spec)
        if d.exists():
            shutil.rmtree(d)  # interrupted, stale or retried: start afresh
        d.mkdir(parents=True)
        progress.say(f"start {index}/{len(specs)} {spec.label} k={spec.updates} seed {spec.seed} -> {d}")
        record = {"run_id": spec.run_id, "variant": spec.variant, "label": spec.label, "updates": spec.updates,
                  "seed": spec.seed, "steps": spec.sizes.steps, "validations": spec.sizes.validations,
                  "started": time.strftime("%Y-%m-%d %H:%M:%S"), "code": _code_version(), "overrides": overrides}
        t0 = time.time()
        try:
            run = run_trainer(overrides, output_dir=d, entry=str(project_root() / ENTRY), timeout_s=timeout_s,
                              on_metrics=progress.callback(index, spec))
            step_s, val_s, _ = _timing(run.metrics_file)
            arrivals = progress.arrivals
            # wall time from the first record (validation before training) to the last: steps + validations + overhead
            train_s = max(arrivals.values()) - min(arrivals.values()) if len(arrivals) > 1 else step_s + val_s
            record.update(status="done", wall_time_s=round(run.wall_time_s, 1), step_time_s=round(step_s, 1),
                          val_time_s=round(val_s, 1), train_wall_s=round(train_s, 1), last_step=run.last_step(),
                          leftover_pids=run.leftover_pids)
        except TrainerRunError as err:
            last = [ln for ln in str(err).splitlines() if ln.strip()]
            record.update(status="failed", wall_time_s=round(time.time() - t0, 1),
                          last_step=err.run.last_step(), error=(last[-1] if last else str(err))[-400:])
        save_json(d / RUN_RECORD, record)
        progress.say(f"{record['status']} {index}/{len(specs)} {spec.label} k={spec.updates} seed {spec.seed} "
                     f"in {fmt_duration(record['wall_time_s'])}" + (f": {record['error']}" if "error" in record else ""))
    return [read_record(out, s) or {"run_id": s.run_id, "status": "todo"} for s in specs]
