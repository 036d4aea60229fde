"""The HF rollout's sampler (rpg/backends/hf_rollout/sampling.py) against a reference sampler, on the real tiny model.

Token for token: each sample the server decodes (in one batch, keyed as the agent loop keys it) is decoded again
alone by transformers' ``generate`` (greedy over the scores of ``InverseCdfReference``), which draws the same
uniform numbers (the sample's generator, seeded by its identity as the server seeds it: ``row_seed(rollout.seed,
"sample", sample_key, prompt)``, one number per step) and turns each into a token with code of its own: the
temperature, top-k and top-p written from their definitions in float64, and the inverse CDF over the probabilities
in vocabulary order (token 0 first), the order the project's ``RowSampler`` takes its cumulative sum in. Not
``generate``'s own multinomial sampling: it draws from another random stream.

Frequencies: thousands of first tokens sampled by the decode loop against softmax(logits / T) of the same context,
by a chi-square test with fixed seeds (the same counts on every run; the p-values found are given at the test).
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from rpg.backends.hf_rollout import HFRolloutServer, sampling
from rpg.backends.hf_rollout.sampling import row_seed
from rpg.tiny.warm_up import prompt_ids as _prompt_ids

ROLLOUT_SEED = 11
LOGP_ATOL = 1e-5  # a row decoded in a batch against alone: float32 rounding (test_cpu_hf_prefix.py)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The reference decodes about 200 rows one at a time, a few microseconds of work per product on the tiny model:
    with a second thread each product waits for it, which on a busy machine took 0.5 s per generate instead of 0.04."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def server(tiny_assets):
    from verl.workers.config import HFModelConfig, RolloutConfig

    rc = RolloutConfig(name="hf", prompt_length=64, response_length=8, tensor_model_parallel_size=1, seed=ROLLOUT_SEED)
    return HFRolloutServer(rc, HFModelConfig(path=str(tiny_assets.model_dir)), replica_rank=0, pool="hybrid")


@pytest.fixture(scope="module")
def prompts(server):
    tok = server.model_config.tokenizer
    return [_prompt_ids(tok, a, b) for a, b in [(1, 2), (7, 8), (3, 4), (9, 6)]]


def warped(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """vLLM's sampling distribution, in float64: softmax(logits / T), then only the top-k largest logits (ties with
    the k-th kept; -1 or 0: all), then only the most probable tokens whose mass first reaches ``top_p`` (a token is
    kept when the mass of the tokens before it, most probable first, is under top_p), renormalised."""
    probs = torch.softmax(logits.double() / temperature, -1)
    if top_k > 0:
        probs = torch.where(logits >= logits.topk(top_k).values[-1], probs, 0.0)
    if top_p < 1.0:
        ordered, order = (probs / probs.sum()).sort(descending=True)
        before = ordered.cumsum(-1) - ordered
        probs = torch.zeros_like(probs).index_put((order,), torch.where(before < top_p, ordered, 0.0))
    return probs / probs.sum()


def inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The first token, in vocabulary order, whose cumulative probability exceeds ``u``."""
    return int((probs.cumsum(-1) > u * probs.sum()).nonzero()[0])


class InverseCdfReference(LogitsProcessor):
    """One row of ``generate(do_sample=False)`` sampled from ``warped`` by ``inverse_cdf``, at each step with the next
    uniform number of the row's own generator: the scores returned are -inf except at that token, which greedy
    decoding then takes. ``decisions``: per step, the token and the one the same number picks without top-k/top-p."""

    def __init__(self, seed: int, temperature: float, top_k: int, top_p: float):
        self.generator = torch.Generator().manual_seed(seed)
        self.params = (temperature, top_k, top_p)
        self.decisions: list[tuple[int, int]] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        u = float(torch.rand(1, generator=self.generator))
        token = inverse_cdf(warped(scores[0], *self.params), u)
        self.decisions.append((token, inverse_cdf(warped(scores[0], self.params[0], -1, 1.0), u)))
        chosen = torch.full_like(scores, float("-inf"))
        chosen[0, token] = 0.0
        return chosen


def reference(server, prompt: list[int], sample_key: tuple, temperature: float, top_k: int, top_p: float):
    """(tokens, log-probs of the temperature-scaled logits, the sampler's decisions) of one sample decoded alone."""
    sampler = InverseCdfReference(row_seed(ROLLOUT_SEED, "sample", sample_key, tuple(prompt)), temperature, top_k,
                                  top_p)
    out = server.model.generate(
        torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), do_sample=False,
        max_new_tokens=server.response_length, logits_processor=LogitsProcessorList([sampler]),
        eos_token_id=sorted(server.eos_ids), pad_token_id=server.pad_id, output_logits=True,
        return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt):].tolist()
    logits = torch.cat(out.logits)[: len(tokens)].double() / temperature
    return tokens, torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1), \
        sampler.decisions


def served(server, requests, **params):
    """The server's outputs for (prompt, sample_key) requests sent together, as the agent loop sends them."""
    async def go():
        return await asyncio.gather(*[server.generate(f"r{i}", p, dict(params), sample_key=k)
                                      for i, (p, k) in enumerate(requests)])

    return asyncio.run(go())


# with these seeds top-k/top-p change 3 to 10 of the reference's 211-227 decisions (top-k 2 or 3 alone at T 0.6 none:
# the third token's probability there is under 0.02, so those cases are left out)
@pytest.mark.parametrize("temperature,top_k,top_p", [(0.6, -1, 1.0), (0.6, -1, 0.7), (0.6, 3, 0.8), (1.0, -1, 1.0),
                                                     (1.0, 2, 1.0), (1.0, 3, 0.8)])
def test_the_server_samples_token_for_token_what_the_reference_sampler_does(server, prompts, temperature, top_k,
                                                                             top_p):
    """32 samples (4 prompts x 8) decoded as one batch equal the reference's, token for token, their log-probs within
    LOGP_ATOL; the samples of a prompt differ, and with top-k/top-p some draws pick another token than the
    unfiltered distribution would."""
    requests = [(p, (5, row, s)) for row, p in enumerate(prompts) for s in range(8)]
    outs = served(server, requests, temperature=temperature, top_k=top_k, top_p=top_p)
    decisions = []
    for (prompt, key), out in zip(requests, outs):
        tokens, log_probs, made = reference(server, prompt, key, temperature, top_k, top_p)
        assert out.token_ids == tokens, (key, out.token_ids, tokens)
        torch.testing.assert_close(torch.tensor(out.log_probs, dtype=torch.float64), log_probs, atol=LOGP_ATOL,
                                   rtol=0)
        decisions += made
    assert len({tuple(o.token_ids) for o in outs}) > len(prompts)  # samples of a prompt differ
    if top_k > 0 or top_p < 1.0:
        assert any(token != unfiltered for token, unfiltered in decisions)


def first_token_counts(server, prompt: list[int], n: int, temperature: float, top_k: int = -1, top_p: float = 1.0):
    """How often each token is the first of ``n`` samples of ``prompt``, decoded as one batch (seeds fixed)."""
    seeds = [row_seed("chi-square", i) for i in range(n)]
    outs = sampling.generate_batch(server.model, [prompt] * n, temperature, top_p, top_k, 1, seeds,
                                   eos_ids=server.eos_ids, pad_id=server.pad_id, max_model_len=server.max_model_len,
                                   device=server.device, global_steps=None)
    return torch.bincount(torch.tensor([o.token_ids[0] for o in outs]), minlength=server.model.config.vocab_size)


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square p-value of ``counts`` against ``probs``: a bin per token expected 5 times or more, the
    rest one bin (added to the smallest bin when it is expected under 5 times)."""
    expected = probs.double() * counts.sum()
    big = expected >= 5
    obs, exp = counts[big].double(), expected[big]
    rest_obs, rest_exp = counts[~big].sum().double(), expected[~big].sum()
    if rest_exp >= 5:
        obs, exp = torch.cat([obs, rest_obs[None]]), torch.cat([exp, rest_exp[None]])
    else:
        smallest = exp.argmin()
        obs[smallest] += rest_obs
        exp[smallest] += rest_exp
    stat = ((obs - exp) ** 2 / exp).sum()
    return float(torch.special.gammaincc(torch.tensor((len(obs) - 1) / 2.0, dtype=torch.float64), stat / 2))


# The p-values these seeds give: 0.78 (T 0.6), 0.82 (T 1), 0.24 (T 1, top-k 2). The counts are the same on every run,
# so the bound cannot flake; the temperature applied twice (0.36) gives p = 3e-228 at T 0.6.
@pytest.mark.parametrize("temperature,top_k,top_p", [(0.6, -1, 1.0), (1.0, -1, 1.0), (1.0, 2, 1.0)])
def test_the_first_tokens_follow_softmax_of_logits_over_t(server, prompts, temperature, top_k, top_p):
    """4,000 samples of the answer's first digit (its context: the prompt and the model's own "Answer: "), decoded as
    one batch, against softmax(logits / T) of a plain forward of that context (top-k: renormalised over the two
    largest): Pearson's chi-square p-value over 1e-3."""
    tok = server.model_config.tokenizer
    context = prompts[2] + tok.encode("Answer: ")  # 3 + 4: "7" 0.72, "6" 0.21, "8" 0.06, ... at T = 1
    with torch.no_grad():
        logits = server.model(torch.tensor([context])).logits[0, -1]
    probs = warped(logits, temperature, top_k, top_p)
    assert int((probs > 0.01).sum()) >= 2  # a real choice
    counts = first_token_counts(server, context, 4000, temperature, top_k, top_p)
    assert int(counts[probs == 0].sum()) == 0
    assert chi_square_p(counts, probs) > 1e-3
