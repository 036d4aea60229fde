"""GRPO's KL term: the importance-weight correction (Sec. 2.2, T13-T17 in docs/math.md) and the estimator-as-loss
facts (T18), against verl 0.9.1's own ``kl_penalty`` for the stock estimators."""

import pytest
import torch
from exact_enumeration import Bandit, assert_close, kl
from verl.trainer.ppo.core_algos import kl_penalty

from rpg.math.fused import grpo_corrected_kl


def expected(b: Bandit, per_token: torch.Tensor, weights=None) -> torch.Tensor:
    weights = b.mu if weights is None else weights
    return (weights * per_token.squeeze(1)).sum()


def logs(b: Bandit):
    log_pi = torch.log_softmax(b.z, 0).unsqueeze(1)
    return log_pi, torch.log(b.mu).unsqueeze(1), torch.log(b.pi_ref).unsqueeze(1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_t13_t14_corrected_kl_is_reverse_kl_in_value_and_gradient(seed):
    b = Bandit.make(seed=seed, drift=0.5)
    l, l_old, l_ref = logs(b)
    value = expected(b, grpo_corrected_kl(log_prob=l, old_log_prob=l_old, ref_log_prob=l_ref))
    target = kl(b.pi, b.pi_ref)
    assert_close(value, target, what="T13 value = KL(pi||pi_ref)")
    assert_close(b.grad(value), b.grad(target), what="T13 gradient")
    w = (l - l_old).exp().detach()
    closed_form = expected(b, w * (l - l_ref).detach() * l)
    assert_close(b.grad(value), b.grad(closed_form), what="T14 closed form sum mu w log(pi/pi_ref) grad log pi")


def test_t15_uncorrected_grpo_kl_is_forward_at_theta_old_and_wrong_elsewhere():
    on = Bandit.make(seed=3, drift=0.0)
    l, _, l_ref = logs(on)
    stock = expected(on, kl_penalty(l, l_ref, "low_var_kl"))  # verl's GRPO term, unweighted
    assert_close(on.grad(stock), on.grad(kl(on.pi_ref, on.pi)), what="T15 forward gradient at theta_old")
    assert (on.grad(stock) - on.grad(kl(on.pi, on.pi_ref))).abs().max() > 1e-2, "T15 it is not the reverse gradient"

    off = Bandit.make(seed=3, drift=0.5)
    l, _, l_ref = logs(off)
    g = off.grad(expected(off, kl_penalty(l, l_ref, "low_var_kl")))
    for target in (kl(off.pi_ref, off.pi), kl(off.pi, off.pi_ref)):
        assert (g - off.grad(target)).abs().max() > 1e-3, "T15 off-policy: neither KL direction"


def test_t16_detached_weight_gives_forward_gradient():
    b = Bandit.make(seed=4, drift=0.5)
    l, l_old, l_ref = logs(b)
    w = (l - l_old).exp().detach()
    y = (l_ref - l).exp()
    g = b.grad(expected(b, w * (y - 1 - (l_ref - l))))  # k3(pi_ref/pi), unclamped
    assert_close(g, b.grad(kl(b.pi_ref, b.pi)), what="T16 SG(w)*k3 -> grad KL(pi_ref||pi)")


def test_verl_k3_clamp_zeroes_gradients_of_large_terms():
    """verl clamps k3 to [-10, 10], which silently drops the gradient of large terms.
    This instance has a token with k3 = 37.8; our corrected KL keeps its gradient."""
    b = Bandit.make(seed=4, drift=0.5)
    l, l_old, l_ref = logs(b)
    stock = kl_penalty(l, l_ref, "low_var_kl")
    assert stock.max() == 10.0
    (g_stock,) = torch.autograd.grad(stock.sum(), l)
    (g_ours,) = torch.autograd.grad(grpo_corrected_kl(log_prob=l, old_log_prob=l_old, ref_log_prob=l_ref).sum(), l)
    clamped = stock.squeeze(1) >= 10.0
    assert (g_stock.squeeze(1)[clamped] == 0).all() and (g_ours.squeeze(1)[clamped] != 0).all()


def test_t17_reference_equal_to_sampler_gives_urkl_surrogate():
    b = Bandit.make(seed=5, drift=0.5)
    l, l_old, _ = logs(b)
    w = (l - l_old).exp()
    assert_close(grpo_corrected_kl(log_prob=l, old_log_prob=l_old, ref_log_prob=l_old), w * w.log() - w + 1, what="T17")


def test_t18_estimators_as_losses_with_on_policy_sampling():
    b = Bandit.make(seed=6)
    l, _, l_ref = logs(b)
    frozen = b.pi.detach()  # sampling distribution held at the current policy
    k2 = expected(b, kl_penalty(l, l_ref, "mse"), frozen)
    k3 = expected(b, kl_penalty(l, l_ref, "low_var_kl"), frozen)
    k1 = expected(b, kl_penalty(l, l_ref, "kl"), frozen)
    assert_close(b.grad(k2), b.grad(kl(b.pi, b.pi_ref)), what="T18 k2 -> reverse")
    assert_close(b.grad(k3), b.grad(kl(b.pi_ref, b.pi)), what="T18 k3 -> forward")
    assert_close(b.grad(k1), torch.zeros_like(b.z), what="T18 k1 -> zero")


def test_corrected_kl_is_finite_for_extreme_ratios():
    l = torch.tensor([[-0.1, -60.0, -1e-3]], requires_grad=True)
    l_old = torch.tensor([[-80.0, -0.1, -1e-3]])
    l_ref = torch.tensor([[-0.2, -90.0, -70.0]])
    out = grpo_corrected_kl(log_prob=l, old_log_prob=l_old, ref_log_prob=l_ref)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(l.grad).all()
