"""RPG policy losses with verl's policy-loss signature (import-light: torch + core_algos).

``rpg_pg_loss`` is registered as verl loss modes ``rpg`` and ``grpo_corrected``
(``rpg.verl.register``). It is the single place where verl meets the loss library:

* ``rpg``: per-token matrix from ``rpg.losses.rpg_token_loss`` (RPG-{F,R,UF,UR}KL, fully
  differentiable or REINFORCE-style, with/without RPG-Style Clip; spec §2, §4), aggregated with
  verl's ``agg_loss(..., **config.global_batch_info)`` so the summed micro-batch losses equal the
  global mini-batch loss (verl's normalisation contract; the engine never divides by the number
  of micro-batches).
* ``grpo_corrected``: verl's vanilla PPO dual-clip loss on A plus
  ``beta * agg_loss(grpo_corrected_kl(...))``, the importance-weighted k3 KL of spec §3.

Anchor: ``ref_log_prob=None`` -> the sampling policy pi_old (paper's iterative reference, what
the registered loss sees: verl's ``ppo_loss`` never passes ``ref_log_prob``). With
``ref_log_prob`` (only reachable through ``rpg.verl.actor_loss.rpg_actor_loss``) the exact
three-policy weights of spec §2.7 are used.

``rollout_is_weights`` (verl rollout correction, pi_old/pi_rollout) multiply the per-token loss
like in verl's vanilla loss. Settings come from ``config.policy_loss.rpg_*``
(``rpg.verl.policy_config.RPGPolicyLossConfig``); clip ratios from verl's actor keys.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from verl.trainer.ppo.core_algos import agg_loss, compute_policy_loss_vanilla

_RPG_FIELDS = ("rpg_divergence", "rpg_form", "rpg_beta", "rpg_clip", "rpg_branch_on", "rpg_fd_clip", "rpg_kl_clamp",
               "rpg_compile")


def _policy_settings(config) -> Any:
    pl = config.policy_loss
    missing = [f for f in _RPG_FIELDS if pl.get(f, "__missing__") == "__missing__"]
    if missing:
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.{missing[0]} is missing: loss_mode "
            f"{pl.get('loss_mode')!r} needs policy_loss._target_=rpg.verl.policy_config.RPGPolicyLossConfig "
            "(use recipe/rpg/main_rpg.py, which sets it from the rpg: block)"
        )
    return pl


def make_rpg_loss_config(config, loss_agg_mode: str):
    """Build ``rpg.losses.RPGLossConfig`` from verl's actor config (clip ratios, c, aggregation)."""
    from rpg.losses import RPGLossConfig

    pl = _policy_settings(config)
    clip_low = config.clip_ratio_low if config.get("clip_ratio_low", None) is not None else config.clip_ratio
    clip_high = config.clip_ratio_high if config.get("clip_ratio_high", None) is not None else config.clip_ratio
    return RPGLossConfig(
        divergence=pl.rpg_divergence,
        form=pl.rpg_form,
        beta=float(pl.rpg_beta),
        clip=bool(pl.rpg_clip),
        clip_ratio_low=float(clip_low),
        clip_ratio_high=float(clip_high),
        clip_ratio_c=float(config.get("clip_ratio_c", 3.0)),
        loss_agg_mode=loss_agg_mode,
        branch_on=pl.rpg_branch_on,
        fd_clip=pl.rpg_fd_clip,
        kl_clamp=None if pl.rpg_kl_clamp is None else float(pl.rpg_kl_clamp),
        compile=bool(pl.rpg_compile),
    )


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.to(x.dtype)
    return float((x * m).sum() / m.sum().clamp_min(1.0))


def rpg_pg_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: Optional[torch.Tensor] = None,
    ref_log_prob: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl ``PolicyLossFn`` for loss modes ``rpg`` and ``grpo_corrected``.

    Returns ``(loss, metrics)``: a scalar that keeps the graph, normalised with
    ``config.global_batch_info``, and a flat dict of floats (``rpg/*`` keys of the loss library
    plus verl-compatible ``actor/pg_clipfrac`` and ``actor/ppo_kl``).
    """
    if config is None:
        raise ValueError("rpg_pg_loss needs verl's actor config (config=None)")
    mode = config.policy_loss.get("loss_mode", "rpg")
    mask = response_mask.to(log_prob.dtype)
    gbi = dict(config.global_batch_info)
    if mode == "grpo_corrected":
        return _grpo_corrected(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                               rollout_is_weights, ref_log_prob, gbi)
    if mode != "rpg":
        raise ValueError(f"rpg_pg_loss called with policy_loss.loss_mode={mode!r}; allowed: rpg, grpo_corrected")

    from rpg.losses import rpg_token_loss

    cfg = make_rpg_loss_config(config, loss_agg_mode)
    loss_mat, metrics = rpg_token_loss(log_prob, old_log_prob, advantages, mask, cfg, ref_log_prob=ref_log_prob)
    if rollout_is_weights is not None:
        loss_mat = loss_mat * rollout_is_weights
    loss = agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=loss_agg_mode, **gbi)
    metrics = dict(metrics)  # read back with the library's single host sync
    metrics["actor/pg_clipfrac"] = metrics["rpg/clipfrac"]
    metrics["actor/ppo_kl"] = -metrics["rpg/log_ratio_mean"]  # verl's ppo_kl: masked mean of l_old - l
    return loss, metrics


def _grpo_corrected(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                    rollout_is_weights, ref_log_prob, gbi):
    """GRPO with the importance-weighted KL (spec §3): vanilla dual-clip PPO + beta * agg(w * k3)."""
    from rpg.losses import grpo_corrected_kl, value_clamp

    pl = _policy_settings(config)
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
    kl_mat = grpo_corrected_kl(log_prob, old_log_prob, anchor)
    if pl.rpg_kl_clamp is not None:  # value-only guard: clamp the value, keep the gradient
        kl_mat = value_clamp(kl_mat, float(pl.rpg_kl_clamp))
    if rollout_is_weights is not None:
        kl_mat = kl_mat * rollout_is_weights
    kl_loss = agg_loss(loss_mat=kl_mat, loss_mask=mask, loss_agg_mode=loss_agg_mode, **gbi)
    loss = pg_loss + float(pl.rpg_beta) * kl_loss
    log_w = (log_prob - old_log_prob).detach()
    w = torch.exp(log_w)
    metrics = {k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in pg_metrics.items()}
    with torch.no_grad():
        valid = mask > 0
        metrics.update(
            {
                "rpg/kl_estimate": _masked_mean(kl_mat.detach(), mask),
                "rpg/ratio_mean": _masked_mean(w, mask),
                "rpg/ratio_max": float(w[valid].max()) if valid.any() else 1.0,
                "rpg/ratio_min": float(w[valid].min()) if valid.any() else 1.0,
                "rpg/log_ratio_abs_max": float(log_w.abs()[valid].max()) if valid.any() else 0.0,
            }
        )
    return loss, metrics
