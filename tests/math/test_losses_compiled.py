"""The compiled loss (``RPGLossConfig(compile=True)``, ``rpg.loss.compile=true``) equals the eager
one -- loss, gradient and metrics -- for every variant, as one graph (``fullgraph=True``: a graph
break is an error) compiled once for a sequence of micro-batch shapes (dynamic, unbacked sizes).

Backends: every variant runs with dynamo's ``eager`` backend, i.e. the same capture, guards and
dynamic shapes as inductor, the captured graph executed by ATen (no C++ compiler, ~1 s a variant).
Two variants (the library's aggregated loss and the token loss that the verl glue uses) run with
inductor, the backend the option ships with, which needs a C++ compiler (README's Quick start): its fused
kernels round differently, so metrics are compared to 1e-5 there (kl_estimate is a mean of
w - 1 - log w, a difference of nearly equal numbers). tests/gpu/test_gpu_losses.py runs every variant
with inductor on CUDA (Triton kernels).

Tolerance of loss and gradient (first-order float32 rounding bound, both sides float32). Every form's
slope at token t (docs/math.md#per-token-losses) is a sum of terms whose absolute values add up to at
most S_t = X|A| + beta (r_ref + 2X (1 + |log w| + |log r_ref|)), X = max(w, 1 + eps_high) (a clipped
ratio is at most X; |log w_bar| <= |log w|). A term reaches the gradient a_t slope_t (a_t: the
aggregation's weight) through at most K = 16 rounding steps (about ten float32 operations of relative
error u = 2^-24, exp and log within 2 ulps, the log-ratio's rounding u |log w| with |log w| < 2 here), in
whatever order or fusion a backend picks: each evaluation is within K u a_t S_t of the exact value, two of
them within 2 K u a_t S_t. No relative bound holds where the slope is a difference of nearly equal
terms: Algorithm 1's slope w (beta - A_hat) with A_hat close to beta (on CUDA, inductor's gradient
differed from eager's by 2.4e-6 relative at a token with S_t / |slope_t| = 208, 0.2 u a_t S_t). The
value at t is at most S_t (1 + |l| + |log w| + |log r_ref|) = V_t, the loss sum_t a_t value_t adds
(N - 1) u sum_t a_t V_t for its reduction over N tokens in any order. The bound is asserted to stay
below 1 % of a_t beta min(w, r_ref, 1) at every token, the size of a KL term: a wrong KL term or a wrong
clip decision at any token is still caught; and no token lies within the bound of a clip boundary
(else compiled and eager could take different branches, both right).
"""

import importlib.util
import math
import shutil
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

import rpg.math.fused as L
from rpg.math.formulas import agg_weights, aggregate, kl_weight

_spec = importlib.util.spec_from_file_location("bench_losses", Path(__file__).parents[2] / "benchmarks" / "bench_losses.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

SHAPES = [(3, 17), (1, 9), (6, 1), (5, 40)]  # varying rows and lengths, size-1 dims included
U_F32 = 2.0**-24  # unit roundoff of float32
K = 16  # rounding steps on a term's path to the gradient (module docstring)


def rounding_bounds(cfg, log_prob, old, adv, mask, ref):
    """(2 K u a_t S_t per token, 2 (K + N) u sum_t a_t V_t for the loss), float64 (module docstring); asserts that
    the bound is below 1 % of a KL term's size and that no clip decision lies within it."""
    l, old, adv, mask = (t.double().cpu() for t in (log_prob, old, adv, mask))
    log_w = l - old
    log_r_ref = torch.zeros_like(l) if ref is None else ref.double().cpu() - old
    w, r_ref, valid = log_w.exp(), log_r_ref.exp(), mask != 0
    assert float(log_w[valid].abs().max()) < 2, "K counts the log-ratio's rounding with |log w| < 2"
    X = w.clamp(min=1 + cfg.clip_ratio_high)
    S = X * adv.abs() + cfg.beta * (r_ref + 2 * X * (1 + log_w.abs() + log_r_ref.abs()))
    a = agg_weights(mask, cfg.loss_agg_mode)
    grad_bound = 2 * K * U_F32 * a * S
    kl_size = a * cfg.beta * torch.minimum(torch.minimum(w, r_ref), torch.ones_like(w))
    assert (grad_bound < 0.01 * kl_size)[valid].all(), "the bound would hide a KL term"
    if cfg.clip:
        lo, hi, c = 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high, cfg.clip_ratio_c
        for edge in (lo, hi, c):
            assert ((w - edge).abs() > 2 * K * U_F32 * edge)[valid].all(), f"a ratio within rounding of {edge}"
        sign = None  # the sign that picks the branch, where it is computed (the advantage's is exact)
        if cfg.form == "differentiable" and cfg.fd_clip == "algorithm1":  # A_hat = A - beta phi(rho)
            sign = adv - cfg.beta * (log_w - log_r_ref + (1.0 if cfg.divergence == "rkl" else 0.0))
        elif cfg.form == "reinforce" and cfg.branch_on == "regularized":  # W = w A + C(w_bar)
            w_bar, log_w_bar = w.clamp(lo, hi), log_w.clamp(math.log(lo), math.log(hi))
            sign = w * adv + kl_weight(cfg.divergence, cfg.beta, w_bar, r_ref, log_w_bar - log_r_ref)
        if sign is not None:
            assert (sign.abs() > 2 * K * U_F32 * S)[valid].all(), "a branch's sign within rounding of 0"
    V = S * (1 + l.abs() + log_w.abs() + log_r_ref.abs())
    n = int(valid.sum())
    return grad_bound, 2 * (K + n) * U_F32 * float((a * V).sum())


def compare(variant, backend, monkeypatch, token_loss=False, shapes=SHAPES, metric_rel=1e-6, device="cpu"):
    """Eager vs compiled on every shape (inputs on ``device``), loss and gradient within ``rounding_bounds``;
    returns how many graphs were compiled."""
    monkeypatch.setattr(L, "COMPILE_BACKEND", backend)
    kwargs = {k: v for k, v in variant.items() if k != "anchor"}
    eager, compiled = L.RPGLossConfig(beta=0.05, **kwargs), L.RPGLossConfig(beta=0.05, compile=True, **kwargs)
    before = counters["stats"]["unique_graphs"]
    for i, (b, t) in enumerate(shapes):
        log_prob, old, adv, mask, ref = inputs(variant, b, t, device, seed=i)
        results = [loss_and_gradient(cfg, log_prob, old, adv, mask, ref, token_loss) for cfg in (eager, compiled)]
        (loss_e, grad_e, met_e), (loss_c, grad_c, met_c) = results
        what = f"{bench.label(variant, compiled=True)} {backend} shape {(b, t)}"
        grad_bound, loss_bound = rounding_bounds(eager, log_prob, old, adv, mask, ref)
        within(loss_c, loss_e, loss_bound, f"{what} loss")
        within(grad_c, grad_e, grad_bound, f"{what} gradient")
        assert met_c == pytest.approx(met_e, rel=metric_rel, abs=1e-9), what
    return counters["stats"]["unique_graphs"] - before


def inputs(variant, b, t, device, seed, dtype=torch.float32):
    log_prob, old, adv, mask, ref = bench.make_inputs(b, t, device=device, seed=seed)
    log_prob = old + 6.0 * (log_prob - old)  # ratios spread over every clip region
    ref = ref if variant["anchor"] == "reference" else None
    return tuple(None if x is None else x.to(dtype) for x in (log_prob, old, adv, mask, ref))


def loss_and_gradient(cfg, log_prob, old, adv, mask, ref, token_loss=False):
    lp = log_prob.clone().requires_grad_(True)
    if token_loss:
        out, metrics = L.rpg_policy_loss(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, config=cfg,
                                         ref_log_prob=ref, aggregate=False)
        loss = aggregate(out, mask, cfg.loss_agg_mode)
    else:
        loss, metrics = L.rpg_policy_loss(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask,
                                          config=cfg, ref_log_prob=ref)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, metrics


def within(actual, expected, bound, what):
    """|actual - expected| <= bound elementwise (bound: a float or a per-token tensor, float64 on the CPU)."""
    excess = (actual.double().cpu() - expected.double().cpu()).abs() - bound
    assert float(excess.max()) <= 0, (f"{what}: {int((excess > 0).sum())} element(s) beyond the rounding bound, "
                                      f"the largest difference {float((excess + bound).max()):.3g}")


@pytest.mark.parametrize("variant", bench.VARIANTS, ids=bench.label)
def test_float32_loss_and_gradient_within_half_the_bound_of_float64(variant):
    """The bound's premise: one float32 evaluation (eager) is within K u a_t S_t of the float64 one. At the
    algorithm-1 tokens where A_hat is close to beta, float32's own gradient is 1e-5 off relative."""
    cfg = L.RPGLossConfig(beta=0.05, **{k: v for k, v in variant.items() if k != "anchor"})
    for i, (b, t) in enumerate(SHAPES):
        x32 = inputs(variant, b, t, "cpu", seed=i)
        x64 = tuple(None if x is None else x.double() for x in x32)  # the same values, exactly
        (loss32, grad32, _), (loss64, grad64, _) = (loss_and_gradient(cfg, *x) for x in (x32, x64))
        grad_bound, loss_bound = rounding_bounds(cfg, *x32)
        what = f"{bench.label(variant)} shape {(b, t)} float32 vs float64"
        within(loss32, loss64, loss_bound / 2, f"{what} loss")
        within(grad32, grad64, grad_bound / 2, f"{what} gradient")


@pytest.mark.parametrize("variant", bench.VARIANTS, ids=bench.label)
def test_compiled_graph_equals_eager_for_every_variant(variant, monkeypatch):
    assert compare(variant, "eager", monkeypatch) == 1, "one compilation for all micro-batch shapes"


def test_compiled_graph_with_inductor(monkeypatch):
    from torch._inductor import config as inductor_config
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        compiler = get_cpp_compiler()
    except Exception as err:  # noqa: BLE001 - report inductor's own reason
        pytest.fail(f"inductor needs a C++ compiler (install g++, see README's Quick start): {err}")
    assert shutil.which(compiler) or Path(compiler).exists(), f"C++ compiler {compiler!r} not found"
    monkeypatch.setattr(inductor_config, "compile_threads", 1)  # no worker pool on a small CI machine
    library = dict(form="reinforce", divergence="ufkl", clip=True, anchor="sampler")
    assert compare(library, "inductor", monkeypatch, shapes=SHAPES[:3], metric_rel=1e-5) == 1
    glue = dict(form="differentiable", divergence="urkl", clip=True, anchor="reference")
    assert compare(glue, "inductor", monkeypatch, token_loss=True, shapes=SHAPES[:3], metric_rel=1e-5) == 1
