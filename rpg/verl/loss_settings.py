"""The loss settings in the driver and the workers: ``loss_config``, ``POLICY_LOSS_TARGET``.

``loss_config(actor_config)`` builds the exact ``RPGLossConfig`` from verl's actor config (the ``rpg_loss``
mapping of ``RPGPolicyLossConfig``, ``POLICY_LOSS_TARGET``, plus verl's clip ratios and aggregation,
``ACTOR_FIELDS``), in the driver before Ray and in each worker's loss, so both refuse the same inputs. How the
``rpg:`` values get there: ``rpg.verl.translate``.
"""

from __future__ import annotations

from rpg.config import ACTOR_FIELDS, RPGLossConfig, build_loss_config

POLICY_LOSS_TARGET = "rpg.verl.policy_config.RPGPolicyLossConfig"


def _actor_value(actor, field: str):
    """verl's actor value of an ``ACTOR_FIELDS`` entry (None: unset, the library default applies).
    verl's rule: clip_ratio_low / clip_ratio_high fall back to clip_ratio."""
    value = actor.get(field, None)
    if value is None and field in ("clip_ratio_low", "clip_ratio_high"):
        value = actor.get("clip_ratio", None)
    return value


def loss_config(actor, loss_agg_mode: str | None = None) -> RPGLossConfig:
    """The exact ``RPGLossConfig`` the loss runs with, from a verl actor config: the composed
    DictConfig in the driver (``apply_to_verl_config``), verl's ``ActorConfig`` on a worker
    (``rpg.verl.policy_loss``). One construction in both places (``rpg.config.build_loss_config``),
    so the driver rejects before Ray exactly what a worker would; a broken rule raises
    ``RPGLossConfigError`` (its field, value and what is allowed). ``loss_agg_mode``: the value verl
    hands the policy loss (default: the actor's).

    ``grpo_corrected`` reads beta, kl_clamp and log_ratio_guard (validated as the differentiable form,
    so a value-only ``kl_clamp`` is allowed there, as for RPG-X).
    """
    pl = actor.get("policy_loss", None)
    values = None if pl is None else pl.get("rpg_loss", None)
    if values is None:
        mode = None if pl is None else pl.get("loss_mode", None)
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.rpg_loss is missing: loss_mode {mode!r} needs "
                         f"policy_loss._target_={POLICY_LOSS_TARGET} (use recipe/rpg/main_rpg.py, which sets it "
                         "from the rpg: block)")
    values = {k: values[k] for k in values}
    for field in ACTOR_FIELDS:
        value = loss_agg_mode if field == "loss_agg_mode" and loss_agg_mode is not None else _actor_value(actor, field)
        if value is not None:
            values[field] = value
    return build_loss_config(pl.get("loss_mode", None), values)
