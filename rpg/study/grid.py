"""The study's grid: methods, the tiny-task adaptation of their paper settings, run identities, cost.

Methods are paper run names, parsed by ``rpg.variants`` (the one source of truth for every
algorithm setting); a run's overrides are exactly what ``RPG_BACKEND=cpu`` would launch for that
name (``rpg.launch.plan_overrides(..., cpu=True)``: the variant's algorithm settings, the CPU
backend, the tiny task) followed by the study's own overrides, which win:

* **Sizes**: ``prompts`` prompts per rollout batch, ``n`` responses each, validation
  ``val_n`` samples per held-out problem (``rpg.tiny.overrides.tiny_task_overrides``).
* **Off-policy regime**: ``updates`` optimizer steps per rollout batch, i.e. the actor's
  mini-batch is ``prompts / updates`` prompts (the paper: 512 / 32 = 16 steps per batch).
* **Learning rate**: the paper's learning rate times ``LR_SCALE`` (1e-6 -> 5e-4, the tiny
  demo's rate; RPG-REINFORCE's 5e-7 -> 2.5e-4: the paper's ratio between methods is kept). A
  0.34M-parameter model does not move at 1e-6 in a few dozen steps.
* **Warm-up**: none (the paper's 10 warm-up steps would be a large part of a short run).
* **Seed**: ``data.seed`` (prompt order) and the rollout's sampling seed.

Everything else (losses, KL form and coefficient, reference, clip ranges, advantage estimator,
DAPO dynamic sampling and overlong shaping, weight decay, gradient clipping) is the paper
variant's own setting.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rpg.variants import Variant, paper_row, parse

LR_SCALE = 500.0  # tiny lr = paper lr x 500 (1e-6 -> 5e-4, the tiny demo's learning rate)

# The methods of the study (issue 10): paper run names; the model part (7b) is replaced by the tiny model.
METHODS: tuple[str, ...] = (
    "run_grpo_7b",                                # GRPO: k3 KL 1e-3 vs the fixed initial model, clip (0.2, 0.2)
    "run_dapo_7b",                                # DAPO: no KL, clip (0.2, 0.28), dynamic sampling
    "run_rfpp_7b_1e-4",                           # REINFORCE++: k1 KL loss 1e-4 vs the sampler
    "run_rpg_7b_ufkl1e-4",                        # RPG-UFKL, fully differentiable
    "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28",   # RPG-REINFORCE-UFKL with RPG-Style Clip
    "run_rpg_7b_ufkl1e-4_rf",                     # RPG-REINFORCE-UFKL without clip
)
STRESS_METHODS: tuple[str, ...] = METHODS[4:]  # clipped vs unclipped RPG-REINFORCE-UFKL


def label_of(v: Variant) -> str:
    """Table row / legend name: the paper's method label, '(no clip)' for unclipped RPG-REINFORCE."""
    return paper_row(v) + (" (no clip)" if v.form == "reinforce" and not v.clip else "")


@dataclass(frozen=True)
class Sizes:
    """Tiny-task sizes and schedule shared by every run of a grid."""

    steps: int = 16
    test_freq: int = 4
    prompts: int = 16
    n: int = 4
    val_n: int = 4

    def check(self, updates: tuple[int, ...]) -> None:
        for name in ("steps", "test_freq", "prompts", "n", "val_n"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        bad = [k for k in updates if k < 1 or self.prompts % k]
        if bad:
            raise ValueError(f"optimizer steps per rollout batch {bad} must divide --prompts {self.prompts} "
                             "(the mini-batch is prompts / steps prompts)")

    @property
    def validations(self) -> int:
        """Validation passes: before training, every test_freq steps, and at the last step."""
        return 1 + self.steps // self.test_freq + (1 if self.steps % self.test_freq else 0)


@dataclass(frozen=True)
class RunSpec:
    """One run of the grid: a method (paper run name) at ``updates`` optimizer steps per batch, one seed."""

    variant: str
    updates: int
    seed: int
    sizes: Sizes = field(default_factory=Sizes)

    @property
    def label(self) -> str:
        return label_of(parse(self.variant))

    @property
    def run_id(self) -> str:
        """Directory name; the sizes enter through a short hash so that a changed grid never reuses a run."""
        digest = hashlib.sha1(json.dumps(asdict(self.sizes), sort_keys=True).encode()).hexdigest()[:6]
        return f"{self.variant}-k{self.updates}-seed{self.seed}-{digest}"

    def study_overrides(self, assets) -> list[str]:
        """The study's overrides (after the variant's and the CPU backend's; these win)."""
        from rpg.tiny.overrides import tiny_task_overrides

        v, s = parse(self.variant), self.sizes
        return [
            *tiny_task_overrides(assets, steps=s.steps, test_freq=s.test_freq, train_batch_size=s.prompts,
                                 n=s.n, val_n=s.val_n, mini_batch_size=s.prompts // self.updates),
            f"actor_rollout_ref.actor.optim.lr={v.lr * LR_SCALE:g}",
            "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
            f"data.seed={self.seed}",
            f"actor_rollout_ref.rollout.seed={self.seed}",
            "trainer.project_name=rpg_study",
            f"trainer.experiment_name={self.run_id}",
        ]


def grid(seeds: int = 2, updates: int = 4, stress: tuple[int, ...] = (1, 4, 16), sizes: Sizes = Sizes(),
         methods: tuple[str, ...] = METHODS, stress_methods: tuple[str, ...] = STRESS_METHODS) -> list[RunSpec]:
    """Every method at ``updates`` steps per batch, and the stress methods at each of ``stress``; seeds 1..seeds.

    A run shared by both parts (a stress method at ``updates``) appears once. The order is
    seed-major: every run of seed 1 (main grid, then stress axis) before any of seed 2, so that an
    interrupted grid has complete seeds.
    """
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    for name in (*methods, *stress_methods):
        parse(name)  # a bad name fails here with the grammar
    sizes.check((updates, *stress))
    specs: dict[tuple[str, int, int], RunSpec] = {}
    for seed in range(1, seeds + 1):
        for m in methods:
            specs.setdefault((m, updates, seed), RunSpec(m, updates, seed, sizes))
        for k in stress:
            for m in stress_methods:
                specs.setdefault((m, k, seed), RunSpec(m, k, seed, sizes))
    return list(specs.values())


# ----------------------------------------------------------------------------- cost


@dataclass(frozen=True)
class Costs:
    """Seconds per run: start-up + shutdown, one training step with one update, each extra update, one validation."""

    startup_s: float
    step_s: float
    update_s: float
    val_s: float
    source: str

    def run_s(self, spec: RunSpec) -> float:
        s = spec.sizes
        return self.startup_s + s.steps * (self.step_s + (spec.updates - 1) * self.update_s) + s.validations * self.val_s


# Measured on the development machine (2 cores, load average ~9 from other jobs): a 3-step run of
# unclipped RPG-REINFORCE-UFKL, 16 prompts x 4 responses, 16 updates per batch: 215 s wall, of it
# ~180 s start-up + shutdown; from the first metrics record to the last 35 s for 3 steps and 2
# validations: ~7.8 s per step (generation ~4 s; the actor update 1.3-1.7 s at 16 mini-batches vs
# 0.9-1.3 s at 4), validation (30 problems x 4 samples) ~5.8 s. Replaced by the figures of
# finished runs in the output directory when there are any.
BUILTIN_COSTS = Costs(startup_s=180.0, step_s=7.0, update_s=0.05, val_s=5.8,
                      source="built-in (measured on a loaded 2-core machine)")


def calibrate(records: list[dict]) -> Costs:
    """Costs from finished runs' records; the built-in figures when there are none.

    A record has the run's ``wall_time_s``, ``train_wall_s`` (wall time from the first metrics
    record, the validation before training, to the last), summed ``val_time_s``, ``steps``,
    ``validations`` and ``updates``. Start-up + shutdown = wall - train; one step = (train - the
    validations after step 0) / steps, which includes the trainer's overhead between steps.
    Medians over the runs.
    """
    done = [r for r in records if r.get("status") == "done" and r.get("steps") and "train_wall_s" in r]
    if not done:
        return BUILTIN_COSTS
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    val = med([r["val_time_s"] / max(1, r["validations"]) for r in done])
    startup = med([r["wall_time_s"] - r["train_wall_s"] for r in done])
    step = med([(r["train_wall_s"] - (r["validations"] - 1) * val) / r["steps"]
                - (r["updates"] - 1) * BUILTIN_COSTS.update_s for r in done])
    return Costs(max(0.0, startup), max(0.0, step), BUILTIN_COSTS.update_s, val,
                 source=f"measured from {len(done)} finished run(s) in this output directory")


def fmt_duration(seconds: float) -> str:
    seconds = int(math.ceil(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def describe(specs: list[RunSpec], costs: Costs, finished: set[str] = frozenset()) -> str:
    """The grid as a table with the time estimate (what ``--dry-run`` prints)."""
    lines = [f"{'#':>3}  {'method':<32} {'steps/batch':>11} {'seed':>4}  {'estimate':>8}  status   run id"]
    todo = 0.0
    for i, spec in enumerate(specs, 1):
        est = costs.run_s(spec)
        status = "done" if spec.run_id in finished else "to run"
        todo += 0 if spec.run_id in finished else est
        lines.append(f"{i:>3}  {spec.label:<32} {spec.updates:>11} {spec.seed:>4}  {fmt_duration(est):>8}  "
                     f"{status:<7}  {spec.run_id}")
    s = specs[0].sizes if specs else Sizes()
    lines.append(
        f"{len(specs)} runs ({len(specs) - len(finished & {x.run_id for x in specs})} to run); each: {s.steps} steps of "
        f"{s.prompts} prompts x {s.n} responses, validation every {s.test_freq} steps ({s.val_n} samples per problem)"
    )
    lines.append(f"estimated time to run: {fmt_duration(todo)} (costs {costs.source}: start-up {costs.startup_s:.0f}s, "
                 f"step {costs.step_s:.1f}s + {costs.update_s:.2f}s per extra update, validation {costs.val_s:.1f}s)")
    return "\n".join(lines)


def save_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    tmp.replace(path)
