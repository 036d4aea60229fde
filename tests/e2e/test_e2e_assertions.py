"""The end-to-end tests assert what the loss metrics guarantee, not what they usually show.

``tests/support/e2e_recipe.py::assert_step_guarantees`` checks every step of a real trainer run. Here it is fed
steps built from the loss library itself (``rpg.math.fused.rpg_policy_loss(..., aggregate=False)``) the way verl
reduces a step's micro-batch metrics (means averaged, ``*_max`` / ``*_min`` as max / min): an on-policy first
mini-batch (float32 recomputation noise only) and off-policy later ones, for every divergence, both
anchors and random advantages. Whatever was sampled, the assertions must hold. (An assertion of
``kl_estimate > 0`` fails on such steps: the normalized surrogates' sample mean is negative for many
of them, and a step whose updates did not move the policy gives a k3 mean at float32 rounding level.)
"""

from __future__ import annotations

import pytest
import torch
from e2e_recipe import NARROW_CLIP, assert_off_policy, assert_step_guarantees

from rpg.math.fused import RPGLossConfig, rpg_policy_loss

DIVERGENCES = ("fkl", "rkl", "ufkl", "urkl")


class _Run:
    def __init__(self, divergence: str, metrics: dict[int, dict]):
        self.log = f"rpg: loss=rpg divergence={divergence} form=reinforce beta=0.0001 clip=True"
        self.metrics = metrics


def _step(cfg: RPGLossConfig, gen: torch.Generator, moved: float, with_ref: bool) -> dict:
    """One step of 4 mini-batches of 16 responses x 12 tokens: the first on-policy, the others moved by
    ``moved`` (std of log w); metrics reduced as verl reduces them."""
    per_batch = []
    l_old = -torch.rand(16, 12, generator=gen, dtype=torch.float32) * 3
    l_ref = l_old + 0.05 * torch.randn(16, 12, generator=gen) if with_ref else None
    adv = torch.randn(16, 1, generator=gen).expand(16, 12).contiguous()
    mask = (torch.rand(16, 12, generator=gen) < 0.9).float()
    for i in range(4):
        noise = 1e-7 if i == 0 else moved
        log_prob = l_old + noise * torch.randn(16, 12, generator=gen)
        _, m = rpg_policy_loss(log_prob=log_prob, old_log_prob=l_old, advantages=adv, response_mask=mask, config=cfg,
                               ref_log_prob=l_ref, aggregate=False)
        per_batch.append(m)
    out = {}
    for key in per_batch[0]:
        values = [m[key] for m in per_batch]
        out[f"actor/{key}"] = max(values) if key.endswith("_max") else min(values) if key.endswith("_min") \
            else sum(values) / len(values)
    return out


@pytest.mark.parametrize("divergence", DIVERGENCES)
@pytest.mark.parametrize("with_ref", [False, True])
def test_the_per_step_assertions_hold_whatever_was_sampled(divergence, with_ref):
    gen = torch.Generator().manual_seed(0)
    cfg = RPGLossConfig(divergence=divergence, form="reinforce", beta=1e-4, clip=True,
                        clip_ratio_low=NARROW_CLIP[0], clip_ratio_high=NARROW_CLIP[1], clip_ratio_c=NARROW_CLIP[2])
    negative = 0
    for trial in range(40):
        # step 1: the updates did not move the policy (every mini-batch on-policy); step 2: they did
        steps = {1: _step(cfg, gen, 1e-7, with_ref), 2: _step(cfg, gen, 0.02 + 0.1 * (trial % 4), with_ref)}
        for s in steps:
            assert_step_guarantees(_Run(divergence, steps), s, divergence, clip=NARROW_CLIP)
        negative += sum(steps[s]["actor/rpg/kl_estimate"] < 0 for s in steps)
    if divergence in ("fkl", "rkl"):
        assert negative > 0  # what `kl_estimate > 0` got wrong: no sign is guaranteed for them


def test_a_run_that_never_moved_is_reported():
    """The one premise-based assertion (some step is off-policy) still catches a run without updates."""
    gen = torch.Generator().manual_seed(1)
    cfg = RPGLossConfig(divergence="ufkl", clip=False)
    steps = {1: _step(cfg, gen, 1e-7, False), 2: _step(cfg, gen, 1e-7, False)}
    with pytest.raises(AssertionError):
        assert_off_policy(_Run("ufkl", steps), (1, 2))
