"""Autograd gradients of every RPG surrogate vs the exact gradient of its objective (docs/math.md#testable-identities).

Exact enumeration over categorical distributions in float64 at theta != theta_old
(see exact_enumeration.py). Covers T1-T12, T5b and T25.
"""

import pytest
import torch
from exact_enumeration import DT, Bandit, assert_close, kl, ukl

from rpg.math.formulas import k3, kl_weight
from rpg.math.fused import RPGLossConfig

BETA = 0.37  # large, so a wrong KL term cannot hide behind a small coefficient
NORMALIZED = [("fkl", 1.0), ("rkl", 1.0), ("ufkl", 1.0), ("urkl", 1.0), ("ufkl", 2.5), ("urkl", 2.5)]


def cfg(divergence, form, **kw):
    return RPGLossConfig(divergence=divergence, form=form, beta=BETA, clip=kw.pop("clip", False), **kw)


# ----------------------------------------------------------------- k3 / UKL identities (App. D)


@pytest.mark.parametrize("mass", [1.0, 2.5])
def test_t1_t2_k3_is_unnormalized_kl(mass):
    b = Bandit.make(mass=mass)
    pi, m = b.pi.detach(), b.m_old
    assert_close((m * k3(pi / m, (pi / m).log())).sum(), ukl(m, pi), what="T1 sum m*k3(pi/m) = UKL(m||pi)")
    assert_close((pi * k3(m / pi, (m / pi).log())).sum(), ukl(pi, m), what="T2 sum pi*k3(m/pi) = UKL(pi||m)")
    w = pi / m
    assert_close(mass * (b.mu * w * k3(1 / w, (1 / w).log())).sum(), ukl(pi, m), what="T2 Z*E_mu[w k3(1/w)]")


def test_t3_pointwise_identity():
    w = torch.logspace(-6, 6, 101, dtype=DT)
    assert_close(w * k3(1 / w, -w.log()), w * w.log() - w + 1, what="T3 w*k3(1/w) = w log w - w + 1")


def test_t4_normalized_and_unnormalized_objectives_coincide_at_z1():
    b = Bandit.make(seed=1)
    for fwd, unf in (("fkl", "ufkl"), ("rkl", "urkl")):
        assert_close(b.objective(fwd, BETA), b.objective(unf, BETA), what=f"T4 J_{fwd} = J_{unf}")
        assert_close(b.grad(b.objective(fwd, BETA)), b.grad(b.objective(unf, BETA)), what=f"T4 grad J_{fwd}")


def test_t5_mass_decomposition():
    z = 2.5
    b = Bandit.make(seed=2, mass=z)
    pi, mu = b.pi.detach(), b.mu
    assert_close(ukl(b.m_old, pi), z * kl(mu, pi) + z * torch.log(torch.tensor(z, dtype=DT)) + 1 - z, what="T5 forward")
    assert_close(ukl(pi, b.m_old), kl(pi, mu) - torch.log(torch.tensor(z, dtype=DT)) + z - 1, what="T5 reverse")


def test_exact_gradient_reference_matches_finite_differences():
    """Guard for the reference itself: autograd of the closed-form J vs central differences."""
    b = Bandit.make(seed=3, mass=2.5)
    for name in ("ufkl", "urkl"):
        g = b.grad(b.objective(name, BETA))
        fd = torch.zeros_like(g)
        for i in range(g.numel()):
            e = torch.zeros_like(g)
            e[i] = 1e-6
            with torch.no_grad():
                hi = Bandit(b.z + e, b.z_old, b.z_ref, b.reward, b.mass).objective(name, BETA)
                lo = Bandit(b.z - e, b.z_old, b.z_ref, b.reward, b.mass).objective(name, BETA)
            fd[i] = (hi - lo) / 2e-6
        assert_close(g, fd, rtol=1e-6, atol=1e-8, what=f"finite differences {name}")


# ----------------------------------------------------------------- unclipped surrogates: -grad J


@pytest.mark.parametrize("form", ["differentiable", "reinforce"])
@pytest.mark.parametrize("divergence,mass", NORMALIZED)
@pytest.mark.parametrize("seed", [0, 7])
def test_t6_t9_surrogate_gradient_is_minus_grad_objective(form, divergence, mass, seed):
    b = Bandit.make(seed=seed, mass=mass)
    loss = b.expected_loss(cfg(divergence, form))
    assert_close(b.grad(loss), -b.grad(b.objective(divergence, BETA)), what=f"T6/T9 {form} {divergence} Z={mass}")


@pytest.mark.parametrize("divergence,mass", NORMALIZED)
def test_t7_differentiable_loss_equals_minus_objective(divergence, mass):
    """Our kappa's carry the constants that make L = -J exactly (FKL via -log w, URKL via +1)."""
    b = Bandit.make(seed=4, mass=mass)
    assert_close(b.expected_loss(cfg(divergence, "differentiable")), -b.objective(divergence, BETA), what="T7")


@pytest.mark.parametrize("divergence", ["fkl", "rkl", "ufkl", "urkl"])
def test_t8_proposition_gradient_formula(divergence):
    """sum_x mu * Weight(x) * grad log pi = grad J, with the weights of Props. F.1-F.5 written out."""
    b = Bandit.make(seed=5)
    pi = b.pi
    w = (pi / b.mu).detach()
    weight = {"fkl": w * b.reward + BETA, "ufkl": w * b.reward - BETA * (w - 1),
              "rkl": w * (b.reward - BETA * (w.log() + 1)), "urkl": w * (b.reward - BETA * w.log())}[divergence]
    surrogate = (b.mu * weight * torch.log(pi)).sum()
    assert_close(b.grad(surrogate), b.grad(b.objective(divergence, BETA)), what="T8")


@pytest.mark.parametrize("divergence", ["fkl", "rkl", "ufkl", "urkl"])
def test_t10_removing_stop_gradient_breaks_equality(divergence):
    """The library's weight differentiated (no SG) is no longer -grad J at theta != theta_old."""
    b = Bandit.make(seed=6)
    log_pi = torch.log_softmax(b.z, 0)
    log_w = log_pi - torch.log(b.mu)
    w = log_w.exp()  # NOT detached
    weight = w * b.reward + kl_weight(divergence, BETA, w, 1.0, log_w)
    no_sg = -(b.mu * weight * log_pi).sum()
    deviation = (b.grad(no_sg) + b.grad(b.objective(divergence, BETA))).abs().max()
    assert deviation > 1e-3, f"T10: gradient without stop-gradient should differ, max deviation {deviation}"


@pytest.mark.parametrize("form", ["differentiable", "reinforce"])
@pytest.mark.parametrize("divergence", ["fkl", "rkl", "ufkl", "urkl"])
def test_t11_baseline_invariance(form, divergence):
    b = Bandit.make(seed=8)
    g0 = b.grad(b.expected_loss(cfg(divergence, form)))
    for baseline in (-3.0, 0.5, 11.0):
        assert_close(b.grad(b.expected_loss(cfg(divergence, form), baseline=baseline)), g0, what=f"T11 b={baseline}")


def test_t12_zero_mean_control_variate():
    b = Bandit.make(seed=9)
    w = (b.pi / b.mu).detach()
    cv = (b.mu * w * torch.log_softmax(b.z, 0)).sum()
    assert_close(b.grad(cv), torch.zeros_like(b.z), what="T12 E_old[w grad log pi] = 0")
    for fwd, unf in (("fkl", "ufkl"), ("rkl", "urkl")):
        g_f = b.grad(b.expected_loss(cfg(fwd, "reinforce")))
        g_u = b.grad(b.expected_loss(cfg(unf, "reinforce")))
        assert_close(g_f, g_u, what=f"T12 {fwd} and {unf} updates agree in expectation")


# ----------------------------------------------------------------- three-policy weights (docs/math.md#three-policies)


@pytest.mark.parametrize("form", ["differentiable", "reinforce"])
@pytest.mark.parametrize("divergence", ["fkl", "rkl", "ufkl", "urkl"])
def test_t5b_three_policy_gradient(form, divergence):
    """Sampler mu != anchor pi_ref: gradient is -grad(E_pi[R] - beta D(pi, pi_ref))."""
    b = Bandit.make(seed=10)
    loss = b.expected_loss(cfg(divergence, form), three_policy=True)
    target = b.objective(divergence, BETA, anchor=b.pi_ref)
    assert_close(b.grad(loss), -b.grad(target), what=f"T5b {form} {divergence}")
    if form == "differentiable":
        assert_close(loss, -target, what="T5b value: L = -J")


# ----------------------------------------------------------------- Algorithm 1 (T25)


@pytest.mark.parametrize("divergence", ["rkl", "urkl"])
def test_t25_algorithm1_exact_in_expectation_but_not_per_sample(divergence):
    b = Bandit.make(seed=11)
    alg1 = cfg(divergence, "differentiable", fd_clip="algorithm1")
    assert_close(b.grad(b.expected_loss(alg1)), -b.grad(b.objective(divergence, BETA)), what="T25 expectation")
    # Per outcome, the Algorithm-1 gradient exceeds the exact one by +beta * w * grad log pi.
    log_prob, old, adv, mask, _ = b.rows()
    from rpg.math.fused import rpg_policy_loss

    exact = cfg(divergence, "differentiable")
    for x in range(b.z.numel()):
        one = torch.zeros_like(mask)
        one[x] = 1.0
        ga = b.grad(rpg_policy_loss(log_prob=log_prob, old_log_prob=old, advantages=adv, response_mask=one, config=alg1, aggregate=False)[0].sum())
        ge = b.grad(rpg_policy_loss(log_prob=log_prob, old_log_prob=old, advantages=adv, response_mask=one, config=exact, aggregate=False)[0].sum())
        w = (log_prob[x, 0] - old[x, 0]).exp().detach()
        extra = b.grad(BETA * w * log_prob[x, 0])
        assert_close(ga - ge, extra, what=f"T25 per-sample extra term, outcome {x}")
        assert extra.abs().max() > 1e-6
