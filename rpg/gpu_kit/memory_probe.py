"""The paper's model widths on one GPU: the peak memory of verl's FSDP2 actor in the old log-prob pass and the update,
measured, against the plan every shipped script is checked with (``rpg.memory.gpu``).

    python3 -m rpg.gpu_kit.memory_probe [--device cuda] [--depths 1,2] [--eager-entropy] [--result FILE]

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

The plan for the same truncated model (``rpg.memory.estimate`` with one GPU) is given beside each measurement. Then
the per-layer and fixed terms are fitted (``fit``): what a phase holds beyond the actor's state (parameters, gradients,
optimizer states: exact from the parameter count) is linear in the depth, ``c + d * L``; and each script's plan is
re-stated at its full depth on 8 GPUs from the measured terms (``restate``): state / 8 + c + d * L + the plan's assumed
runtime overhead, the optimizer step's temporaries scaled by their measured ratio to one state shard. The result is
JSON (``--result``), written again after each measurement so a run stopped by its time box keeps what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rpg.gpu_kit import report
from rpg.memory import architecture_for, estimate, settings_from_config
from rpg.memory.architecture import Architecture
from rpg.memory.gpu import RUNTIME_OVERHEAD_GIB
from rpg.memory.sizes import DEFAULT_GPU_MEM_GIB, GIB, HEADROOM_FRACTION


@dataclass(frozen=True)
class Probe:
    """A model shape of the paper's scripts and their per-GPU token budgets (update = old log-prob = reference)."""

    model: str                  # rpg.memory's KNOWN_ARCHITECTURES name (the widths; depth is --depths)
    tokens: tuple[int, ...]
    rollout_util: float         # the scripts' rollout.gpu_memory_utilization (the plan's generation phase)
    scripts: str                # which shipped scripts have this shape and these budgets


PROBES = (
    Probe("Qwen/Qwen2.5-7B-Instruct", (4096, 16384), 0.6,
          "recipe/rpg/7b/*: Qwen2.5-Math-7B and Qwen2.5-7B-Instruct (same widths), 4k or 16k tokens per GPU"),
    Probe("Qwen/Qwen3-4B", (8192, 16384, 32768), 0.7, "recipe/rpg/4b/*: Qwen3-4B, ctx2k / ctx4k / ctx8k"),
)
# The kit's CPU tests run the same code on these widths (--stand-in): each layout (Qwen2's biases, Qwen3's q/k norms,
# tied or not) at a size a CPU computes in seconds
STAND_IN = {"hidden": 64, "intermediate": 160, "heads": 4, "kv_heads": 2, "head_dim": 16, "vocab": 512}
STAND_IN_TOKENS = (32, 64)
SCRIPT_GPUS = 8          # every paper script: 8 GPUs, one FSDP group of 8 (tests/launch checks it)
DEPTHS = (1, 2)
PHASES = ("log-prob", "forward+backward", "optimizer step")


# ----------------------------------------------------------------------------- the plan (pure Python)

def script_settings(tokens: int, gpus: int, attn: str, rollout_util: float = 0.6):
    """rpg.memory's settings of a paper script: FSDP2, fp32 master weights, no offload, gradient checkpointing,
    compiled entropy, AdamW, dynamic batching at ``tokens`` per GPU for the update and both log-prob passes."""
    budget = {"log_prob_use_dynamic_bsz": True, "log_prob_max_token_len_per_gpu": tokens}
    return settings_from_config({
        "trainer": {"nnodes": 1, "n_gpus_per_node": gpus},
        "data": {"max_prompt_length": 1024, "max_response_length": 3072},
        "actor_rollout_ref": {
            "actor": {"strategy": "fsdp2", "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": tokens,
                      "fsdp_config": {"model_dtype": "fp32", "use_torch_compile": True}},
            "rollout": dict(budget, gpu_memory_utilization=rollout_util), "ref": budget,
            "model": {"enable_gradient_checkpointing": True, "override_config": {"attn_implementation": attn}}}})


def uncovered(settings, arch: Architecture) -> str | None:
    """Why the probe's restatement does not describe a script with these settings (None: it does): its widths and
    token budget are not in ``PROBES``, or a memory-relevant setting differs from ``script_settings``'."""
    probe = next((p for p in PROBES if dataclasses.replace(architecture_for(p.model), name=arch.name,
                                                            max_position_embeddings=arch.max_position_embeddings)
                  == arch), None)
    if probe is None:
        return f"{arch.name}: no probe has its widths"
    tokens = settings.train_tokens
    if tokens not in probe.tokens or {settings.logprob_tokens, settings.ref_tokens} != {tokens}:
        return (f"{arch.name}: token budgets update {tokens}, log-prob {settings.logprob_tokens}, reference "
                f"{settings.ref_tokens}; probed: {probe.tokens} for all three")
    ours = script_settings(tokens, SCRIPT_GPUS, settings.attn_implementation, probe.rollout_util)
    fields = ("rollout_util", "n_gpus", "fsdp_size", "param_bytes", "param_offload", "optimizer_offload", "offload_policy", "fsdp2",
              "optimizer_states", "gradient_checkpointing", "activation_offload", "entropy_in_update",
              "entropy_compiled")
    differ = [f"{f}={getattr(settings, f)!r} (probed {getattr(ours, f)!r})" for f in fields
              if getattr(settings, f) != getattr(ours, f)]
    return f"{arch.name}: " + ", ".join(differ) if differ else None


def truncated(arch: Architecture, layers: int) -> Architecture:
    return dataclasses.replace(arch, layers=layers, name=f"{arch.name} ({layers} layers)")


def state_gib(arch: Architecture, gradients: bool, gpus: int = 1) -> float:
    """The actor's fp32 state per GPU: parameters + 2 AdamW states (+ the gradients)."""
    return arch.params * 4 * (4 if gradients else 3) / gpus / GIB


def planned_gib(arch: Architecture, tokens: int, gpus: int, attn: str) -> dict[str, float]:
    """The plan's log-prob and update phases (GiB) without its assumed runtime overhead, and the optimizer step's
    temporaries (one state shard) it counts inside the update."""
    e = estimate(script_settings(tokens, gpus, attn), arch, DEFAULT_GPU_MEM_GIB)
    phases = {p.name: p.gib - RUNTIME_OVERHEAD_GIB for p in e.phases}
    return {"log-prob": phases["log-prob forward"], "update": phases["update (forward + backward)"],
            "optimizer step temporaries": arch.params * 4 / gpus / GIB}


def fit(points: dict[int, float]) -> tuple[float, float]:
    """Least squares c + d * L through {L: GiB} (two depths: the line through both)."""
    n = len(points)
    if n < 2:
        raise ValueError(f"a fit needs two depths or more, got {sorted(points)}")
    xs, ys = list(points), list(points.values())
    mx, my = sum(xs) / n, sum(ys) / n
    d = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - d * mx, d


def restate(arch: Architecture, tokens: int, measured: dict[int, dict[str, float]], rollout_util: float,
            gpus: int = SCRIPT_GPUS, gpu_gib: float = DEFAULT_GPU_MEM_GIB) -> dict:
    """A script's log-prob and update phases at full depth on ``gpus`` GPUs from the measured peaks
    {depth: {phase: GiB}}, against the plan for the same settings (SDPA, the kernels measured) and the scripts' own
    (flash-attn); the run's peak with the plan's generation and weight-sync phases, which the probe does not measure
    (vLLM's share of the GPU and the actor's state, both set by the config).

    What each phase holds beyond the sharded state is fitted as c + d * L at one GPU and kept whole on ``gpus``
    GPUs (activations and transients do not shrink with the shard):

    * log-prob: beyond parameters and optimizer states;
    * forward + backward: a unit's gradient exists once the backward has passed it, so the peak comes either early in
      the backward (the logits' transients, few gradients yet: d is the activations kept per layer) or at its end
      (every gradient: d is one layer's gradient plus a little). The fit beyond parameters and optimizer states tells
      which: d under half a layer's gradient is the first, and (c, d) are kept; else the second, and (c, d) are
      refitted beyond the gradients too. Either way the restated peak adds every gradient, sharded (an upper bound
      for the first);
    * optimizer step: beyond parameters, gradients and optimizer states, as a multiple of one state shard (its
      temporaries are per parameter, so they shrink with the shard)."""
    out: dict = {"model": arch.name, "tokens": tokens, "gpus": gpus, "layers": arch.layers}
    def beyond(phase: str, gradients: bool) -> tuple[float, float]:
        return fit({L: m[phase] - state_gib(truncated(arch, L), gradients) for L, m in measured.items()})

    lp, fb = beyond("log-prob", False), beyond("forward+backward", False)
    layer_gradient = arch.layer_params * 4 / GIB
    at_end = fb[1] >= layer_gradient / 2
    if at_end:
        fb = beyond("forward+backward", True)
    step_ratio = max((m["optimizer step"] - state_gib(truncated(arch, L), True))
                     / (truncated(arch, L).params * 4 / GIB) for L, m in measured.items())
    out["fitted"] = {"log-prob": {"fixed_gib": lp[0], "per_layer_gib": lp[1]},
                     "forward+backward": {"fixed_gib": fb[0], "per_layer_gib": fb[1],
                                          "peak": "end of the backward" if at_end else "early in the backward"},
                     "optimizer step / one state shard": step_ratio}
    out["restated_gib"] = {
        "log-prob": state_gib(arch, False, gpus) + lp[0] + lp[1] * arch.layers + RUNTIME_OVERHEAD_GIB,
        "forward+backward": state_gib(arch, True, gpus) + fb[0] + fb[1] * arch.layers + RUNTIME_OVERHEAD_GIB,
        "optimizer step": state_gib(arch, True, gpus) + step_ratio * arch.params * 4 / gpus / GIB
        + RUNTIME_OVERHEAD_GIB}
    out["restated_gib"]["update"] = max(out["restated_gib"]["forward+backward"], out["restated_gib"]["optimizer step"])
    plans = {attn: estimate(script_settings(tokens, gpus, attn, rollout_util), arch, gpu_gib)
             for attn in ("sdpa", "flash_attention_2")}
    out["planned_gib"] = {attn: {p.name: p.gib for p in e.phases} for attn, e in plans.items()}
    others = [g for name, g in out["planned_gib"]["flash_attention_2"].items()
              if name not in ("log-prob forward", "update (forward + backward)")]
    peak = max(others + [out["restated_gib"]["log-prob"], out["restated_gib"]["update"]])
    out["peak_gib"], out["gpu_gib"] = peak, gpu_gib
    out["headroom_gib"] = gpu_gib - peak
    out["fits"] = out["headroom_gib"] >= HEADROOM_FRACTION * gpu_gib
    return out


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

        from rpg.gpu_kit.model_step import actor_config

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
    """``fn()``'s peak allocated and reserved GiB (None off CUDA) and its seconds."""
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
            del actor
        entry["restated"] = restated(arch, entry["runs"], spec.rollout_util)
        save()


def restated(arch: Architecture, runs: list[dict], rollout_util: float) -> list[dict]:
    """``restate`` for each token budget measured at two depths or more (peaks measured: CUDA only)."""
    out = []
    for tokens in sorted({r["tokens"] for r in runs}):
        at = {r["layers"]: {ph: r[ph]["peak_gib"] for ph in PHASES} for r in runs if r["tokens"] == tokens}
        if len(at) >= 2 and all(v is not None for m in at.values() for v in m.values()):
            out.append(restate(arch, tokens, at, rollout_util))
    return out


def probe_result(path: Path) -> dict:
    """The probe's result from its own JSON or from a GPU kit summary.json that ran it."""
    data = json.loads(path.read_text())
    if "steps" in data and "shapes" not in data:
        step = next((s for s in data["steps"] if s["name"] == "memory_probe" and s.get("result")), None)
        if step is None:
            raise ValueError(f"{path}: the kit's summary has no memory_probe result")
        data = dict(step["result"], run_id=data.get("run_id"))
    return data


def render(result: dict) -> str:
    """Markdown: each measurement against the plan for the same truncated model, then each script shape restated
    from the fitted terms (``restate``, recomputed here from the measured peaks)."""
    gib = lambda x: f"{x:.1f}"  # noqa: E731
    lines = ["| model (widths), layers | tokens | log-prob: measured / planned | forward+backward: measured | "
             "optimizer step: measured | update: planned | largest reserved |", "|---|---|---|---|---|---|---|"]
    restated_rows = []
    for model, entry in result["shapes"].items():
        for r in entry["runs"]:
            plan = r["planned_gib"]
            reserved = max(r[ph]["reserved_gib"] for ph in PHASES)
            lines.append(f"| {model.split('/')[-1]}, {r['layers']} | {r['tokens']} | {gib(r['log-prob']['peak_gib'])} / "
                         f"{gib(plan['log-prob'])} | {gib(r['forward+backward']['peak_gib'])} | "
                         f"{gib(r['optimizer step']['peak_gib'])} | {gib(plan['update'])} | {gib(reserved)} |")
        util = next(p.rollout_util for p in PROBES if p.model == model)
        restated_rows += restated(architecture_for(model), entry["runs"], util)
    lines += ["", "| script shape (8 GPUs, full depth) | tokens | log-prob: restated / planned | update: restated / "
              "planned (SDPA) / planned (flash-attn) | fitted per layer (fwd+bwd) | run's peak, headroom on "
              f"{DEFAULT_GPU_MEM_GIB:g} GiB |", "|---|---|---|---|---|---|"]
    for r in restated_rows:
        sdpa, flash = r["planned_gib"]["sdpa"], r["planned_gib"]["flash_attention_2"]
        lines.append(f"| {r['model'].split('/')[-1]}, {r['layers']} layers | {r['tokens']} | "
                     f"{gib(r['restated_gib']['log-prob'])} / {gib(sdpa['log-prob forward'])} | "
                     f"{gib(r['restated_gib']['update'])} / {gib(sdpa['update (forward + backward)'])} / "
                     f"{gib(flash['update (forward + backward)'])} | "
                     f"{r['fitted']['forward+backward']['per_layer_gib']:.3f} GiB "
                     f"({r['fitted']['forward+backward']['peak']}) | {gib(r['peak_gib'])}, "
                     f"{gib(r['headroom_gib'])} ({'fits' if r['fits'] else 'DOES NOT FIT'}) |")
    return "\n".join(lines) + "\n"


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
            print(f"rpg.gpu_kit.memory_probe: --render {args.render}: {e}", file=sys.stderr)
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
    return report(result, args.result, "rpg.gpu_kit.memory_probe")


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
