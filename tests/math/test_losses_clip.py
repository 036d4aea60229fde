"""RPG-Style Clip and dual clip (docs/math.md#rpg-style-clip, T19-T24), token by token in float64.

The regularized advantage and Algorithm 2 are written out here independently of the library
(formulas of docs/math.md#rpg-style-clip) and compared with it.
"""

import math
import zlib

import pytest
import torch
from exact_enumeration import DT, Bandit, assert_close, dual_clip_ppo

from rpg.math.formulas import dual_clip
from rpg.math.fused import RPGLossConfig, rpg_policy_loss

EPS_LO, EPS_HI, C = 0.2, 0.28, 10.0


def c_kl(divergence, beta, w_bar):
    """KL component at the clipped ratio (C_D at w_bar, Remark F.2), written out."""
    return {"fkl": beta * torch.ones_like(w_bar), "rkl": -beta * w_bar * (w_bar.log() + 1),
            "ufkl": -beta * (w_bar - 1), "urkl": -beta * w_bar * w_bar.log()}[divergence]


def random_tokens(n=13_000, seed=0):
    g = torch.Generator().manual_seed(seed)
    log_w = torch.empty(n, dtype=DT).uniform_(math.log(0.3), math.log(14.0), generator=g)
    # log-probabilities are negative under both policies: l = l_old + log w < 0
    l_old = -torch.rand(n, generator=g, dtype=DT) * 5 - 0.01 - log_w.clamp(min=0)
    adv = torch.randn(n, generator=g, dtype=DT)
    adv[: n // 4] *= 1e-6  # tiny |A|: where the A' and A branches can differ
    adv[n // 4 : n // 4 + 50] = 0.0
    return l_old, log_w, adv


def token_grads(loss_fn, l_old, log_w):
    l = (l_old + log_w).clone().requires_grad_(True)
    loss = loss_fn(l)
    (g,) = torch.autograd.grad(loss.sum(), l)
    return loss.detach(), g


def library(divergence, beta, l_old, adv, branch_on="regularized"):
    cfg = RPGLossConfig(divergence=divergence, form="reinforce", beta=beta, clip=True, clip_ratio_low=EPS_LO,
                        clip_ratio_high=EPS_HI, clip_ratio_c=C, branch_on=branch_on)
    return lambda l: rpg_policy_loss(log_prob=l[None], old_log_prob=l_old[None], advantages=adv[None], response_mask=torch.ones_like(l)[None], config=cfg, aggregate=False)[0][0]


# ----------------------------------------------------------------- T19 gate regions of dual clip


@pytest.mark.parametrize("a_hat", [1.3, -0.7])
def test_t19_dual_clip_gradient_regions(a_hat):
    r = torch.linspace(0.05, 14.0, 2801, dtype=DT)
    r = r[(r - (1 - EPS_LO)).abs() > 1e-9]
    r = r[((r - (1 + EPS_HI)).abs() > 1e-9) & ((r - C).abs() > 1e-9)].clone().requires_grad_(True)
    x, active = dual_clip(r, torch.full_like(r, a_hat >= 0, dtype=torch.bool), 1 - EPS_LO, 1 + EPS_HI, C)
    (g,) = torch.autograd.grad((-a_hat * x).sum(), r)
    rv = r.detach()
    expected = (rv < 1 + EPS_HI) if a_hat >= 0 else ((rv > 1 - EPS_LO) & (rv < C))
    assert torch.equal(g != 0, expected), "T19: gradient must flow exactly on the documented regions"
    assert torch.equal(active, expected), "T19: the active set is where the gradient flows"
    assert_close(g[expected], torch.full_like(g[expected], -a_hat), what="T19 slope -A")


# ----------------------------------------------------------------- T20 PPO-form equivalence + Alg. 2


@pytest.mark.parametrize("beta", [1e-4, 0.5])
@pytest.mark.parametrize("divergence", ["fkl", "rkl", "ufkl", "urkl"])
def test_t20_rpg_style_clip_equals_dual_clip_with_regularized_advantage(divergence, beta):
    l_old, log_w, adv = random_tokens(seed=zlib.crc32(f"{divergence}/{beta}".encode()) % 1000)  # stable per case
    w = log_w.exp()
    w_bar = w.clamp(1 - EPS_LO, 1 + EPS_HI)
    kl_part = c_kl(divergence, beta, w_bar)
    a_reg = adv + kl_part / w  # A' = A + C(w_bar)/w

    val_lib, g_lib = token_grads(library(divergence, beta, l_old, adv), l_old, log_w)
    _, g_ppo = token_grads(lambda l: dual_clip_ppo((l - l_old).exp(), a_reg, 1 - EPS_LO, 1 + EPS_HI, C), l_old, log_w)
    assert_close(g_lib, g_ppo, what="T20 gradient vs dual-clip PPO with SG(A')")

    def algorithm2(l):  # Algorithm 2, literal: branch on psi = A' * (-l)
        lt = -l
        psi = a_reg * lt.detach()
        pos = psi >= 0
        return torch.where(pos & (w >= 1 + EPS_HI), (adv * (1 + EPS_HI) + kl_part) * lt.detach(),
               torch.where(~pos & (w <= 1 - EPS_LO), (adv * (1 - EPS_LO) + kl_part) * lt.detach(),
               torch.where(~pos & (w >= C), (C * adv + kl_part) * lt.detach(), a_reg * lt * w)))

    val_alg, g_alg = token_grads(algorithm2, l_old, log_w)
    assert_close(g_lib, g_alg, what="T20 gradient vs Algorithm 2")
    assert_close(val_lib, val_alg, what="T20 loss values vs Algorithm 2 constants")
    active = g_lib != 0
    assert 0.2 < active.double().mean() < 0.9, "the sample must exercise both active and clipped tokens"


# ----------------------------------------------------------------- T21 / T22 exact enumeration


@pytest.mark.parametrize("form", ["reinforce", "differentiable"])
@pytest.mark.parametrize("divergence", ["fkl", "rkl", "ufkl", "urkl"])
def test_t21_clip_reduces_to_exact_gradient_inside_trust_region(form, divergence):
    b = Bandit.make(seed=21, drift=0.05)
    w = b.pi.detach() / b.mu
    assert bool(((w > 1 - EPS_LO) & (w < 1 + EPS_HI)).all()), "set-up: all ratios inside the clip range"
    beta = 0.37
    clipped = RPGLossConfig(divergence=divergence, form=form, beta=beta, clip=True)
    assert_close(b.grad(b.expected_loss(clipped)), -b.grad(b.objective(divergence, beta)), what=f"T21 {form}")


@pytest.mark.parametrize("divergence,shift", [("fkl", 1.0), ("rkl", -1.0), ("ufkl", 0.0), ("urkl", 0.0)])
def test_t22_on_policy_point(divergence, shift):
    """At theta = theta_old: UFKL/URKL give -E[A grad l]; FKL/RKL shift A by +-beta; all equal in expectation."""
    beta = 0.37
    b = Bandit.make(seed=22, drift=0.0)
    log_prob, old, adv, mask, _ = b.rows()
    cfg = RPGLossConfig(divergence=divergence, form="reinforce", beta=beta, clip=True)
    g = b.grad(b.expected_loss(cfg))
    shifted = -(b.mu * (b.reward + shift * beta) * torch.log_softmax(b.z, 0)).sum()
    plain = -(b.mu * b.reward * torch.log_softmax(b.z, 0)).sum()
    assert_close(g, b.grad(shifted), what="T22 per-sample weight")
    assert_close(g, b.grad(plain), what="T22 expectation equals plain REINFORCE")


# ----------------------------------------------------------------- T23 / T24 single tokens


def one_token_grad(divergence, beta, adv, w, branch_on="regularized"):
    l_old = torch.tensor([-1.3], dtype=DT)
    _, g = token_grads(library(divergence, beta, l_old, torch.tensor([adv], dtype=DT), branch_on),
                       l_old, torch.tensor([math.log(w)], dtype=DT))
    return g.item()


@pytest.mark.parametrize("divergence", ["fkl", "rkl", "ufkl", "urkl"])
def test_t23_inactive_tokens_have_no_gradient_and_active_use_clipped_kl(divergence):
    beta = 0.05
    for adv, w in [(1.0, 1.5), (1.0, 3.0), (-1.0, 0.5), (-1.0, 11.0)]:
        assert one_token_grad(divergence, beta, adv, w) == 0.0, f"T23 clipped token A={adv} w={w} must not move"
    for adv, w in [(-1.0, 1.5), (-1.0, 5.0), (1.0, 0.5), (1.0, 1.1)]:
        w_bar = min(max(w, 1 - EPS_LO), 1 + EPS_HI)
        expected = -(w * adv + c_kl(divergence, beta, torch.tensor(w_bar, dtype=DT)).item())
        assert one_token_grad(divergence, beta, adv, w) == pytest.approx(expected, rel=1e-12), f"T23 A={adv} w={w}"


def test_t24_branch_on_regularized_vs_raw_advantage():
    """A = 0 and C != 0: the paper branches on sign(A') = sign(C); the authors' code on A (> 0)."""
    beta = 0.05
    # FKL: C = +beta > 0, w = 1.5 > 1 + eps_high.
    assert one_token_grad("fkl", beta, 0.0, 1.5, "regularized") == 0.0  # positive branch, clipped
    assert one_token_grad("fkl", beta, 0.0, 1.5, "raw") == pytest.approx(-beta)  # negative branch, active
    # UFKL: C = -beta (w_bar - 1) > 0 for w = 0.5 < 1 - eps_low.
    c = -beta * (0.8 - 1.0)
    assert one_token_grad("ufkl", beta, 0.0, 0.5, "regularized") == pytest.approx(-c)  # positive branch: no lower cut
    assert one_token_grad("ufkl", beta, 0.0, 0.5, "raw") == 0.0  # negative branch, clipped below
    # With |A| >> |C/w| both rules agree.
    for rule in ("regularized", "raw"):
        assert one_token_grad("ufkl", beta, 0.5, 0.5, rule) == pytest.approx(-(0.5 * 0.5 + c))
