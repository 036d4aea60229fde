"""``RPGPolicyLossConfig``: verl's ``PolicyLossConfig`` plus the RPG loss settings.

Selected with ``actor_rollout_ref.actor.policy_loss._target_=rpg.verl.policy_config.RPGPolicyLossConfig``
(the driver sets it from the ``rpg:`` block, ``rpg.verl.settings``). verl instantiates it in the
driver (``validate_config``) and in every actor worker, so the settings reach the loss as
``config.policy_loss.rpg_*`` without any other channel. Values are validated in the driver; the
dataclass re-checks the enumerations so a hand-written config cannot smuggle in a typo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from verl.workers.config.actor import PolicyLossConfig

from rpg.losses import loss_defaults
from rpg.verl.settings import BRANCH_ON, DIVERGENCES, FD_CLIP, FORMS

_LOSS_DEFAULTS = loss_defaults()  # the library's RPGLossConfig is the one source of these defaults


@dataclass
class RPGPolicyLossConfig(PolicyLossConfig):
    """Fields (all read by ``rpg.verl.policy_loss`` / ``rpg.verl.actor_loss``):

    rpg_divergence: fkl | rkl | ufkl | urkl          (rpg.loss.divergence)
    rpg_form:       reinforce | differentiable      (rpg.loss.form)
    rpg_beta:       KL coefficient beta >= 0         (rpg.loss.beta; also grpo_corrected)
    rpg_clip:       RPG-Style Clip / dual-clip on the reward part (rpg.loss.clip)
    rpg_branch_on:  regularized | raw               (rpg.loss.branch_on)
    rpg_fd_clip:    reward | algorithm1             (rpg.loss.fd_clip)
    rpg_kl_clamp:   None or > 0, value-only guard    (rpg.loss.kl_clamp)
    rpg_compile:    torch.compile the loss and its metrics (rpg.loss.compile)
    rpg_anchor:     sampler (anchor = pi_old, no reference model) | reference (ref_log_prob)
    rpg_sampler_kl: rpg.loss.name=verl only: verl's KL loss against pi_old (ref_log_prob := old_log_probs)
    """

    rpg_divergence: str = _LOSS_DEFAULTS["divergence"]
    rpg_form: str = _LOSS_DEFAULTS["form"]
    rpg_beta: float = _LOSS_DEFAULTS["beta"]
    rpg_clip: bool = _LOSS_DEFAULTS["clip"]
    rpg_branch_on: str = _LOSS_DEFAULTS["branch_on"]
    rpg_fd_clip: str = _LOSS_DEFAULTS["fd_clip"]
    rpg_kl_clamp: Optional[float] = _LOSS_DEFAULTS["kl_clamp"]
    rpg_compile: bool = _LOSS_DEFAULTS["compile"]
    rpg_anchor: str = "sampler"
    rpg_sampler_kl: bool = False

    def __post_init__(self):
        checks = (
            ("rpg_divergence", DIVERGENCES),
            ("rpg_form", FORMS),
            ("rpg_branch_on", BRANCH_ON),
            ("rpg_fd_clip", FD_CLIP),
            ("rpg_anchor", ("sampler", "reference")),
        )
        for name, allowed in checks:
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"policy_loss.{name}={value!r} is invalid; allowed values: {', '.join(allowed)}")
        if self.rpg_beta < 0:
            raise ValueError(f"policy_loss.rpg_beta={self.rpg_beta} is invalid; expected a value >= 0")
        if not isinstance(self.rpg_compile, bool):
            raise ValueError(f"policy_loss.rpg_compile={self.rpg_compile!r} is invalid; allowed values: True, False")
