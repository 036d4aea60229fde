"""SmolLM2's first RPG step, computed in one process: what its reference (``rpg_lab.demo.reference``, ``smol``) pins.

    python -m rpg_lab.demo.first_step --out DIR      # writes DIR/observed.json and DIR/ran_on.json

The first ``PROMPTS`` training prompts of SmolLM2's task (``rpg.smol``), ``SAMPLES`` responses each at temperature
``TEMPERATURE`` and at most ``MAX_TOKENS`` tokens, each sequence decoded alone by the HF rollout's decode loop
(``rpg.backends.hf_rollout.sampling.generate_batch``) with its own seed (``row_seed``), scored by the paper's
scorer; then one update of the demo's RPG loss (RPG-REINFORCE-UFKL with RPG-Style Clip, ``rpg.math.fused``) on
them: advantages ``R - mean(R)`` of each prompt's group, pi_old the model before the update, AdamW at the SmolLM2
run's learning rate. Recorded: the weights' sha256 before, the responses (their sha256, lengths and scores), the
loss, its metrics, the gradient's norm and the weights' digest after the update. Not the trainer's step (verl's
batching, micro-batches and FSDP are the tiny reference's), but the real model's numbers through the project's
sampler, loss and the optimizer, which a change of any of them moves.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

PROMPTS, SAMPLES, MAX_TOKENS, SEED, TEMPERATURE = 2, 4, 32, 7, 0.7


def _prompt_ids(tok, row) -> list[int]:
    from verl.utils.tokenizer.chat_template import apply_chat_template

    ids = apply_chat_template(tok, list(row["prompt"]), tokenize=True, add_generation_prompt=True)
    return [int(i) for i in (ids["input_ids"] if hasattr(ids, "keys") else ids)]


def _padded(rows: list[list[int]], pad: int):
    import torch

    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    return ids, mask


def response_log_probs(model, prompts: list[list[int]], responses: list[list[int]], pad: int):
    """log pi(token) of each response token given its prompt under the temperature-scaled distribution, as verl's
    actor computes it ([rows, longest response], zeros past a response's end); the head only where a log-prob is
    read (the prompts' 200 positions need none)."""
    import torch

    ids, mask = _padded([p + r for p, r in zip(prompts, responses)], pad)
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    width = max(len(r) for r in responses)
    rows = []
    for i, (p, r) in enumerate(zip(prompts, responses)):
        logits = model.lm_head(hidden[i, len(p) - 1: len(p) - 1 + len(r)]).float() / TEMPERATURE
        picked = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(r).unsqueeze(-1)).squeeze(-1)
        rows.append(torch.nn.functional.pad(picked, (0, width - len(r))))
    return torch.stack(rows)


def first_step() -> tuple[dict, dict]:
    """(what the step computed, ``rpg.run_record.ran_on`` of the model) (module docstring)."""
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rpg import run_record
    from rpg.backends.hf_rollout.sampling import generate_batch, row_seed
    from rpg.backends.weight_digest import WeightDigest
    from rpg.config import RPGLossConfig
    from rpg.math.fused import rpg_policy_loss
    from rpg.reward import compute_score
    from rpg.smol import build_smol_assets
    from rpg.smol.overrides import LR

    torch.manual_seed(SEED)
    assets = build_smol_assets()
    tok = AutoTokenizer.from_pretrained(assets.model_dir)
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    rows = pd.read_parquet(assets.train_file).to_dict("records")[:PROMPTS]
    prompts, responses, scores = [], [], []
    model.eval()
    with torch.no_grad():
        for i, row in enumerate(rows):
            ids = _prompt_ids(tok, row)
            for j in range(SAMPLES):  # each sequence alone: its numbers do not depend on a batch
                out = generate_batch(model, [ids], TEMPERATURE, 1.0, -1, MAX_TOKENS, [row_seed(SEED, i, j)],
                                     eos_ids={int(tok.eos_token_id)}, pad_id=int(tok.pad_token_id),
                                     max_model_len=len(ids) + MAX_TOKENS, device=torch.device("cpu"),
                                     global_steps=None)[0]
                text = tok.decode(out.token_ids, skip_special_tokens=True)
                prompts.append(ids)
                responses.append(list(out.token_ids))
                scores.append(float(compute_score(row["data_source"], text, row["reward_model"]["ground_truth"])["score"]))
    pad = int(tok.pad_token_id)
    mask = torch.zeros((len(responses), max(map(len, responses))), dtype=torch.float32)
    for i, r in enumerate(responses):
        mask[i, : len(r)] = 1
    reward = torch.tensor(scores).view(PROMPTS, SAMPLES)
    advantages = (reward - reward.mean(dim=1, keepdim=True)).view(-1, 1) * mask
    model.train()
    log_prob = response_log_probs(model, prompts, responses, pad)
    old = log_prob.detach()  # the first step is on-policy: pi_old is the model before its update
    config = RPGLossConfig(divergence="ufkl", form="reinforce", beta=1e-4, clip=True)
    loss, metrics = rpg_policy_loss(log_prob=log_prob, old_log_prob=old, advantages=advantages, response_mask=mask,
                                    config=config)
    value = float(loss.detach())
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    after = WeightDigest()
    for name, p in model.named_parameters():
        after.add(name, p)
    tokens = hashlib.sha256(json.dumps([prompts, responses]).encode()).hexdigest()
    observed = {"weights_sha256": run_record.weights_digest(assets.model_dir),
                "responses": {"sha256": tokens, "lengths": [len(r) for r in responses], "scores": scores},
                "metrics": {"1": {"loss": value, "grad_norm": float(grad_norm),
                                  "weights_after": after.hexdigest(),
                                  **{k: float(v) for k, v in sorted(metrics.items())}}}}
    return observed, run_record.ran_on(assets.model_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="a folder for observed.json and ran_on.json")
    args = ap.parse_args(argv)
    observed, ran_on = first_step()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "observed.json").write_text(json.dumps(observed, indent=1, sort_keys=True) + "\n")
    (args.out / "ran_on.json").write_text(json.dumps(ran_on, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
