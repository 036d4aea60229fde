"""What the driver prints before a run: one line saying which loss, anchor and trainer will run.

``describe`` reads the settings as ``rpg.verl.block_to_verl.apply_to_verl_config`` left them (the loss's
actor keys included) and the verl keys it wrote (the policy loss, the KL against the sampler).
"""

from __future__ import annotations

from rpg.config import RPGSettings, config_value


def describe(cfg, settings: RPGSettings) -> str:
    """One line saying what will run (printed by the driver)."""
    from omegaconf import OmegaConf

    pl = OmegaConf.select(cfg, "actor_rollout_ref.actor.policy_loss")
    loss = settings.loss
    if settings.uses_rpg_actor_loss:
        what = (f"loss=rpg divergence={loss.divergence} form={loss.form} beta={loss.beta} clip={loss.clip}"
                + (" compiled" if loss.compile else "") if settings.loss_name == "rpg"
                else f"loss=grpo_corrected beta={loss.beta}")
    else:
        what = f"loss=verl:{pl.get('loss_mode', 'vanilla')}"
    ref = settings.reference
    if ref.mode == "sampler":
        anchor = "anchor=sampler (pi_old; no reference model)"
        if not settings.uses_rpg_actor_loss and not pl.get("rpg_sampler_kl", False):
            anchor = "no KL anchor (no reference model)"
    else:
        anchor = f"anchor=reference mode={ref.mode}"
        if ref.mode == "periodic":
            anchor += f" K={ref.update_every}"
        if ref.mode == "kl_threshold":
            anchor += f" kappa={ref.kl_threshold} decay={ref.kl_ema_decay}"
    adv = OmegaConf.select(cfg, "algorithm.adv_estimator")
    return f"rpg: {what}; {anchor}; adv_estimator={adv}; optimizer={settings.optimizer}{_describe_async(cfg, settings)}"


def _describe_async(cfg, settings: RPGSettings) -> str:
    """The asynchronous trainer's settings ('' for sync)."""
    mode = config_value(cfg, "trainer.v1.trainer_mode", "sync")
    if mode == "sync":
        return ""
    v1 = f"trainer.v1.{mode}"
    bypass = bool(config_value(cfg, "algorithm.rollout_correction.bypass_mode", False))
    out = (f"; trainer={mode} warmup_batches={config_value(cfg, f'{v1}.num_warmup_batches', 1)} "
           f"max_off_policy={config_value(cfg, 'trainer.v1.sampler.max_off_policy_threshold', None)} "
           f"({config_value(cfg, 'trainer.v1.sampler.max_off_policy_strategy', 'drop')}) "
           f"old_log_probs={'rollout (bypass: pi_old := mu)' if bypass else 'recomputed (decoupled)'}")
    if mode == "separate_async":
        pool = [config_value(cfg, f"actor_rollout_ref.rollout.{k}", None) for k in ("nnodes", "n_gpus_per_node")]
        trainer = [config_value(cfg, f"trainer.{k}", 1) for k in ("nnodes", "n_gpus_per_node")]
        out += (f" parameter_sync_step={config_value(cfg, f'{v1}.parameter_sync_step', 4)} "
                f"trainer_pool={trainer[0]}x{trainer[1]} rollout_pool={pool[0]}x{pool[1]}"
                f" weight_sync={config_value(cfg, 'actor_rollout_ref.rollout.checkpoint_engine.backend', None)}")
    if settings.uses_rpg_actor_loss:
        loss = settings.loss
        cap = "untruncated (exact)" if loss.behavior_weight_cap is None else f"truncated at {loss.behavior_weight_cap} (biased)"
        if loss.behavior_weight_level == "none":
            out += " behavior_weights=none (dropped: uncorrected, biased)"
        else:
            out += f" behavior_weights=pi_old/mu per {loss.behavior_weight_level}, {cap}"
    else:
        out += f" rollout_is={config_value(cfg, 'algorithm.rollout_correction.rollout_is', None)}"
    return out
