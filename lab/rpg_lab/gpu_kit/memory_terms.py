"""The memory probe's shapes and arithmetic (pure Python, no torch): which model widths and token budgets the paper's
scripts have (``PROBES``), the plan for a truncated model (``planned_gib``), the fit of the measured peaks and each
script shape restated at full depth on 8 GPUs (``restate``), and the tables of a run (``render``, ``--render`` of
``rpg_lab.gpu_kit.memory_probe``). The measurement itself: ``rpg_lab.gpu_kit.memory_probe``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

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
      the backward (the logits' transients, few gradients yet: d is the layer input gradient checkpointing keeps,
      T * H * 2 bytes) or at its end (every gradient: d is that plus one layer's fp32 gradient). The fit beyond
      parameters and optimizer states tells which, by the nearer of the two slopes: the first keeps (c, d); the
      second refits them beyond the gradients too. Either way the restated peak adds every gradient, sharded (an
      upper bound for the first; its c also holds, whole, the gradient of a unit the backward passed first, such
      as an untied lm_head's);
    * optimizer step: beyond parameters, gradients and optimizer states, as a multiple of one state shard (its
      temporaries are per parameter, so they shrink with the shard)."""
    out: dict = {"model": arch.name, "tokens": tokens, "gpus": gpus, "layers": arch.layers}

    def beyond(phase: str, gradients: bool) -> tuple[float, float]:
        return fit({L: m[phase] - state_gib(truncated(arch, L), gradients) for L, m in measured.items()})

    lp, fb = beyond("log-prob", False), beyond("forward+backward", False)
    kept_per_layer, layer_gradient = tokens * arch.hidden * 2 / GIB, arch.layer_params * 4 / GIB
    at_end = abs(fb[1] - (kept_per_layer + layer_gradient)) < abs(fb[1] - kept_per_layer)
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
