"""Run the GPU kit on a node: install the carry, then the checks in order of value, each in its own time box,
``OUT/summary.json`` rewritten after each, one failing step never stopping the next.

    python3 -m rpg_lab.gpu_kit.run --out DIR [--carry .gpu_kit] [--site .gpu_kit_site] [--budget 450]
                               [--steps NAME,...] [--box NAME=SECONDS] [--installed] [--stand-ins FILE]

The steps are ``rpg_lab.gpu_kit.steps``'s ``STEPS``; ``--steps`` runs a subset, e.g. a rerun of the ones that failed,
always with ``install`` unless ``--installed`` (it only checks a site that holds the same carry).
A step not run (not a default step, not in ``--steps``) is listed in the summary's ``not_run`` with why.
A step gets ``min(its box, what is left of --budget)``; one that would get less than its box and less than
``MIN_BOX_S`` is skipped with that reason. Past its box the step's process group gets SIGTERM, then SIGKILL
after the step's grace (at once for what is left of it once the step's own process has exited), and it is
recorded as timed out; in the box's last seconds, and before a stop signal's SIGTERM, each Python process of the
step dumps its stacks and Ray's logs are copied into OUT (``rpg_lab.gpu_kit.stall``). A step's entry names the vLLM
start-up phases its logs show (``phases``; the last one in a timed-out step's reason).
Each run of the kit has an id, its start time (``-2``, ... when OUT holds a run of that
second): each step's output goes to ``OUT/<name>.<run id>.log``, read by the step's parser alone, so a rerun
into the same OUT reports its own output; ``OUT/summary.json`` (the run id, each step's status, seconds, PID,
log, its parsed result and, for a failure, the log's last lines) describes the latest run, the one before is
kept as ``OUT/summary.<its run id>.json``; a run into an OUT another run still writes is refused in one line (a lock
on OUT, ended with its holder), and an error writing OUT (a full disk) ends the run, named in the summary's
``failure`` or, when even that cannot be written, in one line. SIGHUP, SIGINT or SIGTERM to the kit stops the
running step's process group the same way, records it as stopped and the steps after it as not started, and exits
128 + the signal.
Exit 0 when every step passed or was skipped for a reason of its own (vLLM absent, ``--installed``), else 1.

``--stand-ins FILE`` (JSON ``{step: argv}``) replaces steps' commands, for walking the kit on a machine without
a GPU (tests/lab/gpu_kit/test_gpu_kit.py); ``{python}`` in an argv is this interpreter. Each step's process gets
``RPG_GPU_KIT_RESULT`` (a JSON result file it may write), ``RPG_GPU_KIT_WORK`` (its folder) and
``RPG_GPU_KIT_BOX_S``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from rpg.trainer_process.reaping import exited_unreaped
from rpg.paths.checkout import CHECKOUT
from rpg.stop_signals import raise_on_stop_signals
from rpg_lab.gpu_kit import CARRY_DIR, DEFAULT_BUDGET_S, KIT_VLLM_ENV, SITE_DIR, foreign, lock_folder, say, stall
from rpg_lab.gpu_kit.steps import STEPS, Context, Step, StepRun, cap_log
from rpg.launch.args import OneLineParser, positive_seconds

MIN_BOX_S = 20.0
TAIL_LINES = 40
PREFIX = "[gpu-kit]"


# ----------------------------------------------------------------------------- the runner

def write_json(path: Path, data: dict) -> None:
    """Atomically: a reader (or a copy after a kill) sees the old file or the new one, never a part."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
        os.replace(tmp, path)
    except OSError as e:  # a full disk: the part written is given back, the error names the file
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from e


def tail(path: Path, n: int = TAIL_LINES) -> list[str]:
    if not path.is_file():
        return []
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 64 * 1024))
        return f.read().decode(errors="replace").splitlines()[-n:]


MIN_SAMPLE_S = 1.0  # --sample-stacks: every process of a step dumps all its threads at each sample


def sample_seconds(text: str) -> float:
    """argparse type of ``--sample-stacks``: seconds, at least ``MIN_SAMPLE_S``."""
    value = positive_seconds(text)
    if value < MIN_SAMPLE_S:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected at least {MIN_SAMPLE_S:g} s between samples")
    return value


def _kill_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the step's process group (the step started it: its pgid is its pid); once the step's own process
    has exited, or after ``grace_s``, SIGKILL to what is left of the group. The step is reaped only then, so that
    its pid, the group's id, is never another process's when signalled."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    if exited_unreaped(proc.pid, grace_s) is not None:  # None: reaped already, the pid no longer ours
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10.0)


def _wait(proc: subprocess.Popen, box_s: float, stop: list[int]) -> str:
    """How the step ended: "exited", "timed_out" (still running after ``box_s``) or "stopped" (``stop`` holds the
    signal the kit got; looked at every 0.1 s)."""
    deadline = time.monotonic() + box_s
    while not stop:
        left = deadline - time.monotonic()
        if left <= 0:
            return "timed_out"
        try:
            proc.wait(timeout=min(0.1, left))
            return "exited"
        except subprocess.TimeoutExpired:
            pass
    return "stopped"


def run_step(ctx: Context, step: Step, box_s: float, env: dict, argv_override: list[str] | None,
             stop: list[int] | None = None, on_start=None) -> dict:
    """One step: ``stop`` holds the stop signal the kit got (empty until then), ``on_start(pid)`` is called once
    the step's process is started."""
    stop = [] if stop is None else stop
    work = ctx.work / step.name
    work.mkdir(parents=True, exist_ok=True)
    run = StepRun(step, box_s, ctx.out / f"{step.name}.{ctx.run_id}.log", work, work / f"result.{ctx.run_id}.json")
    record: dict = {"box_s": round(box_s)}
    argv = argv_override if argv_override is not None else step.command(ctx, run)
    if isinstance(argv, str):
        return {**record, "status": "skipped", "reason": argv, "fine": step.skip_is_fine}
    argv = [ctx.python if a == "{python}" else a for a in argv]
    stacks, stem = work / f"stacks.{ctx.run_id}", f"{step.name}.{ctx.run_id}"
    step_env = {**stall.hook_env(env, stacks), "RPG_GPU_KIT_RESULT": str(run.result_file),
                "RPG_GPU_KIT_WORK": str(work), "RPG_GPU_KIT_BOX_S": str(int(box_s))}
    record["command"] = " ".join(argv)
    t0 = time.time()
    with open(run.log, "xb") as log:  # a new file: the run id is new in OUT
        log.write(f"{PREFIX} run {ctx.run_id} {step.name}: {record['command']}\n".encode())
        log.flush()
        proc = subprocess.Popen(argv, cwd=ctx.checkout, env=step_env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        record["pid"] = proc.pid  # its process group's id too
        if on_start is not None:
            on_start(proc.pid)
        last_s = min(stall.STACKS_S, box_s / 2)  # the box's end: where it was
        started, samples, sample_problem = time.monotonic(), 0, None
        ended = _wait(proc, min(ctx.sample_s or box_s, box_s - last_s), stop)
        while ctx.sample_s and ended == "timed_out" and time.monotonic() - started < box_s - last_s:  # a sample's time
            try:
                samples += stall.sample(proc.pid, stacks, time.monotonic() - started) > 0
            except Exception as e:  # noqa: BLE001 - the step runs on in its box whatever a sample meets
                sample_problem = f"{type(e).__name__}: {e}"
            ended = _wait(proc, min(ctx.sample_s, box_s - last_s - (time.monotonic() - started)), stop)
        if ended != "exited":
            try:  # the stacks and logs into OUT (a full disk may fail it), then the group stopped whatever happened
                record["stall"] = stall.before_stop(proc.pid, stacks, ctx.out, stem, last_s)
            finally:
                _kill_group(proc, step.grace_s)
    record["seconds"] = round(time.time() - t0, 1)
    record["returncode"] = proc.returncode
    if samples or sample_problem:
        record["samples"] = {"every_s": ctx.sample_s, "taken": samples, "file": f"{stem}.samples.txt"}
        try:
            record["samples"]["processes"] = stall.gather(stacks, ctx.out / f"{stem}.samples.txt")
        except OSError as e:  # a full disk: the step's own result stands
            sample_problem = sample_problem or f"{e.filename}: {e.strerror}"
        if sample_problem:
            record["samples"]["problem"] = sample_problem
    cap_log(run.log)
    try:
        result = step.parse(ctx, run)
    except Exception as e:  # noqa: BLE001 - an unreadable output is the step's failure, not the kit's
        result = {"problems": [f"its output could not be read: {type(e).__name__}: {e}"]}
    problems = result.get("problems") or []
    found = stall.phases(sorted(ctx.out.glob(f"{stem}.*.log")) + [run.log] + sorted(ctx.out.glob(f"{stem}.ray/**/*")))
    if found["reached"]:
        record["phases"] = found
    last = f"; last phase: {found['last']}" if found["last"] else ""
    if ended == "stopped":
        record.update(status="stopped", reason=f"the kit got {signal.Signals(stop[0]).name}: the step's process "
                                               f"group was stopped{last}")
    elif ended == "timed_out":
        record.update(status="timed_out", reason=f"still running after its {box_s:.0f} s box: stopped{last}")
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


def _first_free(base: str, taken) -> str:
    """``base``, else ``base-2``, ``base-3``, ...: the first of them for which ``taken`` is false."""
    return next(c for n in itertools.count(1) if not taken(c := base if n == 1 else f"{base}-{n}"))


def start_run(out: Path) -> tuple[str, str | None]:
    """This run's id (its start time) and the name under which the previous run's ``summary.json`` in ``out`` is
    kept (``summary.<its run id>.json``; None: there was none)."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    kept = None
    previous = out / "summary.json"
    if previous.is_file():
        try:
            old = json.loads(previous.read_text()).get("run_id")
        except (ValueError, AttributeError):  # not JSON, or not an object
            old = None
        if not (isinstance(old, str) and re.fullmatch(r"[\w-]+", old)):  # a summary of an older kit: no run id
            old = f"before-{stamp}"
        kept = f"summary.{_first_free(old, lambda c: (out / f'summary.{c}.json').exists())}.json"
        os.replace(previous, out / kept)
    names = [p.name for p in out.iterdir()]  # a run of this second already there (its logs, its summary)
    return _first_free(stamp, lambda c: any(f".{c}." in name for name in names)), kept


def run_kit(ctx: Context, steps: list[Step], budget_s: float, stand_ins: dict[str, list[str]] | None = None,
            not_run: dict[str, str] | None = None, kept: str | None = None) -> int:
    """The steps in order; ``not_run``: {step: why it is not run}, listed in the summary; ``kept``: where
    ``start_run`` kept the previous summary (when ``ctx.run_id`` is empty, this call starts the run itself)."""
    if not ctx.run_id:
        ctx.run_id, kept = start_run(ctx.out)
    stand_ins = stand_ins or {}
    t0 = time.time()
    deadline = t0 + budget_s
    summary: dict = {
        "kit": "rpg_lab.gpu_kit.run", "run_id": ctx.run_id, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "pid": os.getpid(), "budget_s": budget_s, "checkout": str(ctx.checkout), "work": str(ctx.work),
        "site": None if ctx.installed else str(ctx.site), "stand_ins": sorted(stand_ins),
        "previous_summary": kept, "finished": False,
        "steps": [{"name": s.name, "what": s.what, "status": "pending"} for s in steps],
        "not_run": [{"name": name, "reason": why} for name, why in (not_run or {}).items()],
    }
    path = ctx.out / "summary.json"
    say(PREFIX, f"run {ctx.run_id}: logs {ctx.out}/<step>.{ctx.run_id}.log"
        + (f"; the previous run's summary is kept as {kept}" if kept else ""))
    from rpg_lab.gpu_kit.install import run_env

    def step_env() -> dict[str, str]:  # each step's: the vLLM site a vllm_part step completes is on the next's path
        env = run_env(ctx.site, ctx.checkout) if not ctx.installed else {**KIT_VLLM_ENV, **os.environ}
        return {**env, "PYTHONUNBUFFERED": "1"}

    # SIGHUP/SIGINT/SIGTERM only recorded (never raised mid-way): the running step is stopped, the rest not started
    handlers = raise_on_stop_signals()
    handlers.hold()
    stop = handlers.received
    i, failure = -1, None
    try:
        ctx.work.mkdir(parents=True, exist_ok=True)
        write_json(path, summary)
        for i, step in enumerate(steps):
            entry = summary["steps"][i]
            left = deadline - time.time()
            box = min(step.box_s, left - step.grace_s - 5)
            if stop:
                entry.update(status="skipped", reason=f"not started: the kit got {signal.Signals(stop[0]).name}",
                             fine=False)
            elif box < min(step.box_s, MIN_BOX_S):
                entry.update(status="skipped", reason=f"not started: {max(0, left):.0f} s of the {budget_s:.0f} s "
                                                      f"budget left", fine=False)
            else:
                say(PREFIX, f"{i + 1}/{len(steps)} {step.name} (box {box:.0f} s): {step.what}")

                def started(pid: int, entry: dict = entry, name: str = step.name) -> None:
                    entry.update(status="running", pid=pid, log=f"{name}.{ctx.run_id}.log")
                    with contextlib.suppress(OSError):  # the step runs on in its box; the write after it fails too
                        write_json(path, summary)

                entry.update(run_step(ctx, step, box, step_env(), stand_ins.get(step.name), stop, started))
            line = entry.get("result", {}).get("line") or entry.get("reason", "")
            say(PREFIX, f"{i + 1}/{len(steps)} {step.name}: {entry['status'].upper()}"
                + (f" in {entry['seconds']} s" if "seconds" in entry else "") + (f": {line}" if line else ""))
            write_json(path, summary)
    except OSError as e:  # a full disk, a folder that cannot be made: this step failed with it, the rest not started
        failure = f"the kit stopped on an OS error: {e.filename or ctx.out}: {e.strerror or e}"
        for j, entry in enumerate(summary["steps"]):
            entry.pop("tail", None)  # the logs hold these lines: a smaller summary for a disk with little room
            if entry["status"] in ("pending", "running"):
                entry.update(status="failed" if j == i else "skipped", fine=False,
                             reason=failure if j == i else f"not started: {failure}")
    finally:
        handlers()
    summary["finished"] = True
    summary["seconds"] = round(time.time() - t0, 1)
    if failure:
        summary["failure"] = failure
    ok = not failure and not stop and all(s["status"] == "passed" or (s["status"] == "skipped" and s.get("fine"))
                                          for s in summary["steps"])
    summary["all_passed"] = ok
    if stop:
        summary["stopped_by"] = signal.Signals(stop[0]).name
    try:
        write_json(path, summary)
    except OSError as e:
        at = "ran its steps" if not failure else "stopped before its first step" if i < 0 else \
            f"stopped at step {i + 1} of {len(steps)}, {steps[i].name}"
        print(f"{PREFIX} {e.filename}: cannot be written ({e.strerror}); the kit {at}", file=sys.stderr, flush=True)
        return 1
    if failure:
        say(PREFIX, failure)
    for entry in summary["not_run"]:
        say(PREFIX, f"not run: {entry['name']}: {entry['reason']}")
    if stop:
        say(PREFIX, f"stopped by {summary['stopped_by']} after {summary['seconds']} s; {path}")
        return 128 + stop[0]
    say(PREFIX, f"{'all steps passed' if ok else 'NOT all steps passed'} in {summary['seconds']} s; {path}")
    return 0 if ok else 1


INSTALLED_STACK = ("verl", "ray", "hydra", "transformers", "tensordict")  # what every trainer step imports


def missing_stack() -> list[str]:
    """The modules of ``INSTALLED_STACK`` this interpreter cannot import (``--installed`` runs with no carry)."""
    import importlib.util

    return [name for name in INSTALLED_STACK if importlib.util.find_spec(name) is None]


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, prefix=PREFIX)
    ap.add_argument("--out", type=Path, required=True, help="summary.json and the steps' logs (the device call's $OUT)")
    ap.add_argument("--carry", type=Path, default=CHECKOUT / CARRY_DIR, help=f"the carry (default {CARRY_DIR})")
    ap.add_argument("--site", type=Path, default=CHECKOUT / SITE_DIR, help=f"install target (default {SITE_DIR})")
    ap.add_argument("--work", type=Path, default=None,
                    help="the steps' own outputs (default outputs/gpu_kit/<time> in the checkout)")
    ap.add_argument("--budget", type=positive_seconds, default=DEFAULT_BUDGET_S, help=f"seconds for all steps "
                    f"(default {DEFAULT_BUDGET_S})")
    ap.add_argument("--steps", default=None, help="comma-separated subset, in the kit's order "
                    f"({','.join(s.name for s in STEPS)})")
    ap.add_argument("--box", action="append", default=[], metavar="STEP=SECONDS",
                    help="another time box for a step (repeatable), e.g. smoke_hf=300 on a rerun")
    ap.add_argument("--installed", action="store_true", help="use the installed packages; no carry")
    ap.add_argument("--stand-ins", type=Path, default=None, help="JSON {step: argv} replacing steps' commands")
    ap.add_argument("--sample-stacks", type=sample_seconds, default=0.0, metavar="SECONDS",
                    help="every SECONDS, each step's processes' Python stacks, gathered into "
                         "OUT/<step>.<run id>.samples.txt when it ends (default: only when a step is stopped)")
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
        if name not in names:
            ap.error(f"--box {text}: a step name ({', '.join(names)}) and a positive number of seconds")
        try:
            boxes[name] = positive_seconds(seconds)
        except argparse.ArgumentTypeError as e:
            ap.error(f"--box {text}: SECONDS {e}")
    if args.budget < MIN_BOX_S:
        ap.error(f"--budget must be >= {MIN_BOX_S:g} s")
    missing = missing_stack() if args.installed else []
    if missing:  # without it each step would fail on its own ModuleNotFoundError
        ap.error(f"--installed: {', '.join(missing)} cannot be imported by {sys.executable}; "
                 f"leave out --installed to install the carry (a warm node keeps its site: seconds)")
    from rpg_lab.gpu_kit.install import STATE

    refused = None if args.installed or "install" not in chosen else foreign(args.site.resolve(), STATE)
    if refused:
        ap.error(f"--site {refused}")
    out = args.out.resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        ap.error(f"--out {out}: cannot be made ({e.strerror})")
    held = lock_folder(out)  # held until the run ends (closed below)
    if held is None:
        ap.error(f"--out {out}: another run of the kit is writing there (PID {running_pid(out)}); wait for it or give "
                 f"another --out")
    run_id, kept = start_run(out)
    work = args.work or CHECKOUT / "outputs" / "gpu_kit" / run_id
    ctx = Context(out=args.out.resolve(), work=work.resolve(), carry=args.carry.resolve(), site=args.site.resolve(),
                  installed=args.installed, run_id=run_id, sample_s=args.sample_stacks)
    steps = [replace(s, box_s=boxes.get(s.name, s.box_s)) for s in STEPS if s.name in chosen]
    not_run = {s.name: (f"not a default step: {s.not_default}" if s.not_default and args.steps is None
                        else "not in --steps") for s in STEPS if s.name not in chosen}
    try:
        return run_kit(ctx, steps, args.budget, stand_ins, not_run, kept)
    finally:
        os.close(held)


def running_pid(out: Path) -> str:
    """The PID of the run whose summary is in ``out``, as it wrote it ("unknown" without one)."""
    try:
        return str(json.loads((out / "summary.json").read_text())["pid"])
    except (OSError, ValueError, TypeError, KeyError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
