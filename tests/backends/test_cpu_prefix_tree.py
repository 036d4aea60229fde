"""The actor's prefix tree (rpg/backends/cpu/prefix_tree.py, tree_engine.py) against verl's own packed step.

Each micro-batch is computed once through verl's ``FSDPEngineWithLMHead`` path (``prepare_model_inputs``, the model
over the packed row, ``prepare_model_outputs``) and once through ``PrefixTreeEngine.tree_output``: on a random Llama of
SmolLM2's architecture (grouped-query attention, RoPE, tied embeddings) with groups of responses to prompts that open
alike, the response log-probs, their entropies and every parameter's gradient of a weighted sum of the log-probs agree
within float32 rounding. The bound, ATOL = 1e-5 on log-probs and entropies and GRAD_RTOL = 1e-4 of the largest
gradient entry: both paths evaluate the same float32 function of each sequence's tokens at their positions, in other
matrix shapes (measured here: under 2e-6; SmolLM2's 30 layers on a real step: 2.6e-5 at most, docs/smol.md). A tree
whose mask lets one response see another group's prompt, or that drops a node's position, moves log-probs by 1e-2 or
more: the comparison catches it.

The same bounds hold against each sequence computed alone, under each attention implementation the tree runs with
(sdpa and eager, each reading the mask in its own form) and on the tiny model under eager; every other implementation
transformers registers goes to verl's step with one line. Below verl's temperature floor (1e-8; temperature 0)
log-probs scale as 1/1e-8, and so does their bound.
"""

from __future__ import annotations

import pytest
import torch

from rpg.backends.cpu import prefix_tree
from rpg.backends.cpu.prefix_tree import TREE_ATTENTION, PrefixTree, ReadPositions, build_prefix_tree

ATOL = 1e-5
GRAD_RTOL = 1e-4


def smol_shaped_llama(layers: int = 2, seed: int = 0):
    """A random LlamaForCausalLM with SmolLM2's structure at a small width."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, rope_theta=10000.0, attn_implementation="sdpa")
    return LlamaForCausalLM(config).float()


def groups(seed: int = 1, n_groups: int = 3, n: int = 3, opening: int = 12):
    """(prompt, response) pairs: ``n_groups`` prompts beginning with the same ``opening`` tokens, ``n`` responses
    each, every length different."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randint(3, 97, (opening,), generator=g)
    pairs = []
    for k in range(n_groups):
        prompt = torch.cat([common, torch.randint(3, 97, (4 + 3 * k,), generator=g)])
        for i in range(n):
            pairs.append((prompt, torch.randint(3, 97, (2 + 2 * i + k,), generator=g)))
    return pairs


def micro_batch(pairs, temperature=1.0, calculate_entropy=True):
    """A no-padding micro-batch as verl's engine receives it (jagged input and position ids, prompts, responses)."""
    from verl.utils import tensordict_utils as tu

    nested = lambda ts: torch.nested.as_nested_tensor(ts, layout=torch.jagged)  # noqa: E731
    seqs = [torch.cat([p, r]) for p, r in pairs]
    td = tu.get_tensordict({
        "input_ids": nested(seqs),
        "position_ids": nested([torch.arange(len(s)) for s in seqs]),
        "prompts": nested([p for p, _ in pairs]),
        "responses": nested([r for _, r in pairs]),
        "response_mask": nested([torch.ones(len(r), dtype=torch.long) for _, r in pairs]),
    })
    tu.assign_non_tensor(td, temperature=temperature, calculate_entropy=calculate_entropy, use_remove_padding=True)
    return td


def engines(model):
    """verl's engine class and the tree engine, each an instance carrying only what their steps read."""
    from types import SimpleNamespace

    from verl.utils.torch_functional import entropy_from_logits
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from rpg.backends.cpu.tree_engine import PrefixTreeEngine

    made = []
    for cls in (FSDPEngineWithLMHead, PrefixTreeEngine):
        e = object.__new__(cls)
        e.module, e.pad_to_length, e.use_ulysses_sp, e.ulysses_sequence_parallel_size = model, False, False, 1
        e.compute_entropy_from_logits, e._autocast_dtype = entropy_from_logits, torch.float32
        e.engine_config = SimpleNamespace(entropy_checkpointing=False, entropy_from_logits_with_chunking=False)
        made.append(e)
    return made


def verl_output(engine, td):
    inputs, args = engine.prepare_model_inputs(micro_batch=td)
    return engine.prepare_model_outputs(engine.module(**inputs, use_cache=False), args, td, None)


def responses_of(nested, pairs):
    """The response positions of a jagged per-token output (verl's response_from_nested), concatenated."""
    from verl.workers.utils.padding import response_from_nested

    mask = torch.nested.as_nested_tensor([torch.ones(len(r)) for _, r in pairs], layout=torch.jagged)
    return response_from_nested(nested, mask).values()


def _weights(pairs):
    return torch.linspace(-1.0, 2.0, sum(len(r) for _, r in pairs))


def _taken(model, lp, ent):
    """(log-probs, entropies, every parameter's gradient of ``_weights``' sum of the log-probs)."""
    return lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]


def step_outputs(model, pairs, temperature=1.0):
    """verl's step's and the tree's ``_taken`` of the response tokens, in that order."""
    verl_engine, tree_engine = engines(model)
    td = micro_batch(pairs, temperature)
    found = []
    for engine, run in ((verl_engine, verl_output), (tree_engine, lambda e, t: e.tree_output(t))):
        model.zero_grad()
        out = run(engine, td)
        lp, ent = responses_of(out["log_probs"], pairs), responses_of(out["entropy"], pairs)
        (_weights(pairs) * lp).sum().backward()
        found.append(_taken(model, lp, ent))
    return found


def alone_outputs(model, pairs, temperature=1.0):
    """``_taken`` with each sequence computed alone, as the model computes one sequence (its own causal mask)."""
    from verl.utils.torch_functional import entropy_from_logits

    model.zero_grad()
    lps, ents = [], []
    for prompt, response in pairs:
        logits = model(input_ids=torch.cat([prompt, response])[None], use_cache=False).logits[0].float()
        logits = logits[len(prompt) - 1 : -1] / max(temperature, 1e-8)  # verl's floor of the temperature
        lps.append(torch.log_softmax(logits, -1).gather(-1, response[:, None]).squeeze(-1))
        ents.append(entropy_from_logits(logits))
    lp = torch.cat(lps)
    (_weights(pairs) * lp).sum().backward()
    return _taken(model, lp, torch.cat(ents))


def difference(a, b):
    """(largest log-prob difference, largest entropy difference, largest gradient difference / largest gradient)."""
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = a, b
    scale = max(g.abs().max() for g in g_a)
    grad = max((x - y).abs().max() for x, y in zip(g_a, g_b)) / scale
    return (lp_a - lp_b).abs().max().item(), (ent_a - ent_b).abs().max().item(), grad.item()


def compare(model, pairs, temperature=1.0):
    """``difference`` of verl's step and the tree."""
    return difference(*step_outputs(model, pairs, temperature))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_tree_gives_verls_log_probs_entropies_and_gradients(temperature):
    lp, ent, grad = compare(smol_shaped_llama(), groups(), temperature)
    assert lp < ATOL and ent < ATOL and grad < GRAD_RTOL, (lp, ent, grad)


def test_one_sequence_and_unrelated_sequences_are_exact_too():
    model = smol_shaped_llama(seed=3)
    single = groups(n_groups=1, n=1)
    unrelated = [(torch.randint(3, 97, (5 + k,)), torch.randint(3, 97, (3,))) for k in range(3)]
    for pairs in (single, unrelated):
        lp, ent, grad = compare(model, pairs)
        assert lp < ATOL and ent < ATOL and grad < GRAD_RTOL, (lp, ent, grad)


def test_the_tree_holds_each_distinct_prefix_once():
    pairs = groups(n_groups=3, n=3, opening=12)
    seqs = [torch.cat(p) for p in pairs]
    tree = build_prefix_tree(seqs, [torch.arange(len(s)) for s in seqs])
    prompts = {tuple(p.tolist()) for p, _ in pairs}
    assert tree.size == 12 + sum(len(p) - 12 for p in prompts) + sum(len(r) for _, r in pairs)
    for s, path in zip(seqs, tree.paths):  # each sequence reads back from its path, every node at its depth
        assert torch.equal(tree.tokens[path], s) and torch.equal(tree.positions[path], torch.arange(len(s)))
        assert bool(tree.mask[path[-1]].sum() == len(s))  # its last token sees exactly its own tokens


@pytest.mark.parametrize("implementation", TREE_ATTENTION)
def test_under_each_attention_it_takes_the_tree_is_each_sequence_alone_and_verls_step(implementation):
    """sdpa reads the tree's mask as booleans, eager adds it to the scores: each given its own form, the tree's
    log-probs, entropies and gradients are those of each sequence computed alone and of verl's step (a boolean mask
    under eager moves log-probs by 0.17 and gradients by 37 %)."""
    model = smol_shaped_llama()
    model.set_attn_implementation(implementation)
    verl, tree = step_outputs(model, groups())
    for lp, ent, grad in (difference(alone_outputs(model, groups()), tree), difference(verl, tree)):
        assert lp < ATOL and ent < ATOL and grad < GRAD_RTOL, (implementation, lp, ent, grad)
    assert engines(model)[1].uncovered(micro_batch(groups())) is None


def _attention_implementations() -> list[str]:
    """Every attention implementation transformers registers, and eager (each model's own, not registered)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ["eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()]


def test_every_other_attention_takes_verls_step_with_its_line(monkeypatch, capsys):
    """flex_attention (runs on CPU, without a backward there), the paged and the flash-attention ones: the tree is not
    tested with them, so their micro-batches go to verl's step and the process says so once, naming the
    implementation."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from rpg.backends.cpu.tree_engine import PrefixTreeEngine

    others = [name for name in _attention_implementations() if name not in TREE_ATTENTION]
    assert "flex_attention" in others and "paged|eager" in others
    taken = []
    monkeypatch.setattr(FSDPEngineWithLMHead, "forward_step", lambda self, mb, loss, fwd: taken.append(mb) or "verl's")
    monkeypatch.setattr(PrefixTreeEngine, "_said", set())
    _, tree_engine = engines(smol_shaped_llama())
    for name in others:
        tree_engine.module.config._attn_implementation = name
        td = micro_batch(groups())
        for _ in range(2):
            assert tree_engine.forward_step(td, None, True) == "verl's" and taken[-1] is td
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and f"attn_implementation={name};" in lines[0] and "verl's packed forward" in lines[0], \
            lines


def test_a_real_eager_micro_batch_is_verls_step(tiny_assets):
    """The tiny model as `actor_rollout_ref.model.override_config.attn_implementation=eager` loads it (Qwen2, tied
    embeddings), a micro-batch of its task's chat prompts, two groups of its own sampled responses: the tree's
    log-probs, entropies and gradients are verl's step's and each sequence's alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rpg.tiny.warm_up import prompt_ids as _prompt_ids

    model = AutoModelForCausalLM.from_pretrained(tiny_assets.model_dir, dtype=torch.float32,
                                                 attn_implementation="eager")
    tok = AutoTokenizer.from_pretrained(tiny_assets.model_dir)
    g = torch.Generator().manual_seed(0)
    pairs = []
    for a, b in [(3, 4), (7, 8)]:
        prompt = torch.tensor(_prompt_ids(tok, a, b))
        with torch.no_grad():
            for _ in range(3):
                ids = prompt
                for _ in range(6):  # a sampled response of the model's own
                    probs = model(input_ids=ids[None]).logits[0, -1].softmax(-1)
                    ids = torch.cat([ids, torch.multinomial(probs, 1, generator=g)])
                pairs.append((prompt, ids[len(prompt):]))
    assert model.config._attn_implementation == "eager"
    verl, tree = step_outputs(model, pairs)
    for lp, ent, grad in (difference(verl, tree), difference(alone_outputs(model, pairs), tree)):
        assert lp < ATOL and ent < ATOL and grad < GRAD_RTOL, (lp, ent, grad)
    assert engines(model)[1].uncovered(micro_batch(pairs)) is None


@pytest.mark.parametrize("temperature", [0.0, 1e-9])
def test_a_temperature_under_verls_floor_gives_verls_numbers(temperature):
    """verl's step divides the logits by max(T, 1e-8): at temperature 0 (greedy) and below the floor the tree gives
    its finite numbers. Log-probs scale as 1/T, and so does their rounding: ATOL * 1e8."""
    model = smol_shaped_llama()
    verl, tree = step_outputs(model, groups(), temperature)
    assert all(bool(torch.isfinite(x).all()) for x in (*tree[:2], *tree[2]))
    assert tree[0].abs().max() > 1e6  # the floor, not temperature 1: a log-prob of a token not the argmax
    lp, ent, grad = difference(verl, tree)
    assert lp < ATOL / 1e-8 and ent < ATOL / 1e-8 and grad < GRAD_RTOL, (lp, ent, grad)
    lp, _, grad = difference(alone_outputs(model, groups(), temperature), tree)
    assert lp < ATOL / 1e-8 and grad < GRAD_RTOL, (lp, grad)


def test_the_same_tokens_at_other_positions_are_other_nodes():
    a = torch.tensor([5, 6, 7])
    tree = build_prefix_tree([a, a], [torch.arange(3), torch.arange(3) + 4])
    assert tree.size == 6


def _cross_group(tree: PrefixTree) -> PrefixTree:
    """The tree with the last sequence's last 3 tokens also attending to the first 4 tokens of the first sequence that
    are not its own (the first group's own prompt: another group's)."""
    mask = tree.mask.clone()
    first, last = tree.paths[0], tree.paths[-1]
    theirs = first[~torch.isin(first, last)][:4]
    assert len(theirs) == 4
    mask[last[-3:].unsqueeze(1), theirs.unsqueeze(0)] = True
    return PrefixTree(tree.tokens, tree.positions, mask, tree.paths)


def test_a_response_attending_to_another_groups_prompt_is_caught(monkeypatch):
    build = prefix_tree.build_prefix_tree
    monkeypatch.setattr("rpg.backends.cpu.tree_engine.build_prefix_tree", lambda s, p: _cross_group(build(s, p)))
    lp, _, grad = compare(smol_shaped_llama(), groups())
    assert lp > 1e-3 and grad > GRAD_RTOL, (lp, grad)


def test_a_tree_without_positions_is_caught(monkeypatch):
    build = prefix_tree.build_prefix_tree

    def packed_positions(seqs, positions):  # positions counted along the row, as an unmasked packing would
        tree = build(seqs, positions)
        return PrefixTree(tree.tokens, torch.arange(tree.size), tree.mask, tree.paths)

    monkeypatch.setattr("rpg.backends.cpu.tree_engine.build_prefix_tree", packed_positions)
    lp, _, _ = compare(smol_shaped_llama(), groups())
    assert lp > 1e-3, lp


def test_read_positions_are_verls_response_slice():
    reads = ReadPositions.responses([10, 7], [3, 1])
    assert (reads.starts, reads.ends) == ([6, 5], [9, 6])
    values = prefix_tree.packed_values([torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0])], [10, 7], reads)
    assert values.tolist() == [0.0] * 6 + [1.0, 2.0, 3.0, 0.0] + [0.0] * 5 + [4.0, 0.0]


def test_a_text_micro_batch_takes_the_tree_and_others_verls_step():
    """What verl's v1 workers send (each sample's empty multi-modal inputs among the keys) is covered; the cases the tree does not
    cover are named, and RPG_CPU_PREFIX_TREE=0 turns it off."""
    from verl.utils import tensordict_utils as tu

    _, tree_engine = engines(smol_shaped_llama())
    td = micro_batch(groups())
    tu.assign_non_tensor_stack(td, "multi_modal_inputs", [{} for _ in range(len(td))])
    assert tree_engine.uncovered(td) is None
    for flag in ("use_fused_kernels", "calculate_sum_pi_squared", "distillation_use_topk"):
        other = micro_batch(groups())
        tu.assign_non_tensor(other, **{flag: True})
        assert tree_engine.uncovered(other) == flag
    tree_engine.ulysses_sequence_parallel_size = 2
    assert tree_engine.uncovered(td) == "sequence parallelism"
    tree_engine.ulysses_sequence_parallel_size = 1
    tree_engine.module = smol_shaped_llama()
    tree_engine.module.config.layer_types = ["sliding_attention", "full_attention"]
    assert "sliding" in tree_engine.uncovered(td)


def test_the_switch_is_checked_before_ray_and_forwarded(monkeypatch):
    from rpg.backends.cpu.env_overrides import PREFIX_TREE_ENV as ENV
    from rpg.backends.cpu.env_overrides import cpu_env, cpu_overrides, prefix_tree_on

    assert prefix_tree_on({}) and not prefix_tree_on({ENV: "0"})
    with pytest.raises(ValueError, match="RPG_CPU_PREFIX_TREE='yes' is invalid; allowed: 0"):
        cpu_env(base={ENV: "yes"})
    env = cpu_env(base={ENV: "0"})
    assert env[ENV] == "0" and cpu_env(base={})[ENV] == "1"
    assert f"+ray_kwargs.ray_init.runtime_env.env_vars.{ENV}='0'" in cpu_overrides(env)
    monkeypatch.setenv(ENV, "0")
    _, engine = engines(smol_shaped_llama())
    assert engine.uncovered(micro_batch(groups())) == "RPG_CPU_PREFIX_TREE=0"


@pytest.mark.parametrize("launcher", ["demo", "script"])
def test_a_bad_switch_is_one_line_before_anything_starts(launcher, tmp_path):
    """RPG_CPU_PREFIX_TREE=yes: the tiny demo and a paper script's CPU rehearsal (DRY_RUN=1) stop with one line,
    exit 2, before any asset, config or Ray."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "RPG_CPU_PREFIX_TREE": "yes", "PYTHON": sys.executable}
    cmd = (["bash", str(root / "recipe/rpg/tiny/run_tiny_cpu.sh"), "--out", str(tmp_path / "o")] if launcher == "demo"
           else ["bash", str(root / "recipe/rpg/7b/run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28.sh")])
    if launcher == "script":
        env.update(RPG_BACKEND="cpu", DRY_RUN="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "RPG_CPU_PREFIX_TREE='yes' is invalid; allowed: 0" in lines[0], \
        p.stderr[-2000:]
