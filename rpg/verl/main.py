"""Driver and TaskRunner of the RPG recipe: what ``recipe/rpg/main_rpg.py`` runs around verl's ``run_ppo``.

``driver(config)`` is the context of verl's ``verl.trainer.main_ppo.main`` (auto_set_device -> validate_config ->
run_ppo) with checks before Ray: ``prepare_config`` applies the ``rpg:`` block (``rpg.verl.block_to_verl``), checks every local
input path (``rpg.verl.input_paths``) and pins the checkpoint a resume loads (``rpg.verl.checkpoints``), all before
verl's ``validate_config``; a bad value is one line naming the key, exit code 2. ``run_ppo`` gets ``RPGTaskRunner``:
verl's ``TaskRunnerV1`` with the RPG trainer of ``trainer.v1.trainer_mode`` and verl's file logger on a new segment
of the run's metrics history (a resume never truncates it). recipe/rpg/main_rpg.py's Hydra main runs
``run_ppo`` inside ``driver``; a paper run (``+experiment=<run>``) reaches ``driver`` from its launcher
(``python -m rpg.launch``), composed and prepared by ``Launch.check`` (``rpg.launch.entry``): one composition and one
round of checks per launch. SIGHUP, SIGINT and SIGTERM stop the run: Ray is shut
down and one line says where the metrics and the last complete checkpoint are and how to resume (128 + signum).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import sys
from pathlib import Path
from pprint import pprint

import ray
from omegaconf import DictConfig, OmegaConf

from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.device import auto_set_device
from verl.utils.logging_utils import configure_verl_logging

import rpg.verl.register  # noqa: F401  (registrations in the driver even without the entry point)
from rpg.backends import backend_of_run
from rpg.backends.registry import backend
from rpg.metrics_log.history import PATH_ENV, base_path, claim_segment, logs_to_file, restore_step_record
from rpg.stop_signals import StopSignal, raise_on_stop_signals
from rpg.config import RPGConfigError, RPGSettings, config_value
from rpg.data.checks import shared_file_warning
from rpg.verl.errors import (ELASTIC_EXIT, ELASTIC_GROW_SUFFIX, ELASTIC_JOB_SUFFIX, ELASTIC_STATUS_ENV, NODE_PLAN_ENV,
                             RESUME_COMMAND_ENV)
from rpg.verl.input_paths import check_input_paths, check_run_names, error_line, resolve_resume, run_environ
from rpg.verl.refill_limit import refill_limit_reason
from rpg.verl.run_banner import describe
from rpg.verl.block_to_verl import validate_and_apply
from rpg.verl.verl_rules import check_verl_config, check_verl_rules, set_norm_scale_factor, unbounded_refills


# The body of verl 0.9.1's TaskRunnerV1.run that RPGTaskRunner.run repeats (sha256 of its source, first
# 16 hex digits; tests/verl/test_verl_config.py recomputes it from the installed verl, so a verl whose run()
# changed fails that test instead of silently diverging from this copy).
VERL_TASK_RUNNER_RUN_SHA256 = "69dc336177c55680"


class RPGTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's v1 TaskRunner with the RPG trainer.

    Why ``run`` repeats verl's body instead of calling it: verl picks the trainer class by the name
    ``trainer.v1.trainer_mode`` (``get_trainer_cls``), and the same string selects sync behaviour in
    several places (``trainer_mode == "sync"``: the replay buffer, refills, parameter sync), so the RPG
    trainer can neither take another name nor replace verl's "sync" entry without patching verl's
    registry. The two differences: the trainer class (``RPG_TRAINERS[trainer.v1.trainer_mode]``: the RPG
    trainer on verl's own sync or colocate-async trainer class, which keeps verl's behaviour for that
    name), and ``fit`` inside ``log_segment``."""

    def run(self, config: DictConfig):
        configure_verl_logging()
        import transfer_queue as tq

        import rpg.verl.register  # noqa: F401  (advantage estimators run in this process)
        from rpg.verl.trainer import RPG_TRAINERS

        config.transfer_queue.enable = True
        pprint(OmegaConf.to_container(config, resolve=True))
        OmegaConf.resolve(config)
        self.config = config
        tq.init(config.transfer_queue)
        succeeded = False
        try:
            self.trainer = RPG_TRAINERS[config.trainer.v1.trainer_mode](config=config)
            self.trainer.init()
            self.init_agent_loop_manager()
            with log_segment(config):
                self.trainer.fit(self.agent_loop_manager)
            succeeded = True
        finally:
            try:
                tracking = getattr(self.trainer, "logger", None)
                if tracking is not None:
                    tracking.finish(exit_code=0 if succeeded else 1)
            finally:
                tq.close()


@contextlib.contextmanager
def log_segment(config: DictConfig):
    """With verl's ``file`` logger on: ``VERL_FILE_LOGGER_PATH`` = the next free segment of the run's
    history (read by verl's ``FileLogger``, which opens it with "wb", when ``fit`` starts); before it, on a
    resume, the resumed step's saved record when that step was never logged (``restore_step_record``)."""
    loggers = config.trainer.logger
    if not logs_to_file(loggers):
        yield None
        return
    before = os.environ.get(PATH_ENV)
    base = base_path(config.trainer.project_name, config.trainer.experiment_name)
    # a resume (pinned by the driver: resolve_resume) logs first the record of a step saved but never logged;
    # not when a launcher chose the segment (the CPU harness: its history notes name such a step instead)
    if before is None and OmegaConf.select(config, "trainer.resume_mode") == "resume_path":
        if (note := restore_step_record(base, OmegaConf.select(config, "trainer.resume_from_path"))) is not None:
            print(f"rpg: {note}", flush=True)
    path = claim_segment(base)
    os.environ[PATH_ENV] = str(path)
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(PATH_ENV, None)
        else:
            os.environ[PATH_ENV] = before


def prepare_config(config: DictConfig, *, check_paths: bool = True, check_node: bool = True) -> RPGSettings:
    """Everything the driver does before Ray: RPG validation/translation, this node's GPU checks,
    input paths, verl's numeric rules (``rpg.verl.verl_rules``) and verl's own ``validate_config``.

    ``check_paths=False``: the caller reports missing paths itself (``rpg.launch`` under DRY_RUN=1
    or before a Ray submission, where the files live on the cluster); the resume checkpoint is
    then not resolved either (``rpg.verl.input_paths.resolve_resume``). ``check_node=False``: the
    same for this node's checks (Ray's folder under its TMPDIR, ``ray_folder_problem``; the backend's ``check_driver``,
    ``rpg.backends``; under DRY_RUN=1 its
    ``config_problems`` are refused, its ``node_problems`` are warnings).
    """
    auto_set_device(config)
    settings = validate_and_apply(config)
    check_run_names(config)
    if check_paths:  # the run's own inputs first: they are wrong on every node
        check_input_paths(config)
    if check_node:
        from rpg.verl.joined_cluster import ray_folder_problem

        if (line := ray_folder_problem(config)) is not None:  # this node's TMPDIR: Ray's socket paths past their limit
            raise RPGConfigError(line)
        # this run's backend: CUDA, GPUs, driver, vLLM, flash-attn (gpu); vLLM's CPU build, the world size (cpu)
        if (name := backend_of_run(config)) is not None:
            backend(name).check_driver(config, settings)
    if check_paths:
        note = resolve_resume(config)  # pins the checkpoint verl loads, or refuses (one line)
        print(f"rpg: {note}", flush=True)  # the resume decision, every run (RESUME_LINE_STARTS)
    check_verl_rules(config)  # verl's numeric and divisibility rules its workers would hit (one line)
    for warning in (unbounded_refills(config),  # DAPO's filter without max_num_gen_batches
                    shared_file_warning(lambda key: config_value(config, key))):  # a file trained on and validated
        if warning is not None:
            print(f"rpg: warning: {warning}", file=sys.stderr, flush=True)
    use_critic = need_critic(config)
    for note in set_norm_scale_factor(config, use_critic=use_critic):  # seq-mean-token-sum-norm's constant
        print(f"rpg: {note}", flush=True)
    print(describe(config, settings), flush=True)
    check_verl_config(config, use_reference_policy=need_reference_policy(config), use_critic=use_critic)
    return settings


def driver_resume_command(argv: list[str]) -> str:
    """The command that resumes this run, from any folder (``rpg.override_lists.resume_command``: ``cd`` to
    this run's folder first): the same one, with ``trainer.resume_mode=auto`` (replacing an earlier mode). What
    Hydra's override parser reads as an override is merged; anything else (Hydra's flags such as
    ``--config-name x``, other arguments) is kept as given, before the overrides."""
    from rpg.override_lists import is_override, resume_command

    script, args = argv[0], argv[1:]
    kinds = [is_override(a) for a in args]
    flags = [a for a, ov in zip(args, kinds) if not ov]
    overrides = [a for a, ov in zip(args, kinds) if ov]
    return resume_command(shlex.join([sys.executable, script, *flags]), overrides, os.getcwd())


def signal_stop_line(config: DictConfig, signal_name: str, argv: list[str]) -> str:
    """The one line printed when a stop signal ends the run: log, last complete checkpoint, resume command
    (every trainer mode resumes: docs/verl-integration.md#resume)."""
    return run_stopped_line(config, f"stopped by {signal_name}", argv)


def metrics_log(config: DictConfig) -> Path | None:
    """The run's metrics history (its base path: ``rpg.metrics_log.history``), or None without verl's file logger."""
    trainer = config.trainer
    if not logs_to_file(trainer.logger):
        return None
    # the workers' environment: the launcher passes VERL_FILE_LOGGER_ROOT through Ray's runtime env
    return base_path(trainer.project_name, trainer.experiment_name, run_environ(config))


def run_stopped_line(config: DictConfig, stopped: str, argv: list[str], alive: int | None = None) -> str:
    """``signal_stop_line``'s body for any reason the run stopped (``stopped``: "stopped by SIGTERM", "stopped: node ...
    lost"); the resume command is ``RPG_RESUME_COMMAND`` when the launcher set it, else ``driver_resume_command(argv)``.
    ``alive``: the nodes left that can hold a rank group; the command's ``NNODES`` then fits them (``NODE_PLAN_ENV``)."""
    from rpg.node_counts import nnodes_for_resume, parse_nnodes, with_nnodes
    from rpg.verl.checkpoints import last_complete

    trainer = config.trainer
    ckpt = last_complete(os.path.abspath(trainer.default_local_dir))  # relative: to the cwd, as verl does
    log = metrics_log(config) or "this process's output"
    # a job submitted to a Ray cluster is resumed by submitting it again: the launcher's command
    # (rpg.override_lists.resume_command)
    resume = os.environ.get(RESUME_COMMAND_ENV, "").strip() or driver_resume_command(argv)
    if alive is not None and (plan := os.environ.get(NODE_PLAN_ENV, "").strip()):
        plan = json.loads(plan)
        if (nnodes := nnodes_for_resume(parse_nnodes(plan["nnodes"]), plan["sizes"], alive,
                                        int(plan.get("rollout_nnodes", 0)))) is not None:
            resume = with_nnodes(resume, nnodes)
    return (f"rpg: {stopped}; Ray shut down; metrics log {log}; last complete checkpoint "
            f"{ckpt or 'none (nothing saved yet: the resume starts at step 0)'}; "
            f"resume: {resume}")


@contextlib.contextmanager
def stop_on_signals(config: DictConfig, argv: list[str] | None = None):
    """SIGHUP, SIGINT, SIGTERM (``rpg.stop_signals``): shut down the Ray cluster this driver started (or
    leave the cluster it joined: Ray ends a departed driver's actors), print ``signal_stop_line``, exit
    128 + signum. ``ray.init`` installs its own SIGTERM handler; Ray's post-init hook puts ours back."""
    from ray._private import worker as ray_worker

    handlers = raise_on_stop_signals()
    ray_worker._post_init_hooks.append(handlers.reassert)
    try:
        yield
    except BaseException:
        if not handlers.received:  # not a stop signal: not ours to handle
            raise
        # the handler's StopSignal, or what Ray made of it inside ray.get (its core worker turns an
        # exception raised by a signal handler during a blocking get into SystemExit(1))
        handlers.hold()
        stop = StopSignal(handlers.received[0])
        if ray.is_initialized():
            ray.shutdown()
        line = signal_stop_line(config, stop.name, list(sys.argv if argv is None else argv))
        status = os.environ.get(ELASTIC_STATUS_ENV, "").strip()
        if status and Path(status).with_suffix(ELASTIC_GROW_SUFFIX).is_file():
            line = f"rpg: stopped by {stop.name} from the elastic supervisor, which restarts the run on more nodes"
        with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
            print(line, file=sys.stderr, flush=True)
        sys.exit(stop.code)
    finally:
        with contextlib.suppress(ValueError):
            ray_worker._post_init_hooks.remove(handlers.reassert)
        handlers()


@contextlib.contextmanager
def _removed(path):
    """``path`` (if any) is removed on the way out, whatever the outcome (a rendezvous file: each run its own), when
    it was not there on the way in: a file a user's ``DIST_INIT_METHOD`` names that existed before is not the run's."""
    existed = path is not None and os.path.lexists(path)
    try:
        yield
    finally:
        if path is not None and not existed:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)


@contextlib.contextmanager
def after_ray_init(hook):
    """``hook()`` runs right after ``ray.init`` (Ray's post-init hooks: verl's ``run_ppo`` starts Ray), inside
    ``ray.init``: an exception it raises comes out of ``run_ppo`` before verl builds anything."""
    from ray._private import worker as ray_worker

    ray_worker._post_init_hooks.append(hook)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            ray_worker._post_init_hooks.remove(hook)


@contextlib.contextmanager
def driver(config: DictConfig, settings: RPGSettings | None = None):
    """Around verl's ``run_ppo(config, task_runner_class=...)`` (the block's body; it yields the RPG task runner):
    the checks before Ray (``prepare_config``; ``settings``: those it returned for ``config`` when the caller ran
    it, a paper run's launch) with one clear line on a bad ``rpg:`` value, input path or resume checkpoint, then
    exit code 2; a stop signal ends the run as ``stop_on_signals`` says. On a Ray cluster the driver joined, the
    cluster's checks run once Ray is up (``rpg.verl.joined_cluster``: nodes and GPUs, the checkpoint folder seen
    from every node; a refusal is the same one line, exit 2), and a node lost mid-run ends the run with the stop
    line (exit 1) instead of a traceback (the driver watches the nodes and stops the TaskRunner, which may
    otherwise wait for the lost node forever: ``NodeWatch``); so do DAPO's refills beyond
    ``algorithm.filter_groups.max_num_gen_batches`` (``rpg.verl.refill_limit``: the stop line says why)."""
    from rpg.verl.joined_cluster import ClusterRun, rendezvous_file

    cluster = ClusterRun(config)
    held = []  # this driver's hold on the checkpoint folder (rpg.verl.folder_lock), for its lifetime
    # named so the node watch can stop it (a job's default Ray namespace is its own; the suffix anyway)
    runner = f"rpg_task_runner_{secrets.token_hex(4)}"
    watches = []  # the driver's watch of the nodes (rpg.verl.joined_cluster.NodeWatch), while run_ppo runs

    def stop_runner():  # its ray.get in run_ppo then raises ActorDiedError: the node-lost path below
        with contextlib.suppress(ValueError):  # no such actor: it is already gone (with the node)
            ray.kill(ray.get_actor(runner), no_restart=True)

    def after_init():
        cluster.checks_after_ray_init()
        held.extend(hold_checkpoint_folder(config))
        job = ray.get_runtime_context().get_job_id()
        if (status := os.environ.get(ELASTIC_STATUS_ENV, "").strip()):  # whose Ray job the supervisor waits for
            Path(status).with_suffix(ELASTIC_JOB_SUFFIX).write_text(job)
        if (watch := cluster.node_watch(job, stop_runner)) is not None:
            watches.append(watch)

    with stop_on_signals(config), _removed(rendezvous_file()):
        try:
            cluster.settings = settings if settings is not None else prepare_config(config)
        except RPGConfigError as e:
            print(error_line(e), file=sys.stderr)
            sys.exit(2)
        try:
            try:
                with after_ray_init(after_init):
                    yield ray.remote(name=runner)(RPGTaskRunner)
            finally:
                for watch in watches:
                    watch.stop()
        except RPGConfigError as e:  # the cluster's checks, right after ray.init
            ray.shutdown()
            print(error_line(e), file=sys.stderr, flush=True)
            sys.exit(2)
        except Exception as e:  # noqa: BLE001 - re-raised unless the refill limit, or a node or process was lost
            if (why := refill_limit_reason(e)) is not None:  # the trainer's own stop (rpg.verl.refill_limit)
                line = run_stopped_line(config, why, list(sys.argv))
                ray.shutdown()
                print(line, file=sys.stderr, flush=True)
                sys.exit(1)
            reason = cluster.lost_reason(e)
            if reason is None:
                raise
            line = run_stopped_line(config, f"stopped: {reason}", list(sys.argv), alive=cluster.alive_groups())
            ray.shutdown()
            if (status := os.environ.get(ELASTIC_STATUS_ENV, "").strip()):  # the elastic supervisor decides
                hand_over(config, Path(status), reason, line)
                print(f"rpg: {reason}; Ray shut down; the elastic supervisor decides what follows", file=sys.stderr,
                      flush=True)
                sys.exit(ELASTIC_EXIT)
            print(line, file=sys.stderr, flush=True)
            sys.exit(1)


def hold_checkpoint_folder(config: DictConfig) -> list:
    """On a cluster the driver joined: hold ``trainer.default_local_dir`` for this driver (``rpg.verl.folder_lock``:
    another run writing it is refused in one line), unless the elastic supervisor that started this driver holds
    it. Returns what keeps the hold (nothing on a private Ray: one machine, the launcher checks the folder)."""
    from rpg.verl import folder_lock
    from rpg.verl.joined_cluster import joined_cluster

    folder = os.path.abspath(str(config.trainer.default_local_dir))
    if not joined_cluster(config) or folder_lock.held_by_parent(folder):
        return []
    job = ray.get_runtime_context().get_job_id()
    return list(folder_lock.acquire(folder, f"driver pid {os.getpid()} on {os.uname().nodename}, Ray job {job}"))


def hand_over(config: DictConfig, status: Path, reason: str, stop_line: str) -> None:
    """The elastic supervisor's record of a node loss (``rpg.cluster.elastic``): why, the stop line it prints if the
    run does not go on, the metrics history and the training steps it logged (written, then renamed)."""
    from rpg.metrics_log.history import logged_training_steps

    log = metrics_log(config)
    record = {"reason": reason, "stop_line": stop_line, "log": None if log is None else str(log),
              "logged_steps": sorted(logged_training_steps(log)) if log is not None else []}
    status.parent.mkdir(parents=True, exist_ok=True)
    tmp = status.with_name(status.name + ".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(status)
