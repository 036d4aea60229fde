"""A term's expected gradient under the sampler, exactly, and its distance to each divergence's exact gradient.

For a term used as a **loss** the expected gradient is Σ_y μ(y)·∇Σ_t term_t(y); the probe gives each token's slope
∂Σ_t term_t/∂l_s, so it is the gradient of Σ_y μ(y) Σ_s SG(slope)·l_s(θ) (the chain rule through the log-probs;
or through the logits, for a probe that differentiates there). For a KL folded into the **reward** the trainer's
PPO loss −w_t·A_t with A_t = −β·Σ_s kl_s(y) (the sequence's summed penalty as each token's advantage, no baseline,
γ = 1) and w_t = πθ/μ per token has the expected gradient β·Σ_y μ(y) Σ_t w_t·Σ_s kl_s(y)·∇l_t. β = 1 throughout;
the frameworks' aggregation divides by a positive constant in this set-up (every sequence has T tokens), left out.
"""

from __future__ import annotations

import torch

from rpg_lab.conformance.scenarios import Scenario
from rpg_lab.exact import DIVERGENCES, divergence

# a gradient matches a divergence's within these relative errors, by the precision the framework computed in
MATCH_RTOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def target_gradients(scn: Scenario) -> dict[str, torch.Tensor]:
    """∇θ D(πθ, π_ref) of each divergence over whole sequences (``rpg_lab.exact.divergence``)."""
    z = scn.z.clone().requires_grad_(True)
    pi, ref = scn.space.probs(z), scn.space.probs(scn.z_ref)
    return {d: torch.autograd.grad(divergence(d, pi, ref), z, retain_graph=True)[0] for d in DIVERGENCES}


def expected_gradient(scn: Scenario, terms: dict, form: str) -> torch.Tensor:
    """The term's exact expected gradient under the scenario's sampler (module docstring), w.r.t. πθ's logits."""
    z = scn.z.clone().requires_grad_(True)
    mu = scn.mu
    if form == "loss" and "slope_logits" in terms:
        surrogate = (mu[:, None, None] * terms["slope_logits"].to(mu.dtype) * scn.space.logits(z)).sum()
    elif form == "loss":
        surrogate = (mu[:, None] * terms["slope"].to(mu.dtype) * scn.space.token_logprobs(z)).sum()
    elif form == "reward":
        penalty = terms["value"].to(mu.dtype).sum(-1, keepdim=True)  # Σ_s kl_s(y), every token's −A_t/β
        w = (scn.space.token_logprobs(z) - scn.l_mu).exp()
        surrogate = (mu[:, None] * w * penalty).sum()
    else:
        raise ValueError(f"form must be 'loss' or 'reward', got {form!r}")
    return torch.autograd.grad(surrogate, z)[0]


def distances(g: torch.Tensor, targets: dict[str, torch.Tensor]) -> dict[str, float]:
    """rel_err_D = ‖g − ∇D‖/‖∇D‖ and cos_D = ⟨g, ∇D⟩/(‖g‖‖∇D‖) (NaN when g = 0) for each divergence."""
    out = {"grad_norm": float(g.norm())}
    for d, t in targets.items():
        out[f"rel_err_{d}"] = float((g - t).norm() / t.norm())
        out[f"cos_{d}"] = float((g * t).sum() / (g.norm() * t.norm())) if g.norm() > 0 else float("nan")
    out["target_norm"] = float(targets["rkl"].norm())
    return out


def matches(scores: dict[str, float], rtol: float) -> str:
    """Which divergences' gradients the term's equals, within ``rtol``: 'rkl urkl', 'fkl ufkl' (the normalised and
    unnormalised forms have one gradient when both policies are normalised, T4), 'zero', or 'none'."""
    if scores["grad_norm"] <= rtol * scores["target_norm"]:
        return "zero"
    hit = [d for d in DIVERGENCES if scores[f"rel_err_{d}"] <= rtol]
    return " ".join(hit) if hit else "none"
