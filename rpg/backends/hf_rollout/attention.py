"""The HF rollout's attention on CPU: torch's SDPA over the grouped key/value heads, with the padding mask.

transformers' ``sdpa`` attention hands torch's kernel the grouped heads (``enable_gqa``) only without a mask (a CUDA
kernel's limit) and otherwise repeats each key/value head for its query heads first: with the padding mask every
decoding step does, a copy of the whole cache per layer (SmolLM2: 9 query heads on 3 key/value heads). Torch's CPU
kernel takes the grouped heads and a mask together, with the same numbers (bit for bit in a probe on this project's
2-core machine, 2026-11-27: 2.1 ms per layer instead of 57 ms for 64 rows of 250 cached tokens, 1 thread;
tests/backends/test_cpu_hf_prefix.py holds the two equal on a random Llama). Registered under ``NAME`` with
transformers' sdpa mask, and selected for the rollout server's model on CPU (server.py).
"""

from __future__ import annotations

import torch

NAME = "rpg_sdpa_gqa"


def gqa_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                       is_causal=None, **kwargs):
    """transformers' attention-function interface: ``query`` [B, H, q, D], ``key``/``value`` [B, H_kv, k, D],
    ``attention_mask`` a boolean [B, 1, q, k] (True: attend) or None; returns ([B, q, H, D], None)."""
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=bool(query.shape[2] > 1 and attention_mask is None and is_causal),
        enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make ``NAME`` a transformers attention implementation (idempotent); returns it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, gqa_sdpa_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
