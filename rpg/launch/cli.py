"""Launcher behind every paper script: ``python -m rpg.launch <run name> [hydra overrides ...]``.

``recipe/rpg/{7b,4b}/<name>.sh`` only call ``recipe/rpg/launch.sh <their own name> "$@"``, which
calls this module. The name is parsed by ``rpg.launch.variants`` (the single source of truth), the
environment adds paths, cluster size and loggers, and the user's overrides come last (they win).

Modes (environment variables; defaults in brackets):

* ``DRY_RUN=1``: compose the full config with Hydra's compose API against recipe/rpg/config,
  run the driver-side checks (``rpg.verl.main.prepare_config``: the ``rpg:`` validation and
  translation, then verl 0.9.1's ``validate_config``), print it and the command, exit. No Ray,
  no GPU. A bad value is the driver's one line (exit 2), and so is every other problem of the input paths
  (``rpg.verl.input_paths.refusals``: an existing data file in the wrong layout or with a ``data_source`` no
  reward function scores, an empty list, ...); an input path missing on this machine (data file, local
  model, ...: ``rpg.data.checks.Absent``) is a warning, since a dry run may be made away from the data,
  and so is each refusal the driver would make on this node (no CUDA, too few GPUs, an old driver,
  no vLLM or flash-attn: ``rpg.backends.gpu.preflight``), since it may be made on a laptop. With
  ``RAY_ADDRESS`` the input problems stay warnings (the submission leaves them to the driver on the cluster).
* ``RPG_BACKEND=cpu``: the same overrides on the CPU backend (``rpg.backends.cpu``) with the tiny
  model/task of ``rpg.tiny`` replacing model, data and sizes; the variant's algorithm settings stay.
  Runs through ``rpg.launch.harness`` (output in ``OUT_DIR``). World size 1 unless ``N_GPUS_PER_NODE``
  / ``NNODES`` (or ``trainer.n_gpus_per_node`` / ``trainer.nnodes``) are set: that many gloo FSDP ranks
  on this machine, the tiny task's micro-batches split over them.
* ``RAY_ADDRESS`` set (e.g. ``http://127.0.0.1:8265``): ``ray job submit`` to that cluster (checked first: an
  address that is not a job API's, or where no cluster answers or the token is refused, is one line,
  ``rpg.launch.ray_job_api``), with a submission id ``rpg-<time>-<hex>`` and the command that resumes it
  (``rpg.common.override_lists.resume_command``: the driver's stop line names it); ``RAY_JOB_WAIT=1`` follows the
  job, and Ctrl-C then stops the job (``ray job stop``). With ``RPG_BACKEND=cpu`` the tiny run goes to the cluster as a CPU-backend
  job, one rank per logical GPU (the rehearsal of a multi-node launch, docs/launch-scripts.md).
  The runtime env only carries environment variables (no working-dir upload): every node needs
  this project installed (``pip install -e .``) at ``RPG_CLUSTER_ROOT`` (absolute; default: this
  checkout). Every default path (entry script, data, checkpoints, logs) is then under
  ``RPG_CLUSTER_ROOT``; input paths missing on this machine are a one-line note, the driver checks
  them on the cluster before Ray starts.
* otherwise: ``python recipe/rpg/main_rpg.py <overrides>`` on this machine (exec).

Memory: ``--describe NAME [--gpu-mem-gib G] [--host-mem-gib H] [overrides]`` and ``DRY_RUN=1`` (GPU
size ``RPG_GPU_MEM_GIB``, default 79.6 GiB = an 80 GB card; node RAM ``RPG_HOST_MEM_GIB``, default
2000 GiB) print ``rpg.launch.memory``'s per-GPU memory estimate and ``rpg.launch.memory.host``'s host RAM per node,
each with a FITS / DOES NOT FIT verdict, and the checkpoint disk of the run (docs/memory.md).

Other variables: MODEL_PATH [variant's HF id], DATA_DIR [<root>/data], TRAIN_FILE
[$DATA_DIR/dapo-math-17k-en.parquet], VAL_FILES [variant's sets in $DATA_DIR, comma or space
separated], CKPTS_DIR [<root>/ckpts/$PROJECT_NAME/$EXP_NAME; cpu: the run's own
$OUT_DIR/checkpoints/$PROJECT_NAME/$EXP_NAME], NNODES [1], N_GPUS_PER_NODE [8; cpu: 1, the
CPU backend's FSDP ranks],
LOGGER [console,file], PROJECT_NAME [rpg], EXP_NAME [run name, +the named settings the overrides change],
RAY_JOB_WAIT [0: --no-wait],
OUT_DIR (cpu) [a new <root>/outputs/cpu/<name>/<time>[-N]; the tiny task starts fresh
(trainer.resume_mode=disable), so one holding a run is refused unless trainer.resume_mode=auto continues it:
``rpg.launch.run_dir``].
Every launch prints a header of the settings the run uses (read from its composed config), with a note line when
an override changes what the run name says (the run is renamed: ``rpg.launch.plan.experiment_name``), when a
shipped experiment file differs from the grammar's or a user's is composed (``rpg.launch.experiments.file_note``).
Before anything starts (every mode): an environment variable given as an argument, a key the composed
config does not have (the closest key and the ``+`` hint: ``rpg.launch.config_keys``) and a logger verl
does not know (``LOGGER``, ``trainer.logger``) are one line each, exit 2; Ctrl-C before the run is one line.
A valid run name that is not shipped but a swap or two from a shipped one is run as it reads, after a warning line
naming the closest shipped name (``rpg.launch.shipped_names``).
PROJECT_NAME and EXP_NAME name directories: '/', '\\', '.', '..' are refused (one line, exit 2).
Relative paths given by the user are taken relative to the current directory; defaults are
relative to the project root (``RPG_CLUSTER_ROOT`` for a Ray submission).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from rpg.backends.registry import backend
from rpg.common.checkout import RECIPE_ENTRY
from rpg.common.override_lists import OverrideSyntaxError, resume_command, values
from rpg.config import RPGConfigError
from rpg.launch import job
from rpg.launch.args import read_overrides
from rpg.launch.commands import local_command, ray_command, ray_executable, script_command, submission_env
from rpg.launch.config_keys import checked_config, logger_problem
from rpg.launch.describe import describe, describe_variant, dry_run, launch_notes, list_table
from rpg.launch.node_plan import plan_nodes, supervisor_prefix
from rpg.launch.plan import CONFIG_DIR, TASK_VARS, plan
from rpg.launch.ray_job_api import address_problem, job_api_problem
from rpg.launch.request import ENV_VARS, RESUMED_VARS, LaunchError, LaunchRequest, project_root
from rpg.launch.run_dir import RunDirError, check_fresh_start, checkpoint_root
from rpg.launch.shipped_names import unshipped_note
from rpg.launch.variants import GRAMMAR, VariantNameError, parse
from rpg.verl.block_checks import resume_hint
from rpg.verl.errors import RESUME_COMMAND_ENV
from rpg.verl.input_paths import InputPathError, error_line, input_path_problems


def _check_data_files(overrides: Sequence[str]) -> None:
    """The driver's data check (``rpg.data.checks``) on the values Hydra will give the data keys, before a
    local run starts: ``InputPathError``, one line per problem. URLs and ``${...}`` are left to the driver."""
    from rpg.data.checks import override_problems
    from rpg.launch.variants import recipe_value

    problems = override_problems(values(overrides), recipe_value)
    if problems:
        raise InputPathError(problems)


USAGE = f"""usage: python -m rpg.launch RUN_NAME [hydra overrides ...]   (or recipe/rpg/{{7b,4b}}/RUN_NAME.sh [overrides])
       python -m rpg.launch --describe RUN_NAME [--full] [--gpu-mem-gib G] [--host-mem-gib H] [hydra overrides ...] | --list
environment (docs/launch-scripts.md):
{chr(10).join(f"  {name}: {what}" for name, what in ENV_VARS.items())}
run names:
{GRAMMAR}"""


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    from rpg.common.signals import StopSignal, raise_on_stop_signals

    argv = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if env is None else env)
    handlers = raise_on_stop_signals()  # Ctrl-C (or SIGHUP/SIGTERM) before or after a run: one line, 128 + signum
    try:
        return _main(argv, env)
    except StopSignal as e:  # during a CPU run the harness handles it (its stop line) and returns
        handlers.hold()
        print(f"rpg.launch: stopped by {e.name} before the run started (nothing was started)", file=sys.stderr,
              flush=True)
        return e.code
    except (LaunchError, VariantNameError, OverrideSyntaxError, RunDirError) as e:
        print(f"rpg.launch: {e}", file=sys.stderr)
        return 2
    except RPGConfigError as e:  # from the driver-side checks (compose): the driver's own line
        print(error_line(e), file=sys.stderr)
        return 2
    finally:
        handlers()


def _main(argv: list[str], env: dict[str, str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "--list":
        print(list_table())
        return 0
    if argv[0] == "--describe":
        return describe(argv[1:], env)
    v = parse(argv[0])
    if (note := unshipped_note(v.name)) is not None:  # a valid name a swap or two from a shipped one
        print(f"rpg.launch: warning: {note}", file=sys.stderr, flush=True)
    user = argv[1:]
    root = project_root()
    read_overrides(user, ENV_VARS, script_command(v.name, root))
    req = LaunchRequest.read(env, root, Path.cwd())  # the environment, read once
    chosen = backend(req.backend)
    if chosen.TINY_TASK and (req.dry or req.cluster):
        # verl's platform is chosen when verl is first imported in this process: by the logger check (verl's list of
        # loggers) or the first composition below, so the backend's platform variables come first
        import_env = chosen.run_env((), base=env)
        os.environ.update({k: import_env[k] for k in chosen.IMPORT_ENV if k in import_env})
    if req.loggers is not None and (why := logger_problem(list(req.loggers), "LOGGER")) is not None:
        raise LaunchError(why)
    submission = job.submission_id() if req.cluster else None
    _check_backend(chosen, req)
    if req.cluster_root_unused:
        print("rpg.launch: warning: RPG_CLUSTER_ROOT is ignored without RAY_ADDRESS (local run from this checkout)",
              file=sys.stderr)
    if chosen.TINY_TASK and (unused := [k for k in TASK_VARS if env.get(k, "").strip()]):
        print(f"rpg.launch: warning: {', '.join(unused)} not used: RPG_BACKEND={req.backend} trains the tiny task (its "
              "own model and data); to train yours, override data.train_files / actor_rollout_ref.model.path",
              file=sys.stderr)
    overrides, job_env = plan(req, v, user)

    if req.cluster:
        if (why := address_problem(req.address)) is not None:
            raise LaunchError(why)
        if (why := job_api_problem(ray_executable(env), req.address, env)) is not None:  # no cluster there
            if not req.dry:
                raise LaunchError(why)
            print(f"rpg.launch: warning: {why} (DRY_RUN=1: nothing is submitted)", file=sys.stderr, flush=True)
        # the driver's stop line names this command (rpg.verl.main.run_stopped_line)
        job_env[RESUME_COMMAND_ENV] = resume_command(script_command(v.name, root, req.cwd), user, req.cwd, env,
                                                     RESUMED_VARS)
    if chosen.TINY_TASK:
        from rpg.launch.harness import build_command

        argv_tiny, _ = build_command(overrides, entry=str(root / RECIPE_ENTRY), base_env=env, backend=req.backend,
                                     joins_cluster=req.cluster)
        cfg = checked_config(argv_tiny[2:], root / CONFIG_DIR)  # keys and loggers, before anything is built
        if not (req.dry or req.cluster):
            return _run_here(req, v, overrides, user, cfg)
        if req.dry and not req.cluster:
            _check_out_dir(req, cfg)  # what the run would refuse in its OUT_DIR, refused by the dry run too
        from rpg.tiny import build_tiny_assets

        build_tiny_assets()  # the input paths are then checked as a run would find them
        if not req.cluster:
            return dry_run(req, v, argv_tiny[2:], argv_tiny, user=user)
        overrides = argv_tiny[2:]  # a tiny-task job on the cluster (docs/launch-scripts.md, "Rehearsing")
        job_env = {**job_env, **submission_env(cfg, req, submission)}
        if not req.dry:  # the tiny task starts fresh: never over another run's checkpoints (rpg.launch.run_dir)
            ckpts = Path(str(cfg.trainer.default_local_dir))
            check_fresh_start(ckpts, cfg.trainer.resume_mode, ckpts, another="CKPTS_DIR=... or EXP_NAME=...")
    composed = None
    if req.cluster:  # composed and checked before the job is queued, at the node count it is submitted with
        overrides, composed, count, sizes, node_env = plan_nodes(overrides, req, user, root)
        cfg = composed[0]
        supervisor = supervisor_prefix(req.ray_python, count, sizes, req.max_restarts) if count.elastic else ()
        cmd = ray_command(overrides, req, {**job_env, **node_env}, submission, supervisor)
    else:
        cmd = local_command(overrides, root)
        if not req.dry:  # keys and loggers (DRY_RUN and a submission compose with the driver's checks below)
            cfg = checked_config(overrides, root / CONFIG_DIR)
    if req.dry:
        return dry_run(req, v, overrides, cmd, composed, user)
    if not req.cluster:  # data files and their reward: the driver's lines, exit 2, nothing started
        _check_data_files(overrides)
    print(describe_variant(v, cfg, launch_notes(v, req, user)), flush=True)
    if req.cluster:
        problems = input_path_problems(cfg)
        if problems:
            print(f"rpg.launch: note: on this machine (the driver checks them on the cluster before Ray "
                  f"starts): {'; '.join(problems)}", file=sys.stderr)
        print("+ " + " ".join(cmd[:6]) + " ... -- " + " ".join(cmd[cmd.index("--") + 1:cmd.index("--") + 3]) + " ...",
              flush=True)
    if req.cluster and req.job_wait:  # tails the job; Ctrl-C stops the job, not only the client
        return job.follow(cmd, env, req.address, submission, (signal.SIGHUP,) if req.elastic else ())
    os.execvpe(cmd[0], cmd, env)
    return 0  # pragma: no cover


def _check_backend(chosen, req: LaunchRequest) -> None:
    """The backend's checks of the launch environment (``launch_problems``): a bad value is one line (exit 2);
    what this machine lacks is one line too, a warning under DRY_RUN=1; a version note, a warning."""
    try:
        errors, warnings = chosen.launch_problems(req.env)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    for line in [*warnings, *(errors if req.dry else [])]:
        print(f"rpg.launch: warning: {line}", file=sys.stderr)
    if errors and not req.dry:
        raise LaunchError("; ".join(errors))


def _check_out_dir(req: LaunchRequest, cfg) -> None:
    """A fresh start never overwrites the run a named ``OUT_DIR`` holds (``rpg.launch.run_dir``)."""
    if req.out_dir is not None:
        check_fresh_start(req.out_dir, cfg.trainer.resume_mode,
                          checkpoint_root(req.out_dir, str(cfg.trainer.default_local_dir)),
                          another="OUT_DIR=...; unset, a new folder per run")


def _run_here(req: LaunchRequest, v, overrides: Sequence[str], user: Sequence[str], cfg) -> int:
    """The tiny-task run through the harness, on this machine; exit code: 0, the trainer's own (2: bad config),
    128 + signum when a stop signal ended it (one line: log, last complete checkpoint, resume command), else 1.
    ``cfg``: the run's composed config (its resume mode and checkpoint folder: ``rpg.launch.run_dir``)."""
    from rpg.launch.harness import TrainerRunError, report_failure, resume_decision, run_trainer
    from rpg.launch.run_dir import new_run_dir
    from rpg.tiny import build_tiny_assets

    prefix = f"[{req.backend}]"
    _check_out_dir(req, cfg)
    build_tiny_assets()
    out = req.out_dir or new_run_dir(req.root / "outputs" / req.backend / v.name)
    print(describe_variant(v, cfg, launch_notes(v, req, user)) + f"\n{prefix} backend={req.backend}, tiny model/task; "
          f"output {out}", flush=True)

    def on_line(line: str) -> None:  # the driver's resume decision, on the terminal (--echo shows everything)
        if not req.echo and (decision := resume_decision(line)) is not None:
            print(f"{prefix} {decision}", flush=True)

    try:
        run = run_trainer(overrides, output_dir=out, entry=str(req.root / RECIPE_ENTRY), timeout_s=req.timeout_s,
                          echo=req.echo, on_line=on_line, backend=req.backend)
    except TrainerRunError as e:
        # the variables the user set (RPG_BACKEND=cpu among them), the run's folder, the same overrides
        resume = resume_command(shlex.join([sys.executable, "-m", "rpg.launch", v.name]), user, req.cwd,
                                {**req.env, "OUT_DIR": str(out)}, RESUMED_VARS)
        return report_failure(e, prefix, resume_hint(values(overrides).get("trainer.v1.trainer_mode", "sync"), resume))
    for note in run.notes:
        print(f"{prefix} note: {note}", flush=True)
    print(f"{prefix} done: {run.last_step()} steps in {run.wall_time_s:.0f}s; metrics {run.metrics_file}; "
          f"log {run.log_file}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
