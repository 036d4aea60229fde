"""The SmolLM2 run's phases, the computation before the prefix tree and the new decode loop against today's, side by
side in one process on the same machine, as ratios.

    python benchmarks/bench_smol_speed.py [--threads 2] [--val-problems 200] [--max-new-tokens 96] [--json FILE]
    python benchmarks/bench_smol_speed.py --val-problems 4 --max-new-tokens 8 --prompts 2   # smoke (bench stage)

Per phase of a step of ``recipe/rpg/smol/run_smol_cpu.sh`` (8 training prompts x 4 responses at temperature 1,
responses up to 96 tokens, mini-batches of 2 prompts; the real model built by ``rpg.smol``):

- **generation**: the rollout batch decoded by the HF rollout's ``generate_batch`` (rows leave at EOS, every row
  sampled at once, the grouped-head attention of ``rpg.backends.hf_rollout.attention``) against the decode of
  bf32b4a, written out below as ``decode_before``: transformers' ``generate`` to the longest row with the same
  per-row seeded sampler as a logits processor, transformers' ``sdpa`` attention, every step's raw logits kept;
- **validation**: the same two decoders on ``--val-problems`` validation prompts, one response each;
- **old log-probs**: verl's ``FSDPEngineWithLMHead`` step (packed micro-batches of 1024 tokens, the head and
  log-softmax at every position, entropy) against ``PrefixTreeEngine`` (the whole batch as one prefix tree) on the
  generated responses, no gradient;
- **update**: the same two steps with a backward per mini-batch (verl: micro-batches of 1024 tokens, two per
  mini-batch; the tree: the mini-batch), the loss a fixed weighted sum of the response log-probs (the optimizer step,
  the same for both, is not timed).

Both run on the bare model (the run wraps it in FSDP2 on one rank), float32, ``--threads`` torch threads. Printed per
phase: seconds before and now and their ratio, and what was checked equal (responses and largest log-prob difference;
log-probs of the two engines). The 1-minute load average is printed with each phase: on a shared machine the ratio is
the figure to read. The run's own per-phase times are in docs/smol.md (Cost).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


def decode_before(model, prompts, seeds, max_new, eos, pad):
    """bf32b4a's decode: one greedy ``generate`` over all rows to the longest, the seeded sampler as its last logits
    processor (one draw per row per step), the shared prefix's cache repeated per row, log-probs from the raw logits
    kept at every step."""
    import torch
    from transformers import GenerationConfig, LogitsProcessorList

    from rpg.backends.hf_rollout.sampling import RowSampler, prefix_cache, shared_prefix_length

    class Sampler:  # the same inverse-CDF rule, one generator per row, driven by generate's loop
        def __init__(self):
            self.rule, self.gens = RowSampler(1.0, -1, 1.0), [torch.Generator().manual_seed(s) for s in seeds]

        def __call__(self, input_ids, scores):
            u = torch.cat([torch.rand(1, generator=g) for g in self.gens])
            return torch.full_like(scores, float("-inf")).scatter_(1, self.rule(scores, u).unsqueeze(-1), 0.0)

    shared = shared_prefix_length(prompts)
    width = shared + max(len(p) - shared for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    ids[:, :shared], mask[:, :shared] = torch.tensor(prompts[0][:shared]), 1
    for i, p in enumerate(prompts):
        ids[i, width - len(p) + shared :], mask[i, width - len(p) + shared :] = torch.tensor(p[shared:]), 1
    past = None
    if shared:
        past = copy.deepcopy(prefix_cache(model, prompts[0][:shared], torch.device("cpu")))
        past.batch_repeat_interleave(len(prompts))
    cfg = GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=sorted(eos), pad_token_id=pad,
                           output_logits=True, return_dict_in_generate=True)
    out = model.generate(input_ids=ids, attention_mask=mask, past_key_values=past, generation_config=cfg,
                         logits_processor=LogitsProcessorList([Sampler()]))
    new = out.sequences[:, width:]
    logp = torch.stack([torch.log_softmax(s.float(), -1).gather(-1, new[:, t : t + 1]).squeeze(-1)
                        for t, s in enumerate(out.logits)], dim=1)
    result = []
    for i in range(len(prompts)):
        toks = new[i].tolist()
        end = next((j + 1 for j, t in enumerate(toks) if t in eos), len(toks))
        result.append((toks[:end], logp[i, :end].tolist()))
    return result


def bare_engine(cls, model):
    """An instance of a verl engine class carrying only what its forward step reads (no FSDP, no process group)."""
    from types import SimpleNamespace

    from verl.utils.torch_functional import entropy_from_logits

    engine = object.__new__(cls)
    engine.module, engine.pad_to_length, engine.use_ulysses_sp, engine.ulysses_sequence_parallel_size = (
        model, False, False, 1)
    engine.compute_entropy_from_logits, engine._autocast_dtype = entropy_from_logits, __import__("torch").float32
    engine.engine_config = SimpleNamespace(entropy_checkpointing=False, entropy_from_logits_with_chunking=False)
    return engine


def as_micro_batch(pairs, entropy: bool):
    import torch
    from verl.utils import tensordict_utils as tu

    jagged = lambda ts: torch.nested.as_nested_tensor(ts, layout=torch.jagged)  # noqa: E731
    seqs = [torch.tensor(p + r) for p, r in pairs]
    td = tu.get_tensordict({"input_ids": jagged(seqs), "position_ids": jagged([torch.arange(len(s)) for s in seqs]),
                            "prompts": jagged([torch.tensor(p) for p, _ in pairs]),
                            "responses": jagged([torch.tensor(r) for _, r in pairs])})
    tu.assign_non_tensor(td, temperature=1.0, calculate_entropy=entropy, use_remove_padding=True)
    return td


def by_budget(pairs, budget: int):
    """Consecutive sequences in micro-batches of at most ``budget`` tokens (each at least one sequence)."""
    batches, current, size = [], [], 0
    for p, r in pairs:
        if current and size + len(p) + len(r) > budget:
            batches.append(current)
            current, size = [], 0
        current.append((p, r))
        size += len(p) + len(r)
    return batches + [current]


def response_log_probs(engine, td, pairs):
    import torch
    from verl.workers.utils.padding import response_from_nested

    if hasattr(engine, "tree_output"):
        out = engine.tree_output(td)
    else:
        inputs, args = engine.prepare_model_inputs(micro_batch=td)
        out = engine.prepare_model_outputs(engine.module(**inputs, use_cache=False), args, td, None)
    mask = torch.nested.as_nested_tensor([torch.ones(len(r)) for _, r in pairs], layout=torch.jagged)
    return response_from_nested(out["log_probs"], mask).values()


def actor_phase(engine, batches, backward: bool):
    """Seconds for the engine's step over ``batches`` (lists of (prompt, response)), and the response log-probs."""
    import torch

    t0, values = time.time(), []
    for pairs in batches:
        with torch.enable_grad() if backward else torch.no_grad():
            lp = response_log_probs(engine, as_micro_batch(pairs, entropy=not backward), pairs)
            if backward:
                (lp * torch.linspace(-1, 1, len(lp))).sum().backward()
        values.append(lp.detach())
    return time.time() - t0, torch.cat(values)


def phase(figures, name, before_s, now_s, check: str):
    figures[name] = {"before_s": round(before_s, 2), "now_s": round(now_s, 2), "ratio": round(before_s / now_s, 2),
                     "check": check, "load_1min": round(os.getloadavg()[0], 2)}
    print(f"{name:<14} before {before_s:8.1f} s   now {now_s:7.1f} s   {before_s / now_s:5.2f}x   ({check}; "
          f"load {figures[name]['load_1min']})", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8, help="training prompts (4 responses each)")
    ap.add_argument("--val-problems", type=int, default=200)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    for key in ("threads", "prompts", "val_problems", "max_new_tokens"):
        if getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} must be 1 or more")

    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from bench_smol_base import prompt_ids
    from rpg.backends.cpu.tree_engine import PrefixTreeEngine
    from rpg.backends.hf_rollout import attention
    from rpg.backends.hf_rollout.sampling import generate_batch, row_seed
    from rpg.smol.build import build_smol_assets

    torch.set_num_threads(args.threads)
    assets = build_smol_assets()
    tok = AutoTokenizer.from_pretrained(assets.model_dir)
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    eos, pad = {int(tok.eos_token_id)}, int(tok.pad_token_id)
    train = pd.read_parquet(assets.train_file).to_dict("records")[: args.prompts]
    val = pd.read_parquet(assets.val_file).to_dict("records")[: args.val_problems]
    figures = {"threads": args.threads, "torch": torch.__version__}

    def decode_both(name, prompts):
        seeds = [row_seed(0, name, i) for i in range(len(prompts))]
        t0 = time.time()
        with torch.no_grad():
            before = decode_before(model, prompts, seeds, args.max_new_tokens, eos, pad)
        before_s = time.time() - t0
        model.set_attn_implementation(attention.register())
        t0 = time.time()
        now = generate_batch(model, prompts, 1.0, 1.0, -1, args.max_new_tokens, seeds, eos_ids=eos, pad_id=pad,
                             max_model_len=max(map(len, prompts)) + args.max_new_tokens, device=torch.device("cpu"),
                             global_steps=None)
        now_s = time.time() - t0
        model.set_attn_implementation("sdpa")
        same = sum(o.token_ids == b[0] for o, b in zip(now, before))
        diff = max((abs(x - y) for o, b in zip(now, before) if o.token_ids == b[0]
                    for x, y in zip(o.log_probs, b[1])), default=0.0)
        tokens = sum(len(o.token_ids) for o in now)
        phase(figures, name, before_s, now_s, f"{tokens} tokens; identical responses {same}/{len(prompts)}, "
              f"largest log-prob difference {diff:.1e}")
        return now

    group = [prompt_ids(tok, row) for row in train for _ in range(4)]
    responses = decode_both("generation", group)
    decode_both("validation", [prompt_ids(tok, row) for row in val])
    pairs = [(p, o.token_ids) for p, o in zip(group, responses) if o.token_ids]
    verl_engine, tree_engine = bare_engine(FSDPEngineWithLMHead, model), bare_engine(PrefixTreeEngine, model)
    before_s, a = actor_phase(verl_engine, by_budget(pairs, 1024), backward=False)
    now_s, b = actor_phase(tree_engine, [pairs], backward=False)
    phase(figures, "old log-probs", before_s, now_s, f"largest log-prob difference {(a - b).abs().max():.1e}")
    minis = [pairs[i : i + 8] for i in range(0, len(pairs), 8)]  # 2 prompts x 4 responses
    before_s, a = actor_phase(verl_engine, [mb for m in minis for mb in by_budget(m, 1024)], backward=True)
    model.zero_grad()
    now_s, b = actor_phase(tree_engine, minis, backward=True)
    phase(figures, "update", before_s, now_s, f"{len(minis)} mini-batches; largest log-prob difference "
          f"{(a - b).abs().max():.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
