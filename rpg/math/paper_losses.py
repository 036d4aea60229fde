"""The RPG losses in plain autograd, one line per row of the paper's tables: the tests' oracle.

Formulas and symbols are those of docs/math.md: l = log πθ, w = πθ/π_old, r_ref = a/π_old (1 when the anchor a is
π_old), ρ = w/r_ref, A the advantage, SG = ``detach``. ``rpg.math.losses`` computes the same losses fused (closed-form
slopes, metrics, one pass); tests/math/test_paper_losses.py checks that both agree in value and gradient. No
numerical guard (log_ratio_guard, kl_clamp) is stated here: inputs must lie inside them.
"""

import torch


def phi(divergence, rho):
    """φ_D with ∇D = E_πθ[φ_D(ρ)·∇log πθ] (Props. E.1, E.3, 3.2, 3.6)."""
    return {"fkl": -1 / rho, "ufkl": 1 - 1 / rho, "rkl": rho.log() + 1, "urkl": rho.log()}[divergence]


def kl_weight(divergence, beta, x, r_ref):
    """C_D(x) = −β·x·φ_D(x/r_ref): the REINFORCE weight is W = w·A + C_D(w) (Table 2, App. F)."""
    return -beta * x * phi(divergence, x / r_ref)


def kappa(divergence, w, r_ref, log_rho):
    """κ_D with E_π_old[κ_D] = D, the fully differentiable regularizer (Tables 1 and 4)."""
    return {"fkl": -r_ref * log_rho, "ufkl": w - r_ref - r_ref * log_rho,
            "rkl": w * log_rho, "urkl": w * log_rho - w + r_ref}[divergence]


def dual_clip(r, adv, lo, hi, c):
    """Dual-clip PPO as a loss (App. G.1): max(−r·Â, −clip(r, lo, hi)·Â), capped at −c·Â where Â < 0 (the
    gradient at a tie, r = lo, hi or c exactly, is autograd's convention)."""
    ppo = torch.maximum(-r * adv, -r.clamp(lo, hi) * adv)
    return torch.where(adv >= 0, ppo, torch.minimum(ppo, -c * adv))


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
        up = a_reg >= 0 if cfg.branch_on == "regularized" else adv > 0
        active = torch.where(up, w < hi, (lo < w) & (w < c))
        x = torch.where(up, w.clamp(max=hi), w.clamp(lo, c))  # the clip constant where clipped
        return torch.where(active, -w * a_reg * l, -(adv * x + C) * l.detach())
    if cfg.fd_clip == "algorithm1":  # Algorithm 1: DualClip(w, Â(θ)), Â = A − β·φ(ρ) differentiated too
        a_hat = adv - beta * phi(d, w / r_ref)
        return dual_clip(w, a_hat, lo, hi, c) if cfg.clip else -w * a_hat
    reward = dual_clip(w, adv, lo, hi, c) if cfg.clip else -w * adv  # Tables 1/4; the clip on the reward only
    return reward + beta * kappa(d, w, r_ref, log_rho)


def aggregate(loss, mask, mode, scale=None):
    """verl's ``loss_agg_mode``; S = rows with a valid token, T = width (``scale``); an empty batch gives 0."""
    total, tokens = loss * mask, mask.sum(-1)
    rows = (tokens > 0).sum().clamp(min=1)
    if mode == "token-mean":
        return total.sum() / mask.sum().clamp(min=1)
    if mode == "token-sum":
        return total.sum()
    if mode == "seq-mean-token-mean":
        return (total.sum(-1) / tokens.clamp(min=1)).sum() / rows
    if mode == "seq-mean-token-sum":
        return total.sum() / rows
    return total.sum() / (rows * (loss.shape[-1] if scale is None else scale))  # seq-mean-token-sum-norm


def loss(cfg, l, l_old, adv, mask, l_ref=None):
    """The scalar loss of ``cfg``: ``per_token_loss`` aggregated with ``cfg.loss_agg_mode``."""
    return aggregate(per_token_loss(cfg, l, l_old, adv, l_ref), mask, cfg.loss_agg_mode)


def grpo_corrected_kl(l, l_old, l_ref):
    """GRPO's KL with its weight, w·k3(π_ref/πθ), k3(y) = y − 1 − log y (Sec. 2.2, Eq. (3.2)); w is differentiable,
    so the expected gradient is ∇KL(πθ‖π_ref) at every θ."""
    y = (l_ref - l).exp()
    return (l - l_old).exp() * (y - 1 - y.log())


def behavior_weight(l_old, l_mu, mask, level="token", cap=None):
    """b = π_old/μ per token, or Π_t π_old/μ over the response (``sequence``), or 1 (``none``); min(b, cap)."""
    log_b = (l_old - l_mu) * mask
    b = {"token": log_b.exp(), "sequence": log_b.sum(-1, keepdim=True).exp().expand_as(log_b),
         "none": torch.ones_like(log_b)}[level]
    return (b if cap is None else b.clamp(max=cap)) * mask
