"""Every loss variant with bf16 inputs against the float64 result, with a tolerance derived from
bf16's precision. Runs here on the CPU; tests/gpu/test_gpu_losses.py runs the same cases on CUDA.

Set-up (exact_enumeration.py): a categorical "bandit" at theta != theta_old, its K outcomes laid
out as one-token rows weighted by the sampler's probabilities. The log-probs (log pi_theta, log
pi_old, log pi_ref) and advantages are rounded to bf16, as an actor computing in bf16 hands them
over; the loss computes in float32 from there (``rpg.math.fused`` promotes bf16 to float32); the
gradient flows back through the rounding to theta (float64).

Targets: unclipped RPG variants, the exact gradient of the objective, -grad J (closed form,
independent of ``rpg``); clipped ones, the library's own float64 gradient at the unrounded inputs
(its clip semantics are tested exactly in test_losses_clip.py); GRPO's corrected KL, the gradient
of KL(pi || pi_ref).

Tolerance (first-order rounding bound). Round-to-nearest bf16 keeps 8 significant bits: each
rounded input x has |dx| <= u|x| with u = 2^-9. A log-ratio log w = l - l_old then moves by at
most eps = u * 2 * max|l| (absolute), so w by a relative eps; an advantage by a relative u <= eps.
The gradient is sum_x mu(x) * Weight(x) * grad log pi(x) with |d/dz_j log pi(x)| <= 1, and each
variant's Weight(x) is a sum of terms |A| w, beta, beta w, beta w |log w| (RPG's weights, paper
Section 4) or w(1 + |l - l_ref|) (the corrected KL), each moved relatively by at most eps, so each
gradient component moves by at most eps * S, with S = sum_x mu(x) * (those terms' absolute
values). ``tolerance`` returns 2 eps S (x 2 for the second-order terms and float32 evaluation);
on these bandits it is 9-20 % of the gradient's largest component while the measured error is
below 1 %, so a missing or mis-signed term (of size beta * S) is still caught.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from exact_enumeration import Bandit, kl

from rpg.math.fused import RPGLossConfig, grpo_corrected_kl, rpg_policy_loss

BETA = 0.37
U_BF16 = 2.0**-9  # unit roundoff of bfloat16 (8 significant bits)
RPG_VARIANTS = [dict(form=f, divergence=d, clip=c) for f, d, c in
                itertools.product(("reinforce", "differentiable"), ("fkl", "rkl", "ufkl", "urkl"), (False, True))]
VARIANT_IDS = [f"{v['form']}-{v['divergence']}-clip_{'on' if v['clip'] else 'off'}" for v in RPG_VARIANTS]
SEEDS = (1, 17)  # bandits with ratios on both sides of the clip range, none near its edges


def _rounded(t: torch.Tensor, device) -> torch.Tensor:
    return t.to(device=device, dtype=torch.bfloat16)


def tolerance(b: Bandit, terms: torch.Tensor, *logs: torch.Tensor) -> float:
    """2 * eps * S with eps = 2 u max|log-prob| and S = sum_x mu(x) terms(x) (module docstring)."""
    eps = 2 * U_BF16 * max(float(t.detach().abs().max()) for t in logs)
    return 2 * eps * float((b.mu * terms).sum())


def rpg_case(variant: dict, device: str, seed: int):
    """(gradient from bf16 inputs on ``device``, float64 target, tolerance) for one RPG variant."""
    b = Bandit.make(seed=seed)
    cfg = RPGLossConfig(beta=BETA, **variant)
    log_prob, old, adv, mask, _ = b.rows()
    w = (log_prob - old).exp().detach().squeeze(1)
    if variant["clip"]:  # rounding must not move a ratio across a clip boundary (else no bound holds)
        eps = 2 * U_BF16 * float(torch.cat([log_prob, old]).abs().max())
        lo, hi = 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high
        for edge in (lo, hi):
            assert float((w - edge).abs().min()) > 2 * eps * edge, f"a ratio is within bf16 rounding of {edge}"
        assert ((w < lo) | (w > hi)).any(), "no ratio outside the clip range: clipping would not be tested"
        target = b.grad(rpg_policy_loss(log_prob=log_prob, old_log_prob=old, advantages=adv, response_mask=mask, config=cfg)[0])
    else:
        target = -b.grad(b.objective(variant["divergence"], BETA))
    loss, _ = rpg_policy_loss(log_prob=_rounded(log_prob, device), old_log_prob=_rounded(old, device), advantages=_rounded(adv, device),
                              response_mask=mask.to(device=device, dtype=torch.float32), config=cfg)
    assert loss.dtype == torch.float32 and loss.device.type == torch.device(device).type
    terms = adv.squeeze(1).abs() * w + BETA * (1 + w + w * w.log().abs())
    return b.grad(loss), target, tolerance(b, terms, log_prob, old)


def grpo_corrected_case(device: str, seed: int):
    """(gradient of E_mu[corrected KL] from bf16 inputs, grad KL(pi || pi_ref), tolerance)."""
    b = Bandit.make(seed=seed, drift=0.5)
    l = torch.log_softmax(b.z, 0).unsqueeze(1)
    l_old, l_ref = torch.log(b.mu).unsqueeze(1), torch.log(b.pi_ref).unsqueeze(1)
    per_token = grpo_corrected_kl(log_prob=_rounded(l, device), old_log_prob=_rounded(l_old, device), ref_log_prob=_rounded(l_ref, device))
    value = (b.mu.to(device) * per_token.squeeze(1).double()).sum()
    w = (l - l_old).exp().detach().squeeze(1)
    terms = w * (1 + (l - l_ref).detach().abs().squeeze(1))
    return b.grad(value), b.grad(kl(b.pi, b.pi_ref)), tolerance(b, terms, l, l_old, l_ref)


def check(grad: torch.Tensor, target: torch.Tensor, atol: float, what: str) -> None:
    assert atol < 0.25 * float(target.abs().max()), f"{what}: tolerance {atol:.3g} too loose to test anything"
    torch.testing.assert_close(grad.cpu(), target, rtol=0, atol=atol, msg=lambda m: f"{what} (bf16 inputs): {m}")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("variant", RPG_VARIANTS, ids=VARIANT_IDS)
def test_rpg_loss_from_bf16_inputs_matches_float64(variant, seed):
    check(*rpg_case(variant, "cpu", seed), what=f"{variant} seed {seed}")


@pytest.mark.parametrize("seed", SEEDS)
def test_grpo_corrected_kl_from_bf16_inputs_matches_float64(seed):
    check(*grpo_corrected_case("cpu", seed), what=f"grpo_corrected seed {seed}")


def test_the_tolerance_catches_a_wrong_kl_term():
    """A variant with the KL term's sign flipped (beta -> -beta) lies outside the tolerance."""
    variant = dict(form="reinforce", divergence="urkl", clip=False)
    grad, target, atol = rpg_case(variant, "cpu", SEEDS[0])
    b = Bandit.make(seed=SEEDS[0])
    flipped = -b.grad(b.objective("urkl", -BETA))
    assert float((flipped - target).abs().max()) > atol


# ----------------------------------------------------------------------------- the loss called as verl calls it
#
# verl's actor computes the logits in bf16, turns them into float32 log-probs (flash-attn's Triton cross-entropy,
# verl.utils.torch_functional.logprobs_from_logits, upcasts inside the kernel) and calls the registered policy
# loss (rpg.verl.policy_loss.rpg_policy_loss) inside torch.autocast(device, bf16) with its actor config. Here the
# bandit's logits z, z_old are rounded to bf16 (the gradient flows back through the rounding to z, float64), the
# log-probs are float32 log-softmax of them, and the registered loss runs under autocast.
#
# Tolerance: a logit moves by at most u max|z| when rounded, so a log-softmax value by at most 2u M and a log-ratio
# l - l_old by at most eps = 4u M, M = max(|z|, |z_old|); the gradient bound is then 2 eps S as above (advantages
# stay float32, not rounded), plus u max|grad| for the logits' gradient, which passes the bf16 cast (rounded).


def _verl_actor_config(variant: dict):
    from verl.workers.config.actor import ActorConfig

    from rpg.verl.policy_loss import RPGPolicyLossConfig

    pl = RPGPolicyLossConfig(loss_mode="rpg", rpg_anchor="sampler", rpg_loss={"beta": BETA, **variant})
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2,
                       clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0, loss_agg_mode="token-mean",
                       policy_loss=pl)


def fp32_log_probs(logits_bf16: torch.Tensor, labels: torch.Tensor, use_verl: bool) -> torch.Tensor:
    """float32 log-probs of ``labels`` from bf16 logits: verl's own function (flash-attn's kernel on a GPU), or
    what that kernel computes (log-softmax in float32 of the bf16 values) where it is not available."""
    if use_verl:
        from verl.utils.torch_functional import logprobs_from_logits

        out = logprobs_from_logits(logits_bf16, labels, inplace_backward=False)
    else:
        out = torch.log_softmax(logits_bf16.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert out.dtype == torch.float32, out.dtype
    return out


def verl_call_case(variant: dict, device: str, seed: int, use_verl_log_probs: bool = False):
    """(gradient of the registered loss called as verl calls it, float64 target, tolerance)."""
    from rpg.verl.policy_loss import rpg_policy_loss as registered_loss

    b = Bandit.make(seed=seed)
    k = b.z.numel()
    labels = torch.arange(k, device=device)
    # one row per outcome x: the model's logits over the K outcomes, rounded to bf16 as the actor outputs them
    logits = b.z.to(device=device, dtype=torch.bfloat16).expand(k, k)
    old_logits = b.z_old.to(device=device, dtype=torch.bfloat16).expand(k, k)
    log_prob = fp32_log_probs(logits, labels, use_verl_log_probs).unsqueeze(1)
    old = fp32_log_probs(old_logits, labels, use_verl_log_probs).unsqueeze(1).detach()
    adv = b.reward.to(device=device, dtype=torch.float32).unsqueeze(1)
    mask = b.mu.to(device=device, dtype=torch.float32).unsqueeze(1)
    with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
        loss, metrics = registered_loss(old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=mask,
                                        loss_agg_mode="token-mean", config=_verl_actor_config(variant))
    assert loss.dtype == torch.float32 and loss.device.type == torch.device(device).type
    assert all(isinstance(v, float) for v in metrics.values())

    M = float(torch.cat([b.z.detach(), b.z_old]).abs().max())
    eps = 4 * U_BF16 * M
    l64, old64, adv64, mask64, _ = b.rows()
    w = (l64 - old64).exp().detach().squeeze(1)
    if variant["clip"]:  # rounding must not move a ratio across a clip boundary (else no bound holds)
        lo, hi = 1 - 0.2, 1 + 0.28
        for edge in (lo, hi):
            assert float((w - edge).abs().min()) > 2 * eps * edge, f"a ratio is within bf16 rounding of {edge}"
        assert ((w < lo) | (w > hi)).any(), "no ratio outside the clip range: clipping would not be tested"
        cfg = RPGLossConfig(beta=BETA, **variant)
        target = b.grad(rpg_policy_loss(log_prob=l64, old_log_prob=old64, advantages=adv64, response_mask=mask64,
                                        config=cfg)[0])
    else:
        target = -b.grad(b.objective(variant["divergence"], BETA))
    terms = adv64.squeeze(1).abs() * w + BETA * (1 + w + w * w.log().abs())
    atol = 2 * eps * float((b.mu * terms).sum()) + U_BF16 * float(target.abs().max())
    return b.grad(loss), target, atol


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("variant", RPG_VARIANTS, ids=VARIANT_IDS)
def test_the_registered_loss_under_cpu_autocast_from_bf16_logits_matches_float64(variant, seed):
    """The code path of verl's call on the CPU: autocast(cpu, bf16), float32 log-probs of bf16 logits
    (tests/gpu/test_gpu_losses.py runs it under autocast(cuda, bf16) with verl's own log-prob kernel)."""
    check(*verl_call_case(variant, "cpu", seed), what=f"{variant} seed {seed} under autocast(cpu)")


def test_the_verl_call_tolerance_catches_a_wrong_kl_term():
    variant = dict(form="reinforce", divergence="urkl", clip=False)
    grad, target, atol = verl_call_case(variant, "cpu", SEEDS[0])
    b = Bandit.make(seed=SEEDS[0])
    flipped = -b.grad(b.objective("urkl", -BETA))
    assert float((flipped - target).abs().max()) > atol and float((grad - target).abs().max()) <= atol
