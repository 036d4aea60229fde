"""SmolLM2-135M-Instruct before any training, on the held-out problems of its arithmetic task (rpg.smol.task):
accuracy by the paper's reward and how often it answers in the asked format, greedy and at temperature 1.

    python benchmarks/bench_smol_base.py [--problems N] [--max-new-tokens 96] [--modes greedy,sample]
        [--seeds 0] [--threads N] [--json FILE]
    python benchmarks/bench_smol_base.py --modes sample --seeds 0,1   # the evaluation's own noise
    python benchmarks/bench_smol_base.py --problems 4 --max-new-tokens 16   # smoke (tests/e2e/test_smol_e2e.py)
    python benchmarks/bench_smol_base.py --forward [--budgets 512,1024,2048]   # the log-prob pass's packing
    python benchmarks/bench_smol_base.py --prefix 32,100   # decoding with the prompts' shared prefix and without

What a validation of the demo's run (``--model smol``) sees: the validation file's prompts through the model's chat
template as verl applies it (``verl.utils.tokenizer.chat_template.apply_chat_template``), decoded by the HF
rollout's own ``generate_batch`` (its seeded per-response sampler at temperature 1, as the run's validation; greedy
as well), the response read back with the special tokens skipped and scored by ``rpg.reward.compute_score``. Per
mode: accuracy (+1 answers), the answer-line rate (an ``Answer:`` line the paper's rule reads, right or wrong),
the boxed rate (a ``\\boxed{...}``), the share cut at ``--max-new-tokens``, the mean response length, accuracy per
kind of problem, and decoding throughput. The figures of record are in docs/smol.md.

``--seeds 0,1``: the sample mode once per sampling seed, on the same problems and weights: the evaluation's own
noise, what two validations of unchanged weights differ by. Printed: each accuracy, their largest difference, and
the binomial standard error of one evaluation's accuracy, sqrt(p (1 - p) / n) with p their mean, and of a difference
of two, sqrt(2) times that (independent samples of the same responses' distribution).

``--forward``: what verl's log-prob pass costs for one rollout batch (8 prompts x 4 responses of the task, lengths
drawn like a run's) by how its micro-batches are formed. verl removes the padding and packs a micro-batch's
sequences into one row (``use_remove_padding``); on CPU, transformers' sdpa attention then runs over the whole row
with a block-diagonal mask (its cost per token grows with the row), and the log-softmax and entropy over the 49k
vocabulary follow. Timed: the whole batch in one row (``log_prob_micro_batch_size_per_gpu`` = the batch), rows of
at most B tokens (``use_dynamic_bsz``, ``log_prob_max_token_len_per_gpu=B``), one row per sequence, and the padded
batch (no packing) as the model's own forward; each as forward + log-prob + entropy, no gradient.

``--prefix 32,100``: the HF rollout's shared prompt prefix (rpg/backends/hf_rollout/sampling.py) on the first 32,
then the first 100 validation prompts, one decode batch each as a validation decodes them (the sample mode, its first
seed): without the shared prefix, then with it. Printed per batch: the common prefix, tokens/s of each and their
ratio, how many responses are identical and the largest log-prob difference before a response's first differing
token, and the 1-minute load average at each decode's start (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BOXED = re.compile(r"\\boxed\{[^{}]*\}")
MODES = {"greedy": 0.0, "sample": 1.0}


def prompt_ids(tok, row) -> list[int]:
    """The prompt's token ids as verl renders them (its chat-template helper, a generation prompt added)."""
    from verl.utils.tokenizer.chat_template import apply_chat_template

    ids = apply_chat_template(tok, list(row["prompt"]), tokenize=True, add_generation_prompt=True)
    if hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def evaluate(model, tok, rows, kinds, temperature: float, max_new_tokens: int, seed: int = 0) -> dict:
    import torch

    from rpg.backends.hf_rollout.sampling import generate_batch, row_seed
    from rpg.reward import compute_score

    prompts = [prompt_ids(tok, r) for r in rows]
    eos = {int(tok.eos_token_id)}
    seeds = None if temperature <= 0 else [row_seed(seed, i) for i in range(len(prompts))]
    t0 = time.time()
    outs = generate_batch(model, prompts, temperature, 1.0, -1, max_new_tokens, seeds, eos_ids=eos,
                          pad_id=int(tok.pad_token_id), max_model_len=max(map(len, prompts)) + max_new_tokens,
                          device=torch.device("cpu"), global_steps=None)
    wall = time.time() - t0
    acc, answer_line, boxed, cut, lengths, by_kind, texts = 0, 0, 0, 0, [], defaultdict(list), []
    for row, kind, out in zip(rows, kinds, outs):
        text = tok.decode(out.token_ids, skip_special_tokens=True)
        score = compute_score(row["data_source"], text, row["reward_model"]["ground_truth"])
        acc += score["acc"]
        answer_line += score["pred"] != "[INVALID]"
        boxed += bool(BOXED.search(text))
        cut += out.stop_reason == "length"
        lengths.append(len(out.token_ids))
        by_kind[kind].append(score["acc"])
        texts.append(text)
    n = len(rows)
    return {"temperature": temperature, "problems": n, "accuracy": acc / n, "answer_line_rate": answer_line / n,
            "boxed_rate": boxed / n, "cut_at_limit": cut / n, "mean_response_tokens": sum(lengths) / n,
            "accuracy_by_kind": {k: sum(v) / len(v) for k, v in sorted(by_kind.items())},
            "decode_s": round(wall, 1), "tokens_per_s": round(sum(lengths) / wall, 1), "examples": texts[:3]}


def prefix_gain(model, tok, rows, sizes: list[int], temperature: float, max_new_tokens: int, seed: int = 0) -> dict:
    """Decoding the first ``n`` prompts for each ``n`` of ``sizes`` without, then with the shared prefix (module
    docstring)."""
    import os

    import torch

    from rpg.backends.hf_rollout.sampling import generate_batch, row_seed, shared_prefix_length

    eos, figures = {int(tok.eos_token_id)}, {}
    for n in sizes:
        prompts = [prompt_ids(tok, r) for r in rows[:n]]
        seeds = None if temperature <= 0 else [row_seed(seed, i) for i in range(n)]
        arms = {}
        for name, share in (("unshared", False), ("shared", True)):
            load = os.getloadavg()[0]
            t0 = time.time()
            outs = generate_batch(model, prompts, temperature, 1.0, -1, max_new_tokens, seeds, eos_ids=eos,
                                  pad_id=int(tok.pad_token_id), max_model_len=max(map(len, prompts)) + max_new_tokens,
                                  device=torch.device("cpu"), global_steps=None, share_prefix=share)
            wall = time.time() - t0
            tokens = sum(len(o.token_ids) for o in outs)
            arms[name] = {"decode_s": round(wall, 1), "tokens": tokens, "tokens_per_s": round(tokens / wall, 1),
                          "load_1min": load, "outputs": outs}
        a, b = arms["unshared"].pop("outputs"), arms["shared"].pop("outputs")
        diffs = [0.0]
        for x, y in zip(a, b):  # log-probs of the same tokens: up to each pair's first differing token
            same = next((j for j, (s, t) in enumerate(zip(x.token_ids, y.token_ids)) if s != t),
                        min(len(x.token_ids), len(y.token_ids)))
            diffs += [abs(p - q) for p, q in zip(x.log_probs[:same], y.log_probs[:same])]
        r = figures[str(n)] = {
            "prompts": n, "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts))],
            "shared_prefix": shared_prefix_length(prompts), **arms,
            "ratio": round(arms["shared"]["tokens_per_s"] / arms["unshared"]["tokens_per_s"], 2),
            "identical_responses": sum(x.token_ids == y.token_ids for x, y in zip(a, b)),
            "max_abs_logprob_diff": max(diffs)}
        print(f"{n} prompts ({r['prompt_tokens'][0]}-{r['prompt_tokens'][1]} tokens, {r['shared_prefix']} shared): "
              + "  ".join(f"{k} {v['decode_s']:.0f}s {v['tokens_per_s']:.1f} tokens/s (load {v['load_1min']:.1f})"
                          for k, v in arms.items())
              + f"  ratio {r['ratio']:.2f}; identical responses {r['identical_responses']}/{n}, largest log-prob "
              f"difference {r['max_abs_logprob_diff']:.1e}", flush=True)
    return figures


def noise(accuracies: list[float], problems: int) -> dict:
    """The evaluation's own noise from the accuracies of evaluations of the same weights on ``problems`` problems
    with different sampling seeds (module docstring)."""
    p = sum(accuracies) / len(accuracies)
    se = (p * (1 - p) / problems) ** 0.5
    return {"accuracies": accuracies, "problems": problems, "mean": p,
            "largest_difference": max(accuracies) - min(accuracies), "se_one": se, "se_difference": se * 2**0.5}


def forward_costs(model, budgets: list[int], seed: int = 0) -> dict:
    """Seconds of the log-prob pass over one rollout batch per way of forming micro-batches (module docstring)."""
    import torch

    from rpg.smol.overrides import MAX_RESPONSE_LENGTH, ROLLOUT_N, TRAIN_BATCH_SIZE

    g = torch.Generator().manual_seed(seed)
    vocab = model.get_output_embeddings().weight.shape[0]
    n = TRAIN_BATCH_SIZE * ROLLOUT_N  # prompts of about 100 tokens (the task: 98-114), responses of 40 to the limit
    lengths = [100 + int(x) for x in torch.randint(40, MAX_RESPONSE_LENGTH + 1, (n,), generator=g)]
    seqs = [torch.randint(3, vocab, (length,), generator=g) for length in lengths]

    def log_probs_and_entropy(logits, ids):
        logp = torch.log_softmax(logits.float(), -1)
        return logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)

    def packed(group):  # one row, positions restarting per sequence (verl's remove-padding input)
        ids = torch.cat(group).unsqueeze(0)
        pos = torch.cat([torch.arange(len(s)) for s in group]).unsqueeze(0)
        return log_probs_and_entropy(model(input_ids=ids, position_ids=pos).logits[0], ids[0])

    def padded(group):
        width = max(map(len, group))
        ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros(len(group), width, dtype=torch.long)
        for i, s in enumerate(group):
            ids[i, : len(s)], mask[i, : len(s)] = s, 1
        return log_probs_and_entropy(model(input_ids=ids, attention_mask=mask).logits, ids)

    def by_tokens(cap):
        out, cur, total = [], [], 0
        for s in seqs:
            if cur and total + len(s) > cap:
                out.append(cur)
                cur, total = [], 0
            cur.append(s)
            total += len(s)
        return out + [cur]

    arms = [("one row (the whole batch)", packed, [seqs]),
            *[(f"rows of <= {b} tokens", packed, by_tokens(b)) for b in budgets],
            ("one row per sequence", packed, [[s] for s in seqs]),
            ("padded batch (no packing)", padded, [seqs])]
    out = {"sequences": n, "tokens": sum(lengths)}
    with torch.no_grad():
        for name, fn, groups in arms:
            t0 = time.time()
            for group in groups:
                fn(group)
            out[name] = round(time.time() - t0, 2)
            print(f"{name:28s} {out[name]:6.1f}s  ({len(groups)} forwards)", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=None, help="held-out problems (default: the validation file's)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="response limit (default: the demo's data.max_response_length)")
    ap.add_argument("--modes", default="greedy,sample", help="greedy and/or sample (at --temperature)")
    ap.add_argument("--temperature", type=float, default=1.0, help="the sample mode's temperature (default 1, as "
                    "the run's validation)")
    ap.add_argument("--seeds", default="0", help="the sample mode's sampling seeds, comma-separated (two or more: "
                    "the evaluation's noise)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default torch's)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--forward", action="store_true", help="time the log-prob pass's packings instead")
    ap.add_argument("--budgets", default="512,1024,2048", help="token budgets per row for --forward")
    ap.add_argument("--prefix", default=None, help="prompt counts, comma-separated: decode the first N validation "
                    "prompts with and without the shared prefix instead")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        ap.error(f"--modes {args.modes!r}: expected greedy and/or sample")
    try:
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        seeds = []
    if not seeds or len(set(seeds)) != len(seeds):
        ap.error(f"--seeds {args.seeds!r}: expected distinct integers, comma-separated")
    sizes = []
    if args.prefix is not None:
        try:
            sizes = [int(x) for x in args.prefix.split(",")]
        except ValueError:
            sizes = []
        if not sizes or min(sizes) < 1:
            ap.error(f"--prefix {args.prefix!r}: expected prompt counts >= 1, comma-separated")

    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rpg.smol import build_smol_assets, task
    from rpg.smol.overrides import MAX_RESPONSE_LENGTH

    if args.threads:
        torch.set_num_threads(args.threads)
    max_new = args.max_new_tokens or MAX_RESPONSE_LENGTH
    assets = build_smol_assets()
    rows = pd.read_parquet(assets.val_file).to_dict("records")
    if args.problems is not None and not 1 <= args.problems <= len(rows):
        ap.error(f"--problems {args.problems}: expected 1..{len(rows)} (the validation file's problems)")
    rows = rows[: args.problems or len(rows)]
    if sizes and max(sizes) > len(rows):
        ap.error(f"--prefix {args.prefix}: expected counts up to {len(rows)} (the problems)")
    _, val = task.split()
    kinds = [val[int(r["extra_info"]["source_index"])].kind for r in rows]
    tok = AutoTokenizer.from_pretrained(assets.model_dir)
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir, dtype=torch.float32).eval()
    if args.forward:
        budgets = [int(b) for b in args.budgets.split(",") if b]
        print(f"the log-prob pass over one rollout batch, {torch.get_num_threads()} torch threads", flush=True)
        figures = forward_costs(model, budgets)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2) + "\n")
        return 0
    if sizes:
        import transformers

        print(f"shared prompt prefix, responses up to {max_new} tokens at T={args.temperature:g}, "
              f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, transformers "
              f"{transformers.__version__}", flush=True)
        figures = prefix_gain(model, tok, rows, sizes, args.temperature, max_new, seed=seeds[0])
        if args.json:
            args.json.write_text(json.dumps({"max_new_tokens": max_new, **figures}, indent=2) + "\n")
        return 0
    print(f"SmolLM2-135M-Instruct, {len(rows)} held-out problems, responses up to {max_new} tokens, "
          f"{torch.get_num_threads()} torch threads", flush=True)
    results, runs = {}, [("greedy", "greedy", 0)] if "greedy" in modes else []
    if "sample" in modes:  # "sample" is the first seed's figures; "sample_seed<s>" each further seed's
        runs += [("sample" if i == 0 else f"sample_seed{s}", "sample", s) for i, s in enumerate(seeds)]
    for name, mode, seed in runs:
        temperature = args.temperature if mode == "sample" else 0.0
        r = results[name] = evaluate(model, tok, rows, kinds, temperature, max_new, seed=seed)
        r["seed"] = seed if mode == "sample" else None
        label = f"seed {seed}, " if mode == "sample" and len(seeds) > 1 else ""
        print(f"{mode:6s} ({label}T={r['temperature']:g}): accuracy {r['accuracy']:.3f}  answer line "
              f"{r['answer_line_rate']:.3f}"
              f"  boxed {r['boxed_rate']:.3f}  cut at {max_new} tokens {r['cut_at_limit']:.3f}  mean length "
              f"{r['mean_response_tokens']:.0f} tokens  decoding {r['decode_s']:.0f}s ({r['tokens_per_s']:.0f} "
              f"tokens/s)", flush=True)
        print("        by kind: " + "  ".join(f"{k} {v:.2f}" for k, v in r["accuracy_by_kind"].items()), flush=True)
        print(f"        first response: {r['examples'][0][-300:]!r}", flush=True)
    if "sample" in modes and len(seeds) > 1:
        n = results["noise"] = noise([results[name]["accuracy"] for name, mode, _ in runs if mode == "sample"],
                                     len(rows))
        print(f"noise: {len(seeds)} evaluations of the same weights (seeds {args.seeds}), accuracy "
              f"{' '.join(f'{a:.3f}' for a in n['accuracies'])}: largest difference {n['largest_difference']:.3f}; "
              f"binomial SE of one evaluation {n['se_one']:.3f}, of a difference {n['se_difference']:.3f}",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps({"max_new_tokens": max_new, **results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
