"""RPG's own losses, the reference rows: ``rpg.math.fused.rpg_policy_loss`` (the loss training runs, per token:
``aggregate=False``) with the advantage 0 and β = 1, so that only its KL part remains (unclipped, and the recipe's
default: RPG-REINFORCE-UFKL with RPG-Style Clip at its default widths), anchored at π_ref
(``ref_log_prob``: the three-policy form of docs/math.md), sampled from π_old = μ; and
``rpg.math.fused.grpo_corrected_kl`` (GRPO's k3 with its importance weight, Sec. 2.2)."""

from __future__ import annotations

import functools

import torch

from rpg_lab.conformance.probes import protocol

FORMS = ("differentiable", "reinforce")
DIVERGENCES = ("fkl", "ufkl", "rkl", "urkl")


def _loss(batch: dict, divergence: str, form: str, clip: bool = False) -> dict:
    from rpg.math.fused import RPGLossConfig, rpg_policy_loss

    config = RPGLossConfig(divergence=divergence, form=form, beta=1.0, clip=clip)  # the clip's widths: the defaults

    def term(l):
        zero = torch.zeros_like(l)
        loss, _ = rpg_policy_loss(log_prob=l, old_log_prob=batch["l_mu"], advantages=zero,
                                  response_mask=torch.ones_like(l), config=config, ref_log_prob=batch["l_ref"],
                                  aggregate=False)
        return loss

    return protocol.loss_terms(term, batch)


def _grpo_corrected(batch: dict) -> dict:
    from rpg.math.fused import grpo_corrected_kl

    return protocol.loss_terms(
        lambda l: grpo_corrected_kl(log_prob=l, old_log_prob=batch["l_mu"], ref_log_prob=batch["l_ref"]), batch)


SETTINGS = {**{f"{form}:{d}": functools.partial(_loss, divergence=d, form=form) for form in FORMS
               for d in DIVERGENCES},
            "reinforce-clip:ufkl": functools.partial(_loss, divergence="ufkl", form="reinforce", clip=True),
            "grpo_corrected": _grpo_corrected}


DISTRIBUTION = "rpg-verl"
compute = functools.partial(protocol.compute, SETTINGS)

if __name__ == "__main__":
    protocol.main(compute, DISTRIBUTION)
