"""A few RPG training steps of small models of the project's shapes in bf16, on the path verl's actor takes: bf16
autocast over float32 weights, SDPA attention, float32 log-probs from verl's ``logprobs_from_logits``, the loss verl's
registry returns for ``loss_mode=rpg`` (RPG-REINFORCE-UFKL with RPG-Style Clip), schedule-free AdamW. The weights are
random (each model is built locally from a config, nothing is downloaded): it shows the step runs, its time and its
peak memory at each shape, not learning. The shapes (``SHAPES``):

* ``qwen2``: a Qwen2-shaped model of about 0.1 B parameters (12 layers, hidden 768, vocabulary 32768), 8 x 512 tokens;
* ``smollm2``: SmolLM2-135M-Instruct's shape (Llama: 30 layers, hidden 576, head size 64, 9 query and 3 key/value
  heads, vocabulary 49152, tied embeddings), one micro-batch of its GPU run (docs/smol.md): as many sequences of the
  task's longest prompt and response (224 + 96 tokens) as its 16384-token budget holds.

    python3 -m rpg_lab.gpu_kit.model_step [--device cuda] [--shape qwen2 --shape smollm2] [--layers N --hidden N
                                      --vocab N --batch N --prompt N --response N] [--steps 3] [--result FILE]

The size options replace the shape's own (tests use small ones). Each step recomputes the log-probs of the same batch,
whose sampler log-probs were computed before the first update (their dtype is reported: float32 from flash-attn's
kernel, else what verl's fallback returns for bf16 logits). It fails (exit 1, one line each) on a non-finite loss or
gradient norm, a zero gradient at the first step (every ratio is 1 there, nothing is clipped) or parameters the steps
left unchanged.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
from pathlib import Path

from rpg_lab.gpu_kit import conclude
from rpg.smol.overrides import GPU_SIZES, MAX_PROMPT_LENGTH, MAX_RESPONSE_LENGTH


def qwen2_config(layers: int, hidden: int, vocab: int):
    from transformers import Qwen2Config

    heads = hidden // 64
    return Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 3),
                       max_position_embeddings=4096, tie_word_embeddings=True)


def smollm2_config(layers: int, hidden: int, vocab: int):
    """SmolLM2-135M-Instruct's config as transformers builds it from the model's GGUF file (rpg.smol.build)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=1536, num_hidden_layers=layers,
                       num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                       rms_norm_eps=1e-5, rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
                       tie_word_embeddings=True)


SMOL_SEQUENCE = MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH
# name: (config builder, what it is, its sizes: layers, hidden, vocab, batch, prompt, response)
SHAPES = {
    "qwen2": (qwen2_config, "Qwen2-shaped", dict(layers=12, hidden=768, vocab=32768, batch=8, prompt=256,
                                                 response=256)),
    "smollm2": (smollm2_config, "SmolLM2-135M-shaped (Llama)",
                dict(layers=30, hidden=576, vocab=49152, batch=GPU_SIZES["token_budget"] // SMOL_SEQUENCE,
                     prompt=MAX_PROMPT_LENGTH, response=MAX_RESPONSE_LENGTH)),
}
SIZES = ("layers", "hidden", "vocab", "batch", "prompt", "response")


def actor_config():
    """verl's actor config for the RPG loss as the recipe sets it (sampler anchor, RPG-Style Clip on)."""
    from verl.workers.config.actor import ActorConfig

    from rpg.verl.policy_loss import RPGPolicyLossConfig

    loss = RPGPolicyLossConfig(loss_mode="rpg", rpg_anchor="sampler",
                               rpg_loss={"form": "reinforce", "divergence": "ufkl", "clip": True})
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2,
                       clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0, loss_agg_mode="token-mean",
                       policy_loss=loss)


def run(args, shape: str) -> dict:
    """``args.steps`` RPG steps of ``shape`` with the sizes in ``args`` (``sized``)."""
    import schedulefree
    import torch
    from transformers import AutoModelForCausalLM
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils.torch_functional import logprobs_from_logits

    device = torch.device(args.device)
    gc.collect()  # the shape before this one freed
    if device.type == "cuda":
        torch.cuda.empty_cache()
    torch.manual_seed(0)
    build, what, _ = SHAPES[shape]
    config = build(args.layers, args.hidden, args.vocab)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(device)
    n_params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.prompt + args.response), generator=g).to(device)
    lengths = torch.randint(args.response // 2, args.response + 1, (args.batch,), generator=g)
    mask = (torch.arange(args.response).unsqueeze(0) < lengths.unsqueeze(1)).float().to(device)
    advantages = (torch.randint(0, 2, (args.batch, 1), generator=g).float() * 2 - 1).expand(-1, args.response)
    advantages = advantages.contiguous().to(device)
    loss_fn, cfg = get_policy_loss_fn("rpg"), actor_config()

    def log_probs():
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits[:, args.prompt - 1:-1]
            return logprobs_from_logits(logits, ids[:, args.prompt:])

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    with torch.no_grad():
        old = log_probs().float()
    before = [p.detach().clone() for p in model.parameters()]
    opt = schedulefree.AdamWScheduleFree(model.parameters(), lr=args.lr, warmup_steps=0)
    opt.train()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    steps, problems = [], []
    for k in range(1, args.steps + 1):
        sync()
        t0 = time.perf_counter()
        lp = log_probs()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss, metrics = loss_fn(old_log_prob=old, log_prob=lp, advantages=advantages, response_mask=mask,
                                    loss_agg_mode="token-mean", config=cfg)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        seconds = time.perf_counter() - t0
        value = float(loss.detach())
        steps.append({"step": k, "loss": value, "grad_norm": grad_norm, "seconds": round(seconds, 4),
                      "max_abs_log_ratio": float(((lp.detach().float() - old).abs() * mask).max()),
                      "log_prob_dtype": str(lp.dtype).replace("torch.", ""), "loss_metrics": metrics})
        if not (math.isfinite(value) and math.isfinite(grad_norm)):
            problems.append(f"step {k}: loss {value}, gradient norm {grad_norm}: not finite")
        elif k == 1 and grad_norm == 0:  # every ratio is 1 here: no token is clipped
            problems.append("step 1: the gradient is zero")
    changed = max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before))
    if not changed > 0:
        problems.append(f"the parameters are unchanged after {args.steps} step(s)")
    timed = [s["seconds"] for s in steps[1:]] or [steps[0]["seconds"]]
    tokens = args.batch * (args.prompt + args.response)
    result = {
        "model": f"{what}, random weights (built locally, not trained): {args.layers} layers, hidden "
                 f"{args.hidden}, vocabulary {args.vocab}",
        "parameters": n_params, "device": torch.cuda.get_device_name() if device.type == "cuda" else args.device,
        "torch": torch.__version__, "precision": "bf16 autocast, float32 weights and optimizer state",
        "attention": "sdpa", "batch": f"{args.batch} x ({args.prompt} prompt + {args.response} response) tokens",
        "loss": "verl registry loss_mode=rpg (RPG-REINFORCE-UFKL, RPG-Style Clip, sampler anchor)",
        "optimizer": f"schedulefree.AdamWScheduleFree lr {args.lr}", "steps": steps,
        "max_abs_parameter_change": changed, "step_s_median_after_first": round(statistics.median(timed), 4),
        "tokens_per_s": round(tokens / statistics.median(timed)),
        "problems": problems,
    }
    if device.type == "cuda":
        result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    result["line"] = (f"{shape}: {n_params / 1e6:.0f} M parameters (random), {args.batch} x "
                      f"{args.prompt + args.response} tokens: "
                      f"{result['step_s_median_after_first'] * 1e3:.0f} ms per step after the first"
                      + (f", peak {result['peak_memory_gib']} GiB" if "peak_memory_gib" in result else "")
                      + "; losses " + ", ".join(f"{s['loss']:.4g}" for s in steps))
    return result


def sized(args, shape: str) -> argparse.Namespace:
    """``args`` with the shape's own sizes where the command line gave none."""
    own = SHAPES[shape][2]
    return argparse.Namespace(**{**vars(args), **{k: own[k] if getattr(args, k) is None else getattr(args, k)
                                                  for k in SIZES}})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES), default=None,
                    help="repeat for several (default: every shape)")
    for name in SIZES:
        ap.add_argument(f"--{name}", type=int, default=None, help="replaces the shape's own"
                        + (" (a multiple of 64 for qwen2: head size 64)" if name == "hidden" else ""))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--result", type=Path, default=None, help="write the result as JSON here")
    args = ap.parse_args(argv)
    for name in (*SIZES, "steps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    shapes = args.shape or list(SHAPES)
    if "qwen2" in shapes and args.hidden is not None and args.hidden % 64:
        ap.error(f"--hidden must be a multiple of 64 for qwen2 (head size 64), got {args.hidden}")
    results = {shape: run(sized(args, shape), shape) for shape in shapes}
    result = {"shapes": results,
              "problems": [f"{shape}: {line}" for shape, r in results.items() for line in r["problems"]],
              "line": "; ".join(r["line"] for r in results.values())}
    return conclude(result, args.result, "rpg_lab.gpu_kit.model_step", whole=True)


if __name__ == "__main__":
    sys.exit(main())
