"""The fused RPG losses that training runs: ``rpg_policy_loss`` (every row of docs/math.md#per-token-losses) and
``grpo_corrected_kl``, the formulas of ``rpg.math.formulas`` in one pass with their metrics.

    config = RPGLossConfig(divergence="ufkl", form="reinforce", beta=1e-4, clip=True)
    loss, metrics = rpg_policy_loss(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, config=config)
    kl_tok = grpo_corrected_kl(log_prob=lp, old_log_prob=old, ref_log_prob=ref)   # w·k3(π_ref/πθ) per token

Tensors are keyword-only, [batch, response_len], named as in verl's policy losses. ``ref_log_prob=None`` anchors the
KL on π_old (the iterative reference); a given one uses the three-policy weights (docs/math.md#three-policies). Each
loss is one autograd node over ``rpg.math.fused_terms`` (closed-form value and slope; backward: grad·slope), eager or
compiled (``compile=True``), its metrics read back with one host sync; log-ratios carry a value-only guard
(docs/math.md#numerical-guards). Equal in value and gradient to ``rpg.math.formulas.loss``
(tests/math/test_formulas.py).
``RPGLossConfig``, declared torch-free in ``rpg.config.loss``, is re-exported here.
"""

from __future__ import annotations

import functools
import itertools
import types

import torch

# the declaration of the settings (torch-free), re-exported: ``from rpg.math.fused import RPGLossConfig``
from rpg.config.loss import (AGG_MODES, BEHAVIOR_LEVELS, BRANCH_RULES, DIVERGENCES, FD_CLIP_MODES, FORMS,  # noqa: F401
                             RULES, RPGLossConfig, RPGLossConfigError, Rule, loss_defaults)
from rpg.math.formulas import kappa
from rpg.math.fused_stats import loss_metrics
from rpg.math.fused_terms import loss_terms


# --------------------------------------------------------------------------- helpers


def _check_inputs(log_prob, old_log_prob, advantages, response_mask, ref_log_prob) -> None:
    named = {"log_prob": log_prob, "old_log_prob": old_log_prob, "advantages": advantages,
             "response_mask": response_mask}
    if ref_log_prob is not None:
        named["ref_log_prob"] = ref_log_prob
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape [batch, response_len], got {type(t).__name__}")
    if log_prob.dim() != 2:
        raise ValueError(f"log_prob must be 2-D [batch, response_len], got shape {tuple(log_prob.shape)}")
    for name, t in named.items():
        if t.shape != log_prob.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but log_prob has shape {tuple(log_prob.shape)}; "
                             "they must match")
        if name != "response_mask" and not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")


class _StraightThroughClamp(torch.autograd.Function):
    """Value clamped to [-bound, bound]; gradient of the identity (a value-only guard)."""

    @staticmethod
    def forward(ctx, x, bound):
        return x.clamp(-bound, bound)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def value_clamp(x: torch.Tensor, bound: float) -> torch.Tensor:
    """Value-only guard: x clamped to [-bound, bound] in value, gradient of the identity."""
    return _StraightThroughClamp.apply(x, bound)


# --------------------------------------------------------------------------- the loss as one autograd node


class _ClosedFormLoss(torch.autograd.Function):
    """out = ``loss_terms``' value, d out / d log_prob = its closed-form slope (backward: one multiply)."""

    @staticmethod
    def forward(ctx, log_prob, terms, *data):
        out, slope, stats = terms(log_prob, *data)
        ctx.n_data = len(data)
        ctx.save_for_backward(slope)
        ctx.mark_non_differentiable(stats)
        ctx.set_materialize_grads(False)  # no zero gradient is built for the statistics
        return out, stats

    @staticmethod
    def backward(ctx, grad_out, grad_stats):
        (slope,) = ctx.saved_tensors
        grad = None if grad_out is None else grad_out * slope
        return (grad, None) + (None,) * ctx.n_data


# torch.compile's backend for cfg.compile=True; the tests switch it to "aot_eager" (the same traced
# graph, no C++ compiler) for the many-variant equality checks, inductor checks the fused kernels.
COMPILE_BACKEND = "inductor"
_COMPILED_COUNT = itertools.count()


@functools.lru_cache(maxsize=None)
def _compiled_terms(cfg: RPGLossConfig, agg: str | None, backend: str):
    """``loss_terms`` for one configuration as one compiled graph for every shape (fullgraph: a graph break is an
    error)."""
    def terms(log_prob, old_log_prob, advantages, mask, ref_log_prob):
        return loss_terms(cfg, agg, log_prob, old_log_prob, advantages, mask, ref_log_prob)

    # dynamo keeps 8 graphs per code object (recompile_limit), then runs the 9th configuration eagerly without a
    # word: a code object per configuration gives each its own cache (the tests and benchmarks compile dozens)
    name = f"rpg_loss_terms_{next(_COMPILED_COUNT)}"
    fresh = types.FunctionType(terms.__code__.replace(co_name=name), terms.__globals__, name, None, terms.__closure__)
    compiled = torch.compile(fresh, backend=backend, fullgraph=True, dynamic=True)

    def run(*tensors):
        # unbacked sizes: no specialisation on sizes 0/1 either, so verl's dynamic micro-batches
        # (any number of rows, any length) reuse one graph
        tensors = [t if t is None else t.detach() for t in tensors]
        for t in tensors:
            if t is not None:
                torch._dynamo.decorators.mark_unbacked(t, 0)
                torch._dynamo.decorators.mark_unbacked(t, 1)
        return compiled(*tensors)

    return run



def _token_terms(cfg: RPGLossConfig, aggregate: bool, log_prob, old_log_prob, advantages, response_mask, ref_log_prob):
    """Validated, upcast inputs -> (out, metrics): the shared body of the two public losses."""
    if not isinstance(cfg, RPGLossConfig):
        raise ValueError(f"config must be an RPGLossConfig, got {type(cfg).__name__}")
    agg = cfg.loss_agg_mode if aggregate else None
    _check_inputs(log_prob, old_log_prob, advantages, response_mask, ref_log_prob)
    dtype = torch.float64 if log_prob.dtype == torch.float64 else torch.float32

    def up(t):  # computation in float32 or wider; no op when the dtype already fits
        return t if t is None or t.dtype == dtype else t.to(dtype)

    if cfg.compile and torch._dynamo.config.disable:
        raise ValueError("RPGLossConfig.compile=True needs torch.compile, which is disabled in this process "
                         "(TORCH_COMPILE_DISABLE=1); set compile=False or enable torch.compile")
    terms = _compiled_terms(cfg, agg, COMPILE_BACKEND) if cfg.compile else functools.partial(loss_terms, cfg, agg)
    # only log_prob receives a gradient (the other inputs get None in backward: no detach needed)
    out, stats = _ClosedFormLoss.apply(up(log_prob), terms, up(old_log_prob), up(advantages), up(response_mask),
                                       up(ref_log_prob))
    return out, loss_metrics(stats.tolist(), cfg.log_ratio_guard, ref_log_prob is not None)


# --------------------------------------------------------------------------- public API


def rpg_policy_loss(
    *,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: RPGLossConfig,
    ref_log_prob: torch.Tensor | None = None,
    aggregate: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The RPG loss of ``config`` and its metrics (flat floats, ``rpg/*``; one host sync).

    ``aggregate=True``: a scalar (keeps its graph) aggregated with ``config.loss_agg_mode``, the
    aggregation fused into the same pass; ``aggregate=False``: the per-token loss matrix
    [batch, response_len] (0 where masked), to aggregate with ``rpg.math.formulas.aggregate``
    (verl's ``agg_loss`` inside verl). ``ref_log_prob=None``: the KL anchor is the sampling policy.
    Computation runs in float32 or wider (bf16 inputs are upcast); the gradient flows back to ``log_prob`` only.
    """
    return _token_terms(config, aggregate, log_prob, old_log_prob, advantages, response_mask, ref_log_prob)


def grpo_corrected_kl(
    *, log_prob: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor,
    log_ratio_guard: float = RPGLossConfig.log_ratio_guard,
) -> torch.Tensor:
    """GRPO's KL term with the paper's importance-weight correction (Sec. 2.2), per token.

    Derivation and tests: docs/math.md#grpos-kl-and-its-correction.

    KL_corr_t = w_t * k3(pi_ref/pi_theta) = exp(l_ref - l_old) + w_t*(l_t - l_ref) - w_t,
    with w_t = exp(l_t - l_old) differentiable (do not detach it). Its gradient
    w_t*(l_t - l_ref)*grad l_t has expectation grad KL(pi_theta||pi_ref) under pi_old at every
    theta; GRPO's unweighted k3 gives the forward-KL gradient instead (tested). Unclamped; the
    log-ratios carry the same straight-through guard as ``rpg_policy_loss``.
    """
    _check_inputs(log_prob, old_log_prob, log_prob, torch.ones_like(log_prob), ref_log_prob)
    dtype = torch.promote_types(log_prob.dtype, torch.float32)
    l = log_prob.to(dtype)
    l_old = old_log_prob.detach().to(dtype)
    l_ref = ref_log_prob.detach().to(dtype)
    w = torch.exp(_StraightThroughClamp.apply(l - l_old, log_ratio_guard))
    log_r_ref = (l_ref - l_old).clamp(-log_ratio_guard, log_ratio_guard)
    return kappa("urkl", w, l - l_ref, torch.exp(log_r_ref))
