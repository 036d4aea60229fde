"""The declared lag study (docs/study/lag/PLAN.md) without Ray: its grid and overrides, run order, budget, the plan's
generated numbers, the per-run CSV, the statistics and the tables rebuilt from the CSV.

The statistics are checked on hand-computed cases and on synthetic CSVs with planted effects; the committed tables
are rebuilt from the committed CSV once the plan's runs exist.
"""

from __future__ import annotations

import math
import random

import pytest

from rpg.study import stats as S


# ---- statistics ----

def test_sign_flip_p_values_by_hand():
    # d = (0.1, 0.2, -0.05): the subsets with sum <= 0 are {} and {3}: 2 of 8
    assert S.sign_flip_p([0.1, 0.2, -0.05]) == 2 / 8
    assert S.sign_flip_p([1.0, 2.0, 3.0]) == 1 / 8 and S.sign_flip_p([-1.0, -2.0]) == 1.0
    # ties count against H1: (0.1, -0.1): {} (0), {2} (-0.1), {1, 2} (0) -> 3 of 4
    assert S.sign_flip_p([0.1, -0.1]) == 3 / 4
    # {}, {3}, {1, 3}, {2, 3} and {1, 2, 3}, whose float sum 0.1 + 0.2 - 0.3 is 5.6e-17: a tie, not > 0
    assert S.sign_flip_p([0.1, 0.2, 0.3 - 0.6]) == 5 / 8
    assert S.sign_flip_p([0.05] * 12) == 1 / 4096


def test_sign_flip_interval_by_hand_and_its_coverage():
    # n = 3, level 0.75: k = floor(0.125 * 8 - 1) + 1 = 1: [smallest, largest subset mean] = [1, 3]
    assert S.sign_flip_ci([1.0, 2.0, 3.0], 0.75) == (1.0, 3.0)
    assert S.sign_flip_ci([1.0, 2.0, 3.0], 0.95) == (-math.inf, math.inf)  # 2^-3 > 0.025: nothing excluded
    # n = 5, level 0.75: k = floor(0.125 * 32 - 1) + 1 = 4: the 4th smallest / largest of the 31 subset means
    d = [1.0, 2.0, 4.0, 8.0, 16.0]
    means = sorted(sum(x for i, x in enumerate(d) if m >> i & 1) / bin(m).count("1") for m in range(1, 32))
    assert S.sign_flip_ci(d, 0.75) == (means[3], means[-4])
    rng = random.Random(5)
    cover = sum(lo <= 0.3 <= hi for lo, hi in (S.sign_flip_ci([0.3 + rng.gauss(0, 1) for _ in range(8)])
                                               for _ in range(2000)))
    assert cover / 2000 >= 0.94  # n = 8: each side misses with probability 6/256, coverage 0.953 (SD 0.005)


def test_holm_and_fisher_by_hand():
    assert S.holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert S.holm([0.5, 0.001]) == pytest.approx([0.5, 0.002]) and S.holm([0.9, 0.8]) == [1.0, 1.0]
    assert S.fisher_greater(3, 3, 0, 3) == pytest.approx(1 / 20)  # C(3,3) C(3,0) / C(6,3)
    assert S.fisher_greater(0, 3, 3, 3) == 1.0
    assert S.fisher_greater(2, 4, 1, 4) == pytest.approx((6 * 4 + 4 * 1) / 56)  # X >= 2 of K = 3 in N = 8
    with pytest.raises(ValueError):
        S.fisher_greater(5, 4, 0, 4)


def test_the_sign_flip_test_holds_its_level_under_the_null_and_detects_a_planted_shift():
    rng = random.Random(11)
    alpha = 13 / 256  # attainable at n = 8: P(p <= alpha) = alpha exactly for continuous symmetric noise
    ps = [S.sign_flip_p([rng.gauss(0, 1) for _ in range(8)]) for _ in range(2000)]
    assert abs(sum(p <= alpha for p in ps) / 2000 - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / 2000)
    assert abs(sum(p <= 0.5 for p in ps) / 2000 - 0.5) < 0.05  # ~ uniform in the middle too
    planted = [S.sign_flip_p([1.5 + rng.gauss(0, 1) for _ in range(12)]) for _ in range(200)]
    assert sum(p <= 0.0125 for p in planted) / 200 > 0.85  # standardised MDE at 0.0125 is ~1.03 (PLAN.md)


def test_power_and_mde():
    assert S.min_detectable_effect(0.1, 3, 0.05) == math.inf  # 1/8 > 0.05: no effect is detectable with 3 seeds
    sim = S.PowerSim(sims=1000)
    mde = S.min_detectable_effect(1.0, 12, 0.05, 0.8, sim)
    assert 0.7 < mde < 0.9  # t-approximation: (t_0.95,11 + t_0.8,11) / sqrt(12) = 0.77
    assert S.min_detectable_effect(0.2, 12, 0.05, 0.8, sim) == pytest.approx(0.2 * mde)  # scale-free
    assert S.sign_flip_power(mde, 1.0, 12, 0.05, sim) >= 0.8 > S.sign_flip_power(mde - 0.01, 1.0, 12, 0.05, sim)
    assert S.fisher_power(0.5, 0.03, 12, 0.05) == pytest.approx(0.8189, abs=1e-4)
