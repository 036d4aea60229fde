"""A stale sampler (verl's ``trainer.v1.trainer_mode=colocate_async``): the RPG losses, called through the
registered verl path with a stale-sampler micro-batch, have exactly the gradient of their objective.

Four policies on an enumerated bandit, float64: theta (trained), pi_old (recomputed at the step's start:
the micro-batch's ``old_log_probs``), mu (the stale rollout policy: ``rollout_log_probs``) and pi_ref,
all different. Each outcome x is one micro-batch of one response token, built as verl's engine builds
it (nested prompts/responses, a full-sequence nested ``log_probs`` model output, the non-tensor batch
info), and goes through ``rpg.verl.actor_loss.rpg_actor_loss`` -> verl's ``ppo_loss`` -> the registered
policy loss. The expected gradient under mu is sum_x mu(x) * grad loss(x), compared with the autograd
gradient of the closed-form objective (docs/math.md#four-policies):

  anchor=reference:          J = E_pi[R] - beta * D(pi, pi_ref)
  anchor=sampler, decoupled: J = E_pi[R] - beta * D(pi, pi_old)
  anchor=sampler, bypass:    J = E_pi[R] - beta * D(pi, mu)       (pi_old := mu)
  grpo_corrected:            J = E_pi[R] - beta * KL(pi || anchor)

Negative controls that must fail: the behaviour weights dropped, and a binding truncation.
"""

from __future__ import annotations

import math

import pytest
import torch
from exact_enumeration import DT, assert_close, divergence, kl
from tensordict import TensorDict

from verl.trainer.ppo.rollout_corr_helper import compute_rollout_corr_metrics_from_logprobs
from verl.utils import tensordict_utils as tu
from verl.workers.config.actor import ActorConfig

import rpg.verl.register  # noqa: F401  (the registered loss modes)
from rpg.math.behavior import behavior_weights
from rpg.math.fused import RPGLossConfig, rpg_policy_loss
from rpg.verl.actor_loss import rpg_actor_loss
from rpg.verl.policy_loss import RPGPolicyLossConfig

BETA = 0.37  # large, so a KL term without its weight cannot hide
K = 6
DIVERGENCES = ("fkl", "rkl", "ufkl", "urkl")
FORMS = ("reinforce", "differentiable")


def _nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


class StaleBandit:
    """theta != pi_old != mu != pi_ref on K outcomes (softmax of four parameter vectors)."""

    def __init__(self, seed: int, stale: float = 0.8):
        g = torch.Generator().manual_seed(seed)
        self.z_old = torch.randn(K, generator=g, dtype=DT)
        self.z = (self.z_old + 0.3 * torch.randn(K, generator=g, dtype=DT)).requires_grad_(True)
        self.z_mu = self.z_old + stale * torch.randn(K, generator=g, dtype=DT)
        self.z_ref = torch.randn(K, generator=g, dtype=DT)
        self.reward = torch.randn(K, generator=g, dtype=DT)

    pi = property(lambda self: torch.softmax(self.z, 0))
    pi_old = property(lambda self: torch.softmax(self.z_old, 0))
    mu = property(lambda self: torch.softmax(self.z_mu, 0))
    pi_ref = property(lambda self: torch.softmax(self.z_ref, 0))

    def grad(self, scalar):
        (g,) = torch.autograd.grad(scalar, self.z, retain_graph=True)
        return g

    def objective_grad(self, name: str, anchor: torch.Tensor) -> torch.Tensor:
        return self.grad((self.pi * self.reward).sum() - BETA * divergence(name, self.pi, anchor))

    def micro_batch(self, x: int, bypass: bool, with_ref: bool, baseline: float = 0.3):
        """Outcome x as verl's engine hands a one-response micro-batch to the actor loss."""
        log_pi = torch.log_softmax(self.z, 0)[x]
        l_mu = torch.log_softmax(self.z_mu, 0)[x]
        l_old = l_mu if bypass else torch.log_softmax(self.z_old, 0)[x]  # bypass: old_log_probs := rollout_log_probs
        one = lambda v: _nested([v.detach().reshape(1).to(DT)])  # noqa: E731
        fields = {
            "prompts": _nested([torch.ones(2, dtype=torch.long)]),
            "responses": _nested([torch.ones(1, dtype=torch.long)]),
            "response_mask": _nested([torch.ones(1, dtype=DT)]),
            "old_log_probs": one(l_old),
            "rollout_log_probs": one(l_mu),
            "advantages": one(self.reward[x] - baseline),
        }
        if with_ref:
            fields["ref_log_prob"] = one(torch.log_softmax(self.z_ref, 0)[x])
        data = TensorDict(fields, batch_size=[1])
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=1, global_batch_size=1)
        # full-sequence log-probs (prompt 2 + response 1): the response's log-prob sits at position p - 1
        row = torch.cat([torch.zeros(1, dtype=DT), log_pi.reshape(1), torch.zeros(1, dtype=DT)])
        return {"log_probs": _nested([row])}, data


def _config(loss_mode="rpg", anchor="reference", stale=True, **loss):
    rpg_loss = {"beta": BETA, "clip": False, **loss}
    pl = RPGPolicyLossConfig(loss_mode=loss_mode, rpg_anchor=anchor, rpg_stale_sampler=stale, rpg_loss=rpg_loss)
    # clip ratios wide enough never to bind (grpo_corrected's PPO part is verl's dual-clip)
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2,
                       clip_ratio_low=0.99, clip_ratio_high=100.0, clip_ratio_c=1e6, loss_agg_mode="token-mean",
                       entropy_coeff=0.0, policy_loss=pl)


def expected_surrogate_grad(b: StaleBandit, config, bypass: bool = False):
    """sum_x mu(x) * grad loss(x), each loss(x) through the actor loss; also the per-call metrics."""
    total, metrics = 0.0, []
    for x in range(K):
        model_output, data = b.micro_batch(x, bypass, config.policy_loss.rpg_anchor == "reference")
        loss, m = rpg_actor_loss(config=config, model_output=model_output, data=data)
        total = total + b.mu[x] * loss
        metrics.append(m)
    return b.grad(total), metrics


def _rel_error(got, want) -> float:
    return float((got - want).norm() / want.norm())


# ----------------------------------------------------------------- exact: every divergence x form, clip off


@pytest.mark.parametrize("anchor", ["reference", "sampler"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("div", DIVERGENCES)
@pytest.mark.parametrize("seed", [0, 3])
def test_decoupled_untruncated_weights_give_the_exact_gradient(div, form, anchor, seed):
    b = StaleBandit(seed)
    got, metrics = expected_surrogate_grad(b, _config(anchor=anchor, divergence=div, form=form))
    want = -b.objective_grad(div, b.pi_ref if anchor == "reference" else b.pi_old)
    assert_close(got, want, rtol=1e-9, atol=1e-12, what=f"decoupled {div} {form} {anchor}")
    # the weights really were in play: pi_old/mu far from 1 somewhere
    assert max(m["rpg/behavior_weight_max"].aggregate() for m in metrics) > 1.3
    assert min(m["rpg/behavior_weight_min"].aggregate() for m in metrics) < 0.8


@pytest.mark.parametrize("anchor", ["reference", "sampler"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("div", DIVERGENCES)
def test_bypass_mode_gives_the_exact_gradient(div, form, anchor):
    """verl's bypass mode: old_log_probs := rollout_log_probs, so b = 1 and w = pi_theta/mu; the sampler
    anchor is then mu itself."""
    b = StaleBandit(5)
    got, metrics = expected_surrogate_grad(b, _config(anchor=anchor, divergence=div, form=form), bypass=True)
    want = -b.objective_grad(div, b.pi_ref if anchor == "reference" else b.mu)
    assert_close(got, want, rtol=1e-9, atol=1e-12, what=f"bypass {div} {form} {anchor}")
    assert all(m["rpg/behavior_weight_max"].aggregate() == 1.0 == m["rpg/behavior_weight_min"].aggregate()
               for m in metrics)


@pytest.mark.parametrize("anchor", ["reference", "sampler"])
@pytest.mark.parametrize("bypass", [False, True])
def test_grpo_corrected_gives_the_exact_gradient(anchor, bypass):
    b = StaleBandit(7)
    got, _ = expected_surrogate_grad(b, _config(loss_mode="grpo_corrected", anchor=anchor), bypass=bypass)
    sampler = b.mu if bypass else b.pi_old
    anchor_p = b.pi_ref if anchor == "reference" else sampler
    want = -b.grad((b.pi * b.reward).sum() - BETA * kl(b.pi, anchor_p))
    assert_close(got, want, rtol=1e-9, atol=1e-12, what=f"grpo_corrected {anchor} bypass={bypass}")


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_a_cap_that_never_binds_keeps_the_gradient_exact(level):
    b = StaleBandit(0)
    cap = float((b.pi_old / b.mu).max()) * 1.01
    config = _config(divergence="ufkl", form="reinforce", behavior_weight_cap=cap, behavior_weight_level=level)
    got, metrics = expected_surrogate_grad(b, config)
    assert_close(got, -b.objective_grad("ufkl", b.pi_ref), rtol=1e-9, atol=1e-12, what="cap above every weight")
    assert all(m["rpg/behavior_weight_capped_frac"].aggregate() == 0.0 for m in metrics)


# ----------------------------------------------------------------- negative controls: these MUST be wrong


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("div", DIVERGENCES)
def test_negative_control_dropping_the_weights_is_not_the_gradient(div, form):
    """The same micro-batches without the stale-sampler weights estimate the gradient under mu, not pi_old:
    off by more than 10 % of the gradient's norm on this bandit."""
    b = StaleBandit(0)
    want = -b.objective_grad(div, b.pi_ref)
    exact, _ = expected_surrogate_grad(b, _config(divergence=div, form=form))
    dropped, metrics = expected_surrogate_grad(b, _config(divergence=div, form=form, stale=False))
    assert _rel_error(exact, want) < 1e-10
    assert _rel_error(dropped, want) > 0.10, f"dropping pi_old/mu went unnoticed ({div} {form})"
    assert not any("rpg/behavior_kl" in m for m in metrics)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("div", DIVERGENCES)
def test_negative_control_a_binding_truncation_is_biased(div, form, level):
    b = StaleBandit(0)
    want = -b.objective_grad(div, b.pi_ref)
    config = _config(divergence=div, form=form, behavior_weight_cap=1.0, behavior_weight_level=level)
    truncated, metrics = expected_surrogate_grad(b, config)
    assert max(m["rpg/behavior_weight_capped_frac"].aggregate() for m in metrics) > 0  # the cap binds
    assert max(m["rpg/behavior_weight_max"].aggregate() for m in metrics) == 1.0
    assert _rel_error(truncated, want) > 0.10, f"a binding truncation went unnoticed ({div} {form} {level})"


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("div", DIVERGENCES)
def test_level_none_is_the_weights_dropped_and_is_biased(div, form):
    """``behavior_weight_level=none`` (the study's uncorrected arm) is exactly the loss without the stale-sampler
    weights: the same gradient as a micro-batch the loss treats as fresh, off the exact one by > 10 %; the
    behaviour KL is still measured and the applied weights are all 1."""
    b = StaleBandit(0)
    want = -b.objective_grad(div, b.pi_ref)
    none, metrics = expected_surrogate_grad(b, _config(divergence=div, form=form, behavior_weight_level="none"))
    dropped, _ = expected_surrogate_grad(b, _config(divergence=div, form=form, stale=False))
    assert_close(none, dropped, rtol=1e-12, atol=1e-15, what=f"level none = no weights ({div} {form})")
    assert _rel_error(none, want) > 0.10, f"level none went unnoticed ({div} {form})"
    assert all(m["rpg/behavior_weight_max"].aggregate() == 1.0 == m["rpg/behavior_weight_min"].aggregate()
               for m in metrics)
    assert max(abs(m["rpg/behavior_kl"].aggregate()) for m in metrics) > 0.05  # mu != pi_old, and it is logged


def test_level_none_takes_no_cap():
    from rpg.math.fused import RPGLossConfigError

    with pytest.raises(RPGLossConfigError, match="behavior_weight_cap"):
        RPGLossConfig(behavior_weight_level="none", behavior_weight_cap=1.0)
    _, _, t = _multi_token()
    w = behavior_weights(t["old"], t["mu"], t["mask"], "none")
    assert torch.equal(w, t["mask"])


# ----------------------------------------------------------------- the weights, metrics and guards on real-shaped batches


def _multi_token(seed=0, bypass=False, with_is_weights=False, with_rollout=True):
    """Three responses of lengths 4, 2, 3 as a verl micro-batch; returns (model_output, data, padded tensors)."""
    g = torch.Generator().manual_seed(seed)
    lens, prompts, T = [4, 2, 3], [2, 3, 1], 4
    mask = torch.zeros(3, T)
    for i, n in enumerate(lens):
        mask[i, :n] = 1
    mu = -torch.rand(3, T, generator=g) * 2 - 0.1
    old = mu if bypass else mu + 0.4 * torch.randn(3, T, generator=g)
    new = old + 0.2 * torch.randn(3, T, generator=g)
    adv = torch.randn(3, 1, generator=g).expand(3, T).clone()
    resp = lambda t: _nested([t[i, :n] for i, n in enumerate(lens)])  # noqa: E731
    fields = {"prompts": _nested([torch.ones(p, dtype=torch.long) for p in prompts]),
              "responses": _nested([torch.ones(n, dtype=torch.long) for n in lens]),
              "response_mask": resp(mask), "old_log_probs": resp(old), "advantages": resp(adv)}
    if with_rollout:
        fields["rollout_log_probs"] = resp(mu)
    if with_is_weights:
        fields["rollout_is_weights"] = resp(torch.ones(3, T))
    data = TensorDict(fields, batch_size=[3])
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=3)
    flat = []
    for i, (p, n) in enumerate(zip(prompts, lens)):
        row = torch.zeros(p + n)
        row[p - 1 : p - 1 + n] = new[i, :n]
        flat.append(row)
    leaf = torch.cat(flat).requires_grad_(True)
    offsets = [0]
    for p, n in zip(prompts, lens):
        offsets.append(offsets[-1] + p + n)
    model_output = {"log_probs": _nested([leaf[offsets[i] : offsets[i + 1]] for i in range(3)])}
    return model_output, data, dict(mask=mask, mu=mu, old=old, new=new, adv=adv, leaf=leaf)


def test_sequence_weight_is_the_product_of_token_weights():
    _, _, t = _multi_token()
    tok = behavior_weights(t["old"], t["mu"], t["mask"], "token")
    seq = behavior_weights(t["old"], t["mu"], t["mask"], "sequence")
    for i in range(3):
        n = int(t["mask"][i].sum())
        prod = torch.prod(tok[i, :n].double())
        torch.testing.assert_close(seq[i, :n].double(), prod.expand(n), rtol=1e-5, atol=0)
        assert (seq[i, n:] == 0).all() and (tok[i, n:] == 0).all()


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_actor_loss_weights_every_token_of_the_library_loss(level):
    """Multi-token micro-batch: the actor loss == agg(b * library per-token loss), value and gradient."""
    model_output, data, t = _multi_token(seed=1)
    config = _config(anchor="sampler", divergence="urkl", form="reinforce", clip=True, behavior_weight_level=level)
    config = _with_clip(config)
    loss, metrics = rpg_actor_loss(config=config, model_output=model_output, data=data)
    (grad,) = torch.autograd.grad(loss, t["leaf"])
    lib = RPGLossConfig(divergence="urkl", form="reinforce", beta=BETA, clip=True, behavior_weight_level=level)
    # the same graph: gather the response log-probs from the leaf
    rows, start = [], 0
    for i, (p, n) in enumerate(zip([2, 3, 1], [4, 2, 3])):
        rows.append(torch.nn.functional.pad(t["leaf"][start + p - 1 : start + p - 1 + n], (0, 4 - n)))
        start += p + n
    new = torch.stack(rows)
    w = behavior_weights(t["old"], t["mu"], t["mask"], level)
    loss_mat, _ = rpg_policy_loss(log_prob=new, old_log_prob=t["old"], advantages=t["adv"], response_mask=t["mask"],
                                  config=lib, aggregate=False)
    want = (loss_mat * w * t["mask"]).sum() / t["mask"].sum()
    (want_grad,) = torch.autograd.grad(want, t["leaf"])
    torch.testing.assert_close(loss.detach(), want.detach(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-7)
    assert metrics["rpg/behavior_weight_mean"].aggregate() == pytest.approx(float(w[t["mask"] > 0].mean()), rel=1e-5)


def _with_clip(config):
    import dataclasses

    return dataclasses.replace(config, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)


def test_behavior_metrics_agree_with_verls_rollout_correction_metrics():
    """rpg/behavior_kl is verl's rollout_corr/kl (KL(mu || pi_old), k1) and rpg/behavior_kl_k3 its k3_kl."""
    model_output, data, t = _multi_token(seed=2)
    _, metrics = rpg_actor_loss(config=_config(anchor="sampler", divergence="ufkl", form="reinforce"), model_output=model_output,
                                data=data)
    verl_m = compute_rollout_corr_metrics_from_logprobs(t["old"], t["mu"], t["mask"])
    assert metrics["rpg/behavior_kl"].aggregate() == pytest.approx(verl_m["rollout_corr/kl"], rel=1e-5)
    assert metrics["rpg/behavior_kl_k3"].aggregate() == pytest.approx(verl_m["rollout_corr/k3_kl"], rel=1e-5)
    w = torch.exp(t["old"] - t["mu"])[t["mask"] > 0]
    assert metrics["rpg/behavior_weight_max"].aggregate() == pytest.approx(float(w.max()), rel=1e-6)
    assert metrics["rpg/behavior_weight_min"].aggregate() == pytest.approx(float(w.min()), rel=1e-6)


def test_loss_metrics_are_weighted_to_pi_old():
    """rpg/kl_estimate under a stale sampler is the b-weighted mean over the global token count, sum b * kl / N
    (the importance-weighted estimate under pi_old; rpg.verl.actor_loss._global_means); the library's own
    metric with mask * b is the self-normalised sum b * kl / sum b."""
    model_output, data, t = _multi_token(seed=3)
    _, metrics = rpg_actor_loss(config=_config(anchor="sampler", divergence="ufkl", form="reinforce"),
                                model_output=model_output, data=data)
    w = behavior_weights(t["old"], t["mu"], t["mask"], "token")
    lib = RPGLossConfig(divergence="ufkl", form="reinforce", beta=BETA, clip=False)
    _, weighted = rpg_policy_loss(log_prob=t["new"], old_log_prob=t["old"], advantages=t["adv"],
                                  response_mask=t["mask"] * w, config=lib)
    _, plain = rpg_policy_loss(log_prob=t["new"], old_log_prob=t["old"], advantages=t["adv"],
                               response_mask=t["mask"], config=lib)
    got = metrics["rpg/kl_estimate"].aggregate()
    m = t["mask"]
    assert got == pytest.approx(weighted["rpg/kl_estimate"] * float((m * w).sum() / m.sum()), rel=1e-5)
    assert not math.isclose(got, plain["rpg/kl_estimate"], rel_tol=1e-3)


def test_bypass_weights_are_exactly_one_and_change_nothing():
    model_output, data, t = _multi_token(seed=4, bypass=True)
    stale, _ = rpg_actor_loss(config=_config(anchor="sampler", divergence="fkl", form="differentiable"), model_output=model_output,
                              data=data)
    model_output2, data2, t2 = _multi_token(seed=4, bypass=True)
    plain, _ = rpg_actor_loss(config=_config(anchor="sampler", divergence="fkl", form="differentiable", stale=False),
                              model_output=model_output2, data=data2)
    assert torch.equal(stale.detach(), plain.detach())


def test_stale_sampler_without_rollout_log_probs_is_an_error():
    model_output, data, _ = _multi_token(with_rollout=False)
    with pytest.raises(ValueError, match="rollout_log_probs"):
        rpg_actor_loss(config=_config(anchor="sampler", divergence="ufkl"), model_output=model_output, data=data)


def test_verls_rollout_is_weights_and_the_behaviour_weights_are_never_both_applied():
    model_output, data, _ = _multi_token(with_is_weights=True)
    with pytest.raises(ValueError, match="rollout_is"):
        rpg_actor_loss(config=_config(anchor="sampler", divergence="ufkl"), model_output=model_output, data=data)


def test_kl_threshold_reference_kl_is_weighted_to_pi_old():
    """The kl_threshold schedule's KL(pi_old || pi_ref), from mu's samples: with b = pi_old/mu it is exact
    (enumeration: rows weighted by mu(x)); without b it estimates E_mu[k3], another number."""
    from rpg.verl.trainer import k3_token_kl

    b = StaleBandit(0)
    old, ref = torch.log(b.pi_old)[:, None], torch.log(b.pi_ref)[:, None]
    mu = b.mu.detach()[:, None]
    weights = behavior_weights(old, torch.log(b.mu)[:, None], torch.ones_like(old))
    exact = float(kl(b.pi_old, b.pi_ref))
    assert k3_token_kl(old, ref, mu, weights) == pytest.approx(exact, rel=1e-12)
    assert abs(k3_token_kl(old, ref, mu) - exact) > 0.05 * exact
