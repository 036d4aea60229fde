"""How the HF rollout server decodes one batch of requests: ``generate_batch``, the prompts' common prefix computed
once, then ``decode_chunk``'s own loop: one forward over the rows' own prompt tokens, then one decoding step at a time
over the rows still decoding (a row leaves the batch, and its cache, after its EOS token or at its limit), every row
sampled at once by ``RowSampler`` from its own random generator (seeded by ``row_seed``). The keys and values are
written in place into a buffer per layer (``_BufferLayer``), not concatenated at every step.

A row with a shared prefix is [prefix | padding | its own tokens], the attention mask 0 on the padding: each token's
position is the count of mask-1 tokens before it (as transformers' ``generate`` numbers them) and the attention hides
every key whose mask is 0 (masking_utils.py:164), so a row computes what it computes alone, up to float32 rounding.
Semantics, seeds and what sharing and batching were measured to change: docs/cpu-backend.md#hf-rollout-semantics.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from verl.workers.rollout.replica import TokenOutput
from transformers import LogitsProcessorList
from transformers.cache_utils import DynamicLayer
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


def row_seed(*parts) -> int:
    """A 63-bit seed derived from ``parts`` (stable across processes, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") >> 1


class RowSampler:
    """Sampling of every row of a decode step at once, row ``i`` with its own uniform draw ``u[i]``.

    Applies temperature, top-k and top-p with transformers' own warpers, then takes the inverse CDF of the warped
    distribution at ``u`` (scaled by the total, so the index is valid and its probability > 0). Each row's draws
    come from its own generator (``draws``), so a row's tokens do not depend on the other rows.
    """

    def __init__(self, temperature: float, top_k: int, top_p: float):
        self.warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
        if top_k > 0:
            self.warpers.append(TopKLogitsWarper(top_k=top_k))
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=top_p))

    def __call__(self, scores: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        cdf = torch.softmax(self.warpers(None, scores.float()), dim=-1).cumsum(dim=-1)
        u = u.to(device=cdf.device, dtype=cdf.dtype)
        return torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)


def draws(seeds: list[int], steps: int) -> torch.Tensor:
    """[rows, steps] uniforms, row ``i`` the first ``steps`` draws of a CPU generator seeded ``seeds[i]`` (one draw
    per decoding step, whether or not the row still decodes: a response's numbers never depend on the others')."""
    return torch.stack([torch.rand(steps, generator=torch.Generator().manual_seed(s)) for s in seeds])


# The most key/value cache one decode chunk holds (rows x (prompt width + new tokens) x layers x 2 x KV heads x head
# size, in the model's dtype): SmolLM2-135M in float32 takes 46 kB per token, so a validation of 200 prompts of up to
# 203 tokens with up to 96 new ones holds 2.8 GB in one chunk. Larger batches are decoded in equal chunks; each
# response has its own draws, so chunking changes no response.
KV_BUDGET_BYTES = 4 << 30


def kv_bytes_per_token(model: Any) -> int:
    """Key and value bytes one token adds to the cache, over all layers."""
    cfg = model.config.get_text_config()
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * kv_heads * head * next(model.parameters()).element_size()


def chunk_rows(n_prompts: int, row_bytes: int, budget: int | None = None) -> int:
    """Prompts per decode chunk: all ``n_prompts`` when ``n_prompts * row_bytes`` fits ``budget`` (default
    KV_BUDGET_BYTES), else the size of equal chunks that do (at least one prompt)."""
    budget = KV_BUDGET_BYTES if budget is None else budget
    fits = max(1, budget // max(1, row_bytes))
    chunks = -(-n_prompts // fits)
    return -(-n_prompts // chunks)


def _limit(sampling_params: dict[str, Any], default: int) -> int:
    for key in ("max_tokens", "max_new_tokens"):
        if sampling_params.get(key) is not None:
            return int(sampling_params[key])
    return int(default)


# Prompts shorter in common than this are decoded without a shared prefix. Sharing P tokens over B rows saves
# (B - 1) * P tokens of the prompts' forward for one more model call over the prefix and a copy of its keys and
# values per row. On SmolLM2-135M on 2 cores (docs/smol.md) the prompts' forward runs at 700-1,100 tokens/s and a
# decoding step of 32 rows takes about 0.4 s: under 16 tokens a batch of 32 saves under half a second, about one
# step, and what such prompts share is a chat template's opening (the tiny task's 41-token prompts share 6).
MIN_SHARED_PREFIX = 16


def shared_prefix_support(model: Any) -> str | None:
    """None when ``generate_batch`` can share a prompt prefix's cache exactly with ``model``, else why not: the padding
    between prefix and suffix needs position ids counted from the attention mask (``GenerationMixin``'s own
    preparation, not a model's override) and every layer's cache a plain full-attention ``DynamicLayer`` (a sliding
    window, counted in cache slots, would count the padding)."""
    from transformers import DynamicCache, GenerationMixin
    from transformers.cache_utils import DynamicLayer

    for name in ("_prepare_position_ids_for_generation", "prepare_inputs_for_generation"):
        if getattr(type(model), name, None) is not getattr(GenerationMixin, name):
            return f"{type(model).__name__} overrides GenerationMixin.{name}"
    kinds = {type(layer).__name__ for layer in DynamicCache(config=model.config).layers}
    if kinds != {DynamicLayer.__name__}:
        return f"{type(model).__name__}'s cache has {sorted(kinds)} layers, not only full-attention ones"
    return None


def shared_prefix_length(prompts: list[list[int]]) -> int:
    """Tokens every prompt begins with, leaving each at least one of its own (its last token's logits start the
    response); 0 for a single prompt (nothing to share) or under MIN_SHARED_PREFIX."""
    if len(prompts) < 2:
        return 0
    n = 0
    for column in zip(*prompts):
        if any(t != column[0] for t in column):
            break
        n += 1
    n = min(n, min(map(len, prompts)) - 1)
    return n if n >= MIN_SHARED_PREFIX else 0


def prefix_cache(model: Any, prefix: list[int], device: torch.device) -> Any:
    """A ``DynamicCache`` filled by one forward over ``prefix`` (one row; logits of its last token only where the
    model's forward takes ``logits_to_keep``, as transformers' causal LMs do)."""
    import inspect

    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    last = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    model(input_ids=torch.tensor([prefix], device=device), past_key_values=cache, use_cache=True, **last)
    return cache


@torch.no_grad()
def generate_batch(
    model: Any,
    prompts: list[list[int]],
    temperature: float,
    top_p: float,
    top_k: int,
    max_tokens: int,
    seeds: list[int] | None,
    *,
    eos_ids: set[int],
    pad_id: int,
    max_model_len: int,
    device: torch.device,
    global_steps: int | None,
    share_prefix: bool = True,
) -> list[TokenOutput]:
    """Decode prompts that share their sampling parameters as one batch: greedy unless ``temperature`` > 0,
    then one ``seeds`` entry per prompt. Each response stops at ``max_tokens``, at ``max_model_len`` minus
    its prompt's length (no token for a prompt that fills it, whatever its batch), or after its first EOS token
    (returned); its log-probs are those of the temperature-scaled logits before top-k/top-p (module docstring).
    ``share_prefix``: the decoded prompts' common prefix (``shared_prefix_length``) is computed once for the whole
    batch, all chunks included (module docstring; the caller checks ``shared_prefix_support``)."""
    limits = [max(0, min(max_tokens, max_model_len - len(p))) for p in prompts]
    outs = [TokenOutput(token_ids=[], log_probs=[], stop_reason="length") for _ in prompts]
    decoded = [i for i, n in enumerate(limits) if n > 0]  # a prompt that fills the model's length gets no token
    if not decoded:
        return outs
    prompts, limits = [prompts[i] for i in decoded], [limits[i] for i in decoded]
    seeds = None if seeds is None else [seeds[i] for i in decoded]
    shared = shared_prefix_length(prompts) if share_prefix else 0
    cache = prefix_cache(model, prompts[0][:shared], device) if shared else None
    width = max(map(len, prompts)) + max(limits)
    rows = chunk_rows(len(prompts), width * kv_bytes_per_token(model))
    chunks = [out for i in range(0, len(prompts), rows) for out in decode_chunk(  # chunks: KV_BUDGET_BYTES
        model, prompts[i : i + rows], limits[i : i + rows], temperature, top_p, top_k,
        None if seeds is None else seeds[i : i + rows], shared, cache, eos_ids=eos_ids, pad_id=pad_id,
        device=device, global_steps=global_steps)]
    for i, out in zip(decoded, chunks, strict=True):
        outs[i] = out
    return outs


class _BufferLayer(DynamicLayer):
    """A full-attention cache layer whose keys and values are written in place into a buffer of ``capacity``
    positions (transformers' ``DynamicLayer`` concatenates, copying the whole cache at every decoding step)."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.length = capacity, 0

    def allocate(self, like: torch.Tensor, rows: int) -> None:
        _, heads, _, size = like.shape
        self.dtype, self.device = like.dtype, like.device
        self.buffers = [like.new_empty(rows, heads, self.capacity, size) for _ in range(2)]
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.allocate(key_states, key_states.shape[0])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        for buffer, states in zip(self.buffers, (key_states, value_states)):
            buffer[:, :, self.length : end] = states
        self.length = end
        self.keys, self.values = (b[:, :, :end] for b in self.buffers)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.buffers = [b[indices] for b in self.buffers]
        self.keys, self.values = (b[:, :, : self.length] for b in self.buffers)


def _row_cache(model: Any, rows: int, capacity: int, prefix: Any) -> Any:
    """A ``DynamicCache`` of ``_BufferLayer``s for ``rows`` rows, each holding ``prefix``'s keys and values (one row)
    first, when given."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    cache.layers = [_BufferLayer(capacity) for _ in cache.layers]
    if prefix is not None:
        for layer, shared in zip(cache.layers, prefix.layers, strict=True):
            layer.allocate(shared.keys, rows)
            layer.update(shared.keys.expand(rows, -1, -1, -1), shared.values.expand(rows, -1, -1, -1))
    return cache


def decode_chunk(
    model: Any,
    prompts: list[list[int]],
    limits: list[int],
    temperature: float,
    top_p: float,
    top_k: int,
    seeds: list[int] | None,
    shared: int,
    cache: Any,
    *,
    eos_ids: set[int],
    pad_id: int,
    device: torch.device,
    global_steps: int | None,
) -> list[TokenOutput]:
    """Decode ``prompts``, whose first ``shared`` tokens are in ``cache`` (one row): a forward over the rows' own
    prompt tokens, then one decoding step at a time over the rows still decoding. A row leaves the batch (and its
    cache rows) after its EOS token or at its limit (``limits``, each at least 1); each step samples every row at once
    (``RowSampler``, the row's own draws) and keeps the log-prob of the token drawn (temperature-scaled, before
    top-k/top-p)."""
    if min(limits) < 1:
        raise ValueError(f"decode_chunk: every row's limit must be at least 1, got {limits}")
    # [prefix | padding | own tokens]: the padding between the shared prefix and each row's own tokens (left padding
    # when nothing is shared) has mask 0, and each token's position counts the mask before it (module docstring)
    width = shared + max(len(p) - shared for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    mask[:, :shared] = 1
    for i, p in enumerate(prompts):
        ids[i, width - len(p) + shared :] = torch.tensor(p[shared:], dtype=torch.long)
        mask[i, width - len(p) + shared :] = 1
    positions = (mask.cumsum(-1) - 1).clamp_(min=0)
    steps = max(limits)
    past = _row_cache(model, len(prompts), width + steps, cache)
    greedy = temperature <= 0.0
    sampler, u = (None, None) if greedy else (RowSampler(temperature, top_k, top_p), draws(seeds, steps))
    scale = 1.0 if greedy else temperature
    active = torch.arange(len(prompts))  # each row's prompt
    left = torch.tensor(limits)
    tokens: list[list[int]] = [[] for _ in prompts]
    log_probs: list[list[float]] = [[] for _ in prompts]
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long)
    mask, last = mask.to(device), positions[:, -1].to(device)
    logits = model(input_ids=ids[:, shared:].to(device), attention_mask=mask, position_ids=positions[:, shared:].to(
        device), past_key_values=past, use_cache=True, logits_to_keep=1).logits[:, -1]
    for t in range(steps):
        scores = logits.float()
        token = (scores.argmax(-1) if greedy else sampler(scores, u[active, t])).cpu()
        lp = torch.log_softmax(scores / scale, dim=-1).gather(-1, token.to(device).unsqueeze(-1)).squeeze(-1).cpu()
        for row, tok, value in zip(active.tolist(), token.tolist(), lp.tolist()):
            tokens[row].append(tok)
            log_probs[row].append(value)
        left = left - 1
        going = ~(torch.isin(token, eos) | (left == 0))
        if not bool(going.any()):
            break
        if not bool(going.all()):
            keep = going.nonzero().squeeze(-1)
            active, left, token = active[keep], left[keep], token[keep]
            keep = keep.to(device)
            mask, last = mask[keep], last[keep]
            for layer in past.layers:
                layer.batch_select_indices(keep)
        mask = torch.cat([mask, mask.new_ones(len(active), 1)], dim=1)
        last = last + 1
        logits = model(input_ids=token.to(device).unsqueeze(-1), attention_mask=mask, position_ids=last.unsqueeze(-1),
                       past_key_values=past, use_cache=True).logits[:, -1]
    return [TokenOutput(token_ids=tokens[i], log_probs=log_probs[i],
                        stop_reason="completed" if tokens[i] and tokens[i][-1] in eos_ids else "length",
                        extra_fields={"global_steps": global_steps}) for i in range(len(prompts))]
