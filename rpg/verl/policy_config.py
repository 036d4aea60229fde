"""verl's policy-loss config of the RPG losses and the ``RPGLossConfig`` built from it, in the driver and the workers.

``RPGPolicyLossConfig`` (``POLICY_LOSS_TARGET``) is verl's ``PolicyLossConfig`` plus what the RPG losses read on the
workers; the driver selects it with ``actor_rollout_ref.actor.policy_loss._target_`` (``rpg.verl.block_to_verl``) and
verl instantiates it in the driver and in every actor worker, so its ``rpg_loss`` mapping carries the ``rpg.loss``
values across Ray. ``loss_config(actor)`` builds the exact ``RPGLossConfig`` from verl's actor config (``rpg_loss``
plus verl's clip ratios and aggregation, ``ACTOR_FIELDS``): in the driver before Ray and on each worker, so both
refuse the same inputs. A worker builds it once per actor config (``worker_loss_config``), not per micro-batch.
The road of a setting from the YAML to the loss: docs/architecture.md#the-road-of-a-loss-setting.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig
from verl.workers.config.actor import PolicyLossConfig

from rpg.config import ACTOR_FIELDS, RPGLossConfig, build_loss_config

ANCHORS = ("sampler", "reference")
POLICY_LOSS_TARGET = "rpg.verl.policy_config.RPGPolicyLossConfig"


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


def _actor_value(actor, name: str):
    """verl's actor value of an ``ACTOR_FIELDS`` entry (None: unset, the library default applies).
    verl's rule: clip_ratio_low / clip_ratio_high fall back to clip_ratio."""
    value = actor.get(name, None)
    if value is None and name in ("clip_ratio_low", "clip_ratio_high"):
        value = actor.get("clip_ratio", None)
    return value


def loss_config(actor) -> RPGLossConfig:
    """The exact ``RPGLossConfig`` the loss runs with, from a verl actor config: the composed DictConfig in the
    driver (``rpg.verl.block_to_verl.apply_to_verl_config``), verl's ``ActorConfig`` on a worker
    (``worker_loss_config``). One construction in both places (``rpg.config.build_loss_config``), so the driver
    rejects before Ray exactly what a worker would; a broken rule raises ``RPGLossConfigError`` (its field, value
    and what is allowed). ``grpo_corrected`` reads beta, kl_clamp and log_ratio_guard (validated as the
    differentiable form, so a value-only ``kl_clamp`` is allowed there, as for RPG-X)."""
    pl = actor.get("policy_loss", None)
    values = None if pl is None else pl.get("rpg_loss", None)
    if values is None:
        mode = None if pl is None else pl.get("loss_mode", None)
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.rpg_loss is missing: loss_mode {mode!r} needs "
                         f"policy_loss._target_={POLICY_LOSS_TARGET} (use recipe/rpg/main_rpg.py, which sets it "
                         "from the rpg: block)")
    values = {k: values[k] for k in values}
    for name in ACTOR_FIELDS:
        if (value := _actor_value(actor, name)) is not None:
            values[name] = value
    return build_loss_config(pl.get("loss_mode", None), values)


# a worker's built configs: id(actor config) -> (a weak reference to it, its RPGLossConfig); an entry goes with its
# config object, so that an id reused by a later object never finds it
_BUILT: dict[int, tuple[weakref.ref, RPGLossConfig]] = {}


def worker_loss_config(actor) -> RPGLossConfig:
    """``loss_config(actor)`` built once per actor config object: the RPG actor loss builds it when the worker installs
    it (``rpg.verl.actor_loss.rpg_loss_fn``) and every micro-batch's call finds it. Keyed on the object: verl's configs
    (``BaseConfig``) refuse a new value for a field, so a changed config is another object (``dataclasses.replace``),
    which gets its own; a mutable config (an OmegaConf node, a plain mapping) is refused, as it could change under the
    built one."""
    if not isinstance(actor, BaseConfig):
        raise TypeError(f"the RPG loss needs verl's actor config (a verl BaseConfig, whose fields are frozen), got "
                        f"{type(actor).__name__}")
    key = id(actor)
    if (entry := _BUILT.get(key)) is not None and entry[0]() is actor:
        return entry[1]
    built = loss_config(actor)
    _BUILT[key] = (weakref.ref(actor, lambda _ref, key=key: _BUILT.pop(key, None)), built)
    return built
