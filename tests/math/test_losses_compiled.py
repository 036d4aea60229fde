"""The compiled loss (``RPGLossConfig(compile=True)``, ``rpg.loss.compile=true``) equals the eager
one -- loss, gradient and metrics -- for every variant, as one graph (``fullgraph=True``: a graph
break is an error) compiled once for a sequence of micro-batch shapes (dynamic, unbacked sizes).

Backends: every variant runs with dynamo's ``eager`` backend, i.e. the same capture, guards and
dynamic shapes as inductor, the captured graph executed by ATen (no C++ compiler, ~1 s a variant).
Two variants (the library's aggregated loss and the token loss that the verl glue uses) run with
inductor, the backend the option ships with, which needs a C++ compiler (README's Quick start): its fused
kernels round differently, so metrics are compared to 1e-5 there (kl_estimate is a mean of
w - 1 - log w, a difference of nearly equal numbers); loss and gradient to 1e-6 everywhere.
"""

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

import rpg.math.losses as L

_spec = importlib.util.spec_from_file_location("bench_losses", Path(__file__).parents[2] / "benchmarks" / "bench_losses.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

SHAPES = [(3, 17), (1, 9), (6, 1), (5, 40)]  # varying rows and lengths, size-1 dims included


def compare(variant, backend, monkeypatch, token_loss=False, shapes=SHAPES, metric_rel=1e-6, device="cpu"):
    """Eager vs compiled on every shape (inputs on ``device``); returns how many graphs were compiled."""
    monkeypatch.setattr(L, "COMPILE_BACKEND", backend)
    kwargs = {k: v for k, v in variant.items() if k != "anchor"}
    eager, compiled = L.RPGLossConfig(beta=0.05, **kwargs), L.RPGLossConfig(beta=0.05, compile=True, **kwargs)
    before = counters["stats"]["unique_graphs"]
    for i, (b, t) in enumerate(shapes):
        log_prob, old, adv, mask, ref = bench.make_inputs(b, t, device=device, seed=i)
        log_prob = old + 6.0 * (log_prob - old)  # ratios spread over every clip region
        ref = ref if variant["anchor"] == "reference" else None
        results = []
        for cfg in (eager, compiled):
            lp = log_prob.clone().requires_grad_(True)
            if token_loss:
                out, metrics = L.rpg_policy_loss(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, config=cfg, ref_log_prob=ref, aggregate=False)
                loss = L.aggregate_loss(out, mask, cfg.loss_agg_mode)
            else:
                loss, metrics = L.rpg_policy_loss(log_prob=lp, old_log_prob=old, advantages=adv, response_mask=mask, config=cfg, ref_log_prob=ref)
            (grad,) = torch.autograd.grad(loss, lp)
            results.append((loss.detach(), grad, metrics))
        (loss_e, grad_e, met_e), (loss_c, grad_c, met_c) = results
        what = f"{bench.label(variant, compiled=True)} {backend} shape {(b, t)}"
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-6, atol=0, msg=lambda m: f"{what} loss: {m}")
        torch.testing.assert_close(grad_c, grad_e, rtol=1e-6, atol=1e-12, msg=lambda m: f"{what} gradient: {m}")
        assert met_c == pytest.approx(met_e, rel=metric_rel, abs=1e-9), what
    return counters["stats"]["unique_graphs"] - before


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
