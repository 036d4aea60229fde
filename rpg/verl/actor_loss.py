"""Full actor loss functions installed with verl's ``set_loss_fn`` (worker side).

verl's ``ppo_loss`` (``verl/workers/utils/losses.py``) calls registered policy losses without
``ref_log_prob``, so the RPG recipe replaces the whole actor loss in every RPG mode (one adapter
path for sampler and reference anchors alike):

``rpg_actor_loss(config, model_output, data, dp_group=None)`` mirrors ``ppo_loss`` step by step
-- fill ``config.global_batch_info`` from the micro-batch, pad the model's nested log-probs with
``no_padding_2_padding``, select and pad the batch fields, call the policy loss, subtract
``entropy_coeff * agg_loss(entropy)``, and report metrics with verl's ``Metric`` aggregation
conventions -- but hands ``ref_log_prob`` to ``rpg.verl.policy_loss.rpg_pg_loss`` when the anchor
is a reference model (``policy_loss.rpg_anchor == "reference"``). verl's own KL term
(``use_kl_loss``) is never added here: ``use_kl_loss=True`` only makes verl build the reference.

``verl_loss_with_sampler_kl`` is for ``rpg.loss.name=verl`` with a KL loss against the sampling
policy (REINFORCE++ in the paper's scripts): no reference model is built and verl's own
``ppo_loss`` runs with ``ref_log_prob := old_log_probs``.
"""

from __future__ import annotations

import dataclasses

from tensordict import TensorDict

from verl.trainer.ppo.core_algos import agg_loss
from verl.utils.metric import AggregationType, Metric
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import no_padding_2_padding

from rpg.verl.policy_loss import rpg_pg_loss


def _metric_aggregation(config, data) -> AggregationType:
    # same rule as verl's ppo_loss: globally normalised losses are summed over micro-batches
    if (
        data["dp_size"] > 1
        or data["batch_num_tokens"] is not None
        or data["global_batch_size"] is not None
        or config.loss_scale_factor is not None
    ):
        return AggregationType.SUM
    return AggregationType.MEAN


def _stat_aggregation(key: str) -> AggregationType:
    if key.endswith("_max") or key.endswith("/max"):
        return AggregationType.MAX
    if key.endswith("_min") or key.endswith("/min"):
        return AggregationType.MIN
    return AggregationType.MEAN


def rpg_actor_loss(config, model_output, data: TensorDict, dp_group=None):
    """Actor loss for ``policy_loss.loss_mode`` in {rpg, grpo_corrected}; returns (loss, metrics)."""
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    entropy = model_output.get("entropy", None)
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)

    config.global_batch_info["dp_size"] = data["dp_size"]
    config.global_batch_info["batch_num_tokens"] = data["batch_num_tokens"]
    config.global_batch_info["global_batch_size"] = data["global_batch_size"]
    config.global_batch_info["loss_scale_factor"] = config.loss_scale_factor
    metric_aggregation = _metric_aggregation(config, data)

    use_reference = config.policy_loss.get("rpg_anchor", "sampler") == "reference"
    fields = ["response_mask", "old_log_probs", "advantages"]
    if "rollout_is_weights" in data:
        fields.append("rollout_is_weights")
    if use_reference:
        if "ref_log_prob" not in data:
            raise ValueError(
                "policy_loss.rpg_anchor=reference but the micro-batch has no ref_log_prob: the reference model "
                "was not built (actor.use_kl_loss must be True; the RPG driver sets it for reference modes)"
            )
        fields.append("ref_log_prob")
    data = data.select(*fields).to_padded_tensor()
    response_mask = data["response_mask"].to(bool)
    old_log_prob = data["old_log_probs"]
    ref_log_prob = data["ref_log_prob"] if use_reference else None
    loss_agg_mode = config.loss_agg_mode

    pg_loss, pg_metrics = rpg_pg_loss(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=data["advantages"],
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=data.get("rollout_is_weights", None),
        ref_log_prob=ref_log_prob,
    )
    if ref_log_prob is not None and "rpg/ref_old_logp_absdiff_max" not in pg_metrics:
        # how far the reference is from the sampling policy (0 right after a reference reset); the RPG
        # loss library reports it itself within its single host sync, grpo_corrected does not
        diff = (ref_log_prob - old_log_prob).abs()[response_mask]
        pg_metrics["rpg/ref_old_logp_absdiff_max"] = float(diff.max()) if diff.numel() else 0.0

    # per-micro-batch statistics: means are averaged like verl's ppo_loss (MEAN); extremes keep
    # their meaning across micro/mini-batches (the "max"/"min" naming rule of verl's reduce_metrics)
    metrics = {k: Metric(value=v, aggregation=_stat_aggregation(k)) for k, v in pg_metrics.items()}
    metrics["actor/pg_loss"] = Metric(value=pg_loss, aggregation=metric_aggregation)
    policy_loss = pg_loss

    if entropy is not None:
        entropy_loss = agg_loss(
            loss_mat=entropy, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info
        )
        policy_loss = policy_loss - config.entropy_coeff * entropy_loss
        metrics["actor/entropy_loss"] = Metric(value=entropy_loss, aggregation=metric_aggregation)
    return policy_loss, metrics


def verl_loss_with_sampler_kl(config, model_output, data: TensorDict, dp_group=None):
    """verl's ``ppo_loss`` with its KL loss anchored on the sampling policy (ref := old_log_probs).

    ``config`` is the worker's actor config with ``use_kl_loss`` switched on worker-side only
    (the driver keeps it off so that verl builds no reference model).
    """
    data["ref_log_prob"] = data["old_log_probs"]
    return ppo_loss(config=config, model_output=model_output, data=data, dp_group=dp_group)


def with_kl_loss_enabled(config):
    """Copy of a (frozen) verl ActorConfig with ``use_kl_loss=True``; shares ``global_batch_info``."""
    new = dataclasses.replace(config, use_kl_loss=True)
    object.__setattr__(new, "global_batch_info", config.global_batch_info)
    return new
