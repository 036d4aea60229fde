"""How the HF rollout server decodes one batch of requests: ``generate_batch``, one greedy ``model.generate`` over
the prompts' common prefix computed once, whose last logits processor, ``SeededRowSampler``, does the sampling, with
one random generator per sequence (seeded by ``row_seed``).

Sampling semantics (vLLM's, as verl sends them): ``temperature`` (0 = greedy), ``top_p`` (1 =
off), ``top_k`` (-1 or 0 = off), ``max_tokens``/``max_new_tokens`` (default: the rollout's
response_length), bounded by ``prompt_length + response_length``; generation stops after the
first EOS token, which is returned. ``log_probs`` are log pi(token) under the temperature-scaled
distribution *before* top-k/top-p filtering, i.e. what verl's actor recomputes (it divides the
logits by the same temperature), so ``training/rollout_probs_diff_*`` measures real mismatch.

Shared prefix: prompts that begin with the same ``MIN_SHARED_PREFIX`` or more tokens (a chat template's system turn,
a worked example) have that prefix's keys and values computed once per batch, by one forward into a ``DynamicCache``
repeated per row and given to ``generate`` as ``past_key_values`` (transformers' prompt-cache reuse). A row is
[prefix | padding | its own tokens], the attention mask 0 on the padding. It is the row alone, position for position:
transformers 5.10's ``generate`` numbers the tokens by the mask's cumulative sum minus one
(``GenerationMixin._prepare_position_ids_for_generation``, generation/utils.py:721; the tokens after the cache take
the last of them, :542, each new one the last plus one, :937), and the attention hides every key whose mask is 0
(masking_utils.py:164), so the numbers move only at float32 rounding (other batch shapes, another summation order),
as in any batch (below); ``shared_prefix_support`` names the models where that does not hold (a sliding window counts
cache slots). On SmolLM2's task (prompts of 186-203 tokens, 155 shared; 2 CPU cores, responses up to 32 tokens):
1.31 times the tokens/s for 32 prompts, 1.43 for 100, the same responses, log-probs within 2.4e-5 (docs/smol.md).
Off: verl's ``rollout.enable_prefix_caching=False``.

Reproducible sampling: every sequence draws from its own random generator, seeded by
``HFRolloutServer.request_seed`` (the rollout seed, the sample's identity and its prompt), so the random
numbers of a response do not depend on which other requests shared its decode batch, nor on the replica.
The numbers the model computes do, slightly: on CPU a batched matrix product's result for one row depends on
the batch's size and the row's place in it (measured on the tiny model: log-probs move by up to 2e-6 between
a sequence decoded alone and in a batch, or with its prefix shared; a token changes only when its random number
falls that close to a boundary of the cumulative distribution). ``rollout.full_determinism=True`` (verl's key)
decodes every sequence alone, with nothing to share: the same numbers whatever the timing, at the cost of batching
(server.py).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from verl.workers.rollout.replica import TokenOutput
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


def row_seed(*parts) -> int:
    """A 63-bit seed derived from ``parts`` (stable across processes, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") >> 1


class SeededRowSampler(LogitsProcessor):
    """Sampling with one generator per row, as the last logits processor of a *greedy* generate.

    Applies temperature, top-k and top-p with transformers' own warpers, draws u ~ U(0, 1) from
    the row's generator and takes the inverse CDF of the warped distribution; it returns scores
    that are 0 at the drawn token and -inf elsewhere, so greedy selection picks exactly that token.
    """

    def __init__(self, generators: list[torch.Generator], temperature: float, top_k: int, top_p: float):
        self.generators = generators
        self.warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
        if top_k > 0:
            self.warpers.append(TopKLogitsWarper(top_k=top_k))
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=top_p))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        probs = torch.softmax(self.warpers(input_ids, scores).float(), dim=-1)
        cdf = probs.cumsum(dim=-1)
        # the generators are CPU ones (seeded per row, see module docstring); the draws follow the scores
        u = torch.cat([torch.rand(1, generator=g, dtype=cdf.dtype) for g in self.generators]).to(cdf.device)
        # u * total < total = cdf[-1], so the index is valid and its probability is > 0
        token = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, token.unsqueeze(-1), 0.0)


# The most raw logits one ``model.generate`` call keeps (prompts x new tokens x vocabulary, float32: transformers
# holds every step's for the log-probs). A 49k-token vocabulary makes that 38 MB per response of 192 tokens, so a
# validation of 256 prompts decoded at once would hold 9.7 GB; larger batches are decoded in equal chunks. Each
# response has its own generator (module docstring), so chunking changes no response.
LOGITS_BUDGET_BYTES = 2 << 30


def chunk_rows(n_prompts: int, max_new_tokens: int, vocab_size: int, budget: int | None = None) -> int:
    """Prompts per ``generate`` call: all ``n_prompts`` when their logits fit ``budget`` (default
    LOGITS_BUDGET_BYTES), else the size of equal chunks that do (at least one prompt)."""
    budget = LOGITS_BUDGET_BYTES if budget is None else budget
    fits = max(1, budget // (max(1, max_new_tokens) * vocab_size * 4))
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
    its prompt's length, or after its first EOS token (returned); its log-probs are those of the
    temperature-scaled logits before top-k/top-p (module docstring). ``share_prefix``: the prompts' common
    prefix (``shared_prefix_length``) is computed once for the whole batch, all chunks included (module docstring;
    the caller checks ``shared_prefix_support``)."""
    limits = [max(0, min(max_tokens, max_model_len - len(p))) for p in prompts]
    if max(limits) == 0:
        return [TokenOutput(token_ids=[], log_probs=[], stop_reason="length") for _ in prompts]
    shared = shared_prefix_length(prompts) if share_prefix else 0
    cache = prefix_cache(model, prompts[0][:shared], device) if shared else None
    rows = chunk_rows(len(prompts), max(limits), model.get_output_embeddings().weight.shape[0])
    return [out for i in range(0, len(prompts), rows) for out in _decode(  # chunks: LOGITS_BUDGET_BYTES
        model, prompts[i : i + rows], limits[i : i + rows], temperature, top_p, top_k,
        None if seeds is None else seeds[i : i + rows], shared, cache, eos_ids=eos_ids, pad_id=pad_id,
        device=device, global_steps=global_steps)]


def _decode(
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
    """One ``model.generate`` call over ``prompts``, whose first ``shared`` tokens are in ``cache`` (one row)."""
    import copy

    from transformers import GenerationConfig

    # [prefix | padding | suffix]: the padding between the shared prefix and each row's own tokens (left padding when
    # nothing is shared); its attention mask is 0, and generate counts positions from the mask (module docstring)
    width = shared + max(len(p) - shared for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    ids[:, :shared] = torch.tensor(prompts[0][:shared], dtype=torch.long)
    mask[:, :shared] = 1
    for i, p in enumerate(prompts):
        ids[i, width - len(p) + shared :] = torch.tensor(p[shared:], dtype=torch.long)
        mask[i, width - len(p) + shared :] = 1
    past = None
    if shared:  # transformers' prompt-cache reuse: a copy per call (generate appends to it), one row per prompt
        past = copy.deepcopy(cache)
        past.batch_repeat_interleave(len(prompts))
    greedy = temperature <= 0.0
    gen_cfg = GenerationConfig(  # greedy selection; sampling (if any) is done by SeededRowSampler
        max_new_tokens=max(limits),
        do_sample=False,
        eos_token_id=sorted(eos_ids),
        pad_token_id=pad_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    processors = LogitsProcessorList()
    if not greedy:
        generators = [torch.Generator().manual_seed(s) for s in seeds]
        processors.append(SeededRowSampler(generators, temperature, top_k, top_p))
    out = model.generate(
        input_ids=ids.to(device), attention_mask=mask.to(device), past_key_values=past, generation_config=gen_cfg,
        logits_processor=processors,
    )
    new = out.sequences[:, width:]
    scale = 1.0 if greedy else temperature
    # raw (unprocessed) logits [B, V] per step, one step at a time (no [B, T, V] copies)
    logp = torch.stack([torch.log_softmax(step.float() / scale, dim=-1).gather(-1, new[:, t : t + 1]).squeeze(-1)
                        for t, step in enumerate(out.logits)], dim=1)
    results = []
    for i in range(len(prompts)):
        toks = new[i].tolist()[: limits[i]]
        stop = "length"
        for j, t in enumerate(toks):
            if t in eos_ids:
                toks, stop = toks[: j + 1], "completed"
                break
        results.append(
            TokenOutput(
                token_ids=toks,
                log_probs=logp[i, : len(toks)].tolist(),
                stop_reason=stop,
                extra_fields={"global_steps": global_steps},
            )
        )
    return results
