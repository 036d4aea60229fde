"""The study's grid: methods, the tiny-task adaptation of their paper settings, run identities (the cost model:
``rpg_lab.study.costs``).

A method is a paper run (its experiment file, ``rpg.launch.experiments``: every algorithm setting); a run's overrides
are what ``RPG_BACKEND=cpu`` launches for that run (``rpg.launch.plan.plan``), then the study's own:
sizes (prompts, responses, validation samples), the off-policy regime (``updates`` optimizer steps per rollout
batch), the paper's learning rate times ``LR_SCALE`` (a 0.34M-parameter model does not move at 1e-6; the ratio
between methods is kept), no warm-up, and the seed (``data.seed`` and the rollout's); the rest is the variant's.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rpg.smol import overrides as smol
from rpg.smol.task import N_VAL
from rpg_lab.study.methods import label_of, method_run, setting

LR_SCALE = 500.0  # tiny lr = paper lr x 500 (1e-6 -> 5e-4, the tiny demo's learning rate)

# The methods of the study (docs/study.md): paper run names; the model part (7b) is replaced by the tiny model.
METHODS: tuple[str, ...] = (
    "run_grpo_7b",                                # GRPO: k3 KL 1e-3 vs the fixed initial model, clip (0.2, 0.2)
    "run_dapo_7b",                                # DAPO: no KL, clip (0.2, 0.28), dynamic sampling
    "run_rfpp_7b_1e-4",                           # REINFORCE++: k1 KL loss 1e-4 vs the sampler
    "run_rpg_7b_ufkl1e-4",                        # RPG-UFKL, fully differentiable
    "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28",   # RPG-REINFORCE-UFKL with RPG-Style Clip
    "run_rpg_7b_ufkl1e-4_rf",                     # RPG-REINFORCE-UFKL without clip
)
STRESS_METHODS: tuple[str, ...] = METHODS[4:]  # clipped vs unclipped RPG-REINFORCE-UFKL

# The behaviour-weight study (``--async-weights``, docs/study.md): one method in verl's colocate-async trainer
# (samples from a stale sampler mu), the loss's weights pi_old/mu exact, truncated at 1 per token, or dropped.
ASYNC = "trainer.v1.trainer_mode=colocate_async"
WEIGHT_ARMS: dict[str, tuple[str, ...]] = {
    "exact": (ASYNC,),                                                      # untruncated pi_old/mu: the default
    "truncated": (ASYNC, "rpg.loss.behavior_weight_cap=1.0"),               # min(pi_old/mu, 1) per token: biased
    "uncorrected": (ASYNC, "rpg.loss.behavior_weight_level=none"),          # no weight: biased
}
WEIGHTS_METHOD = METHODS[4]  # RPG-REINFORCE-UFKL with RPG-Style Clip

# The staleness study (``--staleness``, docs/study.md): the stress methods (RPG-Style Clip on / off) in verl's
# separate-async trainer (a standalone rollout pool synced once per step). Staleness s = one weight sync every s
# optimizer updates (``parameter_sync_step``; the rollout batch is s mini-batches), and the replay buffer keeps a
# trajectory for at most STALE_VERSIONS weight versions (its threshold counts versions, not updates): with the
# one-batch prefetch, the sampler mu is at most one version = s updates behind pi_old, and pi_theta up to s - 1
# more updates ahead of pi_old within the step.
SEPARATE = "trainer.v1.trainer_mode=separate_async"
STALE_VERSIONS = 2  # trained at the version it was dispatched at or the next (verl drops a trajectory when
#                     global_steps - dispatch step + 1 > threshold; 1 would drop the whole prefetched batch)
STALENESS = (1, 2, 4, 8)
STALENESS_ARMS: dict[str, tuple[str, ...]] = {
    "token": (),                                                    # exact pi_old/mu per token: the default
    "sequence": ("rpg.loss.behavior_weight_level=sequence",),       # exact per response (product over its tokens)
    "tis2": ("rpg.loss.behavior_weight_cap=2.0",),                  # min(pi_old/mu, 2) per token (verl's TIS default)
    "none": ("rpg.loss.behavior_weight_level=none",),               # no weight: biased
}
# The lag study's arms: the staleness arms and verl's bypass mode (old_log_probs := the sampler's log-probs, so
# pi_old = mu, the loss's weights are 1 and the clip is centred on mu: AReaL's "naive PPO")
LAG_ARMS: dict[str, tuple[str, ...]] = {**STALENESS_ARMS, "bypass": ("algorithm.rollout_correction.bypass_mode=true",)}


@dataclass(frozen=True)
class Sizes:
    """Tiny-task sizes and schedule shared by every run of a grid."""

    steps: int = 16
    test_freq: int = 4
    prompts: int = 16
    n: int = 4
    val_n: int = 4
    val_before = True  # a validation before training (a class constant, not a field: the run ids hash the fields)

    def check(self, updates: tuple[int, ...]) -> None:
        for name in ("steps", "test_freq", "prompts", "n", "val_n"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        bad = [k for k in updates if k < 1 or self.prompts % k]
        if bad:
            raise ValueError(f"optimizer steps per rollout batch {bad} must divide --prompts {self.prompts} "
                             "(the mini-batch is prompts / steps prompts)")

    def schedule(self) -> str:
        """When and how a run validates (``--dry-run``'s line)."""
        return f"validation every {self.test_freq} steps ({self.val_n} samples per problem)"

    @property
    def validations(self) -> int:
        """Validation passes: before training (``val_before``), every test_freq steps, and at the last step."""
        return int(self.val_before) + self.steps // self.test_freq + (1 if self.steps % self.test_freq else 0)


# The staleness study's sizes (fewer steps than the main grid: 96 runs must fit in 2 hours on 2 cores, docs/study.md)
STALENESS_SIZES = Sizes(steps=8, test_freq=4)


@dataclass(frozen=True)
class RunSpec:
    """One run of the grid: a method (paper run name) at ``updates`` optimizer steps per batch, one seed."""

    variant: str
    updates: int
    seed: int
    sizes: Sizes = field(default_factory=Sizes)
    arm: str = ""  # a key of WEIGHT_ARMS (colocate-async), of STALENESS_ARMS (separate-async), or "" (sync)
    staleness: int = 0  # separate-async: parameter_sync_step (= updates); 0: not the staleness study
    lag: int | None = None  # separate-async, the lag study: the sampler's lag in weight versions; None: the staleness
    #                         study's one-batch prefetch (warm-up 1, threshold 2)
    model: str = "tiny"  # what a run trains: the tiny model and task, or SmolLM2 (``rpg_lab.study.smol``)
    rollout_seed: int | None = None  # SmolLM2: the rollout's seed; None: ROLLOUT_SEED (the run id does not hold it:
    #                                  the overrides, the run's identity, do)

    @property
    def label(self) -> str:
        if self.lag is not None:
            stale = f", lag {self.lag} ({self.staleness} updates per version)"
        else:
            stale = f", staleness {self.staleness}" if self.staleness else ""
        arm = ", bypass mode (pi_old := mu)" if self.arm == "bypass" else f", {self.arm} weights" if self.arm else ""
        return label_of(self.variant) + stale + arm

    def mode_overrides(self) -> tuple[str, ...]:
        """The trainer mode's and the behaviour-weight arm's overrides (none for the sync trainer)."""
        if not self.staleness:
            return WEIGHT_ARMS[self.arm] if self.arm else ()
        # lag L: L batches prefetched, a trajectory trained at most L versions after its dispatch (threshold L + 1)
        warmup, threshold = (1, STALE_VERSIONS) if self.lag is None else (self.lag, self.lag + 1)
        # lag study: no DAPO filter (refills at the current version, endless on a collapse: DEVIATIONS.md)
        no_filter = () if self.lag is None else ("algorithm.filter_groups.enable=false",)
        return (SEPARATE, f"trainer.v1.separate_async.parameter_sync_step={self.staleness}",
                f"trainer.v1.separate_async.num_warmup_batches={warmup}",
                f"trainer.v1.sampler.max_off_policy_threshold={threshold}",
                "trainer.v1.sampler.max_off_policy_strategy=drop", *no_filter, *LAG_ARMS[self.arm])

    @property
    def run_id(self) -> str:
        """Directory name; the sizes enter through a short hash so that a changed grid never reuses a run."""
        digest = hashlib.sha1(json.dumps(asdict(self.sizes), sort_keys=True).encode()).hexdigest()[:6]
        arm = ((f"-sep{self.staleness}" if self.staleness else "") + (f"-lag{self.lag}" if self.lag is not None else "")
               + (f"-{self.arm}" if self.arm else ""))
        model = "" if self.model == "tiny" else f"-{self.model}"
        return f"{self.variant}{model}-k{self.updates}{arm}-seed{self.seed}-{digest}"

    def study_overrides(self, assets) -> list[str]:
        """The study's overrides (after the variant's and the CPU backend's; these win)."""
        if self.model == "smol":
            return smol_overrides(self, assets)
        from rpg.tiny.overrides import tiny_task_overrides

        lr, s = setting(self.variant, "actor_rollout_ref.actor.optim.lr"), self.sizes
        return [
            *tiny_task_overrides(assets, steps=s.steps, test_freq=s.test_freq, train_batch_size=s.prompts,
                                 n=s.n, val_n=s.val_n, mini_batch_size=s.prompts // self.updates,
                                 trainer_mode="separate_async" if self.staleness else None),
            f"actor_rollout_ref.actor.optim.lr={lr * LR_SCALE:g}",
            "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
            f"data.seed={self.seed}",
            f"actor_rollout_ref.rollout.seed={self.seed}",
            "trainer.project_name=rpg_study",
            f"trainer.experiment_name={self.run_id}",
            *self.mode_overrides(),
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
        method_run(name)  # a name without a run fails here, with the closest names
    sizes.check((updates, *stress))
    specs: dict[tuple[str, int, int], RunSpec] = {}
    for seed in range(1, seeds + 1):
        for m in methods:
            specs.setdefault((m, updates, seed), RunSpec(m, updates, seed, sizes))
        for k in stress:
            for m in stress_methods:
                specs.setdefault((m, k, seed), RunSpec(m, k, seed, sizes))
    return list(specs.values())


def weights_grid(seeds: int = 3, updates: int = 4, sizes: Sizes = Sizes(), method: str = WEIGHTS_METHOD,
                 arms: tuple[str, ...] = tuple(WEIGHT_ARMS)) -> list[RunSpec]:
    """``method`` in the colocate-async trainer with each behaviour-weight arm, seeds 1..seeds, seed-major
    (every arm of seed 1 before any of seed 2), all at ``updates`` optimizer steps per rollout batch."""
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    bad = [a for a in arms if a not in WEIGHT_ARMS]
    if bad or not arms:
        raise ValueError(f"behaviour-weight arms {bad or '(none)'} are unknown: expected some of {', '.join(WEIGHT_ARMS)}")
    method_run(method)
    sizes.check((updates,))
    return [RunSpec(method, updates, seed, sizes, arm) for seed in range(1, seeds + 1) for arm in arms]


def staleness_grid(seeds: int = 3, staleness: tuple[int, ...] = STALENESS, sizes: Sizes | None = None,
                   methods: tuple[str, ...] = STRESS_METHODS,
                   arms: tuple[str, ...] = tuple(STALENESS_ARMS)) -> list[RunSpec]:
    """Each method x staleness x behaviour-weight arm in the separate-async trainer, seeds 1..seeds, seed-major.

    Every run has the same rollout batch (``sizes.prompts`` prompts) and steps; staleness s splits the batch into s
    mini-batches (one optimizer update each) and syncs the sampler once per step, so s sets both the sampler's lag
    (s updates) and the updates per batch, as the stress axis does for the sync trainer.
    """
    sizes = STALENESS_SIZES if sizes is None else sizes
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    if not staleness or any(s < 1 for s in staleness) or len(set(staleness)) != len(staleness):
        raise ValueError(f"--staleness must be distinct integers >= 1, got {','.join(map(str, staleness)) or '(none)'}")
    bad = [a for a in arms if a not in STALENESS_ARMS]
    if bad or not arms:
        raise ValueError(f"staleness arms {bad or '(none)'} are unknown: expected some of {', '.join(STALENESS_ARMS)}")
    for name in methods:
        method_run(name)
    sizes.check(tuple(staleness))
    return [RunSpec(m, s, seed, sizes, arm, staleness=s) for seed in range(1, seeds + 1) for s in staleness
            for m in methods for arm in arms]


# The lag study (``--lag``, docs/study/lag/PLAN.md): one variable, the sampler's lag in weight versions, at the same
# LAG_UPDATES optimizer updates per version (parameter_sync_step), mini-batch (prompts / LAG_UPDATES) and total updates.
LAG_UPDATES = 8
LAG_SIZES = Sizes(steps=24, test_freq=4, prompts=16, n=4, val_n=8)
LAG_SEEDS = 12
ORDER_SEED = 53  # the declared seed of the run order within each seed (``lag_grid``)
LAG_BUDGET_S = 3 * 3600  # the design must fit in 3 hours on 2 cores at --jobs 2


@dataclass(frozen=True)
class LagCell:
    """One cell of the lag study: a method (RPG-Style Clip on or off) at a lag with a behaviour-weight arm."""

    name: str
    variant: str
    lag: int
    arm: str  # a key of LAG_ARMS


CLIPPED, UNCLIPPED = STRESS_METHODS
LAG_CELLS: tuple[LagCell, ...] = (
    LagCell("lag0-noclip-token", UNCLIPPED, 0, "token"),  # the control: mu = pi_old, weights 1 up to rounding
    LagCell("lag1-noclip-none", UNCLIPPED, 1, "none"),    # neither weights nor clip
    LagCell("lag1-noclip-token", UNCLIPPED, 1, "token"),  # exact per-token weights, no clip (= pi_theta/mu unclipped)
    LagCell("lag1-clip-none", CLIPPED, 1, "none"),
    LagCell("lag1-clip-token", CLIPPED, 1, "token"),      # AReaL's decoupled PPO with RPG-Style Clip
    LagCell("lag1-naive-ppo", CLIPPED, 1, "bypass"),      # the clip centred on the sampler mu, no weights
)
# The lag addendum (docs/study/lag-addendum/PLAN.md): the clip at lag 0, and the three cells it is compared with, rerun
ADDENDUM_CELLS: tuple[LagCell, ...] = (LAG_CELLS[0], LAG_CELLS[2], LagCell("lag0-clip-token", CLIPPED, 0, "token"),
                                       LAG_CELLS[4])
ADDENDUM_ORDER_SEED = 68  # the declared seed of the addendum's run order within each seed (``lag_grid``)


def lag_cell(spec: RunSpec, cells: tuple[LagCell, ...] = LAG_CELLS) -> LagCell:
    """The declared cell a run of the lag study belongs to (ValueError for a run of no declared cell)."""
    for c in cells:
        if (c.variant, c.lag, c.arm) == (spec.variant, spec.lag, spec.arm):
            return c
    raise ValueError(f"{spec.run_id} is no cell of the lag study")


def run_order_key(order_seed: int, seed: int, cell: str) -> str:
    """Sort key of a cell within a seed's block: SHA-256 of (order seed, seed, cell name), a random permutation
    that is a pure function of the declared seed (the same on every Python and machine)."""
    return hashlib.sha256(f"{order_seed}:{seed}:{cell}".encode()).hexdigest()


def lag_grid(seeds: int = LAG_SEEDS, sizes: Sizes | None = None, cells: tuple[LagCell, ...] = LAG_CELLS,
             updates: int = LAG_UPDATES, order_seed: int = ORDER_SEED) -> list[RunSpec]:
    """Each cell x seeds 1..seeds in the separate-async trainer, seed-major (seeds are blocks: every arm of a seed
    shares its prompts, ``data.seed``, and the sampler's seed), the cells of each seed in the order
    ``run_order_key`` draws from ``order_seed``. Every run has ``updates`` optimizer updates per weight version,
    the mini-batch ``sizes.prompts / updates`` prompts and ``sizes.steps x updates`` updates in all; the cells
    differ only in the lag and the arm."""
    sizes = LAG_SIZES if sizes is None else sizes
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    if not cells or len({c.name for c in cells}) != len(cells):
        raise ValueError(f"the lag study's cells must be distinct and at least one, got {[c.name for c in cells]}")
    for c in cells:
        if c.lag < 0 or c.arm not in LAG_ARMS:
            raise ValueError(f"cell {c.name}: lag must be >= 0 and the arm one of {', '.join(LAG_ARMS)}, got lag "
                             f"{c.lag}, arm {c.arm!r}")
        method_run(c.variant)
    sizes.check((updates,))
    return [RunSpec(c.variant, updates, seed, sizes, c.arm, staleness=updates, lag=c.lag)
            for seed in range(1, seeds + 1)
            for c in sorted(cells, key=lambda c: run_order_key(order_seed, seed, c.name))]


def collapsed(val: dict[int, float], grad_norm: dict[int, float]) -> str:
    """Why a finished run collapsed under the criterion declared before the staleness study ran ("" if it did not).

    A run collapses when (1) a logged gradient norm is not finite, or (2) a validation after step 0 falls below
    COLLAPSE_FRACTION x the untrained model's (step 0) accuracy, or (3) it ends below that step-0 accuracy. Every
    healthy run of the tiny task climbs from ~0.35 to 0.6-0.8, so (2) and (3) are failures of training, not noise
    (one evaluation moves by ~0.04, docs/study.md).
    """
    import math as _m

    bad = sorted(step for step, g in grad_norm.items() if not _m.isfinite(float(g)))
    if bad:
        return f"gradient norm not finite at step {bad[0]}"
    if 0 not in val or len(val) < 2:
        return ""
    v0, steps = float(val[0]), sorted(val)
    low = [t for t in steps[1:] if float(val[t]) < COLLAPSE_FRACTION * v0]
    if low:
        return f"accuracy {float(val[low[0]]):.3f} at step {low[0]} < {COLLAPSE_FRACTION:g} x step 0's {v0:.3f}"
    if float(val[steps[-1]]) < v0:
        return f"final accuracy {float(val[steps[-1]]):.3f} < step 0's {v0:.3f}"
    return ""


COLLAPSE_FRACTION = 0.5


def save_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    tmp.replace(path)


# ----------------------------------------------------------------------------- SmolLM2 (``--model smol``)

# The SmolLM2 comparison's schedule and learning-rate rule (its design, costs and report: ``rpg_lab.study.smol``)
LR_KEY = "actor_rollout_ref.actor.optim.lr"
LR_ANCHOR = "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28"  # the SmolLM2 run's method, at its learning rate smol.LR
ROLLOUT_SEED = 1  # every run's rollout seed: the validation's sampling random numbers the same in every run


def lr_scale() -> float:
    """The learning-rate rule: every method at its paper learning rate x (smol.LR / the anchor's paper learning
    rate), so the SmolLM2 run's method keeps the run's 1e-5 and the methods' ratios are the paper's (as LR_SCALE for
    the tiny model)."""
    return smol.LR / setting(LR_ANCHOR, LR_KEY)


@dataclass(frozen=True)
class SmolSizes(Sizes):
    """The SmolLM2 run's sizes (``rpg.smol.overrides``: 8 prompts x 4 responses, mini-batches of 2 prompts, one response
    per validation problem) and this design's schedule: ``steps``, validation every ``test_freq`` steps and at the
    last on ``val_problems`` held-out problems, none before training."""

    steps: int = 3
    test_freq: int = 3
    prompts: int = smol.TRAIN_BATCH_SIZE
    n: int = smol.ROLLOUT_N
    val_n: int = smol.VAL_N
    val_problems: int = N_VAL
    val_before: bool = False

    def check(self, updates: tuple[int, ...]) -> None:
        super().check(updates)
        if not 1 <= self.val_problems <= N_VAL:
            raise ValueError(f"--val-problems must be 1..{N_VAL} (the task's held-out problems), got {self.val_problems}")

    def schedule(self) -> str:
        when = f"every {self.test_freq} steps and at the last" if self.test_freq < self.steps else "at the last step"
        return (f"validation {when} ({'also' if self.val_before else 'none'} before training) on {self.val_problems} "
                f"of the {N_VAL} held-out problems, {self.val_n} response each")


def smol_overrides(spec: RunSpec, assets) -> list[str]:
    """The study's overrides of a SmolLM2 run (after the method's and the rehearsal's; these win): the task at the
    design's schedule (responses per validation problem only where not the run's ``smol.VAL_N``), the learning rate
    by ``lr_scale``, no warm-up, the seeds, the names."""
    s = spec.sizes
    from rpg.override_lists import merge_overrides

    task = smol.smol_task_overrides(assets, steps=s.steps, test_freq=s.test_freq)
    if s.val_n != smol.VAL_N:  # in the task's place (the earlier designs' overrides, their identities, unchanged)
        task = merge_overrides(task, [f"actor_rollout_ref.rollout.val_kwargs.n={s.val_n}"])
    rollout_seed = ROLLOUT_SEED if spec.rollout_seed is None else spec.rollout_seed
    return [
        *task,
        f"trainer.val_before_train={s.val_before}",
        f"data.val_max_samples={s.val_problems}",
        f"{LR_KEY}={setting(spec.variant, LR_KEY) * lr_scale():g}",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        f"data.seed={spec.seed}",
        f"actor_rollout_ref.rollout.seed={rollout_seed}",
        "trainer.project_name=rpg_study",
        f"trainer.experiment_name={spec.run_id}",
    ]


# the cost model lives in rpg_lab.study.costs; its names stay importable from here (the grids', the docs' and the
# tests' ``rpg_lab.study.grid.LAG_COSTS`` ...)
from rpg_lab.study.costs import (BUILTIN_COSTS, LAG_COSTS, PARALLEL_SPEEDUP, STALENESS_COSTS, Costs,  # noqa: E402,F401
                             calibrate, describe, fmt_duration, speedup)
