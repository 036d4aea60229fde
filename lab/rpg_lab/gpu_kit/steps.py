"""The GPU kit's steps (``STEPS``, in the order they run): each one's command, time box and the parsing of its output
into a result (its problems, a summary line); ``rpg_lab.gpu_kit.run`` runs them.

1. ``install``: the carry into ``--site`` (``rpg_lab.gpu_kit.install``); ``--installed`` skips it (packages
   installed with ``pip install -e ".[gpu]"``);
2. ``environment``: the GPU, driver, versions, that verl loads the RPG losses (``rpg_lab.gpu_kit.probe``);
3. ``memory_probe``: verl's FSDP2 actor at the paper's model widths, measured against the memory plan
   (``rpg_lab.gpu_kit.memory_probe``);
4. ``model_step``: RPG steps of a 0.1 B-parameter Qwen2-shaped model and of SmolLM2-135M's shape, random weights
   (``rpg_lab.gpu_kit.model_step``);
5. ``smoke_hf``: run 1 of ``rpg_lab.demo.gpu_smoke --rollout hf`` (SDPA attention without flash-attn), with its checks;
6. ``gpu_tests``: ``pytest -m gpu tests/gpu`` without the smoke run (step 5 runs it); not a default step (it has run);
7. ``bench_losses``: ``benchmarks/bench_losses.py --device cuda``, the RPG losses against verl's vanilla loss; not a
   default step (it has run);
8. ``smoke_resume``: the resumed run from ``smoke_hf``'s checkpoint (this call's, else the newest passed one under
   ``outputs/gpu_kit`` of this checkout): not a default step, as its second trainer start-up does not fit the
   default budget; a second call ``--steps smoke_resume`` on the same node runs it;
9. ``vllm_part``: not a default step: the vLLM parts a call carries into the vLLM site (``rpg_lab.gpu_kit.vllm_install``);
10. ``smoke_vllm``: run 1 with vLLM in eager mode (``enforce_eager``: no torch.compile, no CUDA graphs), skipped with
    its reason when vLLM is not installed (nor its site complete); not a default step: the last call of the vLLM
    parts runs it;
11. ``smoke_vllm_resume``: the resumed run from ``smoke_vllm``'s checkpoint, vLLM eager as there; a call of its own
    on the same node after it;
12. ``smoke_vllm_qwen3``: ``smoke_vllm`` on the tiny model in Qwen3's shape (``rpg.tiny.qwen3``: vLLM's newer model
    runner, the one Qwen3-4B runs on); not a default step: a call of its own;
13. ``smoke_vllm_compiled``: run 1 with vLLM as verl starts it (compiled, CUDA graphs), only once ``smoke_vllm``
    passed on this node; not a default step: a call of its own.

The order is docs/gpu-smoke.md's call order: what has never run on a GPU first.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rpg.paths.checkout import CHECKOUT

LOG_CAP_BYTES = 15 * 2**20  # a file back from the device machine: at most 16 MiB


@dataclass
class Context:
    out: Path
    work: Path
    carry: Path
    site: Path
    installed: bool
    python: str = sys.executable
    checkout: Path = CHECKOUT
    run_id: str = ""  # this run of the kit: its start time (rpg_lab.gpu_kit.run.start_run), in its files' names
    sample_s: float = 0.0  # --sample-stacks: every so many seconds each step's processes' stacks (0: never)

    def available(self, module: str) -> bool:
        """``module`` importable by the steps: in this interpreter, in the carry's site or in the complete vLLM
        site (``rpg_lab.gpu_kit.vllm_install``; the steps' path holds it, ``rpg_lab.gpu_kit.install.run_env``)."""
        if importlib.util.find_spec(module) is not None:
            return True
        from rpg_lab.gpu_kit.vllm_install import ready_site

        sites = [] if self.installed else [s for s in (self.site, ready_site()) if s is not None]
        return any((s / module).is_dir() or any(s.glob(f"{module}*.so")) for s in sites)


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


def cap_log(path: Path, limit: int = LOG_CAP_BYTES) -> None:
    """Keep a log under what comes back from the device machine: its first MiB and its end."""
    if not path.is_file() or path.stat().st_size <= limit:
        return
    with open(path, "rb") as f:
        head = f.read(2**20)
        f.seek(path.stat().st_size - (limit - 2**20 - 200))
        end = f.read()
    path.write_bytes(head + b"\n[... the middle of this log was cut by rpg_lab.gpu_kit.run ...]\n" + end)


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
    """rpg_lab.demo.gpu_smoke's summary.json (its failures are the step's problems); each run's trainer log is copied
    beside the step's log as ``<step>.<run id>.<first|resumed>.trainer.log`` (capped: its first MiB and its end),
    the driver's and Ray's start-up lines included."""
    for which in ("first", "resumed"):
        log = run.work / which / "trainer.log"
        if log.is_file():
            copy = run.log.with_name(f"{run.log.name.removesuffix('.log')}.{which}.trainer.log")
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
    return [ctx.python, "-m", "rpg_lab.gpu_kit.install", "--carry", str(ctx.carry), "--site", str(ctx.site),
            "--result", str(run.result_file)]


def _environment(ctx: Context, run: StepRun):
    return [ctx.python, "-m", "rpg_lab.gpu_kit.probe", "--result", str(run.result_file)]


def _gpu_tests(ctx: Context, run: StepRun):
    argv = [ctx.python, "-m", "pytest", "-m", "gpu", "tests/gpu", "--ignore=tests/gpu/test_gpu_smoke.py",
            "-v", "-rfEs", "-p", "no:cacheprovider", "--color=no"]
    if ctx.available("xdist"):  # the compiled-loss cases compile one by one: 8 workers share the node's cores
        argv += ["-n", "8"]
    return argv


def _bench(ctx: Context, run: StepRun):
    return [ctx.python, "benchmarks/bench_losses.py", "--device", "cuda"]


def passed_checkpoint(ctx: Context, step: str) -> Path | None:
    """The last checkpoint of ``step``'s smoke run 1 in this call's work folder, else in the newest earlier one under
    ``outputs/gpu_kit`` of the checkout (a call before on the same node), whose run 1 passed its checks (its
    summary.json: run 1 and no failure); what ``smoke_resume`` resumes (``smoke_hf``'s), what ``smoke_vllm_resume``
    resumes and what lets ``smoke_vllm_compiled`` run (``smoke_vllm``'s)."""
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

    here = passed(ctx.work / step)
    if here is not None:
        return here
    earlier = sorted(ctx.checkout.glob(f"outputs/gpu_kit/*/{step}"), key=lambda p: p.parent.name, reverse=True)
    return next((ckpt for folder in earlier if (ckpt := passed(folder)) is not None), None)


EAGER = "actor_rollout_ref.rollout.enforce_eager=True"  # vLLM without torch.compile and CUDA graphs


def _smoke(rollout: str, resume_of: str = "", overrides: tuple[str, ...] = (), after: str = "",
           flags: tuple[str, ...] = ()):
    """A smoke run's step: ``flags`` of ``rpg_lab.demo.gpu_smoke``, ``overrides`` appended (a resume takes its run 1's);
    ``after``: a step whose run 1 must have passed on this node; ``resume_of``: the step whose run 1's checkpoint
    this step resumes (the resumed run alone)."""
    def command(ctx: Context, run: StepRun):
        if rollout == "vllm" and not ctx.available("vllm"):
            return ("vLLM is not installed: the kit's carry holds no vLLM (183 MiB of xz with what it needs, over "
                    "what one device call carries); send the vLLM parts (python -m rpg_lab.gpu_kit.vllm_parts), one a "
                    "call, the last with --steps vllm_part,smoke_vllm, or install the gpu extra on a node with network")
        if after and passed_checkpoint(ctx, after) is None:
            return (f"no passed {after} run 1 on this node (this call's or under outputs/gpu_kit): run {after} "
                    f"first, then this one in a call of its own")
        # run 1 alone (its checks written when it ends); the resume is its own step, with a trainer start-up of its own
        argv = [ctx.python, "-m", "rpg_lab.demo.gpu_smoke", "--rollout", rollout, *flags, "--out", str(run.work),
                "--timeout", str(max(10, int(run.box_s - 15)))]
        if resume_of:
            ckpt = passed_checkpoint(ctx, resume_of)
            if ckpt is None:
                return (f"no checkpoint of a passed {resume_of} run 1 on this node (this call's or under "
                        f"outputs/gpu_kit): run {resume_of} first")
            argv += ["--resume-from", str(ckpt)]
        else:
            argv += ["--resume-steps", "0"]
        if not ctx.available("flash_attn"):
            from rpg.backends.gpu.preflight import ATTN_KEY

            argv.append(f"+{ATTN_KEY}=sdpa")
        return argv + list(overrides)
    return command


def _model_step(ctx: Context, run: StepRun):
    return [ctx.python, "-m", "rpg_lab.gpu_kit.model_step", "--device", "cuda", "--result", str(run.result_file)]


def _memory_probe(ctx: Context, run: StepRun):
    return [ctx.python, "-m", "rpg_lab.gpu_kit.memory_probe", "--device", "cuda", "--result", str(run.result_file)]


def _vllm_part(ctx: Context, run: StepRun):
    from rpg_lab.gpu_kit.vllm_install import PARTS_DIR, vllm_site

    parts = ctx.checkout / PARTS_DIR
    if not any(parts.glob("part-*.bin")) and not any(parts.glob("*/part-*.bin")):
        return (f"no vLLM part in this call's carry ({PARTS_DIR}/part-NN): build the parts (python -m "
                f"rpg_lab.gpu_kit.vllm_parts) and carry one")
    return [ctx.python, "-m", "rpg_lab.gpu_kit.vllm_install", "--parts", str(parts), "--site", str(vllm_site()),
            "--kit-site", str(ctx.site), "--result", str(run.result_file)]


# In the call order of docs/gpu-smoke.md: what has never run on a GPU first (the memory probe, SmolLM2's shape in the
# model step), then the smoke run (its driver start changed since it last ran): the default steps, 373 s on an H200
# (2026-11-28); the checks that have run (GPU tests, loss benchmark) and the resume are calls of their own.
# Boxes: about 1.2-3.6x what each step took on an NVIDIA H200 node (16 cores; docs/gpu-smoke.md#what-has-run-on-a-gpu),
# the slowest of the kit runs: install 16.9 s (5.2 s again), environment 23.7, memory_probe 84.2, model_step 25.2 (both
# shapes), smoke_hf's run 1 186-240 (start-up to all workers 107-166 s, validation, 4 steps, validation,
# checkpoint), gpu_tests 73.8, bench_losses 34.7, vllm_part 19.7. The resumed run (a second trainer start-up, 137 s
# in all there) does not fit after them: its own call.
RAN_BEFORE = ("it ran and passed on an NVIDIA H200 (2026-11-26, docs/gpu-smoke.md); a call of its own: "
              "--steps gpu_tests,bench_losses")
STEPS = [
    Step("install", 60, "the carry's wheels and the project installed offline; pip check", _install, read_result),
    Step("environment", 45, "GPU, driver, CUDA, package versions; verl loads the RPG losses", _environment,
         read_result),
    Step("memory_probe", 150, "verl's FSDP2 actor at the paper's widths (Qwen2.5-7B, Qwen3-4B; 1 and 2 layers, random "
         "weights): peak memory of the log-prob pass, the update and the optimizer step at the scripts' token budgets, "
         "against rpg.memory's plan", _memory_probe, read_result),
    Step("model_step", 60, "RPG steps of a 0.1 B-parameter Qwen2-shaped model and of SmolLM2-135M's shape at its GPU "
         "run's micro-batch (random weights) in bf16", _model_step, read_result),
    Step("smoke_hf", 270, "verl's GPU path with the HF rollout, run 1: bf16 FSDP2 actor, offload, schedule-free, "
         "reference reset, validation, checkpoint", _smoke("hf"), parse_smoke, grace_s=45),
    Step("gpu_tests", 120, "tests/gpu: bf16 losses on CUDA, compiled loss, offloaded reference copy, schedule-free "
         "with offload", _gpu_tests, parse_pytest,
         not_default=RAN_BEFORE),
    Step("bench_losses", 60, "RPG losses vs verl's vanilla loss on CUDA: time, memory, eager and compiled", _bench,
         parse_bench, not_default=RAN_BEFORE),
    Step("smoke_resume", 240, "the HF smoke run's resumed run from smoke_hf's checkpoint", _smoke("hf", resume_of="smoke_hf"),
         parse_smoke, grace_s=45, skip_is_fine=False,
         not_default="its run (137 s on an H200) does not fit the budget after the others (373 s); run it in a "
                     "second call on the same node: --steps smoke_resume"),
    # box: the vLLM wheel (420 MiB stored) joined, decompressed and installed, then import vllm (at most 75 s)
    Step("vllm_part", 120, "the vLLM parts this call carries, installed into the vLLM site outside the checkout "
         "(rpg_lab.gpu_kit.vllm_install); vLLM imported once all are in", _vllm_part, read_result, skip_is_fine=False,
         not_default="it installs the vLLM part a call carries (python -m rpg_lab.gpu_kit.vllm_parts): "
                     "--steps vllm_part,smoke_vllm with the last one"),
    # box: on the H200 (2026-11-30) the eager run 1 took 377 s, 100 s of it its first generation (not explained yet:
    # docs/gpu-smoke.md); 450 s is 1.2 times that and fits the last part's call (vllm_parts.smoke_room_s)
    Step("smoke_vllm", 450, "the smoke run's run 1 with vLLM in eager mode (enforce_eager: no torch.compile, no CUDA "
         "graphs): sleep/wake, weight sync through CUDA IPC", _smoke("vllm", overrides=(EAGER,)), parse_smoke,
         grace_s=45,
         not_default="its box (450 s) does not fit after the default steps; the last call of the vLLM parts runs it: "
                     "--steps vllm_part,smoke_vllm"),
    # box: the second vLLM start on the node (smoke_vllm_compiled's, 2026-11-30: 250 s for run 1 with validation
    # before and after 4 steps); the resumed run validates before and after its 2 steps and saves a checkpoint
    Step("smoke_vllm_resume", 360, "the vLLM smoke run's resumed run from smoke_vllm's checkpoint (eager, as run 1): "
         "verl's checkpoint restored into the actor and synced to a new vLLM engine",
         _smoke("vllm", resume_of="smoke_vllm", overrides=(EAGER,)), parse_smoke, grace_s=45, skip_is_fine=False,
         not_default="a call of its own after smoke_vllm passed on the same node: --steps smoke_vllm_resume"),
    Step("smoke_vllm_qwen3", 450, "smoke_vllm on the tiny model in Qwen3's shape (q/k norm, rpg.tiny.qwen3): vLLM's "
         "newer model runner, the paper's Qwen3-4B path", _smoke("vllm", overrides=(EAGER,), flags=("--qwen3",)),
         parse_smoke, grace_s=45,
         not_default="a call of its own, as smoke_vllm's: --steps smoke_vllm_qwen3 (box 450 s)"),
    # box: verl's default start compiles (VLLM_DISABLE_COMPILE_CACHE=1: cold every time) and captures CUDA graphs; a
    # comparable cold start took 127 s, 62 s of it compiling (vllm-project/vllm#43009), on top of the eager run's time
    Step("smoke_vllm_compiled", 520, "the smoke run's run 1 with vLLM as verl starts it (torch.compile, CUDA graphs "
         "FULL_AND_PIECEWISE), once smoke_vllm passed on this node", _smoke("vllm", after="smoke_vllm"), parse_smoke,
         grace_s=45, skip_is_fine=False,
         not_default="the compiled start runs in a call of its own once the eager smoke_vllm passed on this node: "
                     "--steps smoke_vllm_compiled"),
]
