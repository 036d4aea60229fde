"""``RPGPolicyLossConfig``: verl's ``PolicyLossConfig`` plus what the RPG losses read on the workers.

Selected with ``actor_rollout_ref.actor.policy_loss._target_=rpg.verl.policy_config.RPGPolicyLossConfig`` by
the driver (``rpg.verl.translate``, where the path from ``rpg.loss`` to the loss is told). verl instantiates it
in the driver and in every actor worker; no loss setting is declared here (``rpg_loss`` carries them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.workers.config.actor import PolicyLossConfig

ANCHORS = ("sampler", "reference")


@dataclass
class RPGPolicyLossConfig(PolicyLossConfig):
    """Fields:

    rpg_loss:       {RPGLossConfig field: value} for the fields set under rpg.loss (validated by the
                    library when the loss builds its config)
    rpg_anchor:     sampler (anchor = pi_old, no reference model) | reference (ref_log_prob)
    rpg_sampler_kl: rpg.loss.name=verl only: verl's KL loss against pi_old (ref_log_prob := old_log_probs)
    rpg_stale_sampler: the samples come from a stale policy mu (trainer.v1.trainer_mode=colocate_async or separate_async): the
                    RPG actor loss weights every token by pi_old/mu from the micro-batch's rollout_log_probs
                    (rpg.math.behavior; set by the driver, never by hand)
    """

    rpg_loss: dict[str, Any] = field(default_factory=dict)
    rpg_anchor: str = "sampler"
    rpg_sampler_kl: bool = False
    rpg_stale_sampler: bool = False

    def __post_init__(self):
        if self.rpg_anchor not in ANCHORS:
            raise ValueError(f"policy_loss.rpg_anchor={self.rpg_anchor!r} is invalid; allowed values: {', '.join(ANCHORS)}")
