"""RPG's outcome advantages (docs/math.md#advantages): a baseline-subtracted reward, no std division.

A_i = R_i - b, with b the mean reward of the responses to the same prompt (``group``) or of the
whole batch (``batch``). Any theta-independent baseline leaves the expected gradient unchanged
(T11 in docs/math.md#testable-identities), so no normalisation by the group std is applied: the
RPG weights w*A + C already have the KL term on the reward's scale, and dividing A by the std
would rescale the reward against beta. A singleton group has mean R, which would zero its
advantage; the authors' code (and this function) uses b = 0 for it instead, so A = R.
"""

from __future__ import annotations

from typing import Sequence

import torch

ADVANTAGE_MODES = ("group", "batch")


def group_mean_advantage(scores: torch.Tensor, index: Sequence) -> torch.Tensor:
    """A_i = R_i - mean_{j: index_j = index_i} R_j; singleton groups keep A_i = R_i.

    ``scores``: [B] sequence rewards. ``index``: length-B group ids (e.g. verl's uid array).
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [batch], got shape {tuple(scores.shape)}")
    if len(index) != scores.shape[0]:
        raise ValueError(f"index has length {len(index)} but scores has {scores.shape[0]} entries")
    ids: dict = {}
    group = torch.tensor([ids.setdefault(g, len(ids)) for g in list(index)], dtype=torch.long, device=scores.device)
    n_groups = len(ids)
    sums = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, group, scores)
    counts = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, group,
                                                                                        torch.ones_like(scores))
    means = torch.where(counts > 1, sums / counts, torch.zeros_like(sums))
    return scores - means[group]


def batch_mean_advantage(scores: torch.Tensor) -> torch.Tensor:
    """A_i = R_i - mean_j R_j over the whole batch (the paper's "batch average" baseline)."""
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [batch], got shape {tuple(scores.shape)}")
    if scores.numel() <= 1:
        return scores.clone()
    return scores - scores.mean()


def outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Sequence | None = None, mode: str = "group"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence reward R_i = sum_t r_it (reward on the last token plus any shaping), baseline-
    subtracted and broadcast to the response tokens. Returns (advantages, returns), both [B, T],
    zero on masked tokens, as verl's advantage estimators do."""
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"advantage mode={mode!r} is invalid: expected one of {ADVANTAGE_MODES}")
    if token_level_rewards.shape != response_mask.shape or token_level_rewards.dim() != 2:
        raise ValueError(
            f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask {tuple(response_mask.shape)} "
            "must both be [batch, response_len]"
        )
    mask = response_mask.to(token_level_rewards.dtype)
    scores = (token_level_rewards * mask).sum(dim=-1)
    if mode == "group":
        if index is None:
            raise ValueError("index (group ids) is required for mode='group'")
        adv = group_mean_advantage(scores, index)
    else:
        adv = batch_mean_advantage(scores)
    advantages = adv.unsqueeze(-1) * mask
    return advantages, advantages
