"""Pass/fail rules and the phase summary of a smoke run, as pure functions of verl's metrics.

``metrics`` is ``{step: merged data}`` as ``rpg.trainer_process.read_metrics`` returns it
(verl's FileLogger records; the validation before training is logged at step 0). Every rule
returns failure lines (empty = pass), each one line naming the step, the metric and the value.

What a rule can and cannot show, stated with it (docs/gpu-smoke.md):

* non-finite: any NaN/inf metric at any step is a failure.
* ratio stays 1: several mini-batches per rollout batch make every update after the first
  off-policy, so pi_theta / pi_old leaves 1 unless the updates did not change the policy. In bf16
  the ratio also moves by rounding noise (the old log-probs and the update's forward batch the
  sequences differently), so leaving 1 is necessary, not sufficient: ``actor_did_not_move``
  (the reference-copy diagnostics) is the direct check that the weights changed.
* KL stays 0: the loss's UFKL estimate is a mean of terms >= 0 (r_ref * (rho - 1 - log rho), rho the
  ratio of pi_theta to the reference; the smoke run's periodic reference is pi_old right after a
  reset), 0 only when every token's rho is exactly 1.
* the rollout agrees with the actor (``rollout_agrees_with_actor``): vLLM samples in bf16 with its own kernels and
  the actor recomputes in bf16 with others, so a token's two probabilities differ by rounding: bf16 keeps 8
  significant bits (a unit of 2^-8 at 0.5-1), and two kernel sets through the same layers differ by a few units for
  most tokens. The bound: at each step the mean |p_rollout - p_actor| over the response tokens (verl's
  ``training/rollout_probs_diff_mean``) at most 4 units, 2^-6, and their Pearson correlation at least 0.99. It fails
  a rollout sampling from other weights than the actor's (the weights never synced into vLLM, whose engine starts
  from dummy weights; another model or tokenizer), where they differ by O(0.1). It cannot see a sync that missed
  one step (the weights of one step before are as close); ``weight_sync_every_step`` checks that each step synced.
  The largest difference is reported, not bounded (one token in thousands; 0.011-0.056 on the H200).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

# (label, verl metric): verl 0.9.1's marked_timer names (trainer/ppo/v1/trainer_base.py, trainer_sync.py)
PHASES = (
    ("generation", "timing_s/gen"),
    ("old log-prob", "timing_s/old_log_prob"),
    ("reference log-prob", "timing_s/ref"),
    ("update", "timing_s/update_actor"),
    ("weight sync", "timing_s/update_weights"),
    ("reference reset", "timing_s/rpg_reference"),  # rpg.verl.trainer: diagnostics + copy
    ("checkpoint", "timing_s/save_checkpoint"),
    ("step", "timing_s/step"),
)
# the actor worker's torch peaks, measured after each update (verl's engine_workers, prefixed "actor/")
MEMORY = (
    ("max allocated", "actor/perf/max_memory_allocated_gb"),
    ("max reserved", "actor/perf/max_memory_reserved_gb"),
)
ROLLOUT_MISMATCH = ("training/rollout_probs_diff_max", "training/rollout_probs_diff_mean",
                    "training/rollout_actor_probs_pearson_corr")
STEP_KEY = "training/global_step"
RATIO_KEYS = ("actor/rpg/ratio_min", "actor/rpg/ratio_max")
KL_KEY = "actor/rpg/kl_estimate"
RATIO_TOL = 1e-3  # "leaves 1": |ratio - 1| > RATIO_TOL at some step (the CPU tests' threshold)
ROLLOUT_MEAN_TOL = 2.0**-6  # 4 units of bf16's 2^-8: the mean |p_rollout - p_actor| at a step (H200: 0.0002-0.0014)
ROLLOUT_CORR_MIN = 0.99  # the Pearson correlation of the two probabilities at a step


def training_steps(metrics: Mapping[int, Mapping]) -> list[int]:
    """The steps that trained (logged ``training/global_step``), in order."""
    return sorted(s for s, d in metrics.items() if STEP_KEY in d)


def non_finite(metrics: Mapping[int, Mapping]) -> list[str]:
    """One line per NaN/inf numeric metric."""
    return [
        f"step {s}: {k} = {v} is not finite"
        for s, d in sorted(metrics.items())
        for k, v in sorted(d.items())
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v)
    ]


def _missing(metrics: Mapping[int, Mapping], steps: Iterable[int], keys: Iterable[str]) -> list[str]:
    return [f"step {s}: metric {k} is missing (did the RPG loss run?)" for s in steps for k in keys
            if k not in metrics.get(s, {})]


def ratio_stays_one(metrics: Mapping[int, Mapping], steps: Iterable[int], tol: float = RATIO_TOL) -> list[str]:
    """Failure if at none of ``steps`` the importance ratio's range leaves [1 - tol, 1 + tol]."""
    steps = list(steps)
    missing = _missing(metrics, steps, RATIO_KEYS)
    if missing or not steps:
        return missing or ["no training step to check the importance ratio on"]
    lo = min(float(metrics[s][RATIO_KEYS[0]]) for s in steps)
    hi = max(float(metrics[s][RATIO_KEYS[1]]) for s in steps)
    if lo >= 1 - tol and hi <= 1 + tol:
        return [f"steps {steps[0]}-{steps[-1]}: the importance ratio stayed 1 (range [{lo:.6f}, {hi:.6f}], "
                f"tolerance {tol:g}): the updates did not move the policy between mini-batches"]
    return []


def kl_stays_zero(metrics: Mapping[int, Mapping], steps: Iterable[int]) -> list[str]:
    """Failure if the loss's KL estimate is 0 at every one of ``steps``."""
    steps = list(steps)
    missing = _missing(metrics, steps, (KL_KEY,))
    if missing or not steps:
        return missing or ["no training step to check the KL estimate on"]
    if all(float(metrics[s][KL_KEY]) == 0.0 for s in steps):
        return [f"steps {steps[0]}-{steps[-1]}: {KL_KEY} stayed 0: the policy never left pi_old"]
    return []


def reference_resets(metrics: Mapping[int, Mapping], steps: Iterable[int]) -> list[str]:
    """With ``rpg.reference.log_weight_diff``: the actor moved away from the reference during each
    step (``rpg/ref_actor_weight_diff_pre`` > 0), and at a reset step the copy made the reference's
    shards equal to the actor's (``_post`` == 0, compared in the reference's dtype) and brought
    what it computes closer (probe logit difference after < before; exact equality is not required
    of bf16 forwards)."""
    out = []
    for s in steps:
        d = metrics.get(s, {})
        if "rpg/ref_actor_weight_diff_pre" not in d:
            out.append(f"step {s}: rpg/ref_actor_weight_diff_pre is missing (rpg.reference.log_weight_diff off?)")
            continue
        if float(d["rpg/ref_actor_weight_diff_pre"]) <= 0:
            out.append(f"step {s}: rpg/ref_actor_weight_diff_pre = 0: the update did not change the actor's weights")
        if float(d.get("rpg/ref_reset", 0)) != 1:
            continue
        post = d.get("rpg/ref_actor_weight_diff_post")
        if post is None or float(post) != 0.0:
            out.append(f"step {s}: rpg/ref_actor_weight_diff_post = {post}: the reset did not copy the actor's weights")
        pre_l, post_l = d.get("rpg/ref_actor_logit_diff_pre"), d.get("rpg/ref_actor_logit_diff_post")
        if pre_l is None or post_l is None or not float(post_l) < float(pre_l):
            out.append(f"step {s}: probe logit difference actor - reference {pre_l} before the reset, {post_l} after: "
                       f"the reference does not compute what the actor computes")
    return out


def resumed_from(metrics: Mapping[int, Mapping], checkpoint_step: int) -> list[str]:
    """A run resumed from the checkpoint of ``checkpoint_step`` trains from step checkpoint_step + 1 on."""
    steps = training_steps(metrics)
    if not steps:
        return ["the resumed run trained no step"]
    if steps[0] != checkpoint_step + 1:
        return [f"the resumed run's first step is {steps[0]}, expected {checkpoint_step + 1} "
                f"(it did not continue from the checkpoint of step {checkpoint_step})"]
    return []


def hf_rollout_on_gpu(log: str) -> list[str]:
    """``rollout.name=hf``: every weight load of the HF server (its log line names the device) was
    onto a GPU; a CPU one means the server fell back to the CPU."""
    devices = re.findall(r"\[hf-rollout\] weights v\d+ loaded \(.*device=([a-z]+)", log)
    if not devices:
        return ["no HF rollout weight load found in the log (was rollout.name=hf used?)"]
    if any(d != "cuda" for d in devices):
        return [f"the HF rollout server ran on {sorted(set(devices))}, not on the GPU"]
    return []


def weight_sync_every_step(metrics: Mapping[int, Mapping], steps: Iterable[int]) -> list[str]:
    """verl's synchronous trainer syncs the actor's weights into the rollout after every step
    (``timing_s/update_weights``); a step without it sampled the next batch from stale weights."""
    missing = [s for s in steps if "timing_s/update_weights" not in metrics.get(s, {})]
    return [f"steps {missing}: no weight sync (timing_s/update_weights missing)"] if missing else []


def rollout_agrees_with_actor(metrics: Mapping[int, Mapping], steps: Iterable[int]) -> list[str]:
    """At each step the rollout's token probabilities agree with the actor's recomputation within bf16's rounding
    (the module's docstring: ``ROLLOUT_MEAN_TOL``, ``ROLLOUT_CORR_MIN``); a step without verl's metrics fails."""
    mean_key, corr_key, steps = ROLLOUT_MISMATCH[1], ROLLOUT_MISMATCH[2], list(steps)
    out = _missing(metrics, steps, (mean_key, corr_key))
    for s in steps:
        d = metrics.get(s, {})
        if mean_key in d and not float(d[mean_key]) <= ROLLOUT_MEAN_TOL:
            out.append(f"step {s}: {mean_key}={float(d[mean_key]):.3g} > {ROLLOUT_MEAN_TOL:g} (bf16's rounding): "
                       f"the rollout samples from other weights than the actor's")
        if corr_key in d and not float(d[corr_key]) >= ROLLOUT_CORR_MIN:
            out.append(f"step {s}: {corr_key}={float(d[corr_key]):.4g} < {ROLLOUT_CORR_MIN:g}: the rollout's "
                       f"probabilities do not follow the actor's")
    return out


def check_training(metrics: Mapping[int, Mapping], steps: Iterable[int], reference: bool = True) -> list[str]:
    """Every rule above for one run's ``steps`` (``reference``: the run logs the reset diagnostics)."""
    steps = list(steps)
    out = non_finite(metrics) + ratio_stays_one(metrics, steps) + kl_stays_zero(metrics, steps)
    out += weight_sync_every_step(metrics, steps) + rollout_agrees_with_actor(metrics, steps)
    return out + (reference_resets(metrics, steps) if reference else [])


def phase_times(metrics: Mapping[int, Mapping], steps: Iterable[int]) -> dict[str, tuple[float, float, int]]:
    """label -> (mean seconds per step where timed, total seconds, steps timed) for each phase timed."""
    out = {}
    for label, key in PHASES:
        values = [float(metrics[s][key]) for s in steps if key in metrics.get(s, {})]
        if values:
            out[label] = (sum(values) / len(values), sum(values), len(values))
    return out


def peak(metrics: Mapping[int, Mapping], key: str) -> float | None:
    """Largest value of ``key`` over all steps (None if never logged)."""
    values = [float(d[key]) for d in metrics.values() if key in d]
    return max(values) if values else None


def summary_lines(metrics: Mapping[int, Mapping], steps: Iterable[int]) -> list[str]:
    """Time per phase, the actor's peak GPU memory and the rollout/actor mismatch, for printing."""
    steps = list(steps)
    lines = [f"{label:>18}: {mean:7.2f} s/step  ({total:.1f} s over {n} steps)"
             for label, (mean, total, n) in phase_times(metrics, steps).items()]
    for label, key in MEMORY:
        v = peak(metrics, key)
        lines.append(f"{'actor GPU ' + label:>18}: " + ("not logged" if v is None else f"{v:.2f} GiB ({key})"))
    bounds = {ROLLOUT_MISMATCH[0]: "reported, not bounded", ROLLOUT_MISMATCH[1]: f"checked: <= {ROLLOUT_MEAN_TOL:g}",
              ROLLOUT_MISMATCH[2]: f"checked: >= {ROLLOUT_CORR_MIN:g}"}
    for key in ROLLOUT_MISMATCH:
        v = [float(metrics[s][key]) for s in steps if key in metrics.get(s, {})]
        if v:
            lines.append(f"{key}: {min(v):.3g} .. {max(v):.4g} ({bounds[key]}: the rollout vs the actor's bf16)")
    return lines
