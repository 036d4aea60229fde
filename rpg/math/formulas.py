"""The paper's formulas in torch, per token, one function per formula: the RPG losses and their pieces.

Symbols of docs/math.md: l = log πθ, w = πθ/π_old = exp(l − l_old), r_ref = a/π_old (1 when the anchor a is π_old),
ρ = w/r_ref, A the advantage, SG = ``detach``. ``per_token_loss`` and ``loss`` state every loss of docs/math.md's
table in plain autograd, a line per row: the tests' oracle (tests/math/test_formulas.py: their expected gradient is
−∇J by enumeration, and ``rpg.math.fused``, the one-pass closed form that training runs, equals them in value and
gradient). The pieces (``kappa``, ``kl_weight``, ``phi``, ``k3``, ``dual_clip``, ``agg_weights``) are the ones the
fused path and the trainer use: each is written once. No numerical guard (log_ratio_guard, kl_clamp) is stated in
``per_token_loss``: inputs must lie inside them.
"""

from __future__ import annotations

import torch

from rpg.config.loss import AGG_MODES, DIVERGENCES  # the names, declared torch-free with the loss settings


def k3(y, log_y):
    """Schulman's k3(y) = y − 1 − log y ≥ 0 (Eq. (3.2), App. D), given y and log y."""
    return y - log_y - 1.0


def phi(divergence, log_rho):
    """φ_D(ρ) with ∇D = E_πθ[φ_D(ρ)·∇log πθ] (Props. E.1, E.3, 3.2, 3.6), from log ρ, for the reverse divergences,
    the ones Algorithm 1's Â = A − β·φ_D(ρ) is defined for: rkl log ρ + 1, urkl log ρ. The forward ones' φ (fkl −1/ρ,
    ufkl 1 − 1/ρ) enter only through C_D = −β·x·φ_D, in closed form in ``kl_weight``."""
    if divergence == "rkl":
        return log_rho + 1.0
    if divergence == "urkl":
        return log_rho
    raise ValueError(f"Algorithm 1 is defined for divergence in ('rkl', 'urkl'), got {divergence!r}")


def kappa(divergence, w, log_rho, r_ref):
    """κ_D with E_π_old[κ_D] = D, the fully differentiable regularizer (Tables 1 and 4, three-policy form); its
    autograd gradient is ∇D, and d(β·κ_D)/dl = −C_D(w) (``kl_weight``).
    Derivation: docs/math.md#fully-differentiable-losses.

    ==========  ===============================  =======================  ==========================
    divergence  κ_D                              a = π_old (r_ref = 1)    d κ / d l
    ==========  ===============================  =======================  ==========================
    fkl         −r_ref·log ρ                     −log w        (k1)       −r_ref
    ufkl        w − r_ref − r_ref·log ρ          w − 1 − log w (k3)       w − r_ref
    rkl         w·log ρ                          w log w                  w (log ρ + 1)
    urkl        w·log ρ − w + r_ref              w log w − w + 1          w log ρ
    ==========  ===============================  =======================  ==========================

    E_π_old[κ] = KL(a‖πθ) (fkl), UKL(a‖πθ) (ufkl), KL(πθ‖a) (rkl), UKL(πθ‖a) (urkl). The urkl form is
    w·k3(a/πθ) ≥ 0, GRPO's corrected KL (Sec. 2.2; docs/math.md#grpos-kl-and-its-correction).
    ``r_ref`` the float 1.0: the sampler anchor, the products with r_ref left out.
    """
    sampler = isinstance(r_ref, float) and r_ref == 1.0
    if divergence == "fkl":
        return -log_rho if sampler else -r_ref * log_rho
    if divergence == "ufkl":
        return (w - 1.0) - log_rho if sampler else w - r_ref - r_ref * log_rho
    if divergence == "rkl":
        return w * log_rho
    if divergence == "urkl":
        return w * log_rho - w + r_ref
    raise ValueError(f"divergence={divergence!r} is not one of {DIVERGENCES}")


def kl_weight(divergence, beta, x, r_ref, log_rho=None):
    """C_D(x) = −β·x·φ_D(x/r_ref): the REINFORCE weight is W = w·A + C_D(w) (Table 2, App. F), and RPG-Style Clip
    takes C at the clipped ratio w̄ (Remark F.2). ``log_rho``: log(x/r_ref) where the caller has it.
    Derivation: docs/math.md#exact-gradient-and-the-reinforce-weight.

    ==========  =============================  ============================
    divergence  C_D(x), ρ = x/r_ref            a = π_old (r_ref = 1)
    ==========  =============================  ============================
    fkl         +β·r_ref                       +β
    ufkl        −β·(x − r_ref)                 −β·(x − 1)
    rkl         −β·x·(log ρ + 1)               −β·x·(log x + 1)
    urkl        −β·x·log ρ                     −β·x·log x
    ==========  =============================  ============================
    """
    if divergence == "fkl":
        return beta * (r_ref * torch.ones_like(x))
    if divergence == "ufkl":
        return -beta * (x - r_ref)
    log_rho = (x / r_ref).log() if log_rho is None else log_rho
    if divergence == "rkl":
        return -beta * x * (log_rho + 1.0)
    if divergence == "urkl":
        return -beta * x * log_rho
    raise ValueError(f"divergence={divergence!r} is not one of {DIVERGENCES}")


def dual_clip(w, positive, lo, hi, c):
    """Dual-clip PPO (App. G.1) on the branch ``positive`` (Â ≥ 0), as the ratio x it keeps: its loss
    max(−w·Â, −clip(w, lo, hi)·Â), capped at −c·Â where Â < 0, is −Â·x with x = min(w, hi) on the positive branch
    and clip(w, lo, c) on the negative. ``active``: the tokens whose gradient flows, lo < w < c on the negative
    branch and w < hi on the positive one (Algorithm 2 clips at the bounds themselves). docs/math.md#dual-clip."""
    x = torch.where(positive, w.clamp(max=hi), w.clamp(lo, c))
    active = (positive & (w < hi)) | (~positive & (w > lo) & (w < c))
    return x, active


def per_token_loss(cfg, l, l_old, adv, l_ref=None):
    """loss_t of ``cfg`` (an ``RPGLossConfig``); ``l_ref=None``: the anchor is π_old (the iterative reference)."""
    l_ref = l_old if l_ref is None else l_ref
    w, r_ref, log_rho = (l - l_old).exp(), (l_ref - l_old).exp(), l - l_ref
    lo, hi, c, beta, d = 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high, cfg.clip_ratio_c, cfg.beta, cfg.divergence
    if cfg.form == "reinforce" and not cfg.clip:  # Table 2: −SG(w·A + C(w))·l
        return -(w * adv + kl_weight(d, beta, w, r_ref)).detach() * l
    if cfg.form == "reinforce":  # RPG-Style Clip: Eq. (4.1), Algorithm 2 with C at w̄ (Remark F.2)
        w, C = w.detach(), kl_weight(d, beta, w.clamp(lo, hi), r_ref).detach()
        a_reg = adv + C / w  # A' = A + C(w̄)/w
        x, active = dual_clip(w, a_reg >= 0 if cfg.branch_on == "regularized" else adv > 0, lo, hi, c)
        return torch.where(active, -w * a_reg * l, -(adv * x + C) * l.detach())  # the clip constant where clipped
    if cfg.fd_clip == "algorithm1":  # Algorithm 1: DualClip(w, Â(θ)), Â = A − β·φ(ρ) differentiated too
        a_hat = adv - beta * phi(d, log_rho)
        return -a_hat * dual_clip(w, a_hat >= 0, lo, hi, c)[0] if cfg.clip else -w * a_hat
    # Tables 1/4: the clip on the reward only (its gradient at a tie w = lo, hi or c is autograd's convention)
    reward = -adv * dual_clip(w, adv >= 0, lo, hi, c)[0] if cfg.clip else -w * adv
    return reward + beta * kappa(d, w, log_rho, r_ref)


def agg_weights(mask, mode, scale=None, n=None):
    """verl's ``loss_agg_mode`` as per-token weights a_t, loss = Σ_t a_t·loss_t (every mode is linear), S = rows with
    a valid token, T = width (``scale``): token-sum m; token-mean m/Σm; seq-mean-token-mean m/(Σ_row m·S);
    seq-mean-token-sum m/S; seq-mean-token-sum-norm m/(S·T). An empty batch or row weighs 0 (never 0/0); float
    masks are weights. ``n``: Σm if the caller has it already."""
    if mode == "token-sum":
        return mask
    if mode == "token-mean":
        n = mask.sum() if n is None else n
        return mask / torch.where(n > 0, n, 1.0)
    tokens = mask.sum(dim=-1, keepdim=True)
    rows = (tokens > 0).sum().clamp(min=1)
    if mode == "seq-mean-token-mean":
        return mask / (torch.where(tokens > 0, tokens, 1.0) * rows)
    if mode == "seq-mean-token-sum":
        return mask / rows
    if mode == "seq-mean-token-sum-norm":
        return mask / (rows * (scale if scale is not None else mask.shape[-1]))
    raise ValueError(f"loss_agg_mode={mode!r} is invalid: expected one of {AGG_MODES}")


def aggregate(loss, mask, mode, scale=None):
    """Σ_t a_t·loss_t (``agg_weights``): verl's ``agg_loss`` with one data-parallel rank, except that an all-masked
    batch gives 0 (verl: 0/0) and a non-finite loss where masked is left out."""
    mask = mask.to(loss.dtype)
    return (torch.where(mask != 0, loss, 0.0) * agg_weights(mask, mode, scale)).sum()


def loss(cfg, l, l_old, adv, mask, l_ref=None):
    """The scalar loss of ``cfg``: ``per_token_loss`` aggregated with ``cfg.loss_agg_mode``."""
    return aggregate(per_token_loss(cfg, l, l_old, adv, l_ref), mask, cfg.loss_agg_mode)


def grpo_corrected_kl(l, l_old, l_ref):
    """GRPO's KL with its weight, w·k3(π_ref/πθ) (Sec. 2.2, Eq. (3.2)); w is differentiable, so the expected gradient
    is ∇KL(πθ‖π_ref) at every θ."""
    return (l - l_old).exp() * k3((l_ref - l).exp(), l_ref - l)


def behavior_weight(l_old, l_mu, mask, level="token", cap=None):
    """b = π_old/μ per token, or Π_t π_old/μ over the response (``sequence``), or 1 (``none``); min(b, cap)."""
    log_b = (l_old - l_mu) * mask
    b = {"token": log_b.exp(), "sequence": log_b.sum(-1, keepdim=True).exp().expand_as(log_b),
         "none": torch.ones_like(log_b)}[level]
    return (b if cap is None else b.clamp(max=cap)) * mask
