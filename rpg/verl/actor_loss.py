"""Actor losses installed with verl's ``set_loss_fn`` (worker side): verl's own ``ppo_loss``, wrapped.

verl's ``ppo_loss`` (``verl/workers/utils/losses.py``) does everything an actor loss does
(global-batch normalisation, padding, the registered policy loss, entropy, metrics) but calls the
registered policy loss without ``ref_log_prob``. The RPG losses with a reference anchor need it, so
``rpg_actor_loss`` wraps ``ppo_loss`` rather than copying it: it pads the micro-batch's
``ref_log_prob`` as ``ppo_loss`` pads its fields and hands it to ``rpg.verl.policy_loss`` for the
duration of the call (``reference_log_prob``). The config it gets has ``use_kl_loss=False``
(``with_kl_loss``): the driver sets ``use_kl_loss=True`` only so that verl builds the reference
model; the KL is inside the RPG loss and verl's own KL term must not be added.

``verl_loss_with_sampler_kl`` is for ``rpg.loss.name=verl`` with a KL loss against the sampling
policy (REINFORCE++ in the paper's scripts): no reference model is built and verl's ``ppo_loss``
runs with ``ref_log_prob := old_log_probs``.
"""

from __future__ import annotations

import dataclasses

from tensordict import TensorDict

from verl.utils.metric import AggregationType
from verl.workers.utils.losses import ppo_loss

from rpg.verl.policy_loss import reference_log_prob


def _stat_aggregation(key: str) -> AggregationType | None:
    """Extremes (``*_max``, ``*_min``: ``rpg/ratio_max``, ...) keep their meaning across micro/mini-batches
    and ranks (verl's "max"/"min" naming rule of ``reduce_metrics``); ``ppo_loss`` averages every
    policy-loss metric otherwise."""
    if key.endswith("_max"):
        return AggregationType.MAX
    if key.endswith("_min"):
        return AggregationType.MIN
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
    with reference_log_prob(ref):
        loss, metrics = ppo_loss(config=config, model_output=model_output, data=data, dp_group=dp_group)
    for key, metric in metrics.items():
        if (aggregation := _stat_aggregation(key)) is not None and hasattr(metric, "aggregation"):
            metric.aggregation = aggregation
    return loss, metrics


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
