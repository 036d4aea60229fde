"""A paper run submitted to a Ray cluster: ``python -m rpg.cluster <run> [overrides]``, what recipe/rpg/launch.sh
runs when ``RAY_ADDRESS`` is set (docs/launch-scripts.md, section 5).

The run is planned as on one node, with every default path under ``RPG_CLUSTER_ROOT`` (the checkout on the nodes;
no working folder is uploaded), composed and checked here at the node count it is submitted with
(``rpg.cluster.node_plan``), then submitted: ``ray job submit -- python <root>/recipe/rpg/main_rpg.py
+experiment=<run> <overrides>``, with a submission id ``rpg-<time>-<hex>`` and the command that resumes it (the
driver's stop line names it). The address is asked first (``rpg.cluster.ray_job_api``). ``NNODES=MIN:MAX`` makes
the job's entrypoint the elastic supervisor (``rpg.cluster.elastic``); ``RAY_JOB_WAIT=1`` follows the job, and
Ctrl-C then stops it (``rpg.cluster.job``). With ``RPG_BACKEND=cpu`` the rehearsal goes to the cluster, one rank
per logical GPU (docs/launch-scripts.md, "Rehearsing a multi-node launch on one machine").
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rpg.backends.registry import backend
from rpg.paths.checkout import CHECKOUT, RECIPE_CONFIG_DIR, RECIPE_ENTRY
from rpg.override_lists import bad_override_line, resume_command
from rpg.launch.environment import FORWARD_ENV, RESUMED_VARS, LaunchError, Request, flag, positive_int
from rpg.verl.errors import ERROR_PREFIX, LAUNCHED_ENV, RESUME_COMMAND_ENV

# `ray job stop` SIGTERMs the driver, then SIGKILLs it after RAY_JOB_STOP_WAIT_TIME_S seconds (3 by default): Ray
# 2.60's job supervisor reads it from its own environment (ray/dashboard/modules/job/job_supervisor.py:66 and
# :408-413), which is the job's runtime env (job_manager.py:590-592). The driver's stop (Ray's shutdown, the
# checkpoint folder read on shared storage, the stop line) needs more than 3 s; a value the user exported wins.
STOP_WAIT_VAR, STOP_WAIT_S = "RAY_JOB_STOP_WAIT_TIME_S", 60


@dataclass(frozen=True)
class Job:
    """What the environment asks of the Ray job."""

    address: str  # RAY_ADDRESS as given (checked by rpg.cluster.ray_job_api)
    wait: bool  # RAY_JOB_WAIT
    python: str  # RAY_PYTHON
    stop_wait_s: int
    env: Mapping[str, str]  # FORWARD_ENV's variables that are set

    @classmethod
    def read(cls, env: Mapping[str, str]) -> Job:
        return cls(address=env.get("RAY_ADDRESS", ""), wait=flag(env, "RAY_JOB_WAIT"),
                   python=env.get("RAY_PYTHON", "").strip() or "python3",
                   stop_wait_s=positive_int(env, STOP_WAIT_VAR) or STOP_WAIT_S,
                   env={k: env[k] for k in FORWARD_ENV if env.get(k)})


def cluster_root(env: Mapping[str, str]) -> Path:
    """Root of every default path on the cluster: ``RPG_CLUSTER_ROOT`` (absolute), else this checkout."""
    raw = env.get("RPG_CLUSTER_ROOT", "").strip()
    if not raw:
        return CHECKOUT
    if not raw.startswith("/"):
        raise LaunchError(f"RPG_CLUSTER_ROOT={raw!r} must be an absolute path (the project's checkout on the "
                          "cluster nodes)")
    return Path(raw)


def ray_executable(env: Mapping[str, str]) -> str:
    """The `ray` on PATH, else the one installed next to this Python."""
    return shutil.which("ray", path=env.get("PATH", "") + os.pathsep + str(Path(sys.executable).parent)) or "ray"


def ray_command(overrides: Sequence[str], req: Request, job: Job, job_env: Mapping[str, str],
                submission_id: str | None = None, supervisor: Sequence[str] = ()) -> list[str]:
    """``ray job submit`` of the driver's command, run by ``supervisor`` (a command the driver's is appended to:
    the elastic supervisor, ``rpg.cluster.node_plan.supervisor_prefix``) when given; the job's variables: the
    forwarded ones (``job.env``), then ``job_env``."""
    runtime_env = {"env_vars": {"PYTHONUNBUFFERED": "1", STOP_WAIT_VAR: str(job.stop_wait_s), **job.env, **job_env}}
    cmd = [ray_executable(req.env), "job", "submit", "--address", job.address, "--runtime-env-json",
           json.dumps(runtime_env)]
    if submission_id is not None:
        cmd += ["--submission-id", submission_id]
    if not job.wait:
        cmd.append("--no-wait")
    return [*cmd, "--", *supervisor, job.python, str(req.run_root / RECIPE_ENTRY), *overrides]


def rehearsal_env(cfg, req: Request, submission: str) -> dict[str, str]:
    """What the backend adds to a rehearsal's job (``cluster_job_env``), with torch.distributed's rendezvous file in
    the run's checkpoint folder, which every node must see (the driver checks it: ``rpg.verl.joined_cluster``)."""
    ckpts = str(cfg.trainer.default_local_dir)
    if not ckpts.startswith("/"):
        raise LaunchError(f"trainer.default_local_dir={ckpts!r}: a {req.backend}-backend job on a Ray cluster needs an "
                          "absolute folder every node sees (CKPTS_DIR), its ranks meet through a file there")
    return backend(req.backend).cluster_job_env(req.env, f"file://{ckpts}/.rendezvous/{submission}")


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    from rpg.trainer_process.run_dir import RunDirError
    from rpg.override_lists import OverrideSyntaxError
    from rpg.stop_signals import StopSignal, raise_on_stop_signals
    from rpg.config import RPGConfigError
    from rpg.launch.experiments import ExperimentError
    from rpg.verl.input_paths import error_line

    argv = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if env is None else env)
    handlers = raise_on_stop_signals()
    try:
        if not argv or argv[0] in ("-h", "--help"):
            print(__doc__)
            return 0 if argv else 2
        if (line := bad_override_line(argv[1:])) is not None:  # as main_rpg.py says it
            print(f"{ERROR_PREFIX}: {line}", file=sys.stderr, flush=True)
            return 2
        return submit(argv[0], argv[1:], env)
    except StopSignal as e:
        handlers.hold()
        print(f"rpg.launch: stopped by {e.name} before the job was submitted (nothing was started)",
              file=sys.stderr, flush=True)
        return e.code
    except (LaunchError, ExperimentError, OverrideSyntaxError, RunDirError) as e:
        print(f"rpg.launch: {e}", file=sys.stderr)
        return 2
    except RPGConfigError as e:
        print(error_line(e), file=sys.stderr)
        return 2
    finally:
        handlers()


def submit(name: str, user: list[str], env: dict[str, str]) -> int:
    """The run ``name`` with the user's overrides, submitted (see the module's text)."""
    from rpg.cluster import job as jobs
    from rpg.cluster.node_plan import plan_nodes, rollout_pool, supervisor_prefix
    from rpg.cluster.ray_job_api import address_problem, job_api_problem
    from rpg.launch import experiments, rehearsal
    from rpg.launch.args import read_overrides
    from rpg.launch.config_keys import checked_config, logger_problem
    from rpg.launch.describe import dry_run, header, launch_notes
    from rpg.launch.entry import check_backend
    from rpg.launch.environment import VARIABLES
    from rpg.launch.plan import plan, script_command
    from rpg.verl.input_paths import input_path_problems

    exp = experiments.find(name, user)
    read_overrides(user, {k: what for k, (_, what) in VARIABLES.items()}, script_command(name))
    req = Request.read(env, Path.cwd(), run_root=cluster_root(env), cluster=True)
    job = Job.read(env)
    chosen = backend(req.backend)
    if chosen.TINY_TASK:
        rehearsal.import_platform(req)
    if (loggers := req.loggers()) is not None and (why := logger_problem(list(loggers), "LOGGER")) is not None:
        raise LaunchError(why)
    submission = jobs.submission_id()
    check_backend(chosen, req)
    overrides = plan(exp, req, user)
    if (why := address_problem(job.address)) is not None:
        raise LaunchError(why)
    if (why := job_api_problem(ray_executable(env), job.address, env)) is not None:  # no cluster there
        if not req.dry:
            raise LaunchError(why)
        print(f"rpg.launch: warning: {why} (DRY_RUN=1: nothing is submitted)", file=sys.stderr, flush=True)
    # the driver's stop line names this command (rpg.verl.main.run_stopped_line)
    job_env = {LAUNCHED_ENV: "1",
               RESUME_COMMAND_ENV: resume_command(script_command(name, req.cwd), user, str(req.cwd), env, RESUMED_VARS)}
    if chosen.TINY_TASK:  # the rehearsal as a job on the cluster
        from rpg.trainer_process import build_command
        from rpg.trainer_process.run_dir import check_fresh_start

        argv, _ = build_command(overrides, entry=str(CHECKOUT / RECIPE_ENTRY), base_env=env, backend=req.backend,
                                joins_cluster=True)
        overrides = argv[2:]
        cfg = checked_config(overrides, CHECKOUT / RECIPE_CONFIG_DIR)
        rehearsal.build(req)
        job_env.update(rehearsal_env(cfg, req, submission))
        if not req.dry:  # the rehearsal starts fresh: never over another run's checkpoints
            ckpts = Path(str(cfg.trainer.default_local_dir))
            check_fresh_start(ckpts, cfg.trainer.resume_mode, ckpts, another="CKPTS_DIR=... or EXP_NAME=...")
    overrides, composed, count, sizes, node_env = plan_nodes(overrides, req, user)
    cfg = composed[0]
    supervisor = supervisor_prefix(job.python, count, sizes, req.max_restarts, rollout_pool(cfg)) if count.elastic \
        else ()
    cmd = ray_command(overrides, req, job, {**job_env, **node_env}, submission, supervisor)
    if req.dry:
        return dry_run(req, exp, overrides, cmd, composed, user)
    print(header(exp, cfg, launch_notes(exp, req, user)), flush=True)
    if problems := input_path_problems(cfg):
        print(f"rpg.launch: note: on this machine (the driver checks them on the cluster before Ray starts): "
              f"{'; '.join(problems)}", file=sys.stderr)
    print("+ " + " ".join(cmd[:6]) + " ... -- " + " ".join(cmd[cmd.index("--") + 1:cmd.index("--") + 3]) + " ...",
          flush=True)
    if job.wait:  # tails the job; Ctrl-C stops the job, not only the client
        import signal

        return jobs.follow(cmd, env, job.address, submission, (signal.SIGHUP,) if req.elastic else ())
    os.execvpe(cmd[0], cmd, env)
    return 0  # pragma: no cover
