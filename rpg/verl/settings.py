"""The loss settings in the driver and the workers: ``loss_config``, ``POLICY_LOSS_TARGET``.

The block is declared once, torch-free, in ``rpg.config`` (``RPGSettings``: every key with its default,
what it allows and its doc; the ``rpg.loss`` keys derive from ``RPGLossConfig``). The driver
(``rpg.verl.main``) calls ``rpg.verl.translate.validate_and_apply`` before Ray starts, so a bad value fails fast with ONE
line naming the key and the allowed values; unknown keys anywhere under ``rpg.`` are rejected. It then
writes the verl keys the settings imply (``rpg.verl.translate.apply_to_verl_config``, after the checks
against verl's own keys, ``rpg.verl.checks``).

The loss settings reach the actor workers through verl's own config: ``actor_rollout_ref.actor.policy_loss``
becomes an ``RPGPolicyLossConfig`` (``POLICY_LOSS_TARGET``) whose ``rpg_loss`` mapping carries the ``rpg.loss``
values; the clip ratios and the aggregation stay verl's actor keys (``ACTOR_FIELDS``). ``loss_config`` builds
the exact ``RPGLossConfig`` from that actor config, in the driver before Ray and in each worker's loss, so
both reject the same inputs (one validator: the library's ``RULES``).
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
