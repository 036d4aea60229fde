"""The RPG losses in closed form: per-token value, per-token slope d(value)/dl, metric sums.

Pure torch, no autograd and no host sync: ``loss_terms`` is one straight-line graph, run eagerly or
compiled (``rpg.math.losses`` wraps it in an autograd function whose backward is ``grad * slope``).
Every per-token loss of docs/math.md depends on l = log pi_theta(o_t|h_t) alone, so its gradient is
slope_t * grad l_t; the slopes below are the derivatives that autograd would take, written out
(the exact-gradient tests in tests/test_losses_*.py check them against enumeration).

Notation as in ``rpg.math.divergences``: w = exp(l - l_old), r_ref = exp(l_ref - l_old), A = advantage,
C_D(x) = ``kl_weight`` (linear in beta, so K = -C_D is ``kl_weight`` with -beta, no negation pass),
kappa_D = ``kl_surrogate``, d(beta*kappa_D)/dl = -C_D(w) = K(w). Both log-ratios are clamped to
+-guard in value; their derivative is taken as 1 (the straight-through guard of ``rpg.math.losses``).

==========================  =====================================  ====================================
form, clip                  value_t                                slope_t = d value_t / d l_t
==========================  =====================================  ====================================
reinforce, off              -(w*A + C(w)) * l                       -(w*A + C(w))
reinforce, on (Alg. 2)      -(x*A + C(w_bar)) * l                   -(w*A + C(w_bar)) * active
differentiable, off         -w*A + beta*kappa                       -(w*A + C(w))
differentiable, reward clip -x*A + beta*kappa                       -(w*A*active + C(w))
differentiable, algorithm1  -A_hat*x, A_hat = A - beta*phi(rho)     beta*x - A_hat*w*active
==========================  =====================================  ====================================

x is the dual-clipped ratio (``dual_clip_ratio``): w where the token is active, else the clip
constant; unclipped x = w and active = 1.
"""

from __future__ import annotations

import math

import torch

from rpg.math.divergences import kl_phi, kl_surrogate, kl_weight

# order of the statistics vector returned by ``loss_terms`` (read back by ``rpg.math.losses``): weighted
# sums, then extremes (the last one only with a reference anchor), then counts (the last three only with clip)
WEIGHTED_SUMS = ("n", "ratio", "kl", "neg_reg_adv", "log_ratio")  # sum_t m_t * quantity_t
EXTREMES = ("log_ratio", "neg_log_ratio", "reg_adv_abs", "ref_log_ratio_abs")  # max over valid tokens
VALID_COUNTS = ("valid", "guarded", "active", "clip_high", "clip_low")  # tokens with m_t != 0


def agg_weights(mask: torch.Tensor, mode: str, loss_scale_factor: float | None = None, n=None) -> torch.Tensor:
    """Per-token weights a_t of verl's aggregation modes: every mode is linear, loss = sum_t a_t*loss_t.

    token-sum: a = m; token-mean: m / sum(m); seq-mean-token-mean: m / (sum_row(m) * S);
    seq-mean-token-sum: m / S; seq-mean-token-sum-norm: m / (S * loss_scale_factor, default T);
    S = number of non-empty rows. An empty batch or row gets weight 0 (never 0/0). ``n``: sum(m) if
    the caller has it already.
    """
    if mode == "token-sum":
        return mask
    if mode == "token-mean":
        n = mask.sum() if n is None else n
        return mask / torch.where(n > 0, n, 1.0)
    tokens = mask.sum(dim=-1, keepdim=True)
    n_seq = (tokens > 0).sum().clamp(min=1)
    if mode == "seq-mean-token-mean":
        return mask / (torch.where(tokens > 0, tokens, 1.0) * n_seq)
    if mode == "seq-mean-token-sum":
        return mask / n_seq
    return mask / (n_seq * (loss_scale_factor if loss_scale_factor is not None else mask.shape[-1]))


def dual_clip_ratio(positive: torch.Tensor, w: torch.Tensor, cfg):
    """Dual-clip PPO on a fixed branch (App. G.1, boundaries of Algorithm 2; docs/math.md#dual-clip), per token.

    positive: the ratio's value is x = min(w, 1+eps_high), the gradient flows iff w < 1+eps_high;
    negative: x = clip(w, 1-eps_low, c), the gradient flows iff 1-eps_low < w < c.
    Dual-clip PPO is -A*x in value with slope -A*w*active. Returns (x, active, high, low):
    high = clipped positive tokens, low = negative tokens clipped below (the rest of the inactive
    tokens are the dual-clipped ones). Thresholds are Python floats, so they are exact in w's dtype.
    """
    lo, hi, c = 1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high, cfg.clip_ratio_c
    x = torch.where(positive, w.clamp(max=hi), w.clamp(lo, c))
    active = torch.where(positive, w < hi, (w > lo) & (w < c))
    high = positive > active  # positive and not active (bool order: True > False)
    low = (w <= lo) > active  # clipped below: only negative tokens are (positive ones stay active)
    return x, active, high, low


def _reinforce(l, w, log_w, adv, r_ref, log_r_ref, cfg):
    """REINFORCE-style loss, Algorithm 2 with Remark F.2: the KL weight at w_bar = clip(w)."""
    if cfg.clip:
        lo, hi = 1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high
        x_kl = w.clamp(lo, hi)
        # log w_bar without a log pass; fkl and ufkl never read it
        log_x_kl = log_w.clamp(math.log(lo), math.log(hi)) if cfg.divergence in ("rkl", "urkl") else None
    else:
        x_kl, log_x_kl = w, log_w
    k_kl = kl_weight(cfg.divergence, -cfg.beta, x_kl, log_x_kl, r_ref, log_r_ref)  # K = -C
    del x_kl, log_x_kl
    neg_weight = torch.addcmul(k_kl, w, adv, value=-1.0)  # -W = -(w*A + C)
    if not cfg.clip:
        return neg_weight * l, neg_weight, neg_weight, None
    # A' = W / w has the sign of W (w > 0); W stays finite where C/w could overflow.
    positive = neg_weight <= 0 if cfg.branch_on == "regularized" else adv > 0
    x, active, high, low = dual_clip_ratio(positive, w, cfg)
    value = torch.addcmul(k_kl, x, adv, value=-1.0) * l  # -(A*x + C) * l: Algorithm 2's constants where clipped
    return value, neg_weight * active, neg_weight, (active, high, low)


def _differentiable(w, log_w, log_rho, kappa, adv, r_ref, log_r_ref, cfg):
    """Fully differentiable loss; its unclipped slope equals the REINFORCE one token by token."""
    k_w = kl_weight(cfg.divergence, -cfg.beta, w, log_w, r_ref, log_r_ref)  # K(w) = -C(w) = d(beta*kappa)/dl
    neg_weight = torch.addcmul(k_w, w, adv, value=-1.0)  # -(w*A + C(w)), for the A' metrics
    if cfg.fd_clip == "algorithm1":  # A_hat(theta) = A - beta*phi(rho), d A_hat / dl = -beta
        a_hat = adv - cfg.beta * kl_phi(cfg.divergence, log_rho)
        if cfg.clip:
            x, active, high, low = dual_clip_ratio(a_hat >= 0, w, cfg)
            slope = torch.addcmul(cfg.beta * x, a_hat, w * active, value=-1.0)
            return -(a_hat * x), slope, neg_weight, (active, high, low)
        return -(a_hat * w), w * (cfg.beta - a_hat), neg_weight, None
    kl_value = cfg.beta * kappa
    if not cfg.clip:
        return torch.addcmul(kl_value, w, adv, value=-1.0), neg_weight, neg_weight, None
    x, active, high, low = dual_clip_ratio(adv >= 0, w, cfg)  # DualClip(w, A) on the reward part only
    slope = torch.addcmul(k_w, w * active, adv, value=-1.0)
    return torch.addcmul(kl_value, x, adv, value=-1.0), slope, neg_weight, (active, high, low)


def loss_terms(cfg, agg: str | None, log_prob, old_log_prob, advantages, mask, ref_log_prob=None):
    """(out, slope, stats) of one RPG loss, no autograd.

    agg=None: out = per-token loss [B, T] (0 where mask == 0) and slope its derivative in l.
    agg=<verl mode>: out = the aggregated scalar sum_t a_t*value_t and slope = a_t*slope_t.
    stats: float64 vector, WEIGHTED_SUMS then EXTREMES then VALID_COUNTS (one host read-back).
    Inputs are float32 or wider (``rpg.math.losses`` upcasts), all [B, T].

    Statistics are taken as soon as their tensor exists, and a tensor is dropped (or overwritten in
    place) once nothing needs it: the eager peak memory stays at verl's vanilla loss's level.
    Weighted sums are dot products with the mask, counts ``count_nonzero`` of whole tensors (a
    stacked or per-row count would first copy the flags to int64), extremes masked reductions.
    """
    guard = cfg.log_ratio_guard
    l, l_old, adv = log_prob, old_log_prob, advantages
    valid = mask != 0
    n = mask.sum()
    m = mask.reshape(-1)

    def dot(t):
        return torch.dot(t.reshape(-1), m)

    # raw log-ratio (0 where masked: a non-finite log-prob in padding, e.g. -inf - -inf, must reach
    # neither the loss, nor the gradient, nor a metric: 0 * NaN = NaN): its statistics, then the guard
    log_w = torch.where(valid, l - l_old, 0.0)
    lw_sum, lw_max = dot(log_w), torch.where(valid, log_w, -math.inf).amax()
    neg_lw_max = -torch.where(valid, log_w, math.inf).amin()
    guarded = torch.count_nonzero((log_w.abs() > guard) & valid)
    log_w = log_w.clamp_(-guard, guard)
    w = log_w.exp()
    extremes = []
    if ref_log_prob is None:  # anchor = sampler (iterative reference): rho = w, r_ref = 1
        r_ref, log_r_ref, log_rho = 1.0, 0.0, log_w
    else:  # three-policy weights (docs/math.md#three-policies); r_ref = a / mu is data
        log_r_ref = torch.where(valid, ref_log_prob - l_old, 0.0)
        extremes.append(torch.where(valid, log_r_ref, 0.0).abs().amax())  # max |l_ref - l_old|, unclamped
        log_r_ref = log_r_ref.clamp_(-guard, guard)
        r_ref = log_r_ref.exp()
        log_rho = log_w - log_r_ref
    kappa = kl_surrogate(cfg.divergence, w, log_rho, r_ref)
    if cfg.form == "reinforce":  # kappa only for the KL estimate
        kl_sum = dot(kappa)
        del kappa
        value, slope, neg_weight, regions = _reinforce(l, w, log_w, adv, r_ref, log_r_ref, cfg)
    else:
        if cfg.kl_clamp is not None:  # value-only guard: the slope keeps d(beta*kappa)/dl
            kappa = kappa.clamp(-cfg.kl_clamp, cfg.kl_clamp)
        kl_sum = dot(kappa)
        value, slope, neg_weight, regions = _differentiable(w, log_w, log_rho, kappa, adv, r_ref, log_r_ref, cfg)
        del kappa
    del log_w, log_rho, r_ref, log_r_ref

    # where, not a multiply by the mask: the REINFORCE value -W*l is non-finite where l is (padding)
    value, slope = torch.where(valid, value, 0.0), torch.where(valid, slope, 0.0)
    if agg is None:
        out = value
    else:
        weights = agg_weights(mask, agg, n=n)
        out = (value * weights).sum()
        slope = slope * weights
        del weights
    del value

    neg_reg_adv = (neg_weight / w).clamp(-1e30, 1e30)  # -A' = -W/w, saturated so that w -> 0 stays finite
    del neg_weight
    sums = [n, dot(w), kl_sum, dot(neg_reg_adv), lw_sum]
    extremes = [lw_max, neg_lw_max, torch.where(valid, neg_reg_adv, 0.0).abs().amax()] + extremes
    counts = [torch.count_nonzero(valid), guarded] + [torch.count_nonzero(f & valid) for f in regions or ()]
    stats = torch.cat((torch.stack(sums + extremes).double(), torch.stack(counts)))
    return out, slope, stats
