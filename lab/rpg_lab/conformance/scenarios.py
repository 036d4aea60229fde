"""The policies the report is scored on: small tabular autoregressive policies over every sequence of a space
(``rpg_lab.exact.Space``), a fixed reference π_ref, and the sampler μ: πθ itself (on-policy) or an older policy at a
set sequence-level distance KL(μ‖πθ) (off-policy). A scenario's batch is what every probe receives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rpg_lab.exact import DT, Space, kl

SHAPES = ((1, 6), (2, 4), (3, 3))  # (T, V): one token over 6, two over 4, three over 3
DISTANCES = (0.01, 0.1, 0.3, 1.0)  # KL(μ‖πθ) of the off-policy samplers, over whole sequences
SEEDS = (0, 1, 2)
ON_POLICY = 0.0  # the distance of the on-policy sampler, μ = πθ


@dataclass(frozen=True)
class Scenario:
    space: Space
    seed: int
    distance: float  # KL(μ‖πθ) asked for; ON_POLICY: μ = πθ
    z: torch.Tensor  # πθ's logits table [n_prefixes, V]
    z_mu: torch.Tensor
    z_ref: torch.Tensor

    @property
    def mu(self) -> torch.Tensor:
        """[N]: the sampler's probability of each sequence (the weight of its row in every expectation)."""
        return self.space.probs(self.z_mu)

    @property
    def l_mu(self) -> torch.Tensor:
        return self.space.token_logprobs(self.z_mu)

    def kl_mu_pi(self) -> float:
        return float(kl(self.mu, self.space.probs(self.z)))

    def batch(self, keys: list[str]) -> dict:
        """The probes' request (``probes.protocol``)."""
        s = self.space
        return {"l": s.token_logprobs(self.z), "l_mu": self.l_mu, "l_ref": s.token_logprobs(self.z_ref),
                "logits": s.logits(self.z), "seqs": s.seqs, "keys": list(keys)}


def _sampler_at(space: Space, z: torch.Tensor, direction: torch.Tensor, distance: float) -> torch.Tensor:
    """z + s·direction with s such that KL(μ‖πθ) = ``distance`` over the space's sequences, to 1e-12 relative:
    Newton's steps on s (the derivative by autograd) kept inside a bracket [lo, hi] with KL(lo) < distance <
    KL(hi), a bisection where a step would leave it."""
    pi = space.probs(z)

    def gap(s: float) -> tuple[float, float]:
        s = torch.tensor(s, dtype=DT, requires_grad=True)
        value = kl(space.probs(z + s * direction), pi) - distance
        return float(value.detach()), float(torch.autograd.grad(value, s)[0])

    lo, hi = 0.0, 1.0
    while gap(hi)[0] < 0:
        lo, hi = hi, 2 * hi
        if hi > 1e4:
            raise ValueError(f"no sampler at KL(mu||pi) = {distance} along this direction")
    s = hi
    for _ in range(100):
        value, slope = gap(s)
        if abs(value) <= 1e-12 * distance:
            return z + s * direction
        lo, hi = (s, hi) if value < 0 else (lo, s)
        step = s - value / slope if slope > 0 else None
        s = step if step is not None and lo < step < hi else (lo + hi) / 2
    raise ValueError(f"no sampler at KL(mu||pi) = {distance}: the search did not converge")


def scenarios(shapes=SHAPES, distances=DISTANCES, seeds=SEEDS) -> list[Scenario]:
    """Every (shape, seed) draws πθ, π_ref and the direction μ moves along, standard normal logits; then μ = πθ
    and μ at each distance. The same πθ and π_ref for every sampler of a (shape, seed)."""
    out = []
    for T, V in shapes:
        space = Space.make(T, V)
        for seed in seeds:
            g = torch.Generator().manual_seed(1000 * T + 100 * V + seed)
            z, z_ref, direction = (torch.randn(space.n_prefixes, V, generator=g, dtype=DT) for _ in range(3))
            out.append(Scenario(space, seed, ON_POLICY, z, z.clone(), z_ref))
            out += [Scenario(space, seed, d, z, _sampler_at(space, z, direction, d), z_ref) for d in distances]
    return out
