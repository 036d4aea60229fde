"""RPG's policy loss for verl: its config ``RPGPolicyLossConfig`` and its function ``rpg_policy_loss`` (import-light:
torch, verl's ``core_algos`` and config classes).

``RPGPolicyLossConfig`` (``POLICY_LOSS_TARGET``) is verl's ``PolicyLossConfig`` plus what the RPG losses read: the
driver selects it with ``actor_rollout_ref.actor.policy_loss._target_`` (``rpg.verl.block_to_verl``) and verl
instantiates it in the driver and in every actor worker, so its ``rpg_loss`` mapping carries the ``rpg.loss`` values
across Ray (recipe/rpg/config/rpg_trainer.yaml sets both: ``rpg_loss: ${rpg.loss}``, the block itself, by
reference). ``worker_loss_config`` builds the ``RPGLossConfig`` once per actor config on a worker with the one builder,
``rpg.config.loss_config``, which the driver's check before Ray calls too, so both refuse the same inputs. The road
of a setting from the YAML to here: docs/architecture.md#the-road-of-a-loss-setting.

``rpg_policy_loss`` is registered as verl's loss modes (``rpg.verl.register``) and called by verl's ``ppo_loss`` with
the padded micro-batch: ``rpg`` is the per-token loss of ``rpg.math.fused.rpg_policy_loss(..., aggregate=False)``
(docs/math.md#per-token-losses) aggregated by verl's ``agg_loss(..., **config.global_batch_info)``, so that the
micro-batch losses sum to the mini-batch's; ``grpo_corrected`` is verl's vanilla dual-clip PPO loss plus
β·``agg_loss(grpo_corrected_kl(...))`` (Sec. 2.2). The KL anchor is π_old (``policy_loss.rpg_anchor=sampler``) or the
reference whose log-probs the RPG actor loss hands over (``with_reference_log_prob``; docs/math.md#three-policies).
One token weight multiplies the whole per-token loss: verl's ``rollout_is_weights`` or the behaviour weights
b = π_old/μ (``with_behavior_weights``), never both.
"""

from __future__ import annotations

import contextlib
import weakref
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from verl.base_config import BaseConfig
from verl.trainer.ppo.core_algos import agg_loss, compute_policy_loss_vanilla
from verl.workers.config.actor import PolicyLossConfig

from rpg.config import RPG_LOSSES, RPGLossConfig, loss_config
from rpg.math.fused import grpo_corrected_kl, value_clamp
from rpg.math.fused import rpg_policy_loss as library_loss

ANCHORS = ("sampler", "reference")
POLICY_LOSS_TARGET = "rpg.verl.policy_loss.RPGPolicyLossConfig"


@dataclass
class RPGPolicyLossConfig(PolicyLossConfig):
    """Fields:

    rpg_loss:       the rpg.loss block (its name and RPGLossConfig fields; validated by the
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


_REFERENCE: ContextVar[Optional[torch.Tensor]] = ContextVar("rpg_ref_log_prob", default=None)
_BEHAVIOR: ContextVar[Optional[torch.Tensor]] = ContextVar("rpg_behavior_weights", default=None)


@contextlib.contextmanager
def _bound(var: ContextVar, value: Optional[torch.Tensor]):
    """``var`` holds ``value`` for the duration of the block (what verl's ``ppo_loss`` cannot pass on)."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def with_reference_log_prob(ref_log_prob: Optional[torch.Tensor]):
    """Within the block, ``rpg_policy_loss`` anchors on ``ref_log_prob`` (padded like verl's batch)."""
    return _bound(_REFERENCE, ref_log_prob)


def with_behavior_weights(weights: Optional[torch.Tensor]):
    """Within the block, ``rpg_policy_loss`` multiplies each token's loss by ``weights`` (padded like verl's batch)."""
    return _bound(_BEHAVIOR, weights)


def _token_weights(rollout_is_weights: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The per-token weights of this call: the RPG actor loss's behaviour weights or verl's, never both."""
    behavior = _BEHAVIOR.get()
    if behavior is not None and rollout_is_weights is not None:
        raise ValueError("the RPG loss got verl's rollout_is_weights and its own behaviour weights pi_old/mu: the "
                         "weight would be applied twice; set algorithm.rollout_correction.rollout_is=null (truncation: "
                         "rpg.loss.behavior_weight_cap)")
    return behavior if behavior is not None else rollout_is_weights


def _anchor(config) -> Optional[torch.Tensor]:
    """The reference log-probs of this call (None: anchor = pi_old)."""
    if config.policy_loss.get("rpg_anchor", "sampler") != "reference":
        return None
    ref = _REFERENCE.get()
    if ref is None:
        raise ValueError("policy_loss.rpg_anchor=reference but no ref_log_prob reached the loss: the RPG actor loss "
                         "(rpg.verl.actor_loss, installed by the RPG worker) passes it; use recipe/rpg/main_rpg.py")
    return ref


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """sum(x * m) / sum(m), 0 without weight (a weighted mask may sum to less than 1: no clamp at 1)."""
    m = mask.to(x.dtype)
    total = m.sum()
    return float((x * m).sum() / total) if total > 0 else 0.0


def rpg_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl ``PolicyLossFn`` for loss modes ``rpg`` and ``grpo_corrected``.

    Returns ``(loss, metrics)``: a scalar that keeps the graph, normalised with
    ``config.global_batch_info``, and a flat dict of floats (``rpg/*`` keys of the loss library
    plus verl-compatible ``actor/pg_clipfrac`` and ``actor/ppo_kl``). Settings: the ``RPGLossConfig`` of
    ``config``, built once per config object (``worker_loss_config``). With token weights
    the metrics are weighted means, estimates under π_old, self-normalised over the micro-batch here (the RPG actor loss turns them into shares of the
    mini-batch's mean, ``rpg.verl.actor_loss._global_means``).
    """
    if config is None:
        raise ValueError("rpg_policy_loss needs verl's actor config (config=None)")
    mode = config.policy_loss.get("loss_mode", "rpg")
    if mode not in RPG_LOSSES:
        raise ValueError(f"rpg_policy_loss called with policy_loss.loss_mode={mode!r}; allowed: {', '.join(RPG_LOSSES)}")
    settings = worker_loss_config(config)
    if loss_agg_mode != settings.loss_agg_mode:  # verl's ppo_loss hands over config.loss_agg_mode
        raise ValueError(f"rpg_policy_loss called with loss_agg_mode={loss_agg_mode!r} but the actor config's is "
                         f"{settings.loss_agg_mode!r} (the RPG loss's settings are built from the actor config)")
    ref_log_prob = _anchor(config)
    rollout_is_weights = _token_weights(rollout_is_weights)
    mask = response_mask.to(log_prob.dtype)
    gbi = dict(config.global_batch_info)
    if mode == "grpo_corrected":
        return _grpo_corrected(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                               rollout_is_weights, ref_log_prob, gbi, settings)

    # per-token loss (0 where masked, its values independent of the mask's magnitude); with weights, the
    # mask handed to the library is mask * b, so its metrics are b-weighted means (under pi_old)
    stats_mask = mask if rollout_is_weights is None else mask * rollout_is_weights.to(mask.dtype)
    loss_mat, metrics = library_loss(log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages,
                                     response_mask=stats_mask, config=settings, ref_log_prob=ref_log_prob,
                                     aggregate=False)
    if rollout_is_weights is not None:
        loss_mat = torch.where(mask != 0, loss_mat, 0.0) * rollout_is_weights
    loss = agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=loss_agg_mode, **gbi)
    metrics = dict(metrics)  # read back with the library's single host sync
    metrics["actor/pg_clipfrac"] = metrics["rpg/clipfrac"]
    metrics["actor/ppo_kl"] = -metrics["rpg/log_ratio_mean"]  # verl's ppo_kl: masked mean of l_old - l
    return loss, metrics


def _grpo_corrected(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                    rollout_is_weights, ref_log_prob, gbi, settings):
    """GRPO with the importance-weighted KL (Sec. 2.2): vanilla dual-clip PPO + beta * agg(w * k3)."""
    pg_loss, pg_metrics = compute_policy_loss_vanilla(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=rollout_is_weights,
    )
    anchor = old_log_prob if ref_log_prob is None else ref_log_prob
    mask = response_mask.to(log_prob.dtype)
    kl_mat = grpo_corrected_kl(log_prob=log_prob, old_log_prob=old_log_prob, ref_log_prob=anchor,
                               log_ratio_guard=settings.log_ratio_guard)
    if settings.kl_clamp is not None:  # value-only guard: clamp the value, keep the gradient
        kl_mat = value_clamp(kl_mat, settings.kl_clamp)
    # metrics: weighted to pi_old (b-weighted means over the micro-batch) when weights are given
    stats_mask = mask if rollout_is_weights is None else mask * rollout_is_weights.to(mask.dtype)
    kl_estimate = _masked_mean(kl_mat.detach(), stats_mask)
    if rollout_is_weights is not None:
        kl_mat = kl_mat * rollout_is_weights
    kl_loss = agg_loss(loss_mat=kl_mat, loss_mask=mask, loss_agg_mode=loss_agg_mode, **gbi)
    loss = pg_loss + settings.beta * kl_loss
    log_w = (log_prob - old_log_prob).detach()
    w = torch.exp(log_w)
    metrics = {k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in pg_metrics.items()}
    with torch.no_grad():
        valid = mask > 0
        metrics.update(
            {
                "rpg/kl_estimate": kl_estimate,
                "rpg/ratio_mean": _masked_mean(w, stats_mask),
                "rpg/ratio_max": float(w[valid].max()) if valid.any() else 1.0,
                "rpg/ratio_min": float(w[valid].min()) if valid.any() else 1.0,
                "rpg/log_ratio_abs_max": float(log_w.abs()[valid].max()) if valid.any() else 0.0,
            }
        )
        if ref_log_prob is not None:  # how far the reference is from pi_old (0 right after a reset)
            diff = (ref_log_prob - old_log_prob).abs()[valid]
            metrics["rpg/ref_old_logp_absdiff_max"] = float(diff.max()) if diff.numel() else 0.0
    return loss, metrics
