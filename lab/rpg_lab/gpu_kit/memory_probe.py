"""The paper's model widths on one GPU: the peak memory of verl's FSDP2 actor in the old log-prob pass and the update,
measured, against the plan every shipped script is checked with (``rpg.memory.gpu``).

    python3 -m rpg_lab.gpu_kit.memory_probe [--device cuda] [--depths 1,2] [--eager-entropy] [--result FILE]

For each shape in ``PROBES`` (the hidden, MLP, head and vocabulary sizes of Qwen2.5-7B / -Math-7B / -7B-Instruct and
of Qwen3-4B, ``rpg.memory.architecture``) the model is built with random weights and only ``--depths`` decoder layers
(a full 7B does not fit one GPU unsharded), wrapped the way verl 0.9.1's FSDP2 engine wraps the actor (``verl.utils.
fsdp_utils.apply_fsdp2``: each decoder layer, and embed_tokens / lm_head when untied, as a unit; bf16 parameters and
fp32 gradients in ``MixedPrecisionPolicy``; fp32 master weights; torch AdamW; gradient checkpointing; no offload: the
shipped scripts' settings), on a one-process mesh. At each token budget of the scripts (``tokens``: one packed
micro-batch, as verl's remove-padding path feeds it), three phases are measured with
``torch.cuda.max_memory_allocated``:

* ``log-prob``: the old log-prob pass, forward only under bf16 autocast, verl's ``logprobs_from_logits`` and its
  ``entropy_from_logits`` compiled with ``torch.compile(dynamic=True)`` as verl's engine compiles it
  (``use_torch_compile``, the scripts' default);
* ``forward+backward``: the update's forward and backward through verl's registered RPG loss (``loss_mode=rpg``);
* ``optimizer step``: AdamW's step after the backward (activations freed).

Without flash-attn (the kit's node) attention is SDPA and verl's log-probs take its fallback, which keeps fp32
log-softmax rows for the backward (the plan's ``T * V * 4`` term); the scripts' flash-attn kernels hold less.

The plan for the same truncated model (``rpg.memory.estimate`` with one GPU) is given beside each measurement, and
each script shape is restated at full depth on 8 GPUs from the fitted per-layer and fixed terms
(``rpg_lab.gpu_kit.memory_terms.restate``, whose docstring gives the fit). The result is JSON (``--result``), written
again after each measurement so a run stopped by its time box keeps what it measured; ``--render`` prints its tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import socket
import sys
import time
from pathlib import Path

from rpg_lab.gpu_kit import conclude
from rpg_lab.gpu_kit.memory_terms import (DEPTHS, PROBES, STAND_IN, STAND_IN_TOKENS, Probe, planned_gib,
                                      probe_result, render, restated, truncated)
from rpg.memory import architecture_for
from rpg.memory.architecture import Architecture
from rpg.memory.sizes import GIB


# ----------------------------------------------------------------------------- the measurement (torch, verl)

def hf_config(arch: Architecture, layers: int):
    """transformers' config of ``arch`` cut to ``layers`` decoder layers (Qwen2: q/k/v biases; Qwen3: q/k norms)."""
    from transformers import Qwen2Config, Qwen3Config

    cls = Qwen3Config if arch.qk_norm else Qwen2Config
    return cls(vocab_size=arch.vocab, hidden_size=arch.hidden, intermediate_size=arch.intermediate,
               num_hidden_layers=layers, num_attention_heads=arch.heads, num_key_value_heads=arch.kv_heads,
               head_dim=arch.head_dim, tie_word_embeddings=arch.tie_embeddings,
               max_position_embeddings=max(arch.max_position_embeddings or 0, *(max(p.tokens) for p in PROBES)))


def init_single_process_group(device: str) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if device == "cuda":
        import torch

        torch.cuda.set_device(0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)


class Actor:
    """The truncated model as verl's FSDP2 actor holds it, with its optimizer and kernels."""

    def __init__(self, arch: Architecture, layers: int, device: str, compiled_entropy: bool):
        import torch
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy
        from transformers import AutoModelForCausalLM
        from verl.utils.fsdp_utils import apply_fsdp2
        from verl.utils.torch_functional import entropy_from_logits

        self.device = torch.device(device)
        torch.manual_seed(0)
        with self.device:
            model = AutoModelForCausalLM.from_config(hf_config(arch, layers), attn_implementation="sdpa",
                                                     dtype=torch.float32)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        mesh = init_device_mesh(device, (1,), mesh_dim_names=("fsdp",))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=True)
        apply_fsdp2(model, {"mesh": mesh, "mp_policy": mp, "offload_policy": None, "reshard_after_forward": True},
                    {"wrap_policy": {}})
        self.model = model
        self.parameters = sum(p.numel() for p in model.parameters())
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7, weight_decay=0.01)
        self.entropy = torch.compile(entropy_from_logits, dynamic=True) if compiled_entropy else entropy_from_logits
        self.vocab = arch.vocab

    def batch(self, tokens: int):
        import torch

        g = torch.Generator().manual_seed(tokens)
        ids = torch.randint(0, self.vocab, (1, tokens + 1), generator=g).to(self.device)
        return ids[:, :-1], ids[0, 1:], torch.arange(tokens, device=self.device).unsqueeze(0)

    def logits(self, ids, positions):
        import torch

        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
            return self.model(input_ids=ids, position_ids=positions, use_cache=False).logits.squeeze(0)

    def old_log_prob(self, tokens: int):
        import torch
        from verl.utils.torch_functional import logprobs_from_logits

        ids, labels, positions = self.batch(tokens)
        with torch.no_grad(), torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
            logits = self.logits(ids, positions)
            self.entropy(logits)
            return logprobs_from_logits(logits, labels, inplace_backward=False).float()

    def forward_backward(self, tokens: int, old):
        import torch
        from verl.trainer.ppo.core_algos import get_policy_loss_fn
        from verl.utils.torch_functional import logprobs_from_logits

        from rpg_lab.gpu_kit.model_step import actor_config

        ids, labels, positions = self.batch(tokens)
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
            log_prob = logprobs_from_logits(self.logits(ids, positions), labels, inplace_backward=True)
        advantages = torch.where(torch.arange(tokens, device=self.device) % 2 == 0, 1.0, -1.0).unsqueeze(0)
        loss, _ = get_policy_loss_fn("rpg")(old_log_prob=old.unsqueeze(0), log_prob=log_prob.unsqueeze(0),
                                            advantages=advantages, response_mask=torch.ones_like(advantages),
                                            loss_agg_mode="token-mean", config=actor_config())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def measured(device, fn) -> tuple[object, dict]:
    """``fn()``'s allocated GiB at its start, peak and end (forward + backward's end: every gradient there), its peak
    reserved GiB (None off CUDA) and its seconds."""
    import torch

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start, t0 = (torch.cuda.memory_allocated() / GIB if cuda else None), time.perf_counter()
    value = fn()
    if cuda:
        torch.cuda.synchronize()
    return value, {"start_gib": start, "peak_gib": torch.cuda.max_memory_allocated() / GIB if cuda else None,
                   "end_gib": torch.cuda.memory_allocated() / GIB if cuda else None,
                   "reserved_gib": torch.cuda.max_memory_reserved() / GIB if cuda else None,
                   "seconds": round(time.perf_counter() - t0, 3)}


def shapes(stand_in: bool) -> list[tuple[Probe, Architecture]]:
    """Each probe with its architecture: the real widths, or the stand-in's (same layout) for a CPU test."""
    out = []
    for spec in PROBES:
        arch = architecture_for(spec.model)
        if stand_in:
            arch = dataclasses.replace(arch, name=f"{arch.name} (stand-in widths)", **STAND_IN)
            spec = dataclasses.replace(spec, tokens=STAND_IN_TOKENS)
        out.append((spec, arch))
    return out


def probe(args, result: dict, save) -> None:
    import torch

    init_single_process_group(args.device)
    for spec, arch in shapes(args.stand_in):
        entry = result["shapes"].setdefault(spec.model, {"scripts": spec.scripts, "tokens": list(spec.tokens),
                                                          "runs": []})
        for layers in args.depths:
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
            t0 = time.perf_counter()
            actor = Actor(arch, layers, args.device, not args.eager_entropy)
            small = truncated(arch, layers)
            if actor.parameters != small.params:
                result["problems"].append(f"{spec.model}, {layers} layers: the model has {actor.parameters} "
                                          f"parameters, rpg.memory counts {small.params}")
            built_s = round(time.perf_counter() - t0, 2)
            for n, tokens in enumerate(t for t in spec.tokens if t <= args.max_tokens):
                if n == 0:  # warm-up: the entropy compiled, AdamW's states built (they exist in every later step)
                    actor.forward_backward(tokens, actor.old_log_prob(tokens))
                    actor.step()
                old, lp = measured(actor.device, lambda: actor.old_log_prob(tokens))
                _, fb = measured(actor.device, lambda: actor.forward_backward(tokens, old))
                _, st = measured(actor.device, actor.step)
                run = {"layers": layers, "tokens": tokens, "parameters": actor.parameters, "built_s": built_s,
                       "log-prob": lp, "forward+backward": fb, "optimizer step": st,
                       "planned_gib": planned_gib(small, tokens, 1, "sdpa")}
                entry["runs"].append(run)
                save()
            actor = None  # freed before the next depth's model is built
        entry["restated"] = restated(arch, entry["runs"], spec.rollout_util)
        save()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--depths", default=",".join(map(str, DEPTHS)), help="decoder layers of the truncated models")
    ap.add_argument("--max-tokens", type=int, default=max(max(p.tokens) for p in PROBES),
                    help="skip the token budgets above this (a quick run)")
    ap.add_argument("--eager-entropy", action="store_true", help="entropy_from_logits not compiled "
                    "(use_torch_compile=False; the scripts compile it)")
    ap.add_argument("--stand-in", action="store_true", help="each layout at small widths (the CPU tests)")
    ap.add_argument("--result", type=Path, default=None)
    ap.add_argument("--render", type=Path, default=None, metavar="JSON", help="print the tables of a probe's result "
                    "(its JSON, or a GPU kit summary.json that ran it), restated from its measured peaks; runs nothing")
    args = ap.parse_args(argv)
    if args.render is not None:
        try:
            print(render(probe_result(args.render)), end="")
        except (OSError, ValueError, KeyError) as e:
            print(f"rpg_lab.gpu_kit.memory_probe: --render {args.render}: {e}", file=sys.stderr)
            return 2
        return 0
    try:
        args.depths = sorted({int(x) for x in args.depths.split(",")})
    except ValueError:
        ap.error(f"--depths: comma-separated whole numbers, got {args.depths!r}")
    if not args.depths or args.depths[0] < 1:
        ap.error("--depths: at least one depth, each >= 1")
    import torch

    result: dict = {"device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
                    "torch": torch.__version__, "attention": "sdpa (verl's fallback log-probs: no flash-attn)",
                    "entropy": "eager" if args.eager_entropy else "torch.compile(dynamic=True)",
                    "depths": args.depths, "shapes": {}, "problems": []}
    if args.device == "cuda":
        result["gpu_gib"] = round(torch.cuda.get_device_properties(0).total_memory / GIB, 1)

    def save():
        if args.result:
            args.result.write_text(json.dumps(result, indent=1) + "\n")

    t0 = time.perf_counter()
    try:
        probe(args, result, save)
    finally:
        result["seconds"] = round(time.perf_counter() - t0, 1)
        result["line"] = summary_line(result)
        save()
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    return conclude(result, args.result, "rpg_lab.gpu_kit.memory_probe", whole=True)


def summary_line(result: dict) -> str:
    parts = []
    for model, entry in result["shapes"].items():
        for r in entry.get("restated", []):
            parts.append(f"{model.split('/')[-1]} {r['tokens'] // 1024}k: restated peak {r['peak_gib']:.1f} GiB "
                         f"({'fits' if r['fits'] else 'DOES NOT FIT'} {r['gpu_gib']:g})")
    runs = sum(len(e["runs"]) for e in result["shapes"].values())
    return f"{runs} measurements in {result.get('seconds', '?')} s" + ("; " + "; ".join(parts) if parts else "")


if __name__ == "__main__":
    sys.exit(main())
