"""The per-token KL pieces of the RPG objectives J = E_πθ[R] − β·D, in three-policy form (docs/math.md, App. D-F).

w = exp(l − l_old), r_ref = exp(l_ref − l_old) (1 when the anchor a is π_old), log ρ = l − l_ref:

* ``kl_surrogate`` κ_D: E_π_old[κ_D] = D, and its autograd gradient is ∇D (the fully differentiable losses);
* ``kl_weight`` C_D(x) = −β·x·φ_D(x/r_ref): the REINFORCE weight W = w·A + C_D(w) gives −E_π_old[W·∇l] = −∇J;
* ``kl_phi`` φ_D (Algorithm 1) and ``k3(y) = y − 1 − log y``.

d(β·κ_D)/dl = −C_D(w): unclipped, both forms have the same gradient token by token.
"""

from __future__ import annotations

import torch

from rpg.config.loss import DIVERGENCES  # the names, declared torch-free with the loss settings


def kl_surrogate(divergence: str, w: torch.Tensor, log_rho: torch.Tensor, r_ref: torch.Tensor | float) -> torch.Tensor:
    """Differentiable per-token KL surrogate kappa_D (Tables 1 and 4, three-policy form).

    Derivation: docs/math.md#fully-differentiable-losses.

    ==========  ===============================  =======================  ==========================
    divergence  kappa_D                          a = mu (iterative ref)   d kappa / d l
    ==========  ===============================  =======================  ==========================
    fkl         -r_ref * log_rho                 -log w        (k1)       -r_ref
    ufkl        w - r_ref - r_ref * log_rho      w - 1 - log w (k3)       w - r_ref
    rkl         w * log_rho                      w log w                  w (log_rho + 1)
    urkl        w * log_rho - w + r_ref          w log w - w + 1          w log_rho
    ==========  ===============================  =======================  ==========================

    E_mu[kappa] = KL(a||pi) (fkl), UKL(a||pi) (ufkl), KL(pi||a) (rkl), UKL(pi||a) (urkl).
    The urkl form is w * k3(a / pi_theta) >= 0: exactly GRPO's corrected KL (Sec. 2.2;
    docs/math.md#grpos-kl-and-its-correction).
    """
    sampler = isinstance(r_ref, float) and r_ref == 1.0  # anchor = sampler: skip the r_ref products
    if divergence == "fkl":
        return -log_rho if sampler else -r_ref * log_rho
    if divergence == "ufkl":
        return (w - 1.0) - log_rho if sampler else w - r_ref - r_ref * log_rho
    if divergence == "rkl":
        return w * log_rho
    if divergence == "urkl":
        return w * log_rho - w + r_ref
    raise ValueError(f"divergence={divergence!r} is not one of {DIVERGENCES}")


def kl_weight(
    divergence: str, beta: float, x: torch.Tensor, log_x: torch.Tensor | None, r_ref: torch.Tensor | float,
    log_r_ref: torch.Tensor | float,
) -> torch.Tensor:
    """KL component C_D of the REINFORCE weight, evaluated at ratio x.

    Derivation: docs/math.md#exact-gradient-and-the-reinforce-weight.

    With rho_x = x / r_ref (so log rho_x = log x - log r_ref), C_D(x) = -beta * x * phi_D(rho_x):

    ==========  =============================  ============================
    divergence  C_D(x)                         a = mu (r_ref = 1)
    ==========  =============================  ============================
    fkl         +beta * r_ref                  +beta
    ufkl        -beta * (x - r_ref)            -beta (x - 1)
    rkl         -beta * x * (log rho_x + 1)    -beta x (log x + 1)
    urkl        -beta * x * log rho_x          -beta x log x
    ==========  =============================  ============================

    At x = w this is exactly the KL part of the weight of Props. F.1-F.5 (Table 2 / App. F):
    the loss -SG(w*A + C_D(w)) * l has gradient -grad J at every theta. For RPG-Style Clip
    x is the clipped ratio w_bar (Remark F.2; docs/math.md#rpg-style-clip).
    """
    if divergence == "fkl":
        return beta * (r_ref * torch.ones_like(x))
    if divergence == "ufkl":
        return -beta * (x - r_ref)
    log_rho = log_x - log_r_ref
    if divergence == "rkl":
        return -beta * x * (log_rho + 1.0)
    if divergence == "urkl":
        return -beta * x * log_rho
    raise ValueError(f"divergence={divergence!r} is not one of {DIVERGENCES}")


def kl_phi(divergence: str, log_rho: torch.Tensor) -> torch.Tensor:
    """phi_D(rho) (docs/math.md#exact-gradient-and-the-reinforce-weight), used by the paper-literal
    Algorithm 1 (regularized A-hat = A - beta*phi).

    Only defined here for the reverse directions, the ones Algorithm 1 specifies
    (rkl: log rho + 1, urkl: log rho). For the forward directions a differentiable A-hat
    = A + C/w cancels the KL gradient entirely, so Algorithm 1 is rejected for them upstream.
    """
    if divergence == "rkl":
        return log_rho + 1.0
    if divergence == "urkl":
        return log_rho
    raise ValueError(f"Algorithm 1 is defined for divergence in ('rkl', 'urkl'), got {divergence!r}")


def k3(y: torch.Tensor, log_y: torch.Tensor) -> torch.Tensor:
    """Schulman's k3(y) = y - 1 - log y >= 0 (Eq. (3.2), App. D), given y and log y."""
    return y - 1.0 - log_y
