"""Run the GPU kit on a node: install the carry, then the checks in order of value, each in its own time box,
``OUT/summary.json`` rewritten after each, one failing step never stopping the next.

    python3 -m rpg.gpu_kit.run --out DIR [--carry .gpu_kit] [--site .gpu_kit_site] [--budget 450]
                               [--steps NAME,...] [--box NAME=SECONDS] [--installed] [--stand-ins FILE]

Steps (``STEPS``, in order of value; ``--steps`` runs a subset, e.g. a rerun of the ones that failed, always with
``install`` unless ``--installed``: it only checks a site that holds the same carry):

1. ``install``: the carry into ``--site`` (``rpg.gpu_kit.install``); ``--installed`` skips it (packages
   installed with ``pip install -e ".[gpu]"``);
2. ``environment``: the GPU, driver, versions, that verl loads the RPG losses (``rpg.gpu_kit.probe``);
3. ``gpu_tests``: ``pytest -m gpu tests/gpu`` without the smoke run (step 5 runs it);
4. ``bench_losses``: ``benchmarks/bench_losses.py --device cuda``, the RPG losses against verl's vanilla loss;
5. ``smoke_hf``: run 1 of ``rpg.demo.gpu_smoke --rollout hf`` (SDPA attention without flash-attn), with its checks;
6. ``model_step``: RPG steps of a 0.1 B-parameter Qwen2-shaped model with random weights (``rpg.gpu_kit.model_step``);
7. ``smoke_resume``: the resumed run from ``smoke_hf``'s checkpoint (this call's, else the newest passed one under
   ``outputs/gpu_kit`` of this checkout): not a default step, as its second trainer start-up does not fit the
   default budget; a second call ``--steps smoke_resume`` on the same node runs it;
8. ``smoke_vllm``: run 1 with vLLM, skipped with its reason when vLLM is not installed.

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
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rpg.common.checkout import CHECKOUT
from rpg.gpu_kit import CARRY_DIR, DEFAULT_BUDGET_S, SITE_DIR

MIN_BOX_S = 20.0
LOG_CAP_BYTES = 15 * 2**20  # a file back from the device machine: at most 16 MiB
TAIL_LINES = 40
PREFIX = "[gpu-kit]"


@dataclass
class Context:
    out: Path
    work: Path
    carry: Path
    site: Path
    installed: bool
    python: str = sys.executable
    checkout: Path = CHECKOUT

    def available(self, module: str) -> bool:
        """``module`` importable by the steps: in this interpreter or in the carry's site."""
        if importlib.util.find_spec(module) is not None:
            return True
        return not self.installed and ((self.site / module).is_dir() or any(self.site.glob(f"{module}*.so")))


@dataclass
class Step:
    name: str
    box_s: float
    what: str
    command: Callable[[Context, "StepRun"], "list[str] | str"]  # argv, or the reason it is skipped
    parse: Callable[[Context, "StepRun"], dict]
    grace_s: float = 15.0
    skip_is_fine: bool = True  # a skip for the step's own reason (not the budget) leaves the exit code 0
    not_default: str = ""  # why a plain call does not run it (empty: a default step)


@dataclass
class StepRun:
    step: Step
    box_s: float
    log: Path
    work: Path
    result_file: Path


# ----------------------------------------------------------------------------- parsing each step's output

def read_result(ctx: Context, run: StepRun) -> dict:
    """The JSON result the step wrote (install, environment, model step)."""
    if not run.result_file.is_file():
        return {"problems": [f"the step wrote no result ({run.result_file.name})"]}
    return json.loads(run.result_file.read_text())


PYTEST_FINAL = re.compile(r"^=+ (.+?) in [\d.]+s(?: \([\d:]+\))? =+$")
PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)")


def parse_pytest(ctx: Context, run: StepRun) -> dict:
    """Counts from pytest's last line, and its short summary's FAILED/ERROR lines."""
    text = run.log.read_text(errors="replace") if run.log.is_file() else ""
    counts: dict[str, int] = {}
    failures = []
    for line in text.splitlines():
        m = PYTEST_FINAL.match(line.strip())
        if m:
            counts = {("error" if kind.startswith("error") else kind.rstrip("s") if kind.startswith("warning")
                       else kind): int(n) for n, kind in PYTEST_COUNT.findall(m.group(1))}
        if line.startswith(("FAILED ", "ERROR ")):
            failures.append(line[:400])
    result: dict = {"counts": counts, "failures": failures, "problems": []}
    if not counts:
        result["problems"].append("pytest printed no final count (killed, or it did not start)")
    elif counts.get("failed") or counts.get("error"):
        result["problems"].append(f"{counts.get('failed', 0)} failed, {counts.get('error', 0)} error(s)"
                                  + (f": {failures[0]}" if failures else ""))
    elif not counts.get("passed"):
        result["problems"].append("no test passed")
    result["line"] = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no count"
    return result


BENCH_HEADER = re.compile(r"^loss\s+ops\s+ops ratio\s+time ms\s+time ratio\s+peak MiB\s+mem ratio$")


def parse_bench(ctx: Context, run: StepRun) -> dict:
    """benchmarks/bench_losses.py's table: {row: {ops, ops_ratio, time_ms, time_ratio, peak_mib, mem_ratio}}."""
    lines = run.log.read_text(errors="replace").splitlines() if run.log.is_file() else []
    start = next((i for i, line in enumerate(lines) if BENCH_HEADER.match(line.strip())), None)
    rows: dict[str, dict] = {}
    if start is not None:
        for line in lines[start + 1:]:
            cells = line.rsplit(maxsplit=6)
            if len(cells) != 7:
                break
            try:
                values = [None if c == "-" else float(c) for c in cells[1:]]
            except ValueError:
                break
            rows[cells[0].strip()] = dict(zip(("ops", "ops_ratio", "time_ms", "time_ratio", "peak_mib", "mem_ratio"),
                                              values))
    result: dict = {"setting": lines[start - 1] if start else None, "rows": rows, "problems": []}
    if not rows:
        result["problems"].append("no table rows in the benchmark's output")
        return result
    eager = [r["time_ratio"] for n, r in rows.items() if n.startswith("rpg ") and "[" not in n]
    compiled = [r["time_ratio"] for n, r in rows.items() if n.endswith("[compiled]")]
    result["line"] = "; ".join(f"{what} RPG time {min(v):.2f}-{max(v):.2f} x vanilla" for what, v in
                               (("eager", eager), ("compiled", compiled)) if v)
    return result


TRAINER_LOG_CAP_BYTES = 4 * 2**20


def parse_smoke(ctx: Context, run: StepRun) -> dict:
    """rpg.demo.gpu_smoke's summary.json (its failures are the step's problems); each run's trainer log is copied
    into OUT as ``<step>.<first|resumed>.trainer.log`` (capped: its first MiB and its end), the driver's and Ray's
    start-up lines included."""
    for which in ("first", "resumed"):
        log = run.work / which / "trainer.log"
        if log.is_file():
            copy = ctx.out / f"{run.step.name}.{which}.trainer.log"
            copy.write_bytes(log.read_bytes())
            cap_log(copy, TRAINER_LOG_CAP_BYTES)
    path = run.work / "summary.json"
    if not path.is_file():
        return {"problems": [f"the smoke run wrote no {path.name}"]}
    summary = json.loads(path.read_text())
    summary["problems"] = list(summary.get("failures", []))
    parts = [f"{name}: {len(r.get('steps', []))} steps in {r.get('wall_time_s')} s" for name, r in summary.items()
             if name.startswith("run ") and isinstance(r, dict)]
    peaks = summary.get("device_peak_mib") or {}
    summary["line"] = "; ".join(parts + [f"GPU {g} peak {float(m) / 1024:.2f} GiB" for g, m in peaks.items()])
    return summary


# ----------------------------------------------------------------------------- the steps

def _install(ctx: Context, run: StepRun):
    if ctx.installed:
        return "--installed: the packages are installed (pip install -e \".[gpu]\")"
    return [ctx.python, "-m", "rpg.gpu_kit.install", "--carry", str(ctx.carry), "--site", str(ctx.site),
            "--result", str(run.result_file)]


def _environment(ctx: Context, run: StepRun):
    return [ctx.python, "-m", "rpg.gpu_kit.probe", "--result", str(run.result_file)]


def _gpu_tests(ctx: Context, run: StepRun):
    argv = [ctx.python, "-m", "pytest", "-m", "gpu", "tests/gpu", "--ignore=tests/gpu/test_gpu_smoke.py",
            "-v", "-rfEs", "-p", "no:cacheprovider", "--color=no"]
    if ctx.available("xdist"):  # the compiled-loss cases compile one by one: 8 workers share the node's cores
        argv += ["-n", "8"]
    return argv


def _bench(ctx: Context, run: StepRun):
    return [ctx.python, "benchmarks/bench_losses.py", "--device", "cuda"]


def resume_checkpoint(ctx: Context) -> Path | None:
    """The checkpoint ``smoke_resume`` resumes: the last one of ``smoke_hf``'s run 1 in this call's work folder, else
    in the newest earlier one under ``outputs/gpu_kit`` of the checkout (a second call on the same node), whose
    run 1 passed its checks (its summary.json: run 1 and no failure)."""
    def passed(folder: Path) -> Path | None:
        summary = folder / "summary.json"
        try:
            data = json.loads(summary.read_text())
        except (OSError, ValueError):
            return None
        if "run 1" not in data or data.get("failures"):
            return None
        steps = data["run 1"].get("steps") or []
        ckpt = folder / "ckpt" / f"global_step_{steps[-1]}" if steps else None
        return ckpt if ckpt is not None and ckpt.is_dir() else None

    here = passed(ctx.work / "smoke_hf")
    if here is not None:
        return here
    earlier = sorted(ctx.checkout.glob("outputs/gpu_kit/*/smoke_hf"), key=lambda p: p.parent.name, reverse=True)
    return next((ckpt for folder in earlier if (ckpt := passed(folder)) is not None), None)


def _smoke(rollout: str, resume: bool = False):
    def command(ctx: Context, run: StepRun):
        if rollout == "vllm" and not ctx.available("vllm"):
            return ("vLLM is not installed: the kit carries no vLLM (its wheels with their dependencies are about "
                    "500 MiB, over what one device call carries); install the gpu extra on a node with network")
        # run 1 alone (its checks written when it ends); the resume is its own step, with a trainer start-up of its own
        argv = [ctx.python, "-m", "rpg.demo.gpu_smoke", "--rollout", rollout, "--out", str(run.work),
                "--timeout", str(max(10, int(run.box_s - 15)))]
        if resume:
            ckpt = resume_checkpoint(ctx)
            if ckpt is None:
                return ("no checkpoint of a passed smoke_hf run 1 on this node (this call's or under outputs/gpu_kit): "
                        "run smoke_hf first")
            argv += ["--resume-from", str(ckpt)]
        else:
            argv += ["--resume-steps", "0"]
        if not ctx.available("flash_attn"):
            from rpg.backends.gpu.preflight import ATTN_KEY

            argv.append(f"+{ATTN_KEY}=sdpa")
        return argv
    return command


def _model_step(ctx: Context, run: StepRun):
    return [ctx.python, "-m", "rpg.gpu_kit.model_step", "--device", "cuda", "--result", str(run.result_file)]


# Boxes: about 1.1-2x what each step took on an NVIDIA H200 node (16 cores; docs/gpu-smoke.md#what-has-run-on-a-gpu):
# install 10.4 s (5.2 s again), environment 18.4, gpu_tests 73.8, bench_losses 25.2, smoke_hf's run 1 about 240
# (79 s of start-up before Ray, 166 s to all workers, validation, 4 steps, validation, checkpoint), model_step 16.4:
# 390 s in all, within DEFAULT_BUDGET_S. The resumed run needs a second start-up (about 170 s), hence its own call.
STEPS = [
    Step("install", 60, "the carry's wheels and the project installed offline; pip check", _install, read_result),
    Step("environment", 45, "GPU, driver, CUDA, package versions; verl loads the RPG losses", _environment,
         read_result),
    Step("gpu_tests", 120, "tests/gpu: bf16 losses on CUDA, compiled loss, offloaded reference copy, schedule-free "
         "with offload", _gpu_tests, parse_pytest),
    Step("bench_losses", 60, "RPG losses vs verl's vanilla loss on CUDA: time, memory, eager and compiled", _bench,
         parse_bench),
    Step("smoke_hf", 270, "verl's GPU path with the HF rollout, run 1: bf16 FSDP2 actor, offload, schedule-free, "
         "reference reset, validation, checkpoint", _smoke("hf"), parse_smoke, grace_s=45),
    Step("model_step", 45, "RPG steps of a 0.1 B-parameter Qwen2-shaped model (random weights) in bf16",
         _model_step, read_result),
    Step("smoke_resume", 240, "the HF smoke run's resumed run from smoke_hf's checkpoint", _smoke("hf", resume=True),
         parse_smoke, grace_s=45, skip_is_fine=False,
         not_default="its second trainer start-up (about 170 s) does not fit one call after the others; run it in a "
                     "second call on the same node: --steps smoke_resume"),
    Step("smoke_vllm", 300, "the smoke run's run 1 with vLLM: sleep/wake, weight sync through CUDA IPC",
         _smoke("vllm"), parse_smoke, grace_s=45),
]


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


def cap_log(path: Path, limit: int = LOG_CAP_BYTES) -> None:
    """Keep a log under what comes back from the device machine: its first MiB and its end."""
    if not path.is_file() or path.stat().st_size <= limit:
        return
    with open(path, "rb") as f:
        head = f.read(2**20)
        f.seek(path.stat().st_size - (limit - 2**20 - 200))
        end = f.read()
    path.write_bytes(head + b"\n[... the middle of this log was cut by rpg.gpu_kit.run ...]\n" + end)


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
    work = args.work or CHECKOUT / "outputs" / "gpu_kit" / time.strftime("%Y%m%d-%H%M%S")
    ctx = Context(out=args.out.resolve(), work=work.resolve(), carry=args.carry.resolve(), site=args.site.resolve(),
                  installed=args.installed)
    steps = [replace(s, box_s=boxes.get(s.name, s.box_s)) for s in STEPS if s.name in chosen]
    not_run = {s.name: (f"not a default step: {s.not_default}" if s.not_default and args.steps is None
                        else "not in --steps") for s in STEPS if s.name not in chosen}
    return run_kit(ctx, steps, args.budget, stand_ins, not_run)


if __name__ == "__main__":
    sys.exit(main())
