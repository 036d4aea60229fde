"""Exact enumeration over small categorical distributions (the set-up of docs/math.md#testable-identities), float64.

A "bandit" has K outcomes; pi_theta = softmax(z) with z the parameters. The objectives J and
divergences (those in ``rpg_lab.exact``) are written in closed form, independently of ``rpg``; their gradients are
taken by autograd of those closed forms (and checked once against central finite differences).
A surrogate's expectation E_mu[loss] is computed with the library itself by laying the K
outcomes out as K one-token rows whose mask is mu(x): token-mean aggregation with a float
mask is then exactly sum_x mu(x) * loss(x).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rpg.math.fused import RPGLossConfig, rpg_policy_loss

# the divergences live in the lab, where the conformance report (python -m rpg_lab.conformance) reads them too
from rpg_lab.exact import DT, divergence, kl, ukl  # noqa: F401


def dual_clip_ppo(r: torch.Tensor, adv: torch.Tensor, lo: float, hi: float, c: float) -> torch.Tensor:
    """Dual-clip PPO as the paper writes it (App. G.1), independently of ``rpg``: max(−r·A, −clip(r, lo, hi)·A),
    capped at −c·A where A < 0 (the gradient at a tie, r = lo, hi or c exactly, is autograd's convention)."""
    ppo = torch.maximum(-r * adv, -r.clamp(lo, hi) * adv)
    return torch.where(adv >= 0, ppo, torch.minimum(ppo, -c * adv))


@dataclass
class Bandit:
    z: torch.Tensor  # parameters (requires grad)
    z_old: torch.Tensor
    z_ref: torch.Tensor
    reward: torch.Tensor
    mass: float = 1.0  # Z_old: the anchor measure is mass * softmax(z_old)

    @staticmethod
    def make(k: int = 6, seed: int = 0, mass: float = 1.0, drift: float = 0.3) -> "Bandit":
        g = torch.Generator().manual_seed(seed)
        z_old = torch.randn(k, generator=g, dtype=DT)
        z = (z_old + drift * torch.randn(k, generator=g, dtype=DT)).requires_grad_(True)
        z_ref = torch.randn(k, generator=g, dtype=DT)
        reward = torch.randn(k, generator=g, dtype=DT)
        return Bandit(z, z_old, z_ref, reward, mass)

    @property
    def pi(self) -> torch.Tensor:
        return torch.softmax(self.z, 0)

    @property
    def mu(self) -> torch.Tensor:
        """Normalized sampling distribution pi~_old."""
        return torch.softmax(self.z_old, 0)

    @property
    def m_old(self) -> torch.Tensor:
        """Anchor measure Z * pi~_old (== mu when mass = 1)."""
        return self.mass * self.mu

    @property
    def pi_ref(self) -> torch.Tensor:
        return torch.softmax(self.z_ref, 0)

    def objective(self, name: str, beta: float, anchor: torch.Tensor | None = None) -> torch.Tensor:
        """J(theta) = E_pi[R] - beta * D(pi, anchor); anchor defaults to m_old."""
        anchor = self.m_old if anchor is None else anchor
        return (self.pi * self.reward).sum() - beta * divergence(name, self.pi, anchor)

    def grad(self, scalar: torch.Tensor) -> torch.Tensor:
        (g,) = torch.autograd.grad(scalar, self.z, retain_graph=True)
        return g

    def rows(self, baseline: float = 0.0, three_policy: bool = False):
        """Library inputs: K one-token rows, mask = sampler probabilities."""
        log_prob = torch.log_softmax(self.z, 0).unsqueeze(1)
        old = (torch.log_softmax(self.z_old, 0) + torch.log(torch.tensor(self.mass, dtype=DT))).unsqueeze(1)
        adv = (self.reward - baseline).unsqueeze(1)
        mask = self.mu.unsqueeze(1)
        ref = torch.log_softmax(self.z_ref, 0).unsqueeze(1) if three_policy else None
        return log_prob, old, adv, mask, ref

    def expected_loss(self, cfg: RPGLossConfig, baseline: float = 0.0, three_policy: bool = False) -> torch.Tensor:
        """Z * E_{pi~_old}[loss] computed by the library (token-mean over probability-weighted rows)."""
        log_prob, old, adv, mask, ref = self.rows(baseline, three_policy)
        loss, _ = rpg_policy_loss(log_prob=log_prob, old_log_prob=old, advantages=adv, response_mask=mask, config=cfg, ref_log_prob=ref)
        return self.mass * loss


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-8, atol: float = 1e-10, what: str = "") -> None:
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")
