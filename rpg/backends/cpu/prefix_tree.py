"""A micro-batch's sequences as one prefix tree: every distinct prefix computed once, in the forward and the backward.

A causal language model's hidden state at a token depends only on the tokens before it and their positions. The
sequences of a GRPO step share most of theirs: the 4 responses of a group repeat their prompt, and a chat template's
system turn and worked example open every prompt (SmolLM2's task: about 1,300 distinct prefixes among 7,000 tokens).
``build_prefix_tree`` merges the sequences into a tree whose nodes are the distinct (prefix, position) pairs, laid
out as one row; node ``a`` attends to node ``b`` exactly when ``b`` is ``a`` or one of its ancestors, i.e. a token
of the sequence before it. Each node then sees what its token sees in its own sequence, at the same position, so
the hidden states, log-probs and (by autograd, summing over the sequences through a shared node) gradients are
those of the sequences computed one by one, up to float32 rounding (another summation order).

``tree_log_probs`` runs a Hugging Face causal LM over the tree with that mask and applies the output head only at the
nodes whose log-probs are read (the token before each response token), then gathers per sequence; ``packed_values``
lays them out as verl's engine returns them (one value per token of each sequence, the log-prob of the next token;
zero where none is read).

transformers hands a 4-D mask to the attention as given, and each attention implementation reads its own form: sdpa a
boolean one (True: attend), eager an additive one (0, or the dtype's minimum) that it adds to the scores, so a boolean
mask there adds 1 to the scores it should hide. ``attention_mask`` builds the tree's mask with transformers' own mask
function of the implementation (``AttentionMaskInterface``), for the implementations in ``TREE_ATTENTION`` only: those
the tree is tested exact with (tests/backends/test_cpu_prefix_tree.py, against each sequence computed alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The attention implementations the tree is exact with (module docstring). The others transformers 5.10 registers take
# verl's step: flex_attention has no backward on CPU, the paged ones need a generation cache, flash-attention CUDA.
TREE_ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class PrefixTree:
    """Distinct prefixes of a batch of sequences as one row: ``tokens`` and ``positions`` [T], ``mask`` [T, T]
    (True: may attend), ``paths[j]`` the node of each token of sequence ``j``."""

    tokens: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    paths: list[torch.Tensor]

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])


def build_prefix_tree(sequences: list[torch.Tensor], positions: list[torch.Tensor]) -> PrefixTree:
    """The prefix tree of ``sequences`` (1-D token tensors) at their ``positions`` (1-D, same lengths): one node per
    distinct (parent, token, position), in order of first appearance (a node after its ancestors)."""
    index: dict[tuple[int, int, int], int] = {}
    tokens: list[int] = []
    node_pos: list[int] = []
    paths: list[torch.Tensor] = []
    for seq, pos in zip(sequences, positions, strict=True):
        parent, path = -1, []
        for t, p in zip(seq.tolist(), pos.tolist(), strict=True):
            node = index.setdefault((parent, t, p), len(tokens))
            if node == len(tokens):
                tokens.append(t)
                node_pos.append(p)
            path.append(node)
            parent = node
        paths.append(torch.tensor(path, dtype=torch.long))
    size = len(tokens)
    mask = torch.zeros(size, size, dtype=torch.bool)
    for path in paths:  # a node's ancestors are the nodes before it on any path through it
        lower = torch.ones(len(path), len(path), dtype=torch.bool).tril_()
        mask[path.unsqueeze(1), path.unsqueeze(0)] |= lower
    return PrefixTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(node_pos, dtype=torch.long), mask, paths)


@dataclass(frozen=True)
class ReadPositions:
    """Where log-probs are read: for each sequence ``j``, its tokens ``starts[j]`` to ``ends[j] - 1`` (verl's
    convention: the value at token ``t`` is the log-prob of token ``t + 1``)."""

    starts: list[int]
    ends: list[int]

    @classmethod
    def responses(cls, lengths: list[int], response_lengths: list[int]) -> "ReadPositions":
        """The tokens before each response token: ``[L - r - 1, L - 1)`` for a sequence of ``L`` tokens whose last
        ``r`` are the response (what verl's ``response_from_nested`` and ``no_padding_2_padding`` keep)."""
        return cls([n - r - 1 for n, r in zip(lengths, response_lengths, strict=True)], [n - 1 for n in lengths])

    @classmethod
    def every(cls, lengths: list[int]) -> "ReadPositions":
        return cls([0] * len(lengths), [max(0, n - 1) for n in lengths])


def attention_mask(tree: PrefixTree, implementation: str, device) -> torch.Tensor:
    """``tree.mask`` as a [1, 1, T, T] mask in the form ``implementation`` reads (module docstring), made by
    transformers' mask function of that implementation; ``ValueError`` outside ``TREE_ATTENTION``. eager's is float32
    whatever the model's dtype: its 0 leaves a score as it is and its minimum hides a key in any dtype."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    if implementation not in TREE_ATTENTION:
        raise ValueError(f"the prefix tree is exact with attn_implementation {TREE_ATTENTION}, not {implementation!r}")
    allowed = tree.mask.to(device)
    return ALL_MASK_ATTENTION_FUNCTIONS[implementation](
        batch_size=1, q_length=tree.size, kv_length=tree.size, mask_function=lambda b, h, q, kv: allowed[q, kv],
        allow_is_causal_skip=False, dtype=torch.float32, device=device)


def tree_log_probs(module, tree: PrefixTree, sequences: list[torch.Tensor], reads: ReadPositions,
                   temperatures: torch.Tensor, entropy_fn=None) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Per sequence, the log-probs of its tokens ``starts[j] + 1 .. ends[j]`` (and, with ``entropy_fn``, the entropy
    of the distribution that predicts each) under ``module`` at ``temperatures[j]``, computed over ``tree``.

    ``module`` is a Hugging Face causal LM (or its FSDP wrapper) with an attention implementation of
    ``TREE_ATTENTION`` that takes a 4-D ``attention_mask`` and an index tensor as ``logits_to_keep``."""
    from verl.workers.engine.fsdp.transformer_impl import _scale_logits_by_temperature

    rows, labels, seq_of = [], [], []
    for j, (seq, path) in enumerate(zip(sequences, tree.paths, strict=True)):
        s, e = reads.starts[j], reads.ends[j]
        rows.append(path[s:e])
        labels.append(seq[s + 1 : e + 1])
        seq_of.append(torch.full((e - s,), j, dtype=torch.long))
    rows_t, labels_t, seq_t = torch.cat(rows), torch.cat(labels), torch.cat(seq_of)
    keep, inverse = torch.unique(rows_t, return_inverse=True)  # the head at each read node once
    device = next(module.parameters()).device
    mask = attention_mask(tree, module.config.get_text_config()._attn_implementation, device)
    out = module(input_ids=tree.tokens.unsqueeze(0).to(device), position_ids=tree.positions.unsqueeze(0).to(device),
                 attention_mask=mask, use_cache=False, logits_to_keep=keep.to(device))
    logits = out.logits[0].float()[inverse.to(device)]  # one row per read token (a shared node once per reader)
    temps = temperatures.to(device=device, dtype=torch.float32)[seq_t.to(device)]
    # verl's own scaling: logits / max(T, 1e-8), so temperature 0 is finite as in verl's step
    logits = _scale_logits_by_temperature(logits, temps.unsqueeze(-1), is_unit_temperature=bool((temps == 1).all()))
    log_probs = torch.log_softmax(logits, dim=-1).gather(-1, labels_t.to(device).unsqueeze(-1)).squeeze(-1)
    counts = [e - s for s, e in zip(reads.starts, reads.ends, strict=True)]
    entropy = list(entropy_fn(logits).split(counts)) if entropy_fn is not None else None
    return list(log_probs.split(counts)), entropy


def packed_values(per_sequence: list[torch.Tensor], lengths: list[int], reads: ReadPositions) -> torch.Tensor:
    """One value per token of the concatenated sequences (``sum(lengths)``), ``per_sequence[j]`` at sequence ``j``'s
    read positions and 0 elsewhere, differentiable in ``per_sequence``."""
    dtype = per_sequence[0].dtype if per_sequence else torch.float32
    device = per_sequence[0].device if per_sequence else None
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    index = torch.cat([torch.arange(offsets[j] + s, offsets[j] + e) for j, (s, e)
                       in enumerate(zip(reads.starts, reads.ends, strict=True))]).to(device)
    out = torch.zeros(offsets[-1], dtype=dtype, device=device)
    return out.index_put((index,), torch.cat(per_sequence))
