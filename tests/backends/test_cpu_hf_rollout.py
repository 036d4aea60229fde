"""The HF rollout server and its worker-side adapter, without Ray (direct calls on the classes).

Checks against the tiny model's own forward pass: greedy decoding, EOS stop, length limits,
top-k/top-p/temperature semantics, the returned log-probs, request batching and weight sync.
"""

import asyncio

import pytest
import torch

from rpg.backends.hf_rollout import HFRolloutServer, HFServerAdapter
from rpg.backends.weight_digest import WeightDigest, loaded_digests
from rpg.tiny.warm_up import prompt_ids as _prompt_ids


@pytest.fixture(scope="module")
def server(tiny_assets):
    from verl.workers.config import HFModelConfig, RolloutConfig

    rc = RolloutConfig(name="hf", prompt_length=64, response_length=8, tensor_model_parallel_size=1)
    return HFRolloutServer(rc, HFModelConfig(path=str(tiny_assets.model_dir)), replica_rank=0, pool="hybrid")


@pytest.fixture(scope="module")
def prompts(server):
    tok = server.model_config.tokenizer
    return [_prompt_ids(tok, a, b) for a, b in [(1, 2), (7, 8), (0, 0), (9, 4)]]


def _gen(server, prompts, **params):
    async def go():
        return await asyncio.gather(*[server.generate(f"r{i}", p, dict(params)) for i, p in enumerate(prompts)])

    return asyncio.run(go())


def _teacher_forced_logp(model, prompt, tokens, temperature=1.0):
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def test_greedy_batch_matches_unbatched_hf_generate_and_logprobs(server, prompts):
    outs = _gen(server, prompts, temperature=0.0, top_p=1.0, top_k=-1)
    for p, o in zip(prompts, outs):
        ref = server.model.generate(
            torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), do_sample=False,
            max_new_tokens=8, eos_token_id=sorted(server.eos_ids), pad_token_id=server.pad_id,
        )[0, len(p) :].tolist()
        stop = next((i for i, t in enumerate(ref) if t in server.eos_ids), None)
        ref = ref if stop is None else ref[: stop + 1]
        assert o.token_ids == ref
        assert o.stop_reason == ("completed" if o.token_ids[-1] in server.eos_ids else "length")
        lp = _teacher_forced_logp(server.model, p, o.token_ids)
        torch.testing.assert_close(torch.tensor(o.log_probs), lp, atol=1e-4, rtol=0)
    text = server.model_config.tokenizer.decode(outs[0].token_ids, skip_special_tokens=True)
    assert text.startswith("Answer:")  # the warmed-up model answers in the paper's format


def test_sampled_logprobs_are_temperature_scaled_and_unfiltered(server, prompts):
    torch.manual_seed(0)
    outs = _gen(server, prompts, temperature=0.7, top_p=1.0, top_k=-1)
    for p, o in zip(prompts, outs):
        torch.testing.assert_close(
            torch.tensor(o.log_probs), _teacher_forced_logp(server.model, p, o.token_ids, 0.7), atol=1e-4, rtol=0
        )


def test_top_k_1_and_tiny_top_p_reduce_to_greedy(server, prompts):
    greedy = [o.token_ids for o in _gen(server, prompts, temperature=0.0)]
    assert [o.token_ids for o in _gen(server, prompts, temperature=1.5, top_k=1)] == greedy
    assert [o.token_ids for o in _gen(server, prompts, temperature=1.5, top_p=1e-6)] == greedy


def test_max_tokens_and_model_length_bound_the_response(server, prompts):
    for o in _gen(server, prompts, temperature=1.0, max_tokens=2):
        assert len(o.token_ids) <= 2 and len(o.log_probs) == len(o.token_ids)
    long_prompt = prompts[0] * 3  # 123 tokens > prompt_length + response_length = 72
    (o,) = _gen(server, [long_prompt], temperature=1.0)
    assert o.token_ids == [] and o.stop_reason == "length"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_response_never_passes_the_model_length_whatever_its_batch(server, prompts, temperature):
    """max_model_len = prompt_length + response_length = 72: a prompt of 72 tokens gets no token and one of 70 at most
    2, alone and beside a short prompt (whose limit, 8, runs the batch's loop), the same tokens either way."""
    limit = server.max_model_len
    requests = [((prompts[0] * 2)[:limit], (1, 0, 0)), ((prompts[1] * 2)[: limit - 2], (1, 1, 0)),
                (prompts[2], (1, 2, 0))]
    together = _keyed(server, requests, temperature=temperature)
    assert together == [_keyed(server, [r], temperature=temperature)[0] for r in requests]
    assert together[0] == [] and 0 < len(together[1]) <= 2 and together[2]


def test_concurrent_requests_are_batched(server, prompts):
    server.batch_sizes = []
    _gen(server, prompts * 4, temperature=1.0)
    assert sum(server.batch_sizes) == 16 and len(server.batch_sizes) < 16


def test_requests_arriving_over_most_of_a_second_are_one_decode_batch(server, prompts, monkeypatch):
    """The agent loop sends a validation's requests a few ms apart (SmolLM2's 200 took about 0.75 s on 2 cores):
    they are decoded as one batch, not one generate loop per part that arrived (server.py, _BATCH_MAX_WAIT_S).
    The quiet time is raised for the test alone, so that a pause of a loaded machine between two arrivals does
    not end the batch; the limit under test, _BATCH_MAX_WAIT_S, is the server's."""
    from rpg.backends.hf_rollout import server as server_module

    monkeypatch.setattr(server_module, "_BATCH_QUIET_S", 0.5)
    gap, n = 0.02, 40  # 0.8 s in all on an idle machine
    sent = []

    async def go():
        loop, tasks = asyncio.get_running_loop(), []
        for i in range(n):
            sent.append(loop.time())
            tasks.append(asyncio.ensure_future(server.generate(f"s{i}", prompts[i % len(prompts)],
                                                               {"temperature": 1.0, "max_tokens": 2})))
            await asyncio.sleep(gap)
        return await asyncio.gather(*tasks)

    server.batch_sizes = []
    assert len(asyncio.run(go())) == n
    assert sum(server.batch_sizes) == n
    # every request sent within a second of the first is in the first batch (the limit, 2 s, less the time the
    # first takes to reach the collector), however few of them a loaded machine sent in that second
    assert server_module._BATCH_MAX_WAIT_S >= 1.2
    in_time = sum(t - sent[0] < 1.0 for t in sent)
    assert server.batch_sizes[0] >= in_time, (server.batch_sizes, in_time, sent[-1] - sent[0])


def test_rejects_multimodal_input(server, prompts):
    with pytest.raises(ValueError, match="text-only"):
        asyncio.run(server.generate("r", prompts[0], {}, image_data=[object()]))


def test_weight_sync_through_the_adapter_changes_generation(server, prompts, capsys):
    class _Remote:
        def __init__(self, fn):
            self.remote = fn

    class _Handle:  # stands in for the Ray actor handle of the server
        load_weights = _Remote(server.load_weights)

    from verl.workers.config import HFModelConfig, RolloutConfig

    adapter = HFServerAdapter(
        RolloutConfig(name="hf", prompt_length=64, response_length=8, tensor_model_parallel_size=1),
        HFModelConfig(path=str(server.model_config.local_path)),
        device_mesh=None,
    )
    adapter._server = _Handle()
    original = {k: v.clone() for k, v in server.model.state_dict().items()}
    before = asyncio.run(server.get_weights_checksum())
    greedy_before = [o.token_ids for o in _gen(server, prompts, temperature=0.0)]
    try:
        # zero the answer-digit logits' source: a different model must answer differently
        new = {k: (torch.zeros_like(v) if "layers.1.mlp.down_proj" in k else v) for k, v in original.items()}
        new = {k: v for k, v in new.items() if k != "lm_head.weight"}  # tied to the embedding
        asyncio.run(adapter.update_weights(iter(new.items()), global_steps=3))
        assert server.global_steps == 3
        # the load's line names the pool and replica, and the digest of the weights read back: those sent
        sent = WeightDigest()
        for name, t in new.items():
            sent.add(name, t)
        assert loaded_digests(capsys.readouterr().out) == [("3", "hybrid", 0, sent.hexdigest())]
        assert asyncio.run(server.get_weights_checksum()) != before
        assert torch.equal(server.model.model.layers[1].mlp.down_proj.weight, torch.zeros_like(new["model.layers.1.mlp.down_proj.weight"]))
        with pytest.raises(ValueError, match="unexpected"):
            asyncio.run(server.load_weights({**new, "bogus.weight": torch.zeros(1)}))
        with pytest.raises(ValueError, match="shape"):
            asyncio.run(server.load_weights({**new, "model.norm.weight": torch.zeros(3)}))
        with pytest.raises(ValueError, match="missing"):
            asyncio.run(server.load_weights({k: v for k, v in new.items() if k != "model.norm.weight"}))
        with pytest.raises(ValueError, match="named_tensors"):
            asyncio.run(adapter.update_weights(iter(()), wire_format="delta_flush"))
    finally:
        asyncio.run(server.load_weights({k: v for k, v in original.items() if k != "lm_head.weight"}))
    assert asyncio.run(server.get_weights_checksum()) == pytest.approx(before)
    assert [o.token_ids for o in _gen(server, prompts, temperature=0.0)] == greedy_before


def test_sampling_does_not_depend_on_the_batch_a_request_lands_in(server, prompts):
    """Each sequence has its own generator: one batch of 8 == 8 batches of 1 (same weights, same draws)."""
    requests = prompts * 2  # two samples of each prompt: draws 0 and 1
    server._draws = {}
    together = [o.token_ids for o in _gen(server, requests, temperature=1.0)]
    server._draws = {}
    alone = [_gen(server, [p], temperature=1.0)[0].token_ids for p in requests]
    assert together == alone
    assert together[:4] != together[4:]  # the second draw of a prompt is a fresh sample
    # greedy is untouched by the seeds, a different seed samples differently
    server._draws, seed = {}, server.seed
    try:
        server.seed = seed + 1
        assert [o.token_ids for o in _gen(server, requests, temperature=1.0)] != together
    finally:
        server.seed = seed


def test_a_batch_over_the_cache_budget_is_decoded_in_equal_chunks_with_the_same_responses(server, prompts,
                                                                                          monkeypatch):
    """Rows x (prompt width + new tokens) of keys and values over KV_BUDGET_BYTES: equal chunks, and every response and
    log-prob as decoded in one call (each row has its own draws)."""
    from rpg.backends.hf_rollout import sampling

    assert sampling.chunk_rows(400, 299 * 46080) == 200 and sampling.chunk_rows(200, 299 * 46080) == 200
    assert sampling.chunk_rows(5, 10, budget=25) == 2 and sampling.chunk_rows(3, 10, budget=1) == 1
    tiny = server.model.config
    assert sampling.kv_bytes_per_token(server.model) == 2 * tiny.num_hidden_layers * tiny.num_key_value_heads * (
        tiny.hidden_size // tiny.num_attention_heads) * 4
    requests, seeds = prompts * 2, list(range(8))
    whole = server._generate_batch(requests, 1.0, 1.0, -1, 8, seeds=seeds)
    calls, decode = [], sampling.decode_chunk
    monkeypatch.setattr(sampling, "decode_chunk", lambda m, p, *a, **kw: calls.append(len(p)) or decode(m, p, *a, **kw))
    width = max(map(len, requests)) + 8
    monkeypatch.setattr(sampling, "KV_BUDGET_BYTES", 3 * width * sampling.kv_bytes_per_token(server.model))
    chunked = server._generate_batch(requests, 1.0, 1.0, -1, 8, seeds=seeds)
    assert calls == [3, 3, 2]
    assert [o.token_ids for o in chunked] == [o.token_ids for o in whole]
    for a, b in zip(chunked, whole):
        torch.testing.assert_close(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-5, rtol=0)


def test_the_row_sampler_follows_the_warped_distribution_and_a_row_its_own_draws():
    """Inverse-CDF draws reproduce the softmax frequencies (and top-k); each row's token is what its draw gives
    whatever the other rows are; a seed's draws are its generator's first numbers, one per step."""
    from rpg.backends.hf_rollout import RowSampler
    from rpg.backends.hf_rollout.sampling import draws

    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    u = draws([7], 4000)[0]
    picks = RowSampler(temperature=2.0, top_k=-1, top_p=1.0)(logits.expand(4000, -1), u)
    counts = torch.bincount(picks, minlength=4).float()
    torch.testing.assert_close(counts / 4000, torch.softmax(logits[0] / 2.0, -1), atol=0.03, rtol=0)
    top2 = RowSampler(temperature=1.0, top_k=2, top_p=1.0)(logits.expand(200, -1), u[:200])
    assert set(top2.tolist()) == {1, 2}
    mixed = torch.stack([logits[0], logits[0].flip(0)])
    sampler = RowSampler(temperature=1.0, top_k=-1, top_p=1.0)
    assert sampler(mixed, u[:2])[0] == sampler(logits, u[:1])[0]
    g = torch.Generator().manual_seed(7)
    assert torch.equal(draws([7], 5)[0], torch.cat([torch.rand(1, generator=g) for _ in range(5)]))


def _keyed(server, requests, **params):
    """``requests``: (prompt, sample_key) pairs, sent together as the agent loop sends them."""
    async def go():
        return await asyncio.gather(*[server.generate(f"r{i}", p, dict(params), sample_key=k)
                                      for i, (p, k) in enumerate(requests)])

    return [o.token_ids for o in asyncio.run(go())]


def test_a_keyed_sample_is_the_same_on_every_replica_and_at_any_arrival_order(server, prompts):
    """The agent loop's sample key (dispatch step, row, sample index) seeds a sample: another replica (whose own
    seed differs by its rank), another arrival order or other batch neighbours draw the same tokens; another
    sample index or step draws a new sample; the keyless path still depends on the replica."""
    from verl.workers.config import HFModelConfig, RolloutConfig

    other = HFRolloutServer(RolloutConfig(name="hf", prompt_length=64, response_length=8, tensor_model_parallel_size=1),
                            HFModelConfig(path=str(server.model_config.local_path)), replica_rank=1,
                            pool="standalone")
    requests = [(p, (3, row, s)) for row, p in enumerate(prompts) for s in range(3)]
    first = _keyed(server, requests, temperature=1.0)
    order = list(reversed(range(len(requests))))
    assert [_keyed(other, [requests[i] for i in order], temperature=1.0)[j] for j in order] == first
    assert [_keyed(other, [r], temperature=1.0)[0] for r in requests] == first  # one request per batch
    assert len({tuple(t) for t in first[:3]}) > 1  # samples 0, 1, 2 of a prompt differ
    assert _keyed(server, [(p, (4, row, s)) for p, (_, row, s) in requests], temperature=1.0) != first
    server._draws, other._draws = {}, {}
    assert [o.token_ids for o in _gen(server, prompts, temperature=1.0)] != \
        [o.token_ids for o in _gen(other, prompts, temperature=1.0)]


def test_the_agent_loop_passes_its_sample_key_and_is_registered_with_verl():
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    from rpg.backends.hf_rollout.agent_loop import SampleKeyAgentLoop, _WithSampleKey, sample_key
    from rpg.backends.hf_rollout.verl_registries import AGENT_LOOP, AGENT_LOOP_FQN, register_hf_rollout

    register_hf_rollout()
    assert _agent_loop_registry[AGENT_LOOP] == {"_target_": AGENT_LOOP_FQN}
    module, name = AGENT_LOOP_FQN.rsplit(".", 1)
    assert getattr(__import__(module, fromlist=[name]), name) is SampleKeyAgentLoop
    fields = {"global_steps": 7, "index": 12, "session_id": 3, "uid": "p7-0", "raw_prompt": []}
    assert sample_key(fields) == (7, 12, 3)
    assert sample_key({**fields, "index": None}) == (7, None, 3)

    class _Client:
        calls = []
        name = "client"

        async def generate(self, request_id, **kwargs):
            self.calls.append((request_id, kwargs))
            return "out"

    client = _WithSampleKey(_Client(), (7, 12, 3))
    assert asyncio.run(client.generate("r", prompt_ids=[1], sampling_params={})) == "out"
    assert _Client.calls == [("r", {"prompt_ids": [1], "sampling_params": {}, "sample_key": (7, 12, 3)})]
    assert client.name == "client"


def test_full_determinism_decodes_each_sequence_alone(tiny_assets, prompts):
    """verl's rollout.full_determinism: requests that arrive together give exactly (log-probs included) what each
    gives alone, so the timing of requests, which decides a batch's make-up, cannot change a number."""
    from verl.workers.config import HFModelConfig, RolloutConfig

    rc = RolloutConfig(name="hf", prompt_length=64, response_length=8, tensor_model_parallel_size=1,
                       full_determinism=True)
    strict = HFRolloutServer(rc, HFModelConfig(path=str(tiny_assets.model_dir)), replica_rank=0, pool="hybrid")
    assert strict.one_per_decode
    requests = [(p, (1, row, s)) for row, p in enumerate(prompts) for s in range(2)]

    async def together():
        return await asyncio.gather(*[strict.generate(f"r{i}", p, {"temperature": 1.0}, sample_key=k)
                                      for i, (p, k) in enumerate(requests)])

    async def alone(p, k):
        return await strict.generate("r", p, {"temperature": 1.0}, sample_key=k)

    got = [(o.token_ids, o.log_probs) for o in asyncio.run(together())]
    assert got == [(o.token_ids, o.log_probs) for o in (asyncio.run(alone(p, k)) for p, k in requests)]
