"""Exact enumeration over small categorical distributions and short sequences, in float64: the oracles of the
tests (tests/support/exact_enumeration.py re-exports the divergences) and of the conformance report.

A distribution is a vector over its outcomes; for sequences the outcomes are all V**T sequences of a ``Space`` and
a policy is autoregressive and tabular: one row of logits per prefix, π(y) = Π_t softmax(z[prefix(y, t)])[y_t].
The divergences are written in closed form (docs/math.md#objectives-and-divergences); gradients are autograd's.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

DT = torch.float64


def kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p||q) = sum p log(p/q)."""
    return (p * (p.log() - q.log())).sum()


def ukl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Unnormalized KL for non-negative measures: sum p log(p/q) + sum (q - p)."""
    return kl(p, q) + (q - p).sum()


DIVERGENCES = ("rkl", "urkl", "fkl", "ufkl")


def divergence(name: str, pi: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """D(theta) of each objective (docs/math.md#objectives-and-divergences): forward ones have the anchor first."""
    return {"fkl": lambda: kl(anchor, pi), "ufkl": lambda: ukl(anchor, pi),
            "rkl": lambda: kl(pi, anchor), "urkl": lambda: ukl(pi, anchor)}[name]()


@dataclass(frozen=True)
class Space:
    """All sequences of length ``T`` over ``V`` tokens (itertools.product order) and the prefixes they pass:
    ``prefix[n, t]`` is the row of the logits table that gives token t of sequence n (prefixes of length t,
    ordered by length, then as in itertools.product)."""

    T: int
    V: int
    seqs: torch.Tensor  # [N, T] token ids
    prefix: torch.Tensor  # [N, T] logits row of each position

    @staticmethod
    def make(T: int, V: int) -> "Space":
        if T < 1 or V < 2:
            raise ValueError(f"a sequence space needs T >= 1 and V >= 2, got T={T}, V={V}")
        seqs = torch.tensor(list(itertools.product(range(V), repeat=T)), dtype=torch.long)
        offset = [sum(V**s for s in range(t)) for t in range(T)]  # first row of the prefixes of length t
        rows = [[offset[t] + sum(int(y[s]) * V ** (t - 1 - s) for s in range(t)) for t in range(T)] for y in seqs]
        return Space(T, V, seqs, torch.tensor(rows, dtype=torch.long))

    @property
    def n_prefixes(self) -> int:
        return sum(self.V**t for t in range(self.T))

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        """[N, T, V]: the logits each position of each sequence is drawn from (z: [n_prefixes, V])."""
        return z[self.prefix]

    def token_logprobs(self, z: torch.Tensor) -> torch.Tensor:
        """[N, T]: log π(y_t | y_<t) of each sequence's tokens."""
        return torch.log_softmax(self.logits(z), -1).gather(-1, self.seqs.unsqueeze(-1)).squeeze(-1)

    def probs(self, z: torch.Tensor) -> torch.Tensor:
        """[N]: π(y), summing to 1 over the space."""
        return self.token_logprobs(z).sum(-1).exp()
