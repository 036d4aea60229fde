"""Paired statistics of a study whose seeds are blocks: exact sign-flip tests, their intervals, Holm, Fisher, power.

Every arm of a seed shares its prompts and random numbers, so arms are compared within a seed: a hypothesis is a
contrast (coefficients over cells) evaluated per seed, d_s = sum_c a_c y_{c,s}, and tested on the n values d_s.
Pure functions (numpy only); the formulas are in the docstrings.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# Sums of subsets of accuracy differences that are mathematically 0 can come out as +-1e-17 in floating point; the
# accuracies are multiples of 1/(problems x samples) (1/800 for 200 problems x 4 responses), so anything below TIE
# is a tie.
TIE = 1e-9
MAX_EXACT = 22  # 2^22 subsets: the largest n enumerated exactly (4 M sums, 32 MB)


def subset_sums(d: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(sum_{i in F} d_i, |F|) for all 2^n subsets F of {1..n}, built by doubling (F without i, then with i)."""
    d = [float(x) for x in d]
    if len(d) > MAX_EXACT:
        raise ValueError(f"an exact sign-flip test enumerates 2^n subsets; n = {len(d)} > {MAX_EXACT}")
    sums, sizes = np.zeros(1), np.zeros(1, dtype=np.int64)
    for x in d:
        sums, sizes = np.concatenate([sums, sums + x]), np.concatenate([sizes, sizes + 1])
    return sums, sizes


def sign_flip_p(d: Sequence[float]) -> float:
    """One-sided exact p-value of the paired sign-flip permutation test, H0: each d_i symmetric about 0, against
    H1: mean(d) > 0.

    The statistic is T = sum_i d_i; under H0 the 2^n sign vectors s are equally likely, so
    p = #{s : sum_i s_i d_i >= T} / 2^n. Flipping the signs of the subset F changes T by -2 sum_{i in F} d_i, hence
    p = #{F : sum_{i in F} d_i <= 0} / 2^n (the empty F included: p >= 2^-n; ties count against H1).
    """
    if len(d) == 0:
        raise ValueError("a sign-flip test needs at least one paired difference")
    sums, _ = subset_sums(d)
    return float(np.count_nonzero(sums <= TIE)) / sums.size


def sign_flip_ci(d: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The interval for a shift delta obtained by inverting the two one-sided sign-flip tests at (1 - level) / 2 each.

    Testing d_i - delta: p_greater(delta) = #{F : sum_F d_i <= |F| delta} / 2^n = (1 + #{F != {} : m_F <= delta}) / 2^n
    with m_F the mean of d over F, so with N = 2^n, c = (1 - level) / 2 * N and k = floor(c - 1) + 1 the interval is
    [k-th smallest m_F, k-th largest m_F] (exact coverage >= level when the d_i - delta are symmetric about 0). When
    k < 1 (too few seeds: 2^-n > (1 - level) / 2) no shift is excluded: (-inf, inf).
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    sums, sizes = subset_sums(d)
    means = np.sort(sums[1:] / sizes[1:])
    k = math.floor((1 - level) / 2 * sums.size - 1) + 1
    if k < 1:
        return -math.inf, math.inf
    return float(means[k - 1]), float(means[-k])


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values: with p_(1) <= ... <= p_(m),
    adj_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)), returned in the input's order (family-wise error <= alpha when
    H_i is rejected for adj_i <= alpha)."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    adj, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p[i])))
        adj[i] = running
    return adj


def fisher_greater(k1: int, n1: int, k0: int, n0: int) -> float:
    """One-sided Fisher exact p-value for rate 1 > rate 0 (k of n events in each group): with K = k1 + k0 events
    in N = n1 + n0 runs, P(X >= k1) for X hypergeometric, P(X = x) = C(n1, x) C(n0, K - x) / C(N, K)."""
    for k, n in ((k1, n1), (k0, n0)):
        if not 0 <= k <= n:
            raise ValueError(f"counts must satisfy 0 <= k <= n, got k={k}, n={n}")
    total, events = n1 + n0, k1 + k0
    denom = math.comb(total, events)
    return sum(math.comb(n1, x) * math.comb(n0, events - x) for x in range(k1, min(n1, events) + 1)) / denom


def fisher_power(p1: float, p0: float, n: int, alpha: float) -> float:
    """Power of the one-sided Fisher test (``fisher_greater`` <= alpha) with n runs per group and true rates
    p1 > p0: the sum of P(k1) P(k0) over the (k1, k0) it rejects, by enumeration (exact)."""
    def pmf(k: int, p: float) -> float:
        return math.comb(n, k) * p ** k * (1 - p) ** (n - k)
    return sum(pmf(k1, p1) * pmf(k0, p0) for k1 in range(n + 1) for k0 in range(n + 1)
               if fisher_greater(k1, n, k0, n) <= alpha)


@dataclass(frozen=True)
class PowerSim:
    """How the power of the sign-flip test is simulated: ``sims`` data sets of n paired differences
    d_i = delta + sd z_i, z_i ~ N(0, 1) from numpy's frozen legacy generator (``RandomState(seed)``: the same
    stream on every numpy), the same z for every delta (common random numbers: power is then nondecreasing in
    delta, and the bisection for the MDE is deterministic)."""

    sims: int = 4000
    seed: int = 20260053


def _min_count_rejecting(n: int, alpha: float) -> int:
    """Largest count c of subsets with sum <= 0 such that c / 2^n <= alpha (the test rejects iff count <= c)."""
    return math.floor(alpha * 2 ** n + 1e-12)


def sign_flip_power(delta: float, sd: float, n: int, alpha: float, sim: PowerSim = PowerSim()) -> float:
    """P(sign_flip_p(d) <= alpha) for d_i = delta + sd z_i (``PowerSim``); 0 when even 2^-n > alpha."""
    c = _min_count_rejecting(n, alpha)
    if c < 1:
        return 0.0
    z = np.random.RandomState(sim.seed).standard_normal((sim.sims, n))
    h = n // 2  # the 2^n subset sums as all pairs (sum over F in the first h, sum over F in the rest)
    first, rest = (((np.arange(2 ** k)[:, None] >> np.arange(k)) & 1).astype(float) for k in (h, n - h))
    rejected = 0
    for start in range(0, sim.sims, 500):  # chunks of [500, 2^h, 2^(n-h)] sums
        d = delta + sd * z[start:start + 500]
        sums = (d[:, :h] @ first.T)[:, :, None] + (d[:, h:] @ rest.T)[:, None, :]
        rejected += int(np.count_nonzero(np.count_nonzero(sums <= TIE, axis=(1, 2)) <= c))
    return rejected / sim.sims


def min_detectable_effect(sd: float, n: int, alpha: float, power: float = 0.8, sim: PowerSim = PowerSim()) -> float:
    """Smallest delta whose simulated power reaches ``power`` (to 1e-4 x sd); inf when no delta can (2^-n > alpha).

    The test is scale-free (a count of subset sums <= 0), so the MDE is sd x the MDE at sd = 1: one bisection per
    (n, alpha, power) serves every sd."""
    return sd * _standard_mde(n, alpha, power, sim)


def _critical_shifts(n: int, alpha: float, sim: PowerSim) -> np.ndarray:
    """Per simulated data set z (``PowerSim``), the shift above which the test rejects d = delta + z, sorted.

    count(delta) = #{F : sum_F (delta + z_i) <= TIE} = 1 + #{F != {} : delta <= t_F}, t_F = (TIE - sum_F z) / |F|; the
    test rejects iff count <= c, i.e. iff delta exceeds the c-th largest t_F."""
    c = _min_count_rejecting(n, alpha)
    z = np.random.RandomState(sim.seed).standard_normal((sim.sims, n))
    h = n // 2
    first, rest = (((np.arange(2 ** k)[:, None] >> np.arange(k)) & 1).astype(float) for k in (h, n - h))
    size = (first.sum(1)[:, None] + rest.sum(1)[None, :]).ravel()[1:]  # |F| of every F but the empty one
    crit = []
    for start in range(0, sim.sims, 500):
        d = z[start:start + 500]
        sums = ((d[:, :h] @ first.T)[:, :, None] + (d[:, h:] @ rest.T)[:, None, :]).reshape(len(d), -1)[:, 1:]
        t = (TIE - sums) / size
        k = t.shape[1] - c
        crit.append(np.partition(t, k, axis=1)[:, k])
    return np.sort(np.concatenate(crit))


@functools.lru_cache(maxsize=None)
def _standard_mde(n: int, alpha: float, power: float, sim: PowerSim) -> float:
    """The bisection of delta over [0, 10] to a width of 1e-4 on power(delta) >= ``power``, whose power is the share
    of ``_critical_shifts`` below delta: the k-th smallest shift, k = ceil(power x sims), decides each step."""
    if _min_count_rejecting(n, alpha) < 1:
        return math.inf
    threshold = _critical_shifts(n, alpha, sim)[math.ceil(power * sim.sims) - 1]
    lo, hi = 0.0, 10.0
    while hi - lo > 1e-4:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if mid > threshold else (mid, hi)
    return hi
