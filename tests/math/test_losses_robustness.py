"""Numerical edge cases (huge/tiny ratios, empty masks, all-equal rewards, bf16) and config
validation: every loss, gradient and metric stays finite; bad input raises a clear ValueError."""

import itertools
import math

import pytest
import torch

from rpg.math.fused import RPGLossConfig, grpo_corrected_kl, rpg_policy_loss

VARIANTS = [
    dict(divergence=d, form=f, clip=c)
    for d, f, c in itertools.product(("fkl", "rkl", "ufkl", "urkl"), ("reinforce", "differentiable"), (True, False))
] + [dict(divergence="urkl", form="differentiable", fd_clip="algorithm1", clip=c) for c in (True, False)]


def run(cfg, l, old, adv, mask, ref=None):
    l = l.clone().requires_grad_(True)
    loss, metrics = rpg_policy_loss(log_prob=l, old_log_prob=old, advantages=adv, response_mask=mask, config=cfg, ref_log_prob=ref)
    loss.backward()
    assert torch.isfinite(loss), f"loss {loss}"
    assert torch.isfinite(l.grad).all(), "gradient"
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    return loss, l.grad, metrics


def extreme_inputs(dtype=torch.float32):
    l = torch.tensor([[-0.01, -60.0, -1e-4, -3.0], [-50.0, -0.5, -80.0, -2.0]], dtype=dtype)
    old = torch.tensor([[-50.01, -10.0, -50.0, -3.0], [-0.001, -50.5, -1.0, -2.5]], dtype=dtype)
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4], dtype=dtype)
    return l, old, adv, torch.ones(2, 4, dtype=dtype)


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_log_ratios_of_plus_minus_50_stay_finite(variant):
    l, old, adv, mask = extreme_inputs()
    assert (l - old).abs().max() >= 49.0
    beta = 1e-4
    run(RPGLossConfig(beta=beta, **variant), l, old, adv, mask)
    run(RPGLossConfig(beta=beta, **variant), l, old, adv, mask, ref=old + 40.0)  # three-policy weights, anchor far from sampler


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_guard_keeps_values_finite_beyond_float32_exp_range(variant):
    l = torch.tensor([[-0.1, -200.0]])
    old = torch.tensor([[-200.0, -0.1]])
    _, _, metrics = run(RPGLossConfig(**variant), l, old, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    assert metrics["rpg/log_ratio_guard_frac"] == 1.0


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_empty_masks_all_equal_rewards_and_bf16(variant):
    l, old, adv, mask = extreme_inputs()
    cfg = RPGLossConfig(**variant)
    loss, grad, metrics = run(cfg, l, old, adv, torch.zeros_like(mask))  # fully masked batch
    assert loss.item() == 0.0 and (grad == 0).all() and set(metrics.values()) == {0.0}
    row_masked = mask.clone()
    row_masked[0] = 0.0
    run(cfg, l, old, adv, row_masked)
    run(cfg, l, old, torch.zeros_like(adv), mask)  # all-equal rewards: A = 0
    lb, ob, ab, mb = extreme_inputs(torch.bfloat16)
    loss, grad, _ = run(cfg, lb, ob, ab, mb)
    assert grad.dtype == torch.bfloat16 and loss.dtype == torch.float32


def test_corrected_kl_bf16_and_validation():
    l = torch.randn(2, 3, dtype=torch.bfloat16)
    assert torch.isfinite(grpo_corrected_kl(log_prob=l, old_log_prob=l - 0.1, ref_log_prob=l + 0.2)).all()
    with pytest.raises(ValueError, match="ref_log_prob"):
        grpo_corrected_kl(log_prob=l, old_log_prob=l, ref_log_prob=l[:, :2])


# ----------------------------------------------------------------- validation

BAD_CONFIGS = [
    ("divergence", dict(divergence="js"), "fkl"),
    ("form", dict(form="ppo"), "reinforce"),
    ("beta", dict(beta=-1e-4), ">= 0"),
    ("beta", dict(beta=float("nan")), ">= 0"),
    ("clip", dict(clip="yes"), "True or False"),
    ("clip_ratio_low", dict(clip_ratio_low=0.0), "(0, 1)"),
    ("clip_ratio_low", dict(clip_ratio_low=1.0), "(0, 1)"),
    ("clip_ratio_high", dict(clip_ratio_high=-0.2), "> 0"),
    ("clip_ratio_c", dict(clip_ratio_c=1.0), "> 1"),
    ("clip_ratio_c", dict(clip_ratio_c=0.5), "> 1"),
    ("loss_agg_mode", dict(loss_agg_mode="mean"), "token-mean"),
    ("branch_on", dict(branch_on="A"), "regularized"),
    ("fd_clip", dict(fd_clip="both"), "algorithm1"),
    ("divergence", dict(form="differentiable", fd_clip="algorithm1", divergence="fkl"), "rkl"),
    ("kl_clamp", dict(form="differentiable", kl_clamp=0.0), "> 0"),
    ("kl_clamp", dict(form="reinforce", kl_clamp=10.0), "reinforce"),
    ("log_ratio_guard", dict(log_ratio_guard=0), "> 0"),
]


@pytest.mark.parametrize("field,kwargs,allowed", BAD_CONFIGS, ids=[f"{f}-{k}" for f, k, _ in BAD_CONFIGS])
def test_invalid_config_names_the_field_and_allowed_values(field, kwargs, allowed):
    with pytest.raises(ValueError) as err:
        RPGLossConfig(**kwargs)
    assert f"RPGLossConfig.{field}=" in str(err.value) and allowed in str(err.value)


def test_shape_and_type_errors_name_the_argument():
    cfg = RPGLossConfig()
    l = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="response_mask has shape"):
        rpg_policy_loss(log_prob=l, old_log_prob=l, advantages=l, response_mask=torch.ones(2, 4), config=cfg)
    with pytest.raises(ValueError, match="advantages has shape"):
        rpg_policy_loss(log_prob=l, old_log_prob=l, advantages=torch.zeros(2, 1), response_mask=torch.ones(2, 3), config=cfg)
    with pytest.raises(ValueError, match="ref_log_prob has shape"):
        rpg_policy_loss(log_prob=l, old_log_prob=l, advantages=l, response_mask=torch.ones(2, 3), config=cfg, ref_log_prob=torch.zeros(3, 2))
    with pytest.raises(ValueError, match="2-D"):
        rpg_policy_loss(log_prob=torch.zeros(6), old_log_prob=torch.zeros(6), advantages=torch.zeros(6), response_mask=torch.ones(6), config=cfg)
    with pytest.raises(ValueError, match="old_log_prob must be a floating-point"):
        rpg_policy_loss(log_prob=l, old_log_prob=torch.zeros(2, 3, dtype=torch.long), advantages=l, response_mask=torch.ones(2, 3), config=cfg)
    with pytest.raises(ValueError, match="config must be an RPGLossConfig"):
        rpg_policy_loss(log_prob=l, old_log_prob=l, advantages=l, response_mask=torch.ones(2, 3), config={"divergence": "ufkl"})


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_non_finite_log_probs_in_padding_change_nothing(variant):
    """-inf / NaN log-probs at masked positions (padding) leave loss, gradient and metrics as with finite ones."""
    l, old, adv, mask = extreme_inputs()
    mask[1, 2:] = 0.0
    cfg = RPGLossConfig(**variant)
    for ref in (None, old + 1.0):
        clean = run(cfg, l, old, adv, mask, ref=ref)
        bad_l, bad_old = l.clone(), old.clone()
        bad_l[1, 2], bad_old[1, 2] = -math.inf, -math.inf  # -inf - -inf = NaN
        bad_l[1, 3], bad_old[1, 3] = math.nan, 0.0
        bad_ref = None if ref is None else torch.where(mask != 0, ref, -math.inf)
        dirty = run(cfg, bad_l, bad_old, adv, mask, ref=bad_ref)
        assert torch.equal(clean[0], dirty[0]) and torch.equal(clean[1][mask != 0], dirty[1][mask != 0])
        assert (dirty[1][mask == 0] == 0).all()
        assert clean[2].keys() == dirty[2].keys()
        assert all(clean[2][k] == dirty[2][k] for k in clean[2] if not k.endswith("absdiff_max")), (clean[2], dirty[2])
