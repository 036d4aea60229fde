"""The references: what the project's runs compute, pinned, so that a change of the computation fails in one line
instead of moving the project's results in silence.

    python -m rpg_lab.demo.reference --check [--model tiny|smol] [--out DIR]                # run it, compare
    python -m rpg_lab.demo.reference --regenerate --reason TEXT [--model tiny|smol] [--out DIR]   # write it, log why

``tiny``: README's main command, short: the tiny demo (``rpg_lab.demo.cpu``) for ``STEPS`` steps with validations
before training, at step ``TEST_FREQ`` and at the end, in the sync trainer with ``rollout.full_determinism=True``
(each sequence decoded alone), on the shipped weights (``rpg.tiny``). Its reference holds the weights' sha256, the
validation-before-training responses (their sha256 over the sorted (prompt, response, score) triples, and their
accuracy), and every metric of every step that measures the computation, not the machine (times, throughput,
memory are left out). ``smol``: SmolLM2's first RPG step computed in one process (``rpg_lab.demo.first_step``).

Both run with the CPU kernels pinned (``PINNED_ENV``, every variable ``rpg.run_record.KERNEL_ENV`` names: ATen's, MKL's
and oneDNN's AVX2 code paths, one torch thread per process), a path every x86-64 CPU of the last decade takes whatever
wider instructions it has (ATen's default path and MKL's compatible one would take older CPUs too, at three to four
times the time). A variable left unpinned would let a user's value reach the run: measured, ``MKL_ENABLE_INSTRUCTIONS=AVX512``
moved SmolLM2's loss in its last bits beside ``MKL_CBWR=AVX2``. The pin does not make two CPU models agree to the bit:
measured, an AMD EPYC (AVX2) and an Intel Xeon (AVX-512) give the same responses, but SmolLM2's loss differs in its
last 4 ulps and its weights after the update in their digest, and the tiny run's metrics by up to 3e-4 of their
value at its fourth step (roundoff that training carries on; its roundoff-sized ones, ``rollout_corr/kl``
and the like, entirely); MKL on the AMD CPU takes one path whatever
``MKL_CBWR`` says but ``COMPATIBLE``. What they read and sample (the weights, the responses) was
the same on both. So a reference (``lab/rpg_lab/demo/references/<model>.json``) holds what each CPU it was made on
computed (``cpus``, keyed by ``cpu_key``: the CPU's model name and widest instructions), and ``--check`` compares a
fresh run with its own CPU's, to the bit: the same bits, or one line naming the first differences and the command
that regenerates it. On a CPU it was never made on no check can pass: a run that read and sampled what a made one did
(``SAMPLED``) fails naming the command that adds this CPU's bits, any other fails as moved. ``--regenerate`` writes
this CPU's (the others kept, and named when what they read and sampled differs: a changed computation is regenerated
on each CPU CI runs on) and appends the reason to the reference log (docs/reference-log.md): a changed computation is
a decision with its reason, never news. CI: the ``repro`` stage
compares its two tiny runs with each other and with the tiny reference; the ``smol`` stage checks SmolLM2's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rpg import run_record
from rpg.paths.checkout import CHECKOUT
from rpg.trainer_process import read_metrics
from rpg_lab import LAB_DIR

REFERENCES = Path(__file__).parent / "references"  # <model>.json
MODELS = ("tiny", "smol")
STEPS, TEST_FREQ = 4, 2
VAL_DIR = "val_generations"  # verl's trainer.validation_data_dir under the run's folder: <step>.jsonl
DEMO_ARGS = ["--steps", str(STEPS), "--test-freq", str(TEST_FREQ), "actor_rollout_ref.rollout.full_determinism=True"]
# the CPU kernel path every AVX2 machine takes (rpg.run_record.KERNEL_ENV names what chooses it)
PINNED_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "MKL_CBWR": "AVX2",
              "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"}
# what measures the machine, not the run: wall times, throughput, memory (actor/perf/cpu_memory_used_gb), MFU
MACHINE = re.compile(r"(^|/)(timing_s|timing_per_token_ms|perf)/")
META = ("made", "command", "env")  # a reference's fields that say how it was made, not what was computed
# what a reference run reads and samples (the weights, the validation's or the step's responses): the same bits on each
# CPU model measured, so a difference in them is a change of the computation wherever the run is
SAMPLED = ("weights_sha256", "val_before", "responses")
SHOWN = 5  # differences named in the failure line
# a reference's fields in the order the run computes them, so the failure line names a cause before its effects
# (responses that moved move every metric after them)
CAUSAL = ("weights_sha256", "val_before", "responses", "metrics")


def reference_file(model: str) -> Path:
    return REFERENCES / f"{model}.json"


def command(out: Path, model: str = "tiny") -> list[str]:
    """The reference run's command into ``out``: the tiny demo (its validation samples under ``out/VAL_DIR``), or
    SmolLM2's first step."""
    if model == "smol":
        return [sys.executable, "-m", "rpg_lab.demo.first_step", "--out", str(out)]
    return [sys.executable, "-m", "rpg_lab.demo.cpu", *DEMO_ARGS, "--out", str(out),
            f"trainer.validation_data_dir={out / VAL_DIR}"]


def pinned_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default this process's environment) with the kernels pinned and this checkout and its lab first on
    the path."""
    env = dict(os.environ if base is None else base)
    env.update(PINNED_ENV)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHECKOUT), str(CHECKOUT / LAB_DIR), env.get("PYTHONPATH"))
                                        if p)
    return env


def computation(metrics: dict[int, dict]) -> dict[str, dict[str, float]]:
    """The metrics that measure the computation: every key but the machine's, per step (JSON's string keys)."""
    return {str(step): {k: v for k, v in sorted(m.items()) if not MACHINE.search(k)} for step, m in sorted(metrics.items())}


def validation_responses(out: Path, step: int = 0) -> dict:
    """The validation samples of ``step`` (verl's dump): their count, accuracy (score +1) and sha256 over the sorted
    (prompt, response, score) triples (verl's sample ids are random per run: left out)."""
    lines = (out / VAL_DIR / f"{step}.jsonl").read_text().splitlines()
    triples = sorted((r["input"], r["output"], float(r["score"])) for r in map(json.loads, filter(None, lines)))
    digest = hashlib.sha256(json.dumps(triples).encode()).hexdigest()
    return {"samples": len(triples), "accuracy": sum(s > 0 for _, _, s in triples) / len(triples),
            "sha256": digest}


def observe(out: Path, model: str = "tiny") -> tuple[dict, dict]:
    """What a finished reference run in ``out`` computed (a reference's fields but ``META``), and what it ran on
    (``rpg.run_record.ran_on``: the demo's summary, the first step's ran_on.json)."""
    if model == "smol":
        return json.loads((out / "observed.json").read_text()), json.loads((out / "ran_on.json").read_text())
    ran_on = json.loads((out / "summary.json").read_text())["ran_on"]
    return ({"weights_sha256": ran_on["weights_sha256"], "val_before": validation_responses(out),
             "metrics": computation(read_metrics(out / "metrics.jsonl"))}, ran_on)


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _shown(value) -> str:
    return value[:12] if isinstance(value, str) and len(value) == 64 else repr(value)


def differences(observed, reference, path: str = "") -> list[str]:
    """Each way ``observed`` differs from ``reference`` (nested dicts, to the bit), one short phrase each, named by its
    path (``metrics 1 actor/grad_norm``)."""
    if isinstance(observed, dict) and isinstance(reference, dict):
        found = []
        def order(k):
            return (len(k), k) if k.isdigit() else (CAUSAL.index(k) if path == "" and k in CAUSAL else len(CAUSAL), k)

        for key in sorted(set(observed) | set(reference), key=order):
            if path == "" and key in META:
                continue
            where = f"{path} {key}".strip()
            if key not in observed or key not in reference:
                found.append(f"{where} {'missing' if key not in observed else 'not in the reference'}")
            else:
                found += differences(observed[key], reference[key], where)
        return found
    if isinstance(observed, list) and isinstance(reference, list) and len(observed) == len(reference):
        return [d for i, (a, b) in enumerate(zip(observed, reference)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if _same(observed, reference) else [f"{path} {_shown(observed)} (reference {_shown(reference)})"]


def _sampled(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k in SAMPLED}


def _listed(found: list[str]) -> str:
    return "; ".join(found[:SHOWN]) + (f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else "")


def cpu_key(kernels: dict) -> str:
    """The CPU a reference was made on, as ``cpus`` keys it: its model name and widest instructions
    (``rpg.run_record``'s ``cpu_kernels``)."""
    return f"{kernels.get('cpu')} ({kernels.get('isa')})"


def verdict(observed: dict, reference: dict, here: dict, model: str = "tiny") -> tuple[bool, str]:
    """(passed, the line to print) for a run that observed ``observed`` on a machine ``here`` (``cpu_kernels``): the
    bits of this CPU's reference pass; anything else fails in one line, as moved when what the run read and sampled
    (or, on its own CPU, anything) differs, else as a CPU the reference was never made on."""
    key, made = cpu_key(here), reference.get("cpus") or {}
    regenerate_it = f"python -m rpg_lab.demo.reference --regenerate --model {model} --reason TEXT"
    if key in made:
        moved = differences(observed, made[key])
        if not moved:
            return True, (f"the {model} reference holds to the last bit on this CPU ({key}; weights "
                          f"{run_record.short(made[key]['weights_sha256'])})")
    else:
        apart = {other: differences(_sampled(observed), _sampled(entry)) for other, entry in made.items()}
        alike = [other for other, found in apart.items() if not found]
        if alike:
            return False, (f"the {model} reference was never made on this CPU ({key}; made on {', '.join(made)}): the "
                           f"run read and sampled what {alike[0]}'s did, its numbers are this CPU's own last bits; if "
                           f"the computation is unchanged, {regenerate_it} adds this CPU's")
        moved = next(iter(apart.values()), ["no CPU's reference yet"])
    return False, (f"the {model} reference moved ({len(moved)} differences): {_listed(moved)}. A change of the "
                   f"computation is a decision: if it is meant, {regenerate_it} records it")


def run(out: Path, model: str = "tiny") -> tuple[dict, dict]:
    """The reference run into ``out`` (a new folder), kernels pinned: ``observe``'s answer. RuntimeError with the
    run's log tail when it fails."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}.log"
    with open(log, "wb") as f:
        done = subprocess.run(command(out, model), cwd=CHECKOUT, env=pinned_env(), stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"the {model} reference run failed (exit {done.returncode}); its log {log}:\n"
                           + log.read_text(errors="replace")[-4000:])
    return observe(out, model)


def regenerate(observed: dict, reason: str, ran_on: dict, model: str = "tiny") -> tuple[Path, list[str]]:
    """Write ``observed`` as ``model``'s reference on this CPU (``ran_on``'s: the run's), the other CPUs' kept, and
    log the reason; (its path, the other CPUs whose references read or sampled otherwise: they are of another
    computation)."""
    path = reference_file(model)
    reference = json.loads(path.read_text()) if path.exists() else {"cpus": {}}  # main refuses one without
    key = cpu_key(ran_on["kernels"])
    before = reference["cpus"].get(key)
    code = run_record.code_state()
    made = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "code": code["code"], "commit": code["commit"],
            "kernels": ran_on["kernels"], "libraries": ran_on["libraries"]}
    reference.update({"command": command(Path("OUT"), model)[1:], "env": PINNED_ENV})
    reference["cpus"][key] = {**observed, "made": made}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(reference, indent=1, sort_keys=True) + "\n")
    digest = lambda entry: hashlib.sha256(  # noqa: E731 - what was computed, not how it was made
        json.dumps({k: v for k, v in entry.items() if k not in META}, sort_keys=True).encode()).hexdigest()
    run_record.log_change(f"{model} reference on {key}", before and digest(before), digest(reference["cpus"][key]),
                          reason, ran_on)
    apart = [other for other, entry in reference["cpus"].items()
             if other != key and differences(_sampled(observed), _sampled(entry))]
    return path, apart


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="run the reference run and compare it with the reference")
    mode.add_argument("--regenerate", action="store_true", help="run it and write it as the reference (--reason)")
    ap.add_argument("--model", default="tiny", choices=MODELS, help="which reference (default tiny)")
    ap.add_argument("--reason", default="", help="why the reference changes (the reference log's row)")
    ap.add_argument("--out", type=Path, default=None, help="the run's folder (default: a new temporary folder)")
    args = ap.parse_args(argv)
    path = reference_file(args.model)
    if args.regenerate and not args.reason.strip():
        ap.error("--regenerate needs --reason: a changed computation is a decision, said with its reason")
    if args.check and not path.exists():
        ap.error(f"{path}: no reference yet; --regenerate --reason TEXT makes it")
    if path.exists() and "cpus" not in json.loads(path.read_text()):
        ap.error(f"{path}: a reference without each CPU's bits ('cpus'), of the format before them; move its "
                 f"computed fields under cpus[cpu_key(made.kernels)] or remove it and --regenerate")
    out = args.out or Path(tempfile.mkdtemp(prefix="rpg-reference-")) / "run"
    print(f"[reference] the {args.model} reference run ({', '.join(f'{k}={v}' for k, v in PINNED_ENV.items())}) into "
          f"{out}", flush=True)
    try:
        observed, ran_on = run(out, args.model)
    except RuntimeError as e:
        print(f"[reference] {e}", file=sys.stderr, flush=True)
        return 1
    if args.regenerate:
        written, apart = regenerate(observed, args.reason, ran_on, args.model)
        print(f"[reference] wrote this CPU's ({cpu_key(ran_on['kernels'])}) in {written} and a row of "
              f"{run_record.REFERENCE_LOG}", flush=True)
        if apart:
            print(f"[reference] the references made on {', '.join(apart)} read or sampled otherwise (weights or "
                  f"responses): they are of another computation; regenerate them on those CPUs", flush=True)
        return 0
    ok, line = verdict(observed, json.loads(path.read_text()), ran_on["kernels"], args.model)
    print(f"[reference] {line}", file=sys.stdout if ok else sys.stderr, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
