"""CLI: the tiny task (or SmolLM2's) through verl's real GPU path, "run this first on a new node"
(what recipe/rpg/tiny/run_tiny_gpu.sh calls; docs/gpu-smoke.md).

    python -m rpg_lab.demo.gpu_smoke [--model tiny|smol] [--qwen3] [--rollout vllm|hf] [--gpus 1] [--steps 4]
                                 [--resume-steps 2] [--resume-from DIR/ckpt/global_step_N] [--no-offload] [--out DIR]
                                 [key=value ...]

``--model tiny`` (default): the tiny model and task (``rpg.tiny``); ``--model smol``: SmolLM2-135M-Instruct and its
arithmetic task (``rpg.smol``, built as for the CPU demo; ``actor_rollout_ref.model.path=`` another copy of the
model, the wheel then not needed), with the CPU run's prompt and response lengths and its GPU sizes
(``rpg_lab.demo.smoke_settings.smoke_sizes``). The model and task are chosen as by the CPU demo
(``rpg.launch.rehearsal.CpuModel``). ``--qwen3``: the tiny task on the tiny model in Qwen3's shape (q/k norm,
``rpg.tiny.qwen3``), which vLLM runs on its newer model runner, as the paper's Qwen3-4B.

Two runs of the RPG recipe (RPG-REINFORCE-UFKL with RPG-Style Clip, 4 mini-batches per rollout
batch) with the settings of rpg_lab.demo.smoke_settings (vLLM or HF rollout, FSDP2 actor in bf16,
offload, periodic reference reset, schedule-free AdamW):

1. ``--steps`` steps from the model, validating before and after, saving a checkpoint at
   the last step;
2. a resume from that checkpoint for ``--resume-steps`` more steps (0: none). ``--resume-from`` runs
   only this one, from the checkpoint of an earlier run 1 with the same settings (the GPU kit's
   ``smoke_resume``, after its ``smoke_hf`` ran run 1 alone).

It prints a progress line per step, then the time per phase (verl's ``timing_s/*``), the actor's
peak GPU memory (verl's ``actor/perf/max_memory_*_gb``) and the node's peak GPU memory in use
(nvidia-smi, vLLM's memory included), and checks (rpg_lab.demo.smoke_checks): no non-finite metric,
the importance ratio leaves 1 and the KL estimate leaves 0, each update changes the actor, each
reference reset makes the reference compute what the actor computes, and the resumed run goes on
from the checkpoint's step. Each run's checks and figures go to ``summary.json`` as soon as it ends
(a run stopped later keeps the earlier one's). Each failure is one line; exit 1 if any, 2 for a bad
setting (before anything starts), 0 otherwise. Every ``key=value`` argument is passed to Hydra last (both runs).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from rpg.backends.gpu.preflight import ATTN_KEY, FLASH_ATTN, GpuProbe, GpuRequest, check
from rpg.backends.gpu.env_overrides import REGISTER_MODULE
from rpg_lab.demo import smoke_checks
from rpg_lab.demo.progress import StartupProgress, progress
from rpg.trainer_process import TrainerRun, TrainerRunError, run_trainer
from rpg.paths.checkout import CHECKOUT
from rpg.paths.user import user_folder
from rpg.override_lists import OverrideSyntaxError, check_user_overrides, hydra_value, values
from rpg_lab.demo.smoke_settings import (ALGORITHM, MODEL_PATH_KEY, ROLLOUTS, SmokeSettingsError, check_settings,
                                       gpu_overrides, head_dim, head_dim_problem, smoke_sizes)
from rpg.launch.args import OneLineParser, positive_seconds
from rpg.launch.environment import CPU_MODELS as MODELS
from rpg.launch.rehearsal import CpuModel

PREFIX = "[gpu-smoke]"
STARTUP_STAGES = (
    ("ray init kwargs:", "driver checks done; starting Ray (ray.init: GCS, dashboard process, raylet)"),  # verl's print
    ("Started a local Ray instance", "Ray started; starting the trainer process"),
    ("TaskRunner pid=", "trainer process up; building datasets, TransferQueue and the trainer"),
    ("create worker group", "starting the FSDP2 actor worker(s) on the GPU(s)"),
    ("actor and ref model engine initialized", "actor and reference ready; starting the rollout server(s)"),
    ("LLMServerManager:", "rollout server(s) ready; syncing weights"),
    ("all initialize finished", "all workers ready; validating before training"),
)
NVIDIA_SMI_EVERY_S = 2.0
# The run's private Ray (rpg.trainer_process) without the dashboard's web modules: nobody browses it, and ray.init
# waits for the dashboard process to publish its address (up to RAY_DASHBOARD_STARTUP_TIMEOUT_S, 60 s) after it
# started its 9 module processes (Ray 2.60). On a 2-core CPU machine ray.init took 59.6 s with them, 38.7-48.0 s
# without; on an H200 node 60 s of the 79 s before "Ray started" were inside ray.init (docs/gpu-smoke.md).
PRIVATE_RAY = ["+ray_kwargs.ray_init.include_dashboard=False"]
DEFAULT_STEPS = 4
# run_tiny_gpu.sh's variables and the flag each one sets (a bad value's line names both)
SCRIPT_ENV = {"--model": "MODEL", "--rollout": "ROLLOUT", "--gpus": "GPUS", "--steps": "STEPS",
              "--resume-steps": "RESUME_STEPS", "--out": "OUT"}


def say(text: str) -> None:
    print(f"{PREFIX} {text}", flush=True)


def parse_nvidia_smi(text: str) -> dict[int, float]:
    """``index, memory.used`` CSV lines (``--format=csv,noheader,nounits``) -> {gpu index: MiB}."""
    out = {}
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdecimal():
            try:
                out[int(parts[0])] = float(parts[1])
            except ValueError:
                continue
    return out


class GpuMemoryPeak:
    """Samples nvidia-smi every few seconds in a thread: the peak memory in use per GPU, all
    processes included (vLLM's weights and KV cache, the actor, the reference). No CUDA context
    is created in this process. Inactive when nvidia-smi is absent."""

    def __init__(self, every_s: float = NVIDIA_SMI_EVERY_S):
        self.exe = shutil.which("nvidia-smi")
        self.peak_mib: dict[int, float] = {}
        self._stop = threading.Event()
        self._every = every_s
        if self.exe:
            threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                text = subprocess.run([self.exe, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                                      capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                text = ""
            for gpu, mib in parse_nvidia_smi(text).items():
                self.peak_mib[gpu] = max(self.peak_mib.get(gpu, 0.0), mib)
            self._stop.wait(self._every)

    def stop(self) -> dict[int, float]:
        self._stop.set()
        return dict(self.peak_mib)


def preflight(rollout: str, gpus: int, user: list[str], probe: GpuProbe | None = None) -> None:
    """The driver's GPU rules (``rpg.backends.gpu.preflight.check``) for what the smoke run will ask,
    before anything starts: SmokeSettingsError (one line: the problems joined) otherwise. ``probe``:
    this node's facts (tests pass their own). The driver applies the same rules to the composed config."""
    attn = values(user).get(ATTN_KEY, FLASH_ATTN)  # Hydra's reading of the user's overrides
    report = check(GpuRequest(gpus_per_node=gpus, rollout=rollout, attn_implementation=attn),
                   probe or GpuProbe.of_this_node())
    if report.errors:
        raise SmokeSettingsError("; ".join(report.errors))


def smoke_overrides(assets, args, *, first: bool, ckpt: Path) -> list[str]:
    """All overrides of run 1 (``first``) or of the resumed run 2, before the user's: ``args.model``'s task with the
    smoke run's sizes for it. Run 2 resumes from ``args.resume_from`` when given, else from run 1's last checkpoint
    in ``ckpt``; both save into ``ckpt``."""
    from rpg.tiny.overrides import tiny_algorithm

    model = CpuModel(getattr(args, "model", "tiny"))
    sizes = smoke_sizes(model.name)
    total = args.steps if first else args.steps + args.resume_steps
    task = model.task_overrides(assets, steps=total, test_freq=total, **sizes)
    _, algo = tiny_algorithm("rpg", lr=args.lr, model=model.name)
    gpu = gpu_overrides(args.rollout, args.gpus, offload=not args.no_offload, mini_batch_size=sizes["mini_batch_size"],
                        n=sizes["n"], train_batch_size=sizes["train_batch_size"])
    run = [f"trainer.default_local_dir={hydra_value(str(ckpt), 'trainer.default_local_dir')}",
           f"trainer.save_freq={total}", "trainer.max_actor_ckpt_to_keep=2", *PRIVATE_RAY]
    if first:
        run += ["trainer.resume_mode=disable", "trainer.val_before_train=True"]
    else:
        source = getattr(args, "resume_from", None) or ckpt / f"global_step_{args.steps}"
        resume_from = hydra_value(str(source), "trainer.resume_from_path")
        run += ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={resume_from}",
                "trainer.val_before_train=False"]
    return [*task, *algo, *ALGORITHM, *gpu, *run]


def resume_source(path: Path, resume_steps: int) -> tuple[Path, int]:
    """(the checkpoint folder, its step) of ``--resume-from``: an existing ``global_step_N`` folder (verl's name),
    N >= 1; SmokeSettingsError (one line) otherwise."""
    step = path.name.removeprefix("global_step_")
    if not (path.name.startswith("global_step_") and step.isdecimal() and int(step) >= 1):
        raise SmokeSettingsError(f"--resume-from {path}: expected a checkpoint folder named global_step_N (N >= 1), "
                                 "as run 1 saves it under <out>/ckpt")
    if not path.is_dir():
        raise SmokeSettingsError(f"--resume-from {path}: no such folder (run 1 saves it under <out>/ckpt)")
    if resume_steps < 1:
        raise SmokeSettingsError(f"--resume-from {path} with RESUME_STEPS={resume_steps}: expected >= 1 step to resume")
    return path.resolve(), int(step)


def _one_run(name: str, overrides: list[str], out: Path, args, total: int) -> TrainerRun:
    startup = None if args.echo else StartupProgress(STARTUP_STAGES, PREFIX)
    say(f"{name}: full log {out / 'trainer.log'}")
    try:
        return run_trainer(
            overrides, output_dir=out, entry=args.entry, timeout_s=args.timeout, echo=args.echo, backend="gpu",
            extra_modules=[REGISTER_MODULE] if args.rollout == "hf" else [],
            on_metrics=None if args.echo else progress(total, PREFIX, startup),
            on_line=None if startup is None else startup.on_line,
        )
    finally:
        if startup is not None:
            startup.finish()


def model_config(path: str) -> dict:
    """The HF config of the model a user gave (``actor_rollout_ref.model.path``: a folder, or a hub name read from
    the hub as verl will); SmokeSettingsError (one line) when it cannot be read."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path).to_dict()
    except Exception as e:  # noqa: BLE001 - a missing folder, no hub, a bad name: one line whatever the cause
        first = (str(e).strip().splitlines() or [""])[0]
        raise SmokeSettingsError(f"{MODEL_PATH_KEY}={path}: cannot read its config ({type(e).__name__}: {first})") \
            from None


def main(argv: list[str] | None = None) -> int:
    from rpg.smol import SmolAssetError
    from rpg.tiny.overrides import RECIPE_ENTRY

    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, prefix=PREFIX,
                       env_of=SCRIPT_ENV)
    ap.add_argument("--model", default="tiny", choices=MODELS,
                    help="tiny (default): the tiny model and task; smol: SmolLM2-135M-Instruct and arithmetic")
    ap.add_argument("--qwen3", action="store_true", help="with --model tiny: the tiny model in Qwen3's shape "
                    "(q/k norm; rpg.tiny.qwen3), built from the tiny one")
    ap.add_argument("--rollout", default="vllm", help=f"rollout engine, one of {ROLLOUTS} (default vllm)")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs of this node to train on (data parallel; default 1)")
    ap.add_argument("--steps", type=int, default=None,
                    help="steps of the first run, checkpointed at its end (default 4; with --resume-from: its N)")
    ap.add_argument("--resume-steps", type=int, default=2, help="steps of the resumed run (default 2; 0: none)")
    ap.add_argument("--resume-from", type=Path, default=None, metavar="CKPT",
                    help="run only the resumed run, from this checkpoint of an earlier run 1 with the same settings "
                         "(its <out>/ckpt/global_step_N; N is the step it resumes from)")
    ap.add_argument("--no-offload", action="store_true",
                    help="keep the actor's parameters and optimizer state on the GPU (verl 0.9.1 keeps the "
                         "forward-only reference on the CPU either way)")
    ap.add_argument("--lr", type=float, default=None,
                    help="learning rate (default the CPU demo's: tiny 5e-4, smol 1e-5)")
    ap.add_argument("--out", type=Path, default=None,
                    help="output dir, relative to the current folder (default outputs/<model>_gpu/<time> in the "
                         "checkout)")
    ap.add_argument("--entry", default=str(CHECKOUT / RECIPE_ENTRY), help="trainer script (default the RPG recipe)")
    ap.add_argument("--timeout", type=positive_seconds, default=1800.0,
                    help="seconds before a run is killed (each run)")
    ap.add_argument("--echo", action="store_true", help="show the trainer's full output")
    try:
        args, user = ap.parse_known_args(argv)
    except SystemExit as e:  # --help (0) or a bad flag's one line (2: OneLineParser)
        return e.code
    model, sizes = CpuModel(args.model), smoke_sizes(args.model)
    args.lr = model.lr if args.lr is None else args.lr
    try:
        check_user_overrides(user)  # Hydra's grammar: a typo is one line here, not a traceback after Ray started
        if args.resume_from is not None:
            args.resume_from, step = resume_source(args.resume_from, args.resume_steps)
            if args.steps not in (None, step):
                raise SmokeSettingsError(f"--steps {args.steps} with --resume-from {args.resume_from}: the checkpoint "
                                         f"is step {step}; leave --steps out")
            args.steps = step
        args.steps = DEFAULT_STEPS if args.steps is None else args.steps
        check_settings(args.rollout, args.gpus, args.steps, args.resume_steps, sizes["mini_batch_size"], sizes["n"])
        if args.qwen3 and (args.model != "tiny" or MODEL_PATH_KEY in values(user)):
            raise SmokeSettingsError(f"--qwen3 is the tiny model in Qwen3's shape: with --model tiny and no "
                                     f"{MODEL_PATH_KEY}=")
        preflight(args.rollout, args.gpus, user)
    except (SmokeSettingsError, OverrideSyntaxError) as e:
        print(f"{PREFIX} {e}", file=sys.stderr)
        return 2

    out = user_folder(args.out or CHECKOUT / "outputs" / f"{model.name}_gpu" / time.strftime("%Y%m%d-%H%M%S"))
    user_model = values(user).get(MODEL_PATH_KEY)  # another copy of the model: SmolLM2's wheel is not needed
    try:
        assets = model.build(prefix=PREFIX, model=user_model is None)
        if args.qwen3:
            from rpg.tiny.qwen3 import build_tiny_qwen3

            user_model = build_tiny_qwen3(assets, prefix=PREFIX)
            user = [*user, f"{MODEL_PATH_KEY}={hydra_value(str(user_model), MODEL_PATH_KEY)}"]
        hf_config = (model_config(str(user_model)) if user_model is not None
                     else json.loads((assets.model_dir / "config.json").read_text()))
    except (SmolAssetError, SmokeSettingsError) as e:
        print(f"{PREFIX} {e}", file=sys.stderr)
        return 2
    shown = user_model if user_model is not None else model.folder(assets)
    problem = head_dim_problem(head_dim(hf_config))
    if problem:
        print(f"{PREFIX} {shown}: {problem}", file=sys.stderr)
        return 2
    ckpt = out / "ckpt"
    plan = [] if args.resume_from else [("run 1", True, args.steps)]
    if args.resume_steps:
        plan.append(("run 2 (resumed)", False, args.steps + args.resume_steps))
    what = (f"a resume from {args.resume_from} (step {args.steps}) for {args.resume_steps}" if args.resume_from else
            f"{args.steps} steps" + (f" + a resume for {args.resume_steps}" if args.resume_steps else " (no resume)"))
    say(f"{model.task}: {shown}; rollout={args.rollout}, {args.gpus} GPU(s), offload={not args.no_offload}; "
        f"{sizes['train_batch_size']} prompts x {sizes['n']} per step; {what}; output {out}")
    memory = GpuMemoryPeak()
    report: dict = {"model": args.model + ("_qwen3" if args.qwen3 else ""), "rollout": args.rollout, "gpus": args.gpus,
                    "offload": not args.no_offload, "output_dir": str(out), "runs": [name for name, _, _ in plan],
                    "device_peak_mib": {}}
    failures: list[str] = []
    out.mkdir(parents=True, exist_ok=True)
    try:
        for name, first, total in plan:
            ov = [*smoke_overrides(assets, args, first=first, ckpt=ckpt), *user]
            try:
                run = _one_run(name, ov, out / ("first" if first else "resumed"), args, total)
            except TrainerRunError as e:
                failures.append(f"{name} failed: {str(e).splitlines()[0]} (log tail above)")
                print(e, file=sys.stderr)
                break
            failures += run_checks(run, args, first)
            steps = smoke_checks.training_steps(run.metrics)
            say(f"{name}: {len(steps)} steps in {run.wall_time_s:.0f} s")
            for line in smoke_checks.summary_lines(run.metrics, steps):
                say(f"  {line}")
            report[name] = {"steps": steps, "wall_time_s": round(run.wall_time_s, 1),
                            "phases_s": smoke_checks.phase_times(run.metrics, steps),
                            **{key: smoke_checks.peak(run.metrics, key) for _, key in smoke_checks.MEMORY}}
            write_report(out, report, failures, memory.peak_mib)  # kept if a later run is stopped
    finally:
        device_peak = memory.stop()
    for gpu, mib in sorted(device_peak.items()):
        say(f"GPU {gpu}: peak memory in use {mib / 1024:.2f} GiB (nvidia-smi, every process)")
    write_report(out, report, failures, device_peak)
    for line in failures:
        print(f"{PREFIX} FAILED: {line}", file=sys.stderr)
    say(("FAILED" if failures else "passed") + f"; wrote {out / 'summary.json'}")
    return 1 if failures else 0


def run_checks(run: TrainerRun, args, first: bool) -> list[str]:
    """The failures of one finished run: run 1 trained steps 1..``args.steps``, the resumed run went on from the
    checkpoint's step; each with finite metrics, a ratio and a KL that left 1 and 0, updates and reference resets
    that changed something (``rpg_lab.demo.smoke_checks``), and with the HF rollout its weights on the GPU."""
    steps = smoke_checks.training_steps(run.metrics)
    failures = []
    if first and steps != list(range(1, args.steps + 1)):
        failures.append(f"run 1 trained steps {steps}, expected 1..{args.steps}")
    if not first:
        failures += smoke_checks.resumed_from(run.metrics, args.steps)
    failures += smoke_checks.check_training(run.metrics, steps)
    if args.rollout == "hf":
        failures += smoke_checks.hf_rollout_on_gpu(run.log)
    return failures


def write_report(out: Path, report: dict, failures: list[str], device_peak: dict[int, float]) -> None:
    """``out/summary.json``: the runs so far, their failures and the peak GPU memory seen so far."""
    data = {**report, "device_peak_mib": dict(device_peak), "failures": list(failures)}
    (out / "summary.json").write_text(json.dumps(data, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
