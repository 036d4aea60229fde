"""Behaviour weights b = π_old/μ for the samples of a stale sampler μ (docs/math.md#four-policies).

E_π_old[f] = E_μ[(π_old/μ)·f] with π_old/μ free of θ, so multiplying each token's whole loss by b_t =
exp(l_old − l_μ) keeps the gradient exact on μ's samples. ``RPGLossConfig.behavior_weight_level``: ``token`` (b_t),
``sequence`` (exp Σ_s (l_old,s − l_μ,s) on every token of the response; heavier-tailed) or ``none`` (b = 1: biased,
for comparison studies only); ``behavior_weight_cap`` c gives min(b, c) (TIS's truncation, biased). |log b| carries
the loss's ``log_ratio_guard``. ``behavior_metrics`` and the step sums give the ``rpg/behavior_*`` statistics.
"""

from __future__ import annotations

import torch

from rpg.config.loss import BEHAVIOR_LEVELS as LEVELS  # declared torch-free with the loss settings
from rpg.math.formulas import k3


def behavior_weights(old_log_prob: torch.Tensor, behavior_log_prob: torch.Tensor, response_mask: torch.Tensor,
                     level: str = "token", cap: float | None = None, log_ratio_guard: float = 60.0) -> torch.Tensor:
    """b = pi_old/mu per token [B, T] (detached; 0 where masked), at ``level``, truncated at ``cap`` if given."""
    if level not in LEVELS:
        raise ValueError(f"behavior weight level={level!r} is invalid: expected one of {', '.join(LEVELS)}")
    valid = response_mask != 0
    if level == "none":  # uncorrected (biased): every token weighted 1, as if mu were pi_old
        return valid.to(old_log_prob.dtype)
    log_b = torch.where(valid, old_log_prob.detach() - behavior_log_prob.detach(), 0.0)
    if level == "sequence":
        log_b = log_b.sum(dim=-1, keepdim=True).expand_as(log_b)
    b = log_b.clamp(-log_ratio_guard, log_ratio_guard).exp()
    if cap is not None:
        b = b.clamp(max=cap)
    return torch.where(valid, b, 0.0)


def behavior_metrics(old_log_prob: torch.Tensor, behavior_log_prob: torch.Tensor, response_mask: torch.Tensor,
                     weights: torch.Tensor, raw_weights: torch.Tensor) -> dict[str, float]:
    """``rpg/behavior_*`` of one micro-batch (valid tokens only):

    kl:            token mean of l_mu - l_old, the k1 estimate of KL(mu || pi_old) from mu's samples
                   (the same statistic as verl's ``rollout_corr/kl``);
    kl_k3:         token mean of b - 1 - log b (untruncated b), the k3 estimate of the same KL (>= 0 per token);
    weight_mean/max/min: the weights the loss applies;
    weight_capped_frac: fraction of tokens whose weight the cap lowered (``weights`` < ``raw_weights``,
                   the same weights untruncated; 0 without a cap).
    """
    valid = response_mask != 0
    n = int(valid.sum())
    if n == 0:
        return {f"rpg/behavior_{k}": 0.0 for k in ("kl", "kl_k3", "weight_mean", "weight_max", "weight_min",
                                                    "weight_capped_frac")}
    log_b = (old_log_prob.detach() - behavior_log_prob.detach())[valid].double()
    w = weights[valid].double()
    capped = float((weights[valid] < raw_weights[valid]).sum()) / n
    return {
        "rpg/behavior_kl": float(-log_b.mean()),
        "rpg/behavior_kl_k3": float(k3(log_b.exp(), log_b).mean()),
        "rpg/behavior_weight_mean": float(w.mean()),
        "rpg/behavior_weight_max": float(w.max()),
        "rpg/behavior_weight_min": float(w.min()),
        "rpg/behavior_weight_capped_frac": capped,
    }


# Step-level statistics of the untruncated per-token weights w = pi_old/mu (every arm alike: they describe how far
# the sampler is from pi_old, not what the arm applies). Kept as sums so that a step of several mini-batches
# (separate_async) gives the statistic of all its tokens, not a mean of per-mini-batch values.
STEP_SUMS = ("tokens", "w", "w2", "log_w2")  # N, sum w, sum w^2, sum (log w)^2 over the valid tokens


def behavior_step_sums(old_log_prob: torch.Tensor, behavior_log_prob: torch.Tensor, response_mask: torch.Tensor,
                       log_ratio_guard: float = 60.0) -> dict[str, float]:
    """``STEP_SUMS`` of one batch (float64; valid tokens only); w carries the loss's guard |log w| <= guard."""
    valid = response_mask != 0
    log_w = (old_log_prob.detach() - behavior_log_prob.detach())[valid].double()
    w = log_w.clamp(-log_ratio_guard, log_ratio_guard).exp()
    return {"tokens": float(valid.sum()), "w": float(w.sum()), "w2": float((w * w).sum()),
            "log_w2": float((log_w * log_w).sum())}


def add_step_sums(total: dict[str, float] | None, part: dict[str, float]) -> dict[str, float]:
    """``total`` + ``part``, key by key (``total`` None: a copy of ``part``)."""
    return dict(part) if total is None else {k: total[k] + part[k] for k in STEP_SUMS}


def behavior_step_metrics(sums: dict[str, float]) -> dict[str, float]:
    """From a step's ``STEP_SUMS``:

    ess:      (sum w)^2 / (N sum w^2), the effective sample size of the weights as a fraction of the N tokens,
              in (0, 1]; 1 exactly when every w is equal (mu = pi_old);
    log_w_m2: mean (log pi_old - log mu)^2, the second moment of the log weight (M2PO's statistic); 0 when
              mu = pi_old.
    A step without valid tokens has neither (empty dict)."""
    n = sums["tokens"]
    if n == 0:
        return {}
    return {"rpg/behavior_ess": sums["w"] ** 2 / (n * sums["w2"]), "rpg/behavior_log_w_m2": sums["log_w2"] / n}
