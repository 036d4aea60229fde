"""The verl loss adapters, fed fabricated engine micro-batches, return exactly what the loss
library returns -- value, gradient and metrics -- for every aggregation mode and across
micro-batch splits (verl's global-batch normalisation contract).

A micro-batch is built in the engine's no-padding format: nested (jagged) ``prompts``,
``responses``, ``response_mask``, ``old_log_probs``, ``advantages``, ``ref_log_prob`` and a
nested full-sequence ``model_output["log_probs"]`` (response log-probs left-shifted by one, as
``no_padding_2_padding`` expects), plus the non-tensor ``dp_size``, ``batch_num_tokens`` and
``global_batch_size`` the FSDP engine assigns.
"""

import pytest
import torch
from tensordict import TensorDict

from verl.trainer.ppo.core_algos import agg_loss, compute_policy_loss_vanilla
from verl.utils import tensordict_utils as tu
from verl.utils.metric import Metric
from verl.workers.config.actor import ActorConfig
from verl.workers.utils.losses import ppo_loss

import rpg.verl.register  # noqa: F401
from rpg.math.formulas import aggregate
from rpg.math.fused import RPGLossConfig, grpo_corrected_kl, rpg_policy_loss
from rpg.verl.actor_loss import rpg_actor_loss
from rpg.verl.policy_loss import RPGPolicyLossConfig

B = 6
RESP_LENS = [5, 3, 7, 1, 4, 6]
PROMPT_LENS = [3, 2, 4, 2, 3, 1]
T = max(RESP_LENS)


def _nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


class Batch:
    """One fabricated mini-batch; ``micro(idx)`` builds the engine's view of a subset of rows."""

    def __init__(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.mask = torch.zeros(B, T)
        for i, n in enumerate(RESP_LENS):
            self.mask[i, :n] = 1.0
        self.mask[2, 3] = 0.0  # an interior masked token
        self.old = -torch.rand(B, T, generator=g) * 2.0 - 0.05
        self.ref = self.old + 0.3 * torch.randn(B, T, generator=g)
        self.new = self.old + 0.35 * torch.randn(B, T, generator=g)  # ratios spread over clip regions
        scores = torch.randn(B, generator=g)
        scores[3] = 0.0
        self.adv = scores[:, None].expand(B, T).clone()
        self.entropy = torch.rand(B, T, generator=g)
        # full-sequence flat log-prob leaf (what the model returns, nested by sequence)
        self.seq_lens = [p + r for p, r in zip(PROMPT_LENS, RESP_LENS)]
        flat = []
        for i in range(B):
            row = torch.randn(self.seq_lens[i], generator=g)
            p, r = PROMPT_LENS[i], RESP_LENS[i]
            row[p - 1 : p - 1 + r] = self.new[i, :r]
            flat.append(row)
        self.flat = torch.cat(flat).requires_grad_(True)
        self.offsets = torch.tensor([0] + self.seq_lens).cumsum(0)

    def padded_log_prob(self):
        """Response log-probs [B,T] gathered from the flat leaf (same graph as the adapter's)."""
        rows = []
        for i in range(B):
            p, r = PROMPT_LENS[i], RESP_LENS[i]
            start = int(self.offsets[i]) + p - 1
            rows.append(torch.nn.functional.pad(self.flat[start : start + r], (0, T - r)))
        return torch.stack(rows)

    def micro(self, idx, with_ref=True, entropy=False):
        def resp(x):
            return _nested([x[i, : RESP_LENS[i]] for i in idx])

        fields = {
            "prompts": _nested([torch.ones(PROMPT_LENS[i], dtype=torch.long) for i in idx]),
            "responses": _nested([torch.ones(RESP_LENS[i], dtype=torch.long) for i in idx]),
            "response_mask": resp(self.mask),
            "old_log_probs": resp(self.old),
            "advantages": resp(self.adv),
        }
        if with_ref:
            fields["ref_log_prob"] = resp(self.ref)
        data = TensorDict(fields, batch_size=[len(idx)])
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(self.mask.sum()), global_batch_size=B)
        pieces = [self.flat[int(self.offsets[i]) : int(self.offsets[i + 1])] for i in idx]
        model_output = {"log_probs": _nested(pieces)}
        if entropy:
            ent_rows = []
            for i in idx:
                row = torch.zeros(self.seq_lens[i])
                p, r = PROMPT_LENS[i], RESP_LENS[i]
                row[p - 1 : p - 1 + r] = self.entropy[i, :r]
                ent_rows.append(row)
            model_output["entropy"] = _nested(ent_rows)
        return model_output, data


def _actor_config(agg, anchor="sampler", loss_mode="rpg", entropy_coeff=0.0, **rpg):
    pl = RPGPolicyLossConfig(loss_mode=loss_mode, rpg_anchor=anchor, rpg_loss={k[len("rpg_"):]: v for k, v in rpg.items()})
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2,
                       clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0, loss_agg_mode=agg,
                       entropy_coeff=entropy_coeff, policy_loss=pl)


def _lib_cfg(agg, **kw):
    args = dict(divergence="ufkl", form="reinforce", beta=0.05, clip=True, clip_ratio_low=0.2,
                clip_ratio_high=0.28, clip_ratio_c=10.0, loss_agg_mode=agg)
    args.update(kw)
    return RPGLossConfig(**args)


def _run_adapter(batch, config, splits, loss_fn=rpg_actor_loss, entropy=False):
    total, metrics_per_mb = 0.0, []
    for idx in splits:
        model_output, data = batch.micro(idx, entropy=entropy)
        loss, metrics = loss_fn(config=config, model_output=model_output, data=data)
        total = total + loss
        metrics_per_mb.append(metrics)
    (grad,) = torch.autograd.grad(total, batch.flat)
    return total.detach(), grad, metrics_per_mb


def _run_library(batch, cfg, ref=False, entropy_coeff=0.0):
    log_prob = batch.padded_log_prob()
    loss, metrics = rpg_policy_loss(log_prob=log_prob, old_log_prob=batch.old, advantages=batch.adv, response_mask=batch.mask, config=cfg,
                                    ref_log_prob=batch.ref if ref else None)
    if entropy_coeff:
        loss = loss - entropy_coeff * aggregate(batch.entropy, batch.mask, cfg.loss_agg_mode)
    (grad,) = torch.autograd.grad(loss, batch.flat)
    return loss.detach(), grad, metrics


SPLITS = {
    "one": [list(range(B))],
    "two": [[0, 1, 2], [3, 4, 5]],
    "uneven": [[0], [1, 2, 3, 4], [5]],
}
VARIANTS = [
    dict(rpg_divergence="ufkl", rpg_form="differentiable"),
    dict(rpg_divergence="urkl", rpg_form="reinforce", rpg_clip=True),
    dict(rpg_divergence="fkl", rpg_form="reinforce", rpg_clip=False),
    dict(rpg_divergence="rkl", rpg_form="differentiable", rpg_fd_clip="algorithm1"),
]


def _lib_kwargs(v):
    return dict(divergence=v["rpg_divergence"], form=v["rpg_form"], clip=v.get("rpg_clip", True),
                fd_clip=v.get("rpg_fd_clip", "reward"))


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum"])
@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("anchor", ["sampler", "reference"])
@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_adapter_equals_library_across_micro_batches(agg, split, anchor, variant):
    v = VARIANTS[variant]
    batch = Batch(seed=variant)
    config = _actor_config(agg, anchor=anchor, rpg_beta=0.05, **v)
    got_loss, got_grad, _ = _run_adapter(batch, config, SPLITS[split])
    want_loss, want_grad, _ = _run_library(batch, _lib_cfg(agg, **_lib_kwargs(v)), ref=anchor == "reference")
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-7)
    assert got_grad.abs().sum() > 0


def test_adapter_metrics_are_the_library_metrics_single_micro_batch():
    batch = Batch(seed=3)
    config = _actor_config("token-mean", anchor="reference", rpg_beta=0.05)
    _, _, (metrics,) = _run_adapter(batch, config, SPLITS["one"])
    _, lib_metrics = rpg_policy_loss(log_prob=batch.padded_log_prob(), old_log_prob=batch.old, advantages=batch.adv, response_mask=batch.mask,
                                    config=_lib_cfg("token-mean"), ref_log_prob=batch.ref, aggregate=False)
    for key, value in lib_metrics.items():
        assert isinstance(metrics[key], Metric)
        assert metrics[key].aggregate() == pytest.approx(value, rel=1e-6, abs=1e-9), key
    assert metrics["rpg/ref_old_logp_absdiff_max"].aggregate() == pytest.approx(
        float((batch.ref - batch.old).abs()[batch.mask.bool()].max()))
    assert "actor/pg_loss" in metrics and "actor/pg_clipfrac" in metrics


def test_adapter_entropy_coefficient_like_ppo_loss():
    batch = Batch(seed=4)
    config = _actor_config("token-mean", entropy_coeff=0.01, rpg_beta=0.05)
    got_loss, got_grad, metrics = _run_adapter(batch, config, SPLITS["two"], entropy=True)
    want_loss, want_grad, _ = _run_library(batch, _lib_cfg("token-mean"), entropy_coeff=0.01)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-7)
    assert "actor/entropy_loss" in metrics[0]


def test_registered_loss_through_verl_ppo_loss_equals_adapter_in_sampler_mode():
    """verl's stock ppo_loss + loss_mode=rpg (registered) == the recipe's full actor loss."""
    batch = Batch(seed=5)
    config = _actor_config("token-mean", anchor="sampler", rpg_beta=0.05)
    got_loss, got_grad, metrics = _run_adapter(batch, config, SPLITS["uneven"], loss_fn=ppo_loss)
    want_loss, want_grad, _ = _run_adapter(batch, config, SPLITS["uneven"])
    torch.testing.assert_close(got_loss, want_loss)
    torch.testing.assert_close(got_grad, want_grad)
    assert any(k.startswith("rpg/") for k in metrics[0])


def test_grpo_corrected_is_vanilla_ppo_plus_weighted_k3():
    batch = Batch(seed=6)
    config = _actor_config("token-mean", anchor="reference", loss_mode="grpo_corrected", rpg_beta=0.1)
    got_loss, got_grad, metrics = _run_adapter(batch, config, SPLITS["two"])

    log_prob = batch.padded_log_prob()
    config.global_batch_info.update(dp_size=1, batch_num_tokens=int(batch.mask.sum()), global_batch_size=B,
                                    loss_scale_factor=None)
    pg, _ = compute_policy_loss_vanilla(batch.old, log_prob, batch.adv, batch.mask, "token-mean", config)
    kl = agg_loss(grpo_corrected_kl(log_prob=log_prob, old_log_prob=batch.old, ref_log_prob=batch.ref), batch.mask, "token-mean")
    want = pg + 0.1 * kl
    (want_grad,) = torch.autograd.grad(want, batch.flat)
    torch.testing.assert_close(got_loss, want.detach(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-7)
    assert "rpg/kl_estimate" in metrics[0] and "actor/pg_clipfrac" in metrics[0]


def test_grpo_corrected_kl_clamp_is_value_only():
    """rpg.loss.kl_clamp caps the KL term's value and leaves its gradient untouched."""
    batch = Batch(seed=6)
    free = _actor_config("token-mean", anchor="reference", loss_mode="grpo_corrected", rpg_beta=0.1)
    capped = _actor_config("token-mean", anchor="reference", loss_mode="grpo_corrected", rpg_beta=0.1,
                           rpg_kl_clamp=1e-6)
    loss_free, grad_free, _ = _run_adapter(batch, free, SPLITS["two"])
    loss_capped, grad_capped, _ = _run_adapter(batch, capped, SPLITS["two"])
    torch.testing.assert_close(grad_capped, grad_free)
    assert loss_capped < loss_free


def test_reference_anchor_without_ref_log_prob_is_a_clear_error():
    batch = Batch()
    config = _actor_config("token-mean", anchor="reference")
    model_output, data = batch.micro(list(range(B)), with_ref=False)
    with pytest.raises(ValueError, match="ref_log_prob"):
        rpg_actor_loss(config=config, model_output=model_output, data=data)


def test_registered_loss_without_rpg_policy_config_is_a_clear_error():
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config.actor import PolicyLossConfig

    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                         policy_loss=PolicyLossConfig(loss_mode="rpg"))
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="RPGPolicyLossConfig"):
        get_policy_loss_fn("rpg")(old_log_prob=x, log_prob=x, advantages=x, response_mask=torch.ones(2, 3),
                                  loss_agg_mode="token-mean", config=config)


def test_extremes_are_aggregated_as_extremes_across_micro_batches():
    """verl's ppo_loss marks every policy-loss metric MEAN; the RPG actor loss re-marks ``*_max`` / ``*_min``
    as MAX / MIN, so that verl's reduction over micro-batches (and ranks) keeps an extreme an extreme, and a
    token mean as its SUM-aggregated share of the global mean (tests/verl/test_dp_equivalence.py)."""
    from verl.utils.metric import AggregationType

    batch = Batch(seed=7)
    config = _actor_config("token-mean", anchor="reference", rpg_beta=0.05)
    _, _, per_mb = _run_adapter(batch, config, SPLITS["uneven"])
    for key, kind in (("rpg/ratio_max", AggregationType.MAX), ("rpg/ratio_min", AggregationType.MIN),
                      ("rpg/ref_old_logp_absdiff_max", AggregationType.MAX), ("rpg/ratio_mean", AggregationType.SUM)):
        assert all(m[key].aggregation is kind for m in per_mb), key
    merged = Metric(aggregation=AggregationType.MAX)
    for m in per_mb:
        merged.extend(m["rpg/ratio_max"])
    assert merged.aggregate() == max(v for m in per_mb for v in m["rpg/ratio_max"].values)
    _, lib = _run_library(batch, _lib_cfg("token-mean"), ref=True)[1:]
    assert merged.aggregate() == pytest.approx(lib["rpg/ratio_max"], rel=1e-6)  # the max over the whole batch
