"""Token-level plumbing: sequence vs token decomposition (T26, T27), masks, and aggregation
modes against verl 0.9.1's own ``agg_loss``."""

import itertools

import pytest
import torch
from exact_enumeration import DT, assert_close
from verl.trainer.ppo.core_algos import agg_loss

from rpg.math.formulas import aggregate
from rpg.math.fused import AGG_MODES, RPGLossConfig, rpg_policy_loss

V, T = 3, 2  # vocabulary and length of the autoregressive toy


class TwoStep:
    """pi(o1, o2) = p1(o1) * p2(o2 | o1), parameterised by logits z1 [V] and z2 [V, V]."""

    def __init__(self, seed, drift):
        g = torch.Generator().manual_seed(seed)
        self.z1_old, self.z2_old = torch.randn(V, generator=g, dtype=DT), torch.randn(V, V, generator=g, dtype=DT)
        self.z1 = (self.z1_old + drift * torch.randn(V, generator=g, dtype=DT)).requires_grad_(True)
        self.z2 = (self.z2_old + drift * torch.randn(V, V, generator=g, dtype=DT)).requires_grad_(True)
        self.seqs = list(itertools.product(range(V), repeat=T))

    @staticmethod
    def token_logps(z1, z2, seq):
        return torch.stack([torch.log_softmax(z1, 0)[seq[0]], torch.log_softmax(z2[seq[0]], 0)[seq[1]]])

    def table(self, new: bool):
        z1, z2 = (self.z1, self.z2) if new else (self.z1_old, self.z2_old)
        return torch.stack([self.token_logps(z1, z2, s) for s in self.seqs])  # [V^T, T]

    def grad(self, scalar):
        return torch.cat([g.flatten() for g in torch.autograd.grad(scalar, (self.z1, self.z2), retain_graph=True)])


def seq_kl(log_p, log_q):
    """Sequence-level KL(p||q) from per-token log-prob tables."""
    lp, lq = log_p.sum(1), log_q.sum(1)
    return (lp.exp() * (lp - lq)).sum()


def test_t26_forward_k3_token_sum_is_exact_sequence_kl():
    toy = TwoStep(seed=0, drift=0.6)
    l, l_old = toy.table(True), toy.table(False)
    mu = l_old.sum(1).exp()  # pi_old(x) per sequence, broadcast to its tokens
    cfg = RPGLossConfig(divergence="ufkl", form="differentiable", beta=1.0, clip=False)
    loss, _ = rpg_policy_loss(log_prob=l, old_log_prob=l_old, advantages=torch.zeros_like(l), response_mask=mu[:, None].expand(-1, T), config=cfg)
    token_sum = T * loss  # token-mean over probability-weighted tokens = E[sum_t] / T
    target = seq_kl(l_old, l)
    assert_close(token_sum, target, what="T26 value")
    assert_close(toy.grad(token_sum), toy.grad(target), what="T26 gradient")


def test_t27_reverse_token_decomposition_needs_prefix_weights():
    toy = TwoStep(seed=1, drift=0.6)
    l, l_old = toy.table(True), toy.table(False)
    mu = l_old.sum(1).exp()
    cfg = RPGLossConfig(divergence="urkl", form="differentiable", beta=1.0, clip=False)
    loss, _ = rpg_policy_loss(log_prob=l, old_log_prob=l_old, advantages=torch.zeros_like(l), response_mask=mu[:, None].expand(-1, T), config=cfg)
    target = seq_kl(l, l_old)
    assert (T * loss - target).abs() > 1e-3, "T27 plain per-token reverse sum is not the sequence KL"
    w = (l - l_old).exp()
    prefix = torch.cat([torch.ones_like(w[:, :1]), w[:, :1]], 1)  # prod_{s<t} w_s (differentiable)
    weighted = (mu[:, None] * prefix * (w * w.log() - w + 1)).sum()
    assert_close(weighted, target, what="T27 with prefix weights: value")
    assert_close(toy.grad(weighted), toy.grad(target), what="T27 with prefix weights: gradient")


# ----------------------------------------------------------------- masks and aggregation


def batch(seed=0, b=5, t=7, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    l = (-torch.rand(b, t, generator=g) * 3).to(dtype).requires_grad_(True)
    old = (l.detach().float() + 0.3 * torch.randn(b, t, generator=g)).to(dtype)
    adv = torch.randn(b, 1, generator=g).expand(b, t).to(dtype)
    mask = (torch.rand(b, t, generator=g) > 0.3).float()
    mask[0] = 0.0  # one fully masked response
    mask[1, :] = 1.0
    return l, old, adv, mask


@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_aggregation_matches_verl_agg_loss(mode):
    assert mode in AGG_MODES
    g = torch.Generator().manual_seed(1)
    loss_mat = torch.randn(6, 9, generator=g, dtype=DT)
    mask = (torch.rand(6, 9, generator=g) > 0.4).to(DT)
    mask[2] = 0.0
    assert_close(aggregate(loss_mat, mask, mode), agg_loss(loss_mat, mask, mode), what=mode)


def test_all_masked_batch_aggregates_to_zero_not_nan():
    loss_mat = torch.randn(3, 4)
    for mode in AGG_MODES:
        out = aggregate(loss_mat, torch.zeros(3, 4), mode)
        assert out.item() == 0.0, mode


@pytest.mark.parametrize("form", ["reinforce", "differentiable"])
def test_masked_positions_neither_count_nor_receive_gradient(form):
    l, old, adv, mask = batch()
    cfg = RPGLossConfig(divergence="urkl", form=form, beta=0.1)
    loss, metrics = rpg_policy_loss(log_prob=l, old_log_prob=old, advantages=adv, response_mask=mask, config=cfg)
    (g,) = torch.autograd.grad(loss, l)
    assert (g[mask == 0] == 0).all()
    old2 = old.clone()
    old2[mask == 0] = -30.0  # garbage where masked
    adv2 = adv.clone()
    adv2[mask == 0] = 1e3
    loss2, metrics2 = rpg_policy_loss(log_prob=l, old_log_prob=old2, advantages=adv2, response_mask=mask, config=cfg)
    assert loss2.item() == pytest.approx(loss.item(), rel=1e-6)
    assert metrics2 == pytest.approx(metrics, rel=1e-6)


def test_token_loss_is_zero_where_masked_and_aggregates_like_policy_loss():
    l, old, adv, mask = batch(seed=2)
    for mode in AGG_MODES:
        cfg = RPGLossConfig(divergence="fkl", form="reinforce", loss_agg_mode=mode)
        mat, _ = rpg_policy_loss(log_prob=l, old_log_prob=old, advantages=adv, response_mask=mask, config=cfg, aggregate=False)
        assert (mat[mask == 0] == 0).all()
        loss, _ = rpg_policy_loss(log_prob=l, old_log_prob=old, advantages=adv, response_mask=mask, config=cfg)
        assert_close(loss, agg_loss(mat, mask, mode), rtol=1e-6, atol=1e-7, what=mode)
