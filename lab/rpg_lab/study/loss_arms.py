"""The arms of the loss comparison on SmolLM2 (docs/study/smol-loss/PLAN.md, ``rpg_lab.study.smol_loss``): one script for
every arm, the arms differing only in the policy loss and its KL term (``LOSSES``) and, for the second factor, in
DAPO's filter and overlong penalty (``FILTER``).

An arm is a run the study declares itself (as ``rpg_lab.study.methods.UNSHIPPED``): the paper setup (``+paper=default``)
with ``SCRIPT``, then its filter setting, then its loss; ``RPG_CPU_MODEL=smol`` replaces the model, data and sizes
(``rpg.launch.rehearsal``) and the study's overrides set the seeds, schedule and learning-rate rule
(``rpg_lab.study.grid.smol_overrides``). The overrides are the runs' identity (``rpg_lab.study.identity``): they stay as the
study first runs them.
"""

from __future__ import annotations

A, REF = "actor_rollout_ref.actor", "rpg.reference.mode"

# What every arm shares besides the rehearsal's model, data and sizes: Table 3's one learning rate (1e-6 for every
# Qwen3-4B method, x 20 on SmolLM2: 2e-5), the group-mean advantage without division by the group's SD (the recipe's
# ``rpg`` estimator), the token-mean aggregation (every paper script's), the dual clip's c.
SCRIPT: tuple[str, ...] = (
    "+paper=default", "data.max_prompt_length=2048", "data.max_response_length=2048",
    f"{A}.optim.lr=1e-06", "algorithm.adv_estimator=rpg", "algorithm.norm_adv_by_std_in_grpo=False",
    f"{A}.loss_agg_mode=token-mean", f"{A}.clip_ratio_c=10.0",
)
# The second factor: DAPO's dynamic-sampling filter (groups with a right and a wrong answer only, refilled) and its
# overlong penalty (the reward's soft penalty over the last quarter of the response budget), both on or both off
FILTER_KEYS = ("algorithm.filter_groups.enable", "reward.reward_kwargs.overlong_buffer_cfg.enable")
FILTER: dict[bool, tuple[str, ...]] = {on: tuple(f"{k}={on}" for k in FILTER_KEYS) for on in (True, False)}

# The policy losses and their KL terms, each as its Table 3 script sets it; every arm sets every one of these keys
LOSS_KEYS = ("rpg.loss.name", "rpg.loss.form", "rpg.loss.divergence", "rpg.loss.beta", "rpg.loss.clip",
             f"{A}.clip_ratio_low", f"{A}.clip_ratio_high", f"{A}.use_kl_loss", f"{A}.kl_loss_coef",
             f"{A}.kl_loss_type", REF)


def _loss(name: str, form: str, divergence: str, clip_high: float, kl_loss: bool, ref: str) -> tuple[str, ...]:
    values = (name, form, divergence, 1e-4, True, 0.2, clip_high, kl_loss, 0.001, "low_var_kl", ref)
    return tuple(f"{k}={v}" for k, v in zip(LOSS_KEYS, values))


LOSSES: dict[str, tuple[str, tuple[str, ...]]] = {
    # verl's PPO-clip loss (0.2, 0.2) with the k3 KL loss (low_var_kl, 1e-3) against the initial model
    "grpo": ("GRPO's loss", _loss("verl", "reinforce", "ufkl", 0.2, True, "fixed")),
    # verl's PPO-clip loss with clip-higher (0.2, 0.28), no KL term
    "dapo": ("DAPO's loss", _loss("verl", "reinforce", "ufkl", 0.28, False, "sampler")),
    # RPG-REINFORCE-URKL, beta 1e-4 against pi_old, RPG-Style Clip (0.2, 0.28)
    "rpg-rf-urkl": ("RPG-REINFORCE-URKL's loss", _loss("rpg", "reinforce", "urkl", 0.28, False, "sampler")),
    # fully differentiable RPG-UFKL, beta 1e-4 against pi_old, the dual clip (0.2, 0.28)
    "rpg-ufkl": ("RPG-UFKL's loss", _loss("rpg", "differentiable", "ufkl", 0.28, False, "sampler")),
}
# (cell, loss, filter and penalty on): the four losses with DAPO's filter and penalty, two of them without
ARMS: tuple[tuple[str, str, bool], ...] = (
    ("grpo", "grpo", True), ("dapo", "dapo", True), ("rpg-rf-urkl", "rpg-rf-urkl", True),
    ("rpg-ufkl", "rpg-ufkl", True), ("grpo-nofilter", "grpo", False), ("rpg-rf-urkl-nofilter", "rpg-rf-urkl", False),
)
PREFIX = "smol_loss_"  # an arm's method name: the prefix and its cell, "-" as "_"


def method_name(cell: str) -> str:
    return PREFIX + cell.replace("-", "_")


def arm_overrides() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each arm's method name -> (its label, its overrides: the script, the filter setting, the loss)."""
    out = {}
    for cell, loss, on in ARMS:
        label, keys = LOSSES[loss]
        out[method_name(cell)] = (label + ("" if on else ", no filter or penalty"), (*SCRIPT, *FILTER[on], *keys))
    return out
