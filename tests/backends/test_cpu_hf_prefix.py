"""The HF rollout's shared prompt prefix (rpg/backends/hf_rollout/sampling.py): a batch whose prompts begin alike
decodes the prefix once and gives what the unshared batch gives, token for token, log-probs within float32 rounding.

The bound, LOGP_ATOL = 1e-5: both paths evaluate the same float32 function of each row's own tokens at its own
positions; only the shapes of the matrix products differ (the prefix as one row, the suffixes after padding), which
changes their summation order, each rounding error about float32's epsilon (1.2e-7) times a sum's magnitude. Measured:
at most 1.2e-6 on the tiny Qwen2 model, 1.7e-6 on the random Llama below, where the padding counted in the positions
moves a log-prob by 2.5 and an attended pad by 1.0 (on SmolLM2's 30 layers 2.4e-5: docs/smol.md). Tokens are compared
exactly: a token could differ only where its random number falls within that rounding of a boundary of the
cumulative distribution, which these fixed seeds do not meet.
"""

import asyncio
import os

import pytest
import torch

from rpg.backends.hf_rollout import HFRolloutServer, sampling
from rpg.tiny import task

LOGP_ATOL = 1e-5


@pytest.fixture(scope="module")
def model(tiny_assets):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_assets.model_dir, dtype=torch.float32,
                                                attn_implementation="sdpa").eval()


@pytest.fixture(scope="module")
def tok(tiny_assets):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_assets.model_dir)


def _chat(tok, messages):
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return [int(i) for i in (ids["input_ids"] if hasattr(ids, "keys") else ids)]


@pytest.fixture(scope="module")
def shared_prompts(tok):
    """A worked example as an earlier turn (shared), then each problem, its turn 0-3 words longer (88-100 tokens)."""
    example = [{"role": "user", "content": task.question(3, 4)}, {"role": "assistant", "content": task.response(7)}]
    return [_chat(tok, example + [{"role": "user", "content": "Now " * k + task.question(a, b)}])
            for k, (a, b) in enumerate([(1, 2), (7, 8), (0, 0), (9, 4)])]


def _kw(tok, **extra):
    return dict(eos_ids={tok.eos_token_id}, pad_id=tok.pad_token_id, max_model_len=256, device=torch.device("cpu"),
                global_steps=None, **extra)


def _decode(model, tok, prompts, temperature, share, seeds=None, top_p=1.0, top_k=-1, max_tokens=8):
    seeds = seeds if seeds is not None or temperature <= 0 else list(range(len(prompts)))
    return sampling.generate_batch(model, prompts, temperature, top_p, top_k, max_tokens, seeds,
                                   **_kw(tok, share_prefix=share))


def _spy(model, monkeypatch):
    """Each decode chunk's rows and the length of the prefix cache it was given (0: none)."""
    calls, decode = [], sampling.decode_chunk

    def spy(model, prompts, limits, temperature, top_p, top_k, seeds, shared, cache, **kw):
        calls.append((len(prompts), 0 if cache is None else cache.get_seq_length()))
        return decode(model, prompts, limits, temperature, top_p, top_k, seeds, shared, cache, **kw)

    monkeypatch.setattr(sampling, "decode_chunk", spy)
    return calls


def _teacher_forced(model, prompt, tokens, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def _same(a, b, atol=LOGP_ATOL):
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.stop_reason for o in a] == [o.stop_reason for o in b]
    for x, y in zip(a, b):
        torch.testing.assert_close(torch.tensor(x.log_probs), torch.tensor(y.log_probs), atol=atol, rtol=0)


def test_the_shared_prefix_leaves_each_row_a_token_and_needs_min_shared_prefix_tokens(shared_prompts):
    n = sampling.MIN_SHARED_PREFIX
    head = list(range(100, 100 + n))
    assert sampling.shared_prefix_length([head + [1, 2], head + [1, 3, 4]]) == n + 1
    assert sampling.shared_prefix_length([head + [1], head + [1, 5]]) == n  # the shorter keeps its last token
    assert sampling.shared_prefix_length([head + [1], head + [1]]) == n  # identical prompts
    assert sampling.shared_prefix_length([head[1:] + [1], head[1:] + [2]]) == 0  # n - 1 tokens: not worth it
    assert sampling.shared_prefix_length([head + [1]]) == 0  # a batch of one: nothing to share
    assert sampling.shared_prefix_length([[7] + head, [8] + head]) == 0
    shared = sampling.shared_prefix_length(shared_prompts)
    assert shared >= n and len({tuple(p[:shared]) for p in shared_prompts}) == 1
    assert len({len(p) - shared for p in shared_prompts}) == 4  # four suffix lengths


@pytest.mark.parametrize("temperature,top_p,top_k", [(0.0, 1.0, -1), (0.7, 0.9, 20)], ids=["greedy", "sampled"])
def test_a_shared_prefix_gives_the_unshared_tokens_and_log_probs(model, tok, shared_prompts, monkeypatch,
                                                                 temperature, top_p, top_k):
    """Rows of four suffix lengths, responses ending at EOS at different steps: the same tokens for the same seeds,
    log-probs within LOGP_ATOL of the unshared batch's and of each row's own teacher-forced forward."""
    calls = _spy(model, monkeypatch)
    shared = sampling.shared_prefix_length(shared_prompts)
    got = _decode(model, tok, shared_prompts, temperature, True, top_p=top_p, top_k=top_k)
    want = _decode(model, tok, shared_prompts, temperature, False, top_p=top_p, top_k=top_k)
    assert calls == [(4, shared), (4, 0)]
    _same(got, want)
    assert "completed" in {o.stop_reason for o in got} and len({len(o.token_ids) for o in got}) > 1  # rows leave
    for p, o in zip(shared_prompts, got):
        lp = _teacher_forced(model, p, o.token_ids, temperature if temperature > 0 else 1.0)
        torch.testing.assert_close(torch.tensor(o.log_probs), lp, atol=LOGP_ATOL, rtol=0)


def test_a_batch_of_one_and_a_batch_without_a_common_prefix_decode_as_before(model, tok, shared_prompts,
                                                                             monkeypatch):
    """Nothing shared (one prompt; prompts that differ at once; the tiny task's 6 common tokens): no cache is given
    and every number is the unshared path's, bit for bit."""
    from rpg.tiny.warm_up import prompt_ids as _prompt_ids

    calls = _spy(model, monkeypatch)
    own = [_prompt_ids(tok, a, b) for a, b in [(1, 2), (7, 8), (0, 0)]]
    assert 0 < len(os.path.commonprefix(own)) < sampling.MIN_SHARED_PREFIX  # the tiny prompts share a few tokens
    unlike = [own[0], [tok.pad_token_id] + shared_prompts[1]]
    for batch in ([shared_prompts[2]], unlike, own):
        got = _decode(model, tok, batch, 1.0, True)
        want = _decode(model, tok, batch, 1.0, False)
        assert [(o.token_ids, o.log_probs) for o in got] == [(o.token_ids, o.log_probs) for o in want]
    assert {past for _, past in calls} == {0}


def test_chunked_batches_share_the_prefix_computed_once(model, tok, shared_prompts, monkeypatch):
    """Over KV_BUDGET_BYTES: equal chunks, one forward over the prefix for all of them, every chunk given its
    cache, and the responses of the whole batch decoded in one call."""
    requests, seeds = shared_prompts * 2, list(range(8))
    whole = _decode(model, tok, requests, 1.0, True, seeds=seeds)
    prefixes, fill = [], sampling.prefix_cache
    monkeypatch.setattr(sampling, "prefix_cache", lambda m, p, d: prefixes.append(len(p)) or fill(m, p, d))
    calls = _spy(model, monkeypatch)
    width = max(map(len, requests)) + 8
    monkeypatch.setattr(sampling, "KV_BUDGET_BYTES", 3 * width * sampling.kv_bytes_per_token(model))  # 3 rows
    chunked = _decode(model, tok, requests, 1.0, True, seeds=seeds)
    shared = sampling.shared_prefix_length(requests)
    assert prefixes == [shared] and calls == [(3, shared), (3, shared), (2, shared)]
    _same(chunked, whole)
    _same(chunked, _decode(model, tok, requests, 1.0, False, seeds=seeds))


def _random_llama(**extra):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, eos_token_id=1,
                      initializer_range=0.2, **extra)  # weights large enough that a position or a pad matters
    return LlamaForCausalLM(cfg).eval()


def test_llama_positions_match_the_row_alone():
    """SmolLM2's architecture (Llama, rotary positions), random weights: shared and unshared agree (greedy and
    sampled), while the same rows with the padding given positions (as if it were tokens) do not."""
    model = _random_llama()
    assert sampling.shared_prefix_support(model) is None
    g = torch.Generator().manual_seed(1)
    head = torch.randint(2, 64, (24,), generator=g).tolist()
    prompts = [head + torch.randint(2, 64, (k,), generator=g).tolist() for k in (1, 5, 9, 3)]
    kw = dict(eos_ids={1}, pad_id=0, max_model_len=128, device=torch.device("cpu"), global_steps=None)
    for temperature, seeds in ((0.0, None), (1.0, [5, 6, 7, 8])):
        runs = [sampling.generate_batch(model, prompts, temperature, 1.0, -1, 12, seeds, share_prefix=share, **kw)
                for share in (True, False)]
        _same(*runs)
    # the controls: the padding counted in the positions, or attended, moves a log-prob by far more than LOGP_ATOL
    row, pad = prompts[0], 8
    ids = torch.tensor([row[:24] + [0] * pad + row[24:]])
    own = torch.tensor([list(range(24)) + [0] * pad + list(range(24, len(row)))])
    with torch.no_grad():
        alone = model(torch.tensor([row])).logits[0, -1].log_softmax(-1)
        for position_ids, mask in ((torch.arange(ids.shape[1])[None], ids != 0), (own, torch.ones_like(ids))):
            wrong = model(ids, position_ids=position_ids, attention_mask=mask.long()).logits[0, -1].log_softmax(-1)
            assert (wrong - alone).abs().max() > 0.1


def test_a_sliding_window_model_is_not_shared_and_the_server_switch(tiny_assets, capsys):
    """A sliding window counts cache slots, padding included: no sharing with such a model. The server shares by
    default and verl's rollout.enable_prefix_caching=False turns it off."""
    from verl.workers.config import HFModelConfig, RolloutConfig

    sliding = _random_llama(sliding_window=16)
    assert "sliding" in (sampling.shared_prefix_support(sliding) or "").lower()

    def server(**extra):
        rc = RolloutConfig(name="hf", prompt_length=128, response_length=8, tensor_model_parallel_size=1, **extra)
        return HFRolloutServer(rc, HFModelConfig(path=str(tiny_assets.model_dir)), replica_rank=0, pool="hybrid")

    assert server().share_prefix and not server(enable_prefix_caching=False).share_prefix
    assert "enable_prefix_caching" not in capsys.readouterr().out


def test_full_determinism_still_decodes_each_sequence_alone_with_a_shared_prefix(tiny_assets, shared_prompts):
    """rollout.full_determinism=True: each decode is a batch of one, so no prefix is shared and requests that arrive
    together give exactly what each gives alone."""
    from verl.workers.config import HFModelConfig, RolloutConfig

    rc = RolloutConfig(name="hf", prompt_length=128, response_length=8, tensor_model_parallel_size=1,
                       full_determinism=True)
    strict = HFRolloutServer(rc, HFModelConfig(path=str(tiny_assets.model_dir)), replica_rank=0, pool="hybrid")
    assert strict.share_prefix and strict.one_per_decode
    requests = [(p, (1, row, 0)) for row, p in enumerate(shared_prompts)]

    async def together():
        return await asyncio.gather(*[strict.generate(f"r{i}", p, {"temperature": 1.0}, sample_key=k)
                                      for i, (p, k) in enumerate(requests)])

    async def alone(p, k):
        return await strict.generate("r", p, {"temperature": 1.0}, sample_key=k)

    got = [(o.token_ids, o.log_probs) for o in asyncio.run(together())]
    assert got == [(o.token_ids, o.log_probs) for o in (asyncio.run(alone(p, k)) for p, k in requests)]


def test_the_grouped_head_attention_decodes_as_transformers_sdpa():
    """rpg.backends.hf_rollout.attention on a random Llama with grouped key/value heads (SmolLM2's layout): the same
    tokens and log-probs as transformers' sdpa, shared prefix and padding included, greedy and sampled."""
    from rpg.backends.hf_rollout import attention

    g = torch.Generator().manual_seed(2)
    head = torch.randint(2, 64, (20,), generator=g).tolist()
    prompts = [head + torch.randint(2, 64, (k,), generator=g).tolist() for k in (1, 6, 3)] + [[5, 9, 11]]
    kw = dict(eos_ids={1}, pad_id=0, max_model_len=128, device=torch.device("cpu"), global_steps=None)
    runs = []
    for name in ("sdpa", attention.register()):
        model = _random_llama()
        model.set_attn_implementation(name)
        assert model.config._attn_implementation == name
        runs.append([sampling.generate_batch(model, prompts, t, 1.0, -1, 10, s, **kw)
                     for t, s in ((0.0, None), (1.0, [1, 2, 3, 4]))])
    for got, want in zip(*runs):
        _same(got, want, atol=1e-6)
