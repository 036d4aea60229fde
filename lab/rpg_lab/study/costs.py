"""The study's cost model: seconds per run from measured figures, the grid's wall time at ``--jobs`` runs at a time,
calibration from finished runs, and the grid as ``--dry-run`` prints it."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# (``RunSpec`` in the annotations: rpg_lab.study.grid's, which imports this module)

# Grid throughput with J runs at a time relative to one at a time (2 cores; a run alone leaves ~40 % of
# them idle while its Ray processes start one after another). Measured: two runs started 20 s apart took
# 3m07s together vs ~3m54s one after the other (idle 2-core machine).
PARALLEL_SPEEDUP = {1: 1.0, 2: 1.25}


def speedup(jobs: int) -> float:
    """Throughput factor of ``jobs`` concurrent runs (beyond 2 jobs no more is assumed on 2 cores)."""
    return PARALLEL_SPEEDUP.get(jobs, PARALLEL_SPEEDUP[max(PARALLEL_SPEEDUP)])


@dataclass(frozen=True)
class Costs:
    """Seconds per run: start-up + shutdown, one training step with one update, each extra update, one validation,
    and what a method's step adds (``method_step_s``: (run name, seconds) pairs; none on the tiny task).

    The figures are walls measured with ``jobs`` runs at a time (each run slower, the grid faster).
    """

    startup_s: float
    step_s: float
    update_s: float
    val_s: float
    source: str
    jobs: int = 1
    method_step_s: tuple[tuple[str, float], ...] = ()

    def step_cost(self, spec: RunSpec) -> float:
        """One training step of ``spec`` with its updates."""
        return self.step_s + (spec.updates - 1) * self.update_s + dict(self.method_step_s).get(spec.variant, 0.0)

    def run_s(self, spec: RunSpec) -> float:
        """One run's wall time with ``self.jobs`` runs at a time."""
        s = spec.sizes
        return self.startup_s + s.steps * self.step_cost(spec) + s.validations * self.val_s

    def remaining_s(self, spec: RunSpec, step: int) -> float:
        """What is left of one run after its record for ``step`` (-1: not started yet: the whole run)."""
        if step < 0:
            return self.run_s(spec)
        s = spec.sizes
        vals_left = sum(1 for t in range(step + 1, s.steps + 1) if t % s.test_freq == 0 or t == s.steps)
        return (s.steps - step) * self.step_cost(spec) + vals_left * self.val_s

    def grid_s(self, specs: list[RunSpec], jobs: int) -> float:
        """Wall time of ``specs`` run ``jobs`` at a time: the one-at-a-time total / speedup(jobs).

        The measured walls are converted to one-at-a-time walls first (x speedup(self.jobs) / self.jobs).
        """
        alone = sum(self.run_s(s) for s in specs) * speedup(self.jobs) / self.jobs
        return alone / speedup(max(1, min(jobs, len(specs))))  # fewer runs than jobs: only they overlap


# Measured on the development machine (2 cores, idle but for a few short tests), with the default
# --jobs 2: the 20 runs of seeds 3-4 of the default sizes took 27 min 43 s; medians over them:
# start-up + shutdown 76 s (Ray and seven processes that each import verl, ~5 s apiece), a
# training step 4.0 s, a validation (30 problems x 4 samples) 3.65 s, each slower than a run alone
# (a 16-step run alone: 117 s, of it 55 s start-up). Replaced by the figures of finished runs in
# the output directory when there are any.
BUILTIN_COSTS = Costs(startup_s=76.0, step_s=4.0, update_s=0.03, val_s=3.65,
                      source="built-in (measured on an idle 2-core machine, 2 runs at a time)", jobs=2)

# The staleness study's built-in costs (separate-async: a standalone rollout replica, a weight sync per step, a pi_old
# snapshot per update): the medians of 61 runs of the default sizes (seeds 2 and 3 of the grid), 2 at a time on an
# otherwise idle 2-core machine (``calibrate``): those 62 runs took 67 min 26 s, i.e. 1 h 44 min for all 96.
STALENESS_COSTS = Costs(startup_s=96.5, step_s=2.7, update_s=0.16, val_s=2.2,
                        source="built-in (separate-async, the medians of 61 runs on an idle 2-core machine, 2 at a time)",
                        jobs=2)


# The lag study's built-in costs: the staleness grid's, with a validation at val_n 8 taken as twice its measured
# 2.2 s at val_n 4 (not measured yet; ``calibrate`` replaces them by the medians of finished runs)
LAG_COSTS = replace(STALENESS_COSTS, val_s=2 * STALENESS_COSTS.val_s,
                    source="built-in (the staleness grid's separate-async medians, 2 at a time; a validation at "
                           "val_n 8 as twice the measured 2.2 s at val_n 4)")


def calibrate(records: list[dict], default: Costs = BUILTIN_COSTS) -> Costs:
    """Costs from finished runs' records; the built-in figures when there are none.

    A record has the run's ``wall_time_s``, ``train_wall_s`` (wall time from the first metrics
    record to the last), summed ``val_time_s``, ``steps``, ``validations``, ``updates``, ``jobs`` (runs at a time; 1
    when absent) and ``val_before`` (True when absent). The first record is the validation before training's
    (step 0), or step 1's without one. One step = (train - the validations after the first record) / the steps after
    it, which includes the trainer's overhead between steps; start-up + shutdown = wall - train - the steps up to the
    first record. Medians over the runs made at the most common ``jobs`` (walls at different concurrency do not mix);
    with ``default.method_step_s``, each method's step is the median of its own runs (a method without one keeps
    the default's difference).
    """
    done = [r for r in records if r.get("status") == "done" and r.get("steps") and "train_wall_s" in r
            and r["steps"] > _first_step(r)]
    if not done:
        return default
    counts: dict[int, int] = {}
    for r in done:
        counts[int(r.get("jobs", 1))] = counts.get(int(r.get("jobs", 1)), 0) + 1
    jobs = max(counts, key=lambda j: (counts[j], -j))
    done = [r for r in done if int(r.get("jobs", 1)) == jobs]
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    val = med([r["val_time_s"] / max(1, r["validations"]) for r in done])

    def step_of(r: dict) -> float:
        first = _first_step(r)
        return ((r["train_wall_s"] - (r["validations"] - (1 - first)) * val) / (r["steps"] - first)
                - (r["updates"] - 1) * default.update_s)

    step = med([step_of(r) for r in done])
    startup = med([r["wall_time_s"] - r["train_wall_s"] - _first_step(r) * step_of(r) for r in done])
    extra = dict(default.method_step_s)
    if default.method_step_s:
        for name in {r.get("variant") for r in done} & set(extra):
            extra[name] = med([step_of(r) for r in done if r.get("variant") == name]) - step
    return Costs(max(0.0, startup), max(0.0, step), default.update_s, val, jobs=jobs,
                 method_step_s=tuple(extra.items()), source=f"measured from {len(done)} finished run(s) in this output directory, {jobs} at a time")


def _first_step(record: dict) -> int:
    """The step of a run's first metrics record: 0 (the validation before training) or 1 (without one)."""
    return 0 if record.get("val_before", True) else 1


def fmt_duration(seconds: float) -> str:
    seconds = int(math.ceil(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def describe(specs: list[RunSpec], costs: Costs, finished: set[str] = frozenset(), jobs: int = 1,
             states: dict[str, str] | None = None) -> str:
    """The grid as a table with the time estimate (what ``--dry-run`` prints): ``finished`` the run ids that do
    not run (done, or failed and not retried), ``states`` each run's state (``rpg_lab.study.records.status``)."""
    w = max([32, *(len(spec.label) for spec in specs)])
    lines = [f"{'#':>3}  {'method':<{w}} {'steps/batch':>11} {'seed':>4}  {'estimate':>8}  status   run id"]
    todo = [spec for spec in specs if spec.run_id not in finished]
    states = states or {}
    for i, spec in enumerate(specs, 1):
        state = states.get(spec.run_id, "done")
        status = (state if spec.run_id in finished else "redo" if state in ("stale", "failed") else "to run")
        est = fmt_duration(costs.run_s(spec))
        lines.append(f"{i:>3}  {spec.label:<{w}} {spec.updates:>11} {spec.seed:>4}  {est:>8}  "
                     f"{status:<7}  {spec.run_id}")
    if specs:
        s = specs[0].sizes
        lines.append(f"{len(specs)} runs ({len(todo)} to run); each: {s.steps} steps of {s.prompts} prompts x {s.n} "
                     f"responses, {s.schedule()}")
    else:
        lines.append("0 runs (0 to run)")
    from rpg_lab.study.methods import label_of

    methods = "".join(f", {label_of(name)} {x:+.1f}s per step" for name, x in costs.method_step_s)
    lines.append(f"estimated time to run: {fmt_duration(costs.grid_s(todo, jobs))} with {jobs} run(s) at a time "
                 f"(costs {costs.source}: start-up {costs.startup_s:.0f}s, step {costs.step_s:.1f}s + "
                 f"{costs.update_s:.2f}s per extra update{methods}, validation {costs.val_s:.1f}s per run; "
                 f"{jobs} at a time x{speedup(jobs):.2f} the throughput of one)")
    return "\n".join(lines)
