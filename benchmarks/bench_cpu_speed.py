"""The CPU path's speed against a baseline checkout, measured in one session: README's main command
(``bash recipe/rpg/tiny/run_tiny_cpu.sh``, assets cached) and, with ``--suite``, README's test command
(``python -m pytest -n 2 --dist loadfile``), each run in the baseline tree and in this one, one after
the other, and printed with the ratio this / baseline.

    python benchmarks/bench_cpu_speed.py --baseline ../rpg-main [--baseline-python ../rpg-main/.venv/bin/python]
        [--suite] [--repeats 1] [--steps 30] [--json FILE]
    python benchmarks/bench_cpu_speed.py --steps 2 --suite --suite-args tests/project/test_docs_references.py
        # smoke: this tree alone (no --baseline: no ratios), a 2-step main command, one test file
        # (tests/benchmarks/test_bench_cpu_speed.py)

The baseline is a checkout of the commit to compare with (``git worktree add ../rpg-main main``) with its
own environment (the editable install of a virtual environment points at one tree: Ray workers import
``rpg`` from there). Per main-command run: wall time of the whole command, seconds to the first step's
line, the median of verl's ``timing_s/step`` and of one validation (``timing_s/testing``), and the CPU
seconds of the run's processes where the tree records them (``summary.json`` ``cpu_s``). Per suite
run: wall time, the counts pytest prints, and the machine's busy CPU seconds over the run
(``/proc/stat``: other work on the machine counts too).

A shared 2-core machine is noisy (other jobs compete): compare within one invocation only.
Figures measured on the project's development machine: benchmarks/cpu_speed.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN_COMMAND = ["bash", "recipe/rpg/tiny/run_tiny_cpu.sh"]
SUITE_COMMAND = ["-m", "pytest", "-n", "2", "--dist", "loadfile", "-q", "-p", "no:cacheprovider"]


def busy_cpu_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def median(values):
    return statistics.median(values) if values else float("nan")


def main_command(tree: Path, python: str, steps: int | None = None) -> dict:
    out = Path(tempfile.mkdtemp(prefix="bench_tiny_"))
    env = {**os.environ, "PYTHON": python, "OUT": str(out / "run"), **({"STEPS": str(steps)} if steps else {})}
    t0, c0 = time.time(), busy_cpu_s()
    p = subprocess.run(MAIN_COMMAND, cwd=tree, env=env, capture_output=True, text=True)
    wall, busy = time.time() - t0, busy_cpu_s() - c0
    if p.returncode != 0:
        raise SystemExit(f"main command failed in {tree}:\n{(p.stdout + p.stderr)[-3000:]}")
    first = re.search(r"\[tiny\] step +1/\d+ .* elapsed (\d+)s", p.stdout)
    summary = json.loads((out / "run" / "summary.json").read_text())
    records = [json.loads(ln) for ln in (out / "run" / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    step_s = [r["data"]["timing_s/step"] for r in records if "timing_s/step" in r["data"] and r["step"] > 1]
    val_s = [r["data"]["timing_s/testing"] for r in records if "timing_s/testing" in r["data"]]
    return {"wall_s": round(wall, 1), "first_step_s": int(first.group(1)) if first else None,
            "step_median_s": round(median(step_s), 2), "validations": len(val_s) + 1,
            "validation_median_s": round(median(val_s), 2), "run_cpu_s": summary.get("cpu_s"),
            "machine_busy_cpu_s": round(busy, 1), "val_acc": [summary["val_acc_before"], summary["val_acc_after"]]}


def suite(tree: Path, python: str, extra: list[str] = ()) -> dict:
    t0, c0 = time.time(), busy_cpu_s()
    p = subprocess.run([python, *SUITE_COMMAND, *extra], cwd=tree, capture_output=True, text=True)
    wall, busy = time.time() - t0, busy_cpu_s() - c0
    counts = re.findall(r"(\d+) (passed|failed|skipped|error)", p.stdout.splitlines()[-1] if p.stdout else "")
    return {"wall_s": round(wall, 1), "machine_busy_cpu_s": round(busy, 1), "returncode": p.returncode,
            "counts": {k: int(v) for v, k in counts}}


def ratio(new, old):
    return round(new / old, 2) if isinstance(new, (int, float)) and isinstance(old, (int, float)) and old else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, default=None,
                    help="checkout of the commit to compare with (without it: this tree alone, no ratios)")
    ap.add_argument("--baseline-python", default=None, help="its Python (default: <baseline>/.venv/bin/python)")
    ap.add_argument("--python", default=sys.executable, help="this tree's Python (default: this one)")
    ap.add_argument("--suite", action="store_true", help="also README's test command (about 2 x 10-15 minutes)")
    ap.add_argument("--suite-args", default="", help="appended to the test command (e.g. test files: a part of the suite)")
    ap.add_argument("--steps", type=int, default=None, help="the main command's STEPS (default: its own, 30)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    for flag in ("steps", "repeats"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            ap.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if args.baseline is not None and not args.baseline.is_dir():
        ap.error(f"--baseline {args.baseline} is not a directory (a checkout of the commit to compare with)")
    trees = {"this": (ROOT, args.python)}
    if args.baseline is not None:
        trees = {"baseline": (args.baseline.resolve(),
                              args.baseline_python or str(args.baseline / ".venv" / "bin" / "python")), **trees}
    extra = shlex.split(args.suite_args)
    results: dict = {"main_command": {k: [] for k in trees}, "suite": {k: [] for k in trees}}
    for _ in range(args.repeats):
        for name, (tree, python) in trees.items():  # alternate, so that slow drift of the load hits both
            results["main_command"][name].append(main_command(tree, python, args.steps))
            print(f"main command, {name}: {results['main_command'][name][-1]}", flush=True)
        if args.suite:
            for name, (tree, python) in trees.items():
                results["suite"][name].append(suite(tree, python, extra))
                print(f"suite, {name}: {results['suite'][name][-1]}", flush=True)
    for what, runs in results.items():
        if not runs["this"] or "baseline" not in runs:
            continue
        for key in runs["this"][0]:
            old = median([r[key] for r in runs["baseline"] if isinstance(r[key], (int, float))])
            new = median([r[key] for r in runs["this"] if isinstance(r[key], (int, float))])
            if isinstance(runs["this"][0][key], (int, float)):
                print(f"{what:12s} {key:22s} baseline {old:8.1f}  this {new:8.1f}  ratio {ratio(new, old)}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
