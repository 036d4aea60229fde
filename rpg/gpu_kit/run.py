"""Run the GPU kit on a node: install the carry, then the checks in order of value, each in its own time box,
``OUT/summary.json`` rewritten after each, one failing step never stopping the next.

    python3 -m rpg.gpu_kit.run --out DIR [--carry .gpu_kit] [--site .gpu_kit_site] [--budget 450]
                               [--steps NAME,...] [--box NAME=SECONDS] [--installed] [--stand-ins FILE]

The steps are ``rpg.gpu_kit.steps``'s ``STEPS``; ``--steps`` runs a subset, e.g. a rerun of the ones that failed,
always with ``install`` unless ``--installed`` (it only checks a site that holds the same carry).
A step not run (not a default step, not in ``--steps``) is listed in the summary's ``not_run`` with why.
A step gets ``min(its box, what is left of --budget)``; one that would get less than its box and less than
``MIN_BOX_S`` is skipped with that reason. Past its box the step's process group gets SIGTERM, then SIGKILL
after the step's grace, and it is recorded as timed out. Each step's output goes to ``OUT/<name>.log``;
``OUT/summary.json`` holds each step's status, seconds, its parsed result and, for a failure, the log's last
lines. Exit 0 when every step passed or was skipped for a reason of its own (vLLM absent, ``--installed``),
else 1.

``--stand-ins FILE`` (JSON ``{step: argv}``) replaces steps' commands, for walking the kit on a machine without
a GPU (tests/gpu_kit/test_gpu_kit.py); ``{python}`` in an argv is this interpreter. Each step's process gets
``RPG_GPU_KIT_RESULT`` (a JSON result file it may write), ``RPG_GPU_KIT_WORK`` (its folder) and
``RPG_GPU_KIT_BOX_S``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from rpg.common.checkout import CHECKOUT
from rpg.gpu_kit import CARRY_DIR, DEFAULT_BUDGET_S, SITE_DIR
from rpg.gpu_kit.steps import STEPS, Context, Step, StepRun, cap_log

MIN_BOX_S = 20.0
TAIL_LINES = 40
PREFIX = "[gpu-kit]"


# ----------------------------------------------------------------------------- the runner

def write_json(path: Path, data: dict) -> None:
    """Atomically: a reader (or a copy after a kill) sees the old file or the new one, never a part."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def tail(path: Path, n: int = TAIL_LINES) -> list[str]:
    if not path.is_file():
        return []
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 64 * 1024))
        return f.read().decode(errors="replace").splitlines()[-n:]


def _kill_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the step's process group, SIGKILL after ``grace_s`` (the step started it: its pgid is its pid)."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_step(ctx: Context, step: Step, box_s: float, env: dict, argv_override: list[str] | None) -> dict:
    work = ctx.work / step.name
    work.mkdir(parents=True, exist_ok=True)
    run = StepRun(step, box_s, ctx.out / f"{step.name}.log", work, work / "result.json")
    record: dict = {"box_s": round(box_s)}
    argv = argv_override if argv_override is not None else step.command(ctx, run)
    if isinstance(argv, str):
        return {**record, "status": "skipped", "reason": argv, "fine": step.skip_is_fine}
    argv = [ctx.python if a == "{python}" else a for a in argv]
    step_env = {**env, "RPG_GPU_KIT_RESULT": str(run.result_file), "RPG_GPU_KIT_WORK": str(work),
                "RPG_GPU_KIT_BOX_S": str(int(box_s))}
    record["command"] = " ".join(argv)
    t0 = time.time()
    with open(run.log, "ab") as log:
        log.write(f"{PREFIX} {step.name}: {record['command']}\n".encode())
        log.flush()
        proc = subprocess.Popen(argv, cwd=ctx.checkout, env=step_env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=box_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc, step.grace_s)
    record["seconds"] = round(time.time() - t0, 1)
    record["returncode"] = proc.returncode
    cap_log(run.log)
    try:
        result = step.parse(ctx, run)
    except Exception as e:  # noqa: BLE001 - an unreadable output is the step's failure, not the kit's
        result = {"problems": [f"its output could not be read: {type(e).__name__}: {e}"]}
    problems = result.get("problems") or []
    if timed_out:
        record.update(status="timed_out", reason=f"still running after its {box_s:.0f} s box: stopped")
    elif proc.returncode != 0:
        record.update(status="failed", reason=f"exit code {proc.returncode}" + (f": {problems[0]}" if problems else ""))
    elif problems:
        record.update(status="failed", reason=problems[0])
    else:
        record["status"] = "passed"
    record["result"] = result
    record["log"] = run.log.name
    if record["status"] != "passed":
        record["tail"] = tail(run.log)
    return record


def run_kit(ctx: Context, steps: list[Step], budget_s: float, stand_ins: dict[str, list[str]] | None = None,
            not_run: dict[str, str] | None = None) -> int:
    """The steps in order; ``not_run``: {step: why it is not run}, listed in the summary."""
    ctx.out.mkdir(parents=True, exist_ok=True)
    ctx.work.mkdir(parents=True, exist_ok=True)
    stand_ins = stand_ins or {}
    t0 = time.time()
    deadline = t0 + budget_s
    summary: dict = {
        "kit": "rpg.gpu_kit.run", "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "budget_s": budget_s,
        "checkout": str(ctx.checkout), "work": str(ctx.work), "site": None if ctx.installed else str(ctx.site),
        "stand_ins": sorted(stand_ins), "finished": False,
        "steps": [{"name": s.name, "what": s.what, "status": "pending"} for s in steps],
        "not_run": [{"name": name, "reason": why} for name, why in (not_run or {}).items()],
    }
    path = ctx.out / "summary.json"
    write_json(path, summary)
    from rpg.gpu_kit.install import run_env

    env = run_env(ctx.site, ctx.checkout) if not ctx.installed else dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    for i, step in enumerate(steps):
        entry = summary["steps"][i]
        left = deadline - time.time()
        box = min(step.box_s, left - step.grace_s - 5)
        if box < min(step.box_s, MIN_BOX_S):
            entry.update(status="skipped", reason=f"not started: {max(0, left):.0f} s of the {budget_s:.0f} s budget "
                                                  f"left", fine=False)
        else:
            say(f"{i + 1}/{len(steps)} {step.name} (box {box:.0f} s): {step.what}")
            entry.update(status="running")
            write_json(path, summary)
            entry.update(run_step(ctx, step, box, env, stand_ins.get(step.name)))
        line = entry.get("result", {}).get("line") or entry.get("reason", "")
        say(f"{i + 1}/{len(steps)} {step.name}: {entry['status'].upper()}"
            + (f" in {entry['seconds']} s" if "seconds" in entry else "") + (f": {line}" if line else ""))
        write_json(path, summary)
    summary["finished"] = True
    summary["seconds"] = round(time.time() - t0, 1)
    ok = all(s["status"] == "passed" or (s["status"] == "skipped" and s.get("fine")) for s in summary["steps"])
    summary["all_passed"] = ok
    write_json(path, summary)
    for entry in summary["not_run"]:
        say(f"not run: {entry['name']}: {entry['reason']}")
    say(f"{'all steps passed' if ok else 'NOT all steps passed'} in {summary['seconds']} s; {path}")
    return 0 if ok else 1


def say(text: str) -> None:
    print(f"{PREFIX} {text}", flush=True)


INSTALLED_STACK = ("verl", "ray", "hydra", "transformers", "tensordict")  # what every trainer step imports


def missing_stack() -> list[str]:
    """The modules of ``INSTALLED_STACK`` this interpreter cannot import (``--installed`` runs with no carry)."""
    import importlib.util

    return [name for name in INSTALLED_STACK if importlib.util.find_spec(name) is None]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="summary.json and the steps' logs (the device call's $OUT)")
    ap.add_argument("--carry", type=Path, default=CHECKOUT / CARRY_DIR, help=f"the carry (default {CARRY_DIR})")
    ap.add_argument("--site", type=Path, default=CHECKOUT / SITE_DIR, help=f"install target (default {SITE_DIR})")
    ap.add_argument("--work", type=Path, default=None,
                    help="the steps' own outputs (default outputs/gpu_kit/<time> in the checkout)")
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help=f"seconds for all steps "
                    f"(default {DEFAULT_BUDGET_S})")
    ap.add_argument("--steps", default=None, help="comma-separated subset, in the kit's order "
                    f"({','.join(s.name for s in STEPS)})")
    ap.add_argument("--box", action="append", default=[], metavar="STEP=SECONDS",
                    help="another time box for a step (repeatable), e.g. smoke_hf=300 on a rerun")
    ap.add_argument("--installed", action="store_true", help="use the installed packages; no carry")
    ap.add_argument("--stand-ins", type=Path, default=None, help="JSON {step: argv} replacing steps' commands")
    args = ap.parse_args(argv)
    names = [s.name for s in STEPS]
    chosen = ([s.name for s in STEPS if not s.not_default] if args.steps is None
              else [n.strip() for n in args.steps.split(",") if n.strip()])
    unknown = [n for n in chosen if n not in names]
    if unknown or not chosen:
        ap.error(f"--steps: unknown step(s) {', '.join(unknown) or '(none given)'}; allowed: {', '.join(names)}")
    if not args.installed and "install" not in chosen:  # a fresh node has no site; a warm one keeps it (fast)
        chosen.insert(0, "install")
    stand_ins = json.loads(args.stand_ins.read_text()) if args.stand_ins else None
    if stand_ins is not None:
        bad = [k for k, v in stand_ins.items() if k not in names or not (isinstance(v, list) and v)]
        if bad:
            ap.error(f"--stand-ins {args.stand_ins}: {', '.join(bad)}: each key a step ({', '.join(names)}), "
                     f"each value a non-empty argv list")
    boxes = {}
    for text in args.box:
        name, _, seconds = text.partition("=")
        try:
            boxes[name] = float(seconds)
        except ValueError:
            ap.error(f"--box {text}: STEP=SECONDS, SECONDS a number")
        if name not in names or boxes[name] <= 0:
            ap.error(f"--box {text}: a step name ({', '.join(names)}) and a positive number of seconds")
    if args.budget < MIN_BOX_S:
        ap.error(f"--budget must be >= {MIN_BOX_S:g} s")
    missing = missing_stack() if args.installed else []
    if missing:  # without it each step would fail on its own ModuleNotFoundError
        ap.error(f"--installed: {', '.join(missing)} cannot be imported by {sys.executable}; "
                 f"leave out --installed to install the carry (a warm node keeps its site: seconds)")
    work = args.work or CHECKOUT / "outputs" / "gpu_kit" / time.strftime("%Y%m%d-%H%M%S")
    ctx = Context(out=args.out.resolve(), work=work.resolve(), carry=args.carry.resolve(), site=args.site.resolve(),
                  installed=args.installed)
    steps = [replace(s, box_s=boxes.get(s.name, s.box_s)) for s in STEPS if s.name in chosen]
    not_run = {s.name: (f"not a default step: {s.not_default}" if s.not_default and args.steps is None
                        else "not in --steps") for s in STEPS if s.name not in chosen}
    return run_kit(ctx, steps, args.budget, stand_ins, not_run)


if __name__ == "__main__":
    sys.exit(main())
