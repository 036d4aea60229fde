"""The losses on CUDA: every variant from bf16 inputs against float64 (the cases and the tolerance
derived from bf16's precision are those of tests/math/test_losses_bf16.py, which runs them on the CPU), the
registered loss called as verl calls it (float32 log-probs from bf16 logits, inside autocast(cuda, bf16)),
and the compiled loss (``rpg.loss.compile=true``, inductor: Triton kernels on CUDA) against the
eager one (tests/math/test_losses_compiled.py's comparison, which runs inductor on the CPU).

Compiled vs eager tolerances are the CPU inductor test's: loss and gradient within the float32 rounding
bound of each token's terms (tests/math/test_losses_compiled.py: no relative bound holds where Algorithm 1's slope
w (beta - A_hat) cancels), metrics 1e-5 (fused kernels sum in another order; the KL estimate is a mean of
w - 1 - log w)."""

from __future__ import annotations

import pytest
import test_losses_bf16 as bf16
import test_losses_compiled as compiled
from gpu_marks import GPU

pytestmark = GPU


@pytest.mark.parametrize("seed", bf16.SEEDS)
@pytest.mark.parametrize("variant", bf16.RPG_VARIANTS, ids=bf16.VARIANT_IDS)
def test_rpg_loss_bf16_on_cuda_matches_float64(variant, seed):
    bf16.check(*bf16.rpg_case(variant, "cuda", seed), what=f"{variant} seed {seed} on CUDA")


@pytest.mark.parametrize("seed", bf16.SEEDS)
def test_grpo_corrected_kl_bf16_on_cuda_matches_float64(seed):
    bf16.check(*bf16.grpo_corrected_case("cuda", seed), what=f"grpo_corrected seed {seed} on CUDA")


@pytest.mark.parametrize("seed", bf16.SEEDS)
@pytest.mark.parametrize("variant", bf16.RPG_VARIANTS, ids=bf16.VARIANT_IDS)
def test_the_registered_loss_called_as_verl_calls_it_on_cuda_matches_float64(variant, seed):
    """verl's call: float32 log-probs from bf16 logits by verl's own logprobs_from_logits (flash-attn's Triton
    cross-entropy when installed, as on a GPU run), the registered loss inside torch.autocast(cuda, bf16)."""
    import importlib.util

    use_verl = importlib.util.find_spec("flash_attn") is not None
    bf16.check(*bf16.verl_call_case(variant, "cuda", seed, use_verl_log_probs=use_verl),
               what=f"{variant} seed {seed} under autocast(cuda) (verl log-probs: {use_verl})")


@pytest.mark.parametrize("variant", compiled.bench.VARIANTS, ids=compiled.bench.label)
def test_compiled_loss_on_cuda_equals_eager(variant, monkeypatch):
    n = compiled.compare(variant, "inductor", monkeypatch, device="cuda", metric_rel=1e-5)
    assert n == 1, "one compilation for all micro-batch shapes"


def test_compiled_token_loss_of_the_verl_glue_on_cuda_equals_eager(monkeypatch):
    glue = dict(form="differentiable", divergence="urkl", clip=True, anchor="reference")
    assert compiled.compare(glue, "inductor", monkeypatch, token_loss=True, device="cuda", metric_rel=1e-5) == 1
