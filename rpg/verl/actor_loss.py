"""Actor losses installed with verl's ``set_loss_fn`` (worker side): verl's own ``ppo_loss``, wrapped.

verl's ``ppo_loss`` (``verl/workers/utils/losses.py``: global-batch normalisation, padding, the registered policy
loss, entropy, metrics) calls the policy loss without ``ref_log_prob``. ``rpg_actor_loss`` wraps it rather than
copying it: it pads the micro-batch's ``ref_log_prob`` and, with a stale sampler μ (colocate_async, separate_async),
the behaviour weights b = π_old/μ from ``rollout_log_probs`` (``rpg.math.behavior``), and hands both to
``rpg.verl.policy_loss`` for the call; verl's own KL term stays off (``with_kl_loss``: the driver sets
``use_kl_loss=True`` only so that verl builds the reference). In verl's bypass mode π_old = μ and b = 1 exactly.
``verl_loss_with_sampler_kl``: ``rpg.loss.name=verl`` with a KL loss on the sampler (ref := old_log_probs).
``rpg_loss_fn(actor_config)``: the loss the RPG worker installs (``rpg.verl.worker``), its ``RPGLossConfig`` built
there, once (``rpg.verl.policy_loss.worker_loss_config``).
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import torch
from tensordict import TensorDict

from verl.utils.metric import AggregationType, Metric
from verl.workers.utils.losses import ppo_loss

from rpg.config import RPG_LOSSES
from rpg.math.behavior import behavior_metrics
from rpg.math.behavior import behavior_weights as compute_behavior_weights
from rpg.verl.policy_loss import with_behavior_weights, with_reference_log_prob, worker_loss_config


def _stat_aggregation(key: str) -> AggregationType | None:
    """Extremes (``*_max``, ``*_min``: ``rpg/ratio_max``, ...) keep their meaning across micro/mini-batches
    and ranks (verl's "max"/"min" naming rule of ``reduce_metrics``); ``ppo_loss`` averages every
    policy-loss metric otherwise."""
    if key.endswith("_max"):
        return AggregationType.MAX
    if key.endswith("_min"):
        return AggregationType.MIN
    return None


def rpg_loss_fn(actor_config):
    """The actor loss an RPG worker installs with verl's ``set_loss_fn`` in place of verl's ``ppo_loss`` on
    ``actor_config`` (verl's ``ActorConfig``), or None to keep verl's: ``policy_loss.loss_mode`` rpg or
    grpo_corrected: ``rpg_actor_loss``, its ``RPGLossConfig`` built here, once for the worker (a bad setting fails
    the actor's init, and every micro-batch finds it built); ``rpg.loss.name=verl`` with a KL loss on pi_old:
    ``verl_loss_with_sampler_kl``."""
    pl = actor_config.policy_loss
    if pl.get("loss_mode") in RPG_LOSSES:
        config = with_kl_loss(actor_config, False)
        worker_loss_config(config)
        return partial(rpg_actor_loss, config=config)
    if pl.get("rpg_sampler_kl", False):
        return partial(verl_loss_with_sampler_kl, config=with_kl_loss(actor_config, True))
    return None


def rpg_actor_loss(config, model_output, data: TensorDict, dp_group=None):
    """Actor loss for ``policy_loss.loss_mode`` in {rpg, grpo_corrected}: verl's ``ppo_loss`` with the
    reference log-probs handed to the RPG policy loss; returns (loss, metrics)."""
    if config.use_kl_loss:
        raise ValueError("rpg_actor_loss needs a config with use_kl_loss=False (with_kl_loss(config, False)): the KL "
                         "is inside the RPG loss and verl's own KL term must not be added")
    ref = None
    if config.policy_loss.get("rpg_anchor", "sampler") == "reference":
        if "ref_log_prob" not in data:
            raise ValueError(
                "policy_loss.rpg_anchor=reference but the micro-batch has no ref_log_prob: the reference model "
                "was not built (actor.use_kl_loss must be True; the RPG driver sets it for reference modes)"
            )
        ref = data.select("response_mask", "ref_log_prob").to_padded_tensor()["ref_log_prob"]
    weights, extra = _behavior(config, data)
    with with_reference_log_prob(ref), with_behavior_weights(weights):
        loss, metrics = ppo_loss(config=config, model_output=model_output, data=data, dp_group=dp_group)
    for key, value in extra.items():
        metrics[key] = Metric(aggregation=_stat_aggregation(key) or AggregationType.MEAN, value=value)
    for key, metric in metrics.items():
        if (aggregation := _stat_aggregation(key)) is not None and hasattr(metric, "aggregation"):
            metric.aggregation = aggregation
    _global_means(metrics, config, data, weights)
    return loss, metrics


# The loss's token means, by the tokens they average over: WEIGHTED ones over mask * w (w: the behaviour weights
# pi_old/mu, or verl's rollout_is_weights; 1 without), VALID ones over the valid tokens (fractions, the
# behaviour statistics, and verl's vanilla statistics that grpo_corrected returns).
WEIGHTED_MEANS = ("rpg/ratio_mean", "rpg/log_ratio_mean", "rpg/kl_estimate", "rpg/reg_adv_mean")
VALID_MEANS = ("rpg/clipfrac", "rpg/clipfrac_high", "rpg/clipfrac_low", "rpg/clipfrac_dual", "rpg/active_frac",
               "rpg/log_ratio_guard_frac", "rpg/behavior_kl", "rpg/behavior_kl_k3", "rpg/behavior_weight_mean",
               "rpg/behavior_weight_capped_frac", "actor/pg_clipfrac", "actor/pg_clipfrac_lower")


def _global_means(metrics: dict, config, data: TensorDict, weights) -> None:
    """Each token mean of one micro-batch (``M = S / n``, n its micro-batch's token count) becomes its share of the
    mean over the data-parallel *global* mini-batch, ``S / N * dp_size`` (N: verl's all-reduced ``batch_num_tokens``),
    marked SUM. verl's reduction (``Metric.aggregate_dp``: the mean over ranks of each micro-batch's value, then
    the aggregation over micro-batches) then logs ``sum S / N``, the token mean of the whole mini-batch, the same
    for every micro-batch size and world size, as the loss itself (tests/verl/test_dp_equivalence.py). Without this,
    verl averages the micro-batch means: a mean of means that changes with the split. With weights w the
    weighted means are ``sum w x / N``: the importance-weighted (unbiased, not self-normalised) estimate under
    pi_old; a self-normalised global mean needs the global sum of w, which no micro-batch holds. A micro-batch
    without valid tokens (fully masked responses) reports its ``*_max`` / ``*_min`` as -inf / +inf, which verl's
    MAX / MIN over micro-batches and ranks then ignore."""
    fields = ["response_mask"] + (["rollout_is_weights"] if "rollout_is_weights" in data else [])
    padded = data.select(*fields).to_padded_tensor()
    mask = padded["response_mask"].to(torch.float64)
    if weights is None and "rollout_is_weights" in padded.keys():
        weights = padded["rollout_is_weights"]
    valid = (mask != 0).to(torch.float64)
    weighted = mask if weights is None else mask * weights.to(torch.float64)
    n_valid, n_weighted = torch.stack([valid.sum(), weighted.sum()]).tolist()  # one host read-back
    if n_valid == 0:  # a micro-batch of fully masked responses has no extremes: neutral for verl's MIN / MAX
        for key, metric in metrics.items():  # (the library reports 0 for every statistic of such a batch)
            if isinstance(metric, Metric) and metric.aggregation in (AggregationType.MIN, AggregationType.MAX):
                sign = 1.0 if metric.aggregation is AggregationType.MIN else -1.0
                metrics[key] = Metric(metric.aggregation)
                metrics[key].extend([sign * math.inf] * len(metric.values))
    gbi = getattr(config, "global_batch_info", None) or {}
    total, dp = gbi.get("batch_num_tokens"), gbi.get("dp_size") or 1
    if not total:
        return  # no global count (a unit call without verl's engine), or nothing valid: the local means stand
    mode = config.policy_loss.get("loss_mode", "rpg")
    # actor/ppo_kl: -rpg/log_ratio_mean for rpg (weighted); verl's vanilla masked mean for grpo_corrected
    ppo_kl = ("actor/ppo_kl",)
    for keys, n in ((WEIGHTED_MEANS + (ppo_kl if mode == "rpg" else ()), n_weighted),
                    (VALID_MEANS + (ppo_kl if mode != "rpg" else ()), n_valid)):
        for key in keys:
            metric = metrics.get(key)
            if isinstance(metric, Metric) and metric.aggregation is AggregationType.MEAN:
                share = Metric(AggregationType.SUM)
                share.extend([v * n / total * dp for v in metric.values])
                metrics[key] = share


def _behavior(config, data: TensorDict):
    """(b = pi_old/mu padded like verl's batch, rpg/behavior_* metrics), or (None, {}) without a stale sampler."""
    if not config.policy_loss.get("rpg_stale_sampler", False):
        return None, {}
    if "rollout_log_probs" not in data:
        raise ValueError("policy_loss.rpg_stale_sampler=True but the micro-batch has no rollout_log_probs: the "
                         "behaviour weights pi_old/mu cannot be computed (actor_rollout_ref.rollout.calculate_log_probs "
                         "must be True; the RPG driver refuses it otherwise)")
    if "rollout_is_weights" in data:
        raise ValueError("the micro-batch holds verl's rollout_is_weights and the RPG loss computes its own behaviour "
                         "weights: set algorithm.rollout_correction.rollout_is=null (truncation: rpg.loss.behavior_weight_cap)")
    padded = data.select("response_mask", "old_log_probs", "rollout_log_probs").to_padded_tensor()
    old, mu, mask = padded["old_log_probs"], padded["rollout_log_probs"], padded["response_mask"]
    s = worker_loss_config(config)
    raw = compute_behavior_weights(old, mu, mask, s.behavior_weight_level, None, s.log_ratio_guard)
    weights = raw if s.behavior_weight_cap is None else raw.clamp(max=s.behavior_weight_cap)
    return weights.to(old.dtype), behavior_metrics(old, mu, mask, weights, raw)


def verl_loss_with_sampler_kl(config, model_output, data: TensorDict, dp_group=None):
    """verl's ``ppo_loss`` with its KL loss anchored on the sampling policy (ref := old_log_probs).

    ``config`` is the worker's actor config with ``use_kl_loss`` switched on worker-side only
    (the driver keeps it off so that verl builds no reference model).
    """
    data["ref_log_prob"] = data["old_log_probs"]
    return ppo_loss(config=config, model_output=model_output, data=data, dp_group=dp_group)


def with_kl_loss(config, enabled: bool):
    """Copy of a (frozen) verl ActorConfig with ``use_kl_loss=enabled``. ``dataclasses.replace`` passes
    the same ``global_batch_info`` dict on (``ppo_loss`` writes the micro-batch's normalisation into it,
    the policy loss reads it: both must see one dict)."""
    new = dataclasses.replace(config, use_kl_loss=enabled)
    assert new.global_batch_info is config.global_batch_info
    return new
