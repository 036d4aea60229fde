"""verl's ``trainer.v1.trainer_mode=separate_async``: exact gradients from stale samples across a whole sync cycle.

One cycle of ``parameter_sync_step`` = k updates on an enumerated bandit, float64, through the registered loss
path of tests/verl/test_async_exact.py (``rpg.verl.actor_loss.rpg_actor_loss``): the actor theta_j moves at every
update j (an SGD step along the exact expected gradient), pi_old is the snapshot theta_0 of the cycle's start
(what ``RPGDetachActorWorker`` restores for the 2nd..k-th mini-batch: rpg.verl.snapshot), and each mini-batch
mixes samples of two stale rollout versions mu_1, mu_2 (staleness 1 and 2, both within verl's threshold), every
token weighted by its own pi_old/mu_v. At every update the expectation over the mixture,
sum_v p_v sum_x mu_v(x) grad loss(x; mu_v), is the exact gradient of the objective (docs/math.md#four-policies)
at theta_j, on the reward and the KL term alike:

  anchor=reference: J = E_pi[R] - beta * D(pi, pi_ref)      anchor=sampler: J = E_pi[R] - beta * D(pi, theta_0)

Negative controls: pi_old drifting with the live weights (verl's snapshot aliasing on the CPU, before the copy)
changes the sampler-anchored objective; a token weighted by the other version's mu is biased.
"""

from __future__ import annotations

import pytest
import torch
from exact_enumeration import DT, assert_close
from test_async_exact import BETA, DIVERGENCES, FORMS, K, StaleBandit, _config, _rel_error, expected_surrogate_grad

SHARES = (0.35, 0.65)  # the two stale versions' shares of a mini-batch
LR = 1.5  # large, so theta_j leaves theta_0 visibly within a cycle


class Cycle:
    """theta_0 (= pi_old), two stale samplers mu_1, mu_2, pi_ref and the reward of one bandit."""

    def __init__(self, seed: int):
        g = torch.Generator().manual_seed(1000 + seed)
        self.z0 = torch.randn(K, generator=g, dtype=DT)
        self.z_mu = [self.z0 + 0.8 * torch.randn(K, generator=g, dtype=DT) for _ in SHARES]
        self.z_ref = torch.randn(K, generator=g, dtype=DT)
        self.reward = torch.randn(K, generator=g, dtype=DT)

    def bandit(self, z_live: torch.Tensor, z_mu: torch.Tensor, z_old: torch.Tensor) -> StaleBandit:
        b = StaleBandit(0)
        b.z = z_live.detach().clone().requires_grad_(True)
        b.z_old, b.z_mu, b.z_ref, b.reward = z_old, z_mu, self.z_ref, self.reward
        return b

    def update_grad(self, z_live, config, z_old=None, weighted_by=None):
        """The mixture's expected surrogate gradient at theta = z_live (pi_old = z_old, default the snapshot);
        ``weighted_by``: the index of the version whose mu every token's weight uses (a wrong attribution)."""
        z_old = self.z0 if z_old is None else z_old
        total = 0.0
        for v, share in enumerate(SHARES):
            b = self.bandit(z_live, self.z_mu[v], z_old)
            if weighted_by is None:
                got, _ = expected_surrogate_grad(b, config)
            else:  # samples from mu_v, weights from mu_w: sum_x mu_v(x) * grad loss(x; mu_w)
                w = self.bandit(z_live, self.z_mu[weighted_by], z_old)
                got = _expected_with_weights_of(b, w, config)
            total = total + share * got
        return total

    def objective_grad(self, z_live, name: str, anchor: str) -> torch.Tensor:
        b = self.bandit(z_live, self.z_mu[0], self.z0)
        return b.objective_grad(name, b.pi_ref if anchor == "reference" else b.pi_old)


def _expected_with_weights_of(sampled: StaleBandit, weights_from: StaleBandit, config) -> torch.Tensor:
    from rpg.verl.actor_loss import rpg_actor_loss

    total = 0.0
    for x in range(K):
        model_output, data = weights_from.micro_batch(x, False, config.policy_loss.rpg_anchor == "reference")
        loss, _ = rpg_actor_loss(config=config, model_output=model_output, data=data)
        total = total + sampled.mu[x] * loss
    return weights_from.grad(total)


def _cycle(c: Cycle, config, div: str, anchor: str, k: int):
    """(theta_j, got_j, want_j) for the k updates of one cycle."""
    z, out = c.z0.clone(), []
    for _ in range(k):
        got = c.update_grad(z, config)
        out.append((z, got, -c.objective_grad(z, div, anchor)))
        z = (z - LR * got).detach()
    return out


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("anchor", ["reference", "sampler"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("div", DIVERGENCES)
def test_every_update_of_a_sync_cycle_has_the_exact_gradient(div, form, anchor, k):
    c = Cycle(seed=k)
    steps = _cycle(c, _config(anchor=anchor, divergence=div, form=form), div, anchor, k)
    for j, (z, got, want) in enumerate(steps):
        assert_close(got, want, rtol=1e-9, atol=1e-12, what=f"update {j} of {k}: {div} {form} {anchor}")
    # the live weights really left the snapshot during the cycle
    assert float((steps[-1][0] - c.z0).abs().max()) > 0.05


@pytest.mark.parametrize("anchor", ["reference", "sampler"])
def test_grpo_corrected_is_exact_across_a_sync_cycle(anchor):
    from exact_enumeration import kl

    c = Cycle(seed=7)
    z, config = c.z0.clone(), _config(loss_mode="grpo_corrected", anchor=anchor)
    for j in range(3):
        got = c.update_grad(z, config)
        b = c.bandit(z, c.z_mu[0], c.z0)
        want = -b.grad((b.pi * b.reward).sum() - BETA * kl(b.pi, b.pi_ref if anchor == "reference" else b.pi_old))
        assert_close(got, want, rtol=1e-9, atol=1e-12, what=f"grpo_corrected update {j} {anchor}")
        z = (z - LR * got).detach()


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("div", DIVERGENCES)
def test_negative_control_a_drifting_pi_old_is_another_objective(div, form):
    """verl's CPU snapshot aliasing: pi_old = the live theta_j instead of theta_0 at the 2nd update. With the
    sampler anchor that is the gradient of another objective (KL to theta_j, whose gradient vanishes there)."""
    c = Cycle(seed=2)
    config = _config(anchor="sampler", divergence=div, form=form)
    z1 = (c.z0 - LR * c.update_grad(c.z0, config)).detach()
    want = -c.objective_grad(z1, div, "sampler")
    assert _rel_error(c.update_grad(z1, config), want) < 1e-10
    assert _rel_error(c.update_grad(z1, config, z_old=z1), want) > 0.05, f"a drifting pi_old went unnoticed ({div})"


@pytest.mark.parametrize("anchor", ["reference", "sampler"])
def test_negative_control_each_token_needs_its_own_samplers_mu(anchor):
    """Tokens of two versions weighted by one version's mu (e.g. the newest): biased."""
    c = Cycle(seed=4)
    config = _config(anchor=anchor, divergence="ufkl", form="reinforce")
    want = -c.objective_grad(c.z0, "ufkl", anchor)
    assert _rel_error(c.update_grad(c.z0, config), want) < 1e-10
    assert _rel_error(c.update_grad(c.z0, config, weighted_by=1), want) > 0.05


def test_the_kl_threshold_schedule_reads_every_mini_batch_of_the_step():
    """separate_async runs parameter_sync_step mini-batches per step, each computing its reference KL: the schedule
    reads the token-weighted KL of all of them (sum of numerators / sum of denominators), not the last one's."""
    from types import SimpleNamespace

    from rpg.verl.trainer import ReferenceSchedule, RPGTrainerMixin, k3_token_kl, k3_token_kl_parts, kl_of_parts

    g = torch.Generator().manual_seed(0)
    batches = []
    for shift in (1.5, 0.01):  # a far first mini-batch, a near last one
        old = -torch.rand(3, 4, generator=g, dtype=DT) - 0.1
        batches.append((old, old + shift * torch.randn(3, 4, generator=g, dtype=DT), torch.ones(3, 4, dtype=DT)))
    parts = [k3_token_kl_parts(*b) for b in batches]
    whole = k3_token_kl(torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches]),
                        torch.cat([b[2] for b in batches]))
    assert kl_of_parts(parts) == pytest.approx(whole, rel=1e-12)
    last = kl_of_parts(parts[-1:])
    assert last < 0.01 < whole

    copies = []
    trainer = object.__new__(RPGTrainerMixin)
    trainer.rpg = SimpleNamespace(reference=SimpleNamespace(mode="kl_threshold", log_weight_diff=False))
    trainer.ref_schedule = ReferenceSchedule("kl_threshold", kl_threshold=0.01, kl_ema_decay=0.0)
    trainer.actor_rollout_wg = SimpleNamespace(sync_ref_from_actor=lambda: copies.append(1))
    trainer.global_steps, trainer._ref_kl_parts = 3, parts
    out = trainer._reference_step()
    assert copies == [1] and out["rpg/ref_reset"] == 1.0
    assert out["rpg/ref_kl_ema"] == pytest.approx(whole, rel=1e-12)
