"""The fused path's per-token terms: value_t and slope_t = d value_t / d l_t of each RPG loss in closed form.

Symbols of docs/math.md: l = log πθ, w = exp(l − l_old), r_ref = exp(l_ref − l_old), ρ = w/r_ref, A the advantage,
C = C_D and κ = κ_D (``rpg.math.formulas``; d(β·κ)/dl = −C(w)), W = w·A + C the REINFORCE weight, x the
dual-clipped ratio (w where the token is active, else the clip constant). Every loss depends on l alone, so its
gradient is slope_t·∇l_t: ``rpg.math.fused`` runs ``loss_terms`` as one autograd node whose backward is grad·slope.
The pieces are ``rpg.math.formulas``'; the tests check each value and slope against its plain-autograd loss there
(tests/math/test_formulas.py) and against exact gradients (tests/math/test_losses_*.py). Log-ratios are clamped
to ±guard in value with derivative 1.
"""

from __future__ import annotations

import math

import torch

from rpg.math.formulas import agg_weights, dual_clip, kappa, kl_weight, phi
from rpg.math.fused_stats import LossStatistics


def reinforce(cfg, l, w, log_w, log_rho, adv, r_ref, log_r_ref):
    """Table 2: value −W·l, slope −W, W = w·A + C(w). RPG-Style Clip (Eq. (4.1), Algorithm 2 with Remark F.2):
    W = w·A + C(w̄) with w̄ = clip(w, 1−ε_low, 1+ε_high), value −(x·A + C(w̄))·l (−W·l where active, Algorithm 2's
    constant elsewhere), slope −W·active, the branch on the sign of A' = W/w (``branch_on="raw"``: of A)."""
    C = kl_weight(cfg.divergence, cfg.beta, *kl_ratio(cfg, w, log_w, log_rho, r_ref, log_r_ref))
    W = torch.addcmul(C, w, adv)  # w·A + C
    slope = -W
    if not cfg.clip:
        return slope * l, slope, W, None
    x, active, high, low = clip_regions(W >= 0 if cfg.branch_on == "regularized" else adv > 0, w, cfg)
    value = -torch.addcmul(C, x, adv).mul_(l)  # −(x·A + C)·l: −W·l where active (x = w)
    return value, slope * active, W, (active, high, low)


def kl_ratio(cfg, w, log_w, log_rho, r_ref, log_r_ref):
    """(x, r_ref, log(x/r_ref)) for REINFORCE's C: x = w, or w̄ = clip(w, 1−ε_low, 1+ε_high) with the clip (Remark
    F.2; log w̄ − log r_ref only for rkl and urkl, the C that read it)."""
    if not cfg.clip:
        return w, r_ref, log_rho
    lo, hi = 1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high
    log_rho_bar = (log_w.clamp(math.log(lo), math.log(hi)) - log_r_ref if cfg.divergence in ("rkl", "urkl")
                   else None)
    return w.clamp(lo, hi), r_ref, log_rho_bar


def differentiable(cfg, w, log_rho, kl, adv, r_ref):
    """Tables 1/4: value −w·A + β·κ, slope −(w·A + C(w)) = −W (the unclipped REINFORCE slope, token by token).
    Clipped (fd_clip="reward", the authors' loss): value DualClip(w, A) + β·κ = −x·A + β·κ, slope −(w·A·active + C):
    the KL term is not clipped."""
    wa = w * adv
    C = kl_weight(cfg.divergence, cfg.beta, w, r_ref, log_rho)
    W = wa + C
    if not cfg.clip:
        return cfg.beta * kl - wa, -W, W, None
    x, active, high, low = clip_regions(adv >= 0, w, cfg)
    value = torch.addcmul(cfg.beta * kl, x, adv, value=-1.0)  # β·κ − x·A
    slope = -torch.addcmul(C, wa, active)  # −(w·A·active + C)
    return value, slope, W, (active, high, low)


def algorithm1(cfg, w, log_rho, adv, r_ref):
    """Algorithm 1 (rkl, urkl): value DualClip(w, Â) = −Â·x with Â(θ) = A − β·φ_D(ρ), so dÂ/dl = −β and the slope is
    β·x − Â·w·active (unclipped: value −Â·w, slope w·(β − Â)). Exact in expectation only (T25 in docs/math.md).
    W = w·A + C(w) only for the statistics of A'."""
    a_hat = adv - cfg.beta * phi(cfg.divergence, log_rho)
    if not cfg.clip:
        value, slope, regions = -(a_hat * w), w * (cfg.beta - a_hat), None
    else:
        x, active, high, low = clip_regions(a_hat >= 0, w, cfg)
        value, slope, regions = -(a_hat * x), cfg.beta * x - a_hat * w * active, (active, high, low)
    return value, slope, w * adv + kl_weight(cfg.divergence, cfg.beta, w, r_ref, log_rho), regions


def clip_regions(positive, w, cfg):
    """``formulas.dual_clip`` at ``cfg``'s bounds, and its regions for the statistics: (x, active, high, low). Its
    value is −A·x and its slope −A·w·active; high = clipped positive tokens, low = negative ones clipped below (the
    other inactive tokens are the dual-clipped ones)."""
    lo = 1.0 - cfg.clip_ratio_low
    x, active = dual_clip(w, positive, lo, 1.0 + cfg.clip_ratio_high, cfg.clip_ratio_c)
    clipped = ~active
    return x, active, positive & clipped, (w <= lo) & clipped


def loss_terms(cfg, agg: str | None, log_prob, old_log_prob, advantages, mask, ref_log_prob=None):
    """(out, slope, stats) of one RPG loss; inputs float32 or wider, all [B, T].

    agg=None: out = value_t [B, T] (0 where masked), slope = slope_t; agg=<verl mode>: out = Σ_t a_t·value_t and
    slope = a_t·slope_t (``agg_weights``). stats: ``LossStatistics.vector()``. Each tensor is dropped once nothing
    needs it, so that the eager peak memory stays at verl's vanilla loss's.
    """
    guard, l, adv = cfg.log_ratio_guard, log_prob, advantages
    valid = mask != 0
    stats = LossStatistics(mask, valid)
    # 0 where masked: a non-finite log-prob in padding (-inf - -inf) must reach no loss, gradient or metric
    log_w = torch.where(valid, l - old_log_prob, 0.0)
    stats.log_ratio(log_w, guard)
    log_w = log_w.clamp_(-guard, guard)
    w = log_w.exp()
    if ref_log_prob is None:  # the anchor is the sampler (the iterative reference): r_ref = 1, ρ = w
        r_ref, log_r_ref, log_rho = 1.0, 0.0, log_w
    else:  # three policies (docs/math.md#three-policies): r_ref = a/π_old is data
        log_r_ref = torch.where(valid, ref_log_prob - old_log_prob, 0.0)
        stats.reference(log_r_ref)
        log_r_ref = log_r_ref.clamp_(-guard, guard)
        r_ref, log_rho = log_r_ref.exp(), log_w - log_r_ref
    kl = kappa(cfg.divergence, w, log_rho, r_ref)
    if cfg.kl_clamp is not None:  # differentiable form only; value-only: the slope keeps −C
        kl = kl.clamp(-cfg.kl_clamp, cfg.kl_clamp)
    stats.kl(kl)
    if cfg.form == "differentiable" and cfg.fd_clip == "reward":
        value, slope, weight, regions = differentiable(cfg, w, log_rho, kl, adv, r_ref)
    else:  # κ enters the statistics only: dropped before the loss's tensors exist
        del kl
        value, slope, weight, regions = (reinforce(cfg, l, w, log_w, log_rho, adv, r_ref, log_r_ref)
                                         if cfg.form == "reinforce" else algorithm1(cfg, w, log_rho, adv, r_ref))
    del log_w, log_rho, r_ref, log_r_ref
    # where, not a product with the mask: −W·l is non-finite where l is (padding)
    value, slope = torch.where(valid, value, 0.0), torch.where(valid, slope, 0.0)
    if agg is not None:
        weights = agg_weights(mask, agg, n=stats.sums["n"])
        value, slope = (value * weights).sum(), slope * weights
        del weights
    stats.loss(w, weight, regions)
    return value, slope, stats.vector()
