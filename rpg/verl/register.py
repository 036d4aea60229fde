"""Register RPG with verl's registries: idempotent and import-light (torch, verl's ``core_algos`` and the loss library).

Imported through the ``verl.plugins`` entry point (pyproject.toml) in every process that imports verl: the driver,
the TaskRunner (advantage estimators run there) and every Ray worker (policy losses run there).

* policy losses (``actor_rollout_ref.actor.policy_loss.loss_mode``): ``rpg``, ``grpo_corrected`` ->
  ``rpg.verl.policy_loss.rpg_policy_loss``;
* advantage estimators (``algorithm.adv_estimator``): ``rpg`` (R − group mean, no std; a singleton group keeps R)
  and ``rpg_batchmean`` (R − batch mean), by ``rpg.math.advantage.outcome_advantage``.
"""

from __future__ import annotations

import torch

from verl.trainer.ppo import core_algos

from rpg.verl.policy_loss import rpg_policy_loss
from rpg.config import RPG_LOSSES


def _outcome(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, mode: str):
    from rpg.math.advantage import outcome_advantage

    if mode == "group" and index is None:
        raise ValueError("algorithm.adv_estimator=rpg needs the prompt uid index (group baseline)")
    return outcome_advantage(token_level_rewards, response_mask, index, mode=mode)


def rpg_group_mean_advantage(token_level_rewards, response_mask, config=None, index=None, **kwargs):
    """``algorithm.adv_estimator=rpg``: A_i = R_i - mean of R over the prompt's group (no std)."""
    return _outcome(token_level_rewards, response_mask, index, "group")


def rpg_batch_mean_advantage(token_level_rewards, response_mask, config=None, index=None, **kwargs):
    """``algorithm.adv_estimator=rpg_batchmean``: A_i = R_i - mean of R over the batch."""
    return _outcome(token_level_rewards, response_mask, index, "batch")


_ADV_FNS = {"rpg": rpg_group_mean_advantage, "rpg_batchmean": rpg_batch_mean_advantage}


def register() -> None:
    """(Re-)register everything. Safe to call any number of times."""
    for name in RPG_LOSSES:
        core_algos.POLICY_LOSS_REGISTRY[name] = rpg_policy_loss
    for name, fn in _ADV_FNS.items():
        current = core_algos.ADV_ESTIMATOR_REGISTRY.get(name)
        if current is fn:
            continue
        if current is not None and getattr(current, "__module__", None) != __name__:
            raise ValueError(f"advantage estimator {name!r} is already registered by {current.__module__}")
        # same function from a re-imported copy of this module, or not registered yet
        core_algos.ADV_ESTIMATOR_REGISTRY[name] = fn


register()
