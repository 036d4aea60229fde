"""The paper runs' launcher, ``cli``: what recipe/rpg/main_rpg.py hands a paper run (``+experiment=<run>``: every
paper script's, through recipe/rpg/launch.sh), ``DRY_RUN``, ``--describe`` or an unreadable override to, in its
process; also ``python -m rpg.launch [+experiment=<run>] [overrides] [--describe]``. A tool beside the recipe's entry
point, which is Hydra's main around verl's ``run_ppo``.

``main`` reads the command line and the environment once (``rpg.launch.environment``) and answers: ``DRY_RUN=1``
(the run checked and printed), ``--describe`` (the run and its memory plan), ``RPG_BACKEND=cpu`` (a rehearsal on the
CPU backend: ``rpg.launch.rehearsal``), a bad input (one line, exit 2); or it gives a paper run's overrides
(``Launch``), which ``cli`` composes once (Hydra's compose API), checks once (``Launch.check``: every check the driver
makes before Ray, and the run's header) and hands to verl's ``run_ppo`` in the driver's context, in this process.
A command line that is not the launcher's (``hydra_reads``: no run and no ``DRY_RUN``, Hydra's own flags, one a
launcher already checked) goes to recipe/rpg/main_rpg.py's Hydra main as it is, and main_rpg.py hands the launcher's
own command lines here: both in one process, with one copy of this module deciding, so a command line never travels
back.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpg.backends.registry import backend
from rpg.override_lists import OverrideSyntaxError, bad_override_line, is_override
from rpg.config import RPGConfigError
from rpg.verl.errors import ERROR_PREFIX, LAUNCHED_ENV
from rpg.verl.input_paths import error_line

GROUP_PREFIX = "+experiment="


def main(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int | list[str] | Launch:
    """An exit code (the launch answered, or refused in one line), the command line Hydra's main composes
    (``hydra_reads``), or a paper run's overrides (``Launch``) for the driver to compose and check."""
    from rpg.trainer_process.run_dir import RunDirError
    from rpg.stop_signals import StopSignal, raise_on_stop_signals
    from rpg.launch.environment import LaunchError
    from rpg.launch.experiments import ExperimentError

    env = dict(os.environ if env is None else env)
    handlers = raise_on_stop_signals()  # Ctrl-C (or SIGHUP/SIGTERM) before the run: one line, 128 + signum
    try:
        return _main(list(argv), env)
    except StopSignal as e:  # during a rehearsal the harness handles it (its stop line) and returns
        handlers.hold()
        print(f"rpg.launch: stopped by {e.name} before the run started (nothing was started)", file=sys.stderr,
              flush=True)
        return e.code
    except (LaunchError, ExperimentError, OverrideSyntaxError, RunDirError) as e:
        print(f"rpg.launch: {e}", file=sys.stderr)
        return 2
    except RPGConfigError as e:  # from the driver's checks (compose): the driver's own line
        print(error_line(e), file=sys.stderr)
        return 2
    finally:
        handlers()


def cli(argv: Sequence[str]) -> int:
    """The launcher's command: ``main``'s answer as the exit code; a command line Hydra reads runs
    recipe/rpg/main_rpg.py as its script (``runpy``, in this process); a paper run is composed, checked and run here
    (the process's command line becomes main_rpg.py's with the run's overrides: the resume command the driver prints
    repeats it)."""
    import runpy

    from rpg.paths.checkout import CHECKOUT, RECIPE_ENTRY

    launched = main(argv)
    if isinstance(launched, int):
        return launched
    entry = str(CHECKOUT / RECIPE_ENTRY)
    if isinstance(launched, list):
        sys.argv = [entry, *launched]
        runpy.run_path(entry, run_name="__main__")
        return 0
    sys.argv = [entry, *launched.argv]
    try:  # Ctrl-C between the checks and the driver's own stop handling: one line
        config, settings = launched.prepare()
        from rpg.verl.main import driver, run_ppo

        with driver(config, settings) as task_runner:
            run_ppo(config, task_runner_class=task_runner)
    except KeyboardInterrupt:
        print("rpg: stopped by SIGINT while starting (before Ray: nothing was started)", file=sys.stderr, flush=True)
        return 130
    return 0


def run_name(argv: Sequence[str]) -> str | None:
    """The run ``+experiment=<run>`` names (the last one), or None."""
    names = [a[len(GROUP_PREFIX):] for a in argv if a.startswith(GROUP_PREFIX)]
    return names[-1] if names else None


def hydra_reads(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether recipe/rpg/main_rpg.py's Hydra main takes ``argv`` as it is: a launcher made the checks (the harness,
    the cluster layer: ``RPG_LAUNCHED``), Hydra's own flags, or neither a run (``+experiment=<run>``, ``--describe``)
    nor ``DRY_RUN``. Otherwise the command line is this launcher's (an unreadable override or a bad flag or
    ``DRY_RUN`` included: its one line). ``main`` gives back exactly the command lines this accepts, so the two
    entry points never hand one to each other twice."""
    from rpg.launch.describe import split_flags
    from rpg.launch.environment import LaunchError, flag

    if env.get(LAUNCHED_ENV):
        return True
    try:
        flags, rest = split_flags(argv)
    except LaunchError:
        return False
    if bad_override_line(rest) is not None:
        return False
    if not flags and any(not is_override(a) for a in rest):
        return True
    if flags or run_name(rest) is not None:
        return False
    try:
        return not flag(env, "DRY_RUN")
    except LaunchError:
        return False


def _main(argv: list[str], env: dict[str, str]) -> int | list[str] | Launch:
    from rpg.launch.describe import split_flags

    if hydra_reads(argv, env):
        return argv
    flags, argv = split_flags(argv)
    if (line := bad_override_line(argv)) is not None:  # before verl is imported: Hydra's own report is 3 lines
        print(f"{ERROR_PREFIX}: {line}", file=sys.stderr, flush=True)
        return 2
    name = run_name(argv)
    if name is None:
        if flags:
            from rpg.launch.environment import LaunchError

            raise LaunchError("--describe describes a run: add +experiment=<run>")
        return _plain(argv, env)
    return launch(name, [a for a in argv if not a.startswith(GROUP_PREFIX)], env, flags)


def _plain(argv: list[str], env: dict[str, str]) -> int:
    """A dry run without a run (``DRY_RUN=1`` and verl's plain driver's overrides): composed, checked and printed;
    ``Request.read`` refuses a ``DRY_RUN`` it cannot read in one line."""
    from rpg.launch.environment import Request
    from rpg.override_lists import check_user_overrides
    from rpg.launch.describe import dry_run
    from rpg.launch.plan import local_command

    check_user_overrides(argv)
    req = Request.read(env, Path.cwd())
    return dry_run(req, None, argv, local_command(argv))


def launch(name: str, user: list[str], env: dict[str, str], flags: Mapping[str, str] = ()) -> int | Launch:
    """The run ``name`` with the user's overrides ``user`` (see the module's text)."""
    from rpg.launch import experiments, rehearsal
    from rpg.launch.args import read_overrides
    from rpg.launch.config_keys import checked_config, logger_problem
    from rpg.launch.describe import describe, dry_run, header, launch_notes
    from rpg.launch.environment import TASK_VARS, VARIABLES, LaunchError, Request
    from rpg.launch.plan import local_command, plan, script_command

    exp = experiments.find(name, user)
    read_overrides(user, {k: what for k, (_, what) in VARIABLES.items()}, script_command(name))
    req = Request.read(env, Path.cwd())
    if flags:  # the paper's run on GPUs, whatever RPG_BACKEND says
        gpu = Request.read({k: v for k, v in env.items() if k != "RPG_BACKEND"}, req.cwd)
        return describe(exp, gpu, plan(exp, gpu, user), flags)
    if env.get("RPG_CLUSTER_ROOT", "").strip():
        print("rpg.launch: warning: RPG_CLUSTER_ROOT is ignored without RAY_ADDRESS (a run on this machine, from this "
              "checkout)", file=sys.stderr)
    chosen = backend(req.backend)
    if chosen.TINY_TASK and req.dry:
        rehearsal.import_platform(req)
    if (loggers := req.loggers()) is not None and (why := logger_problem(list(loggers), "LOGGER")) is not None:
        raise LaunchError(why)
    check_backend(chosen, req)
    if not chosen.TINY_TASK and env.get("RPG_CPU_MODEL", "").strip():
        print("rpg.launch: warning: RPG_CPU_MODEL is ignored without RPG_BACKEND=cpu (the model of a CPU rehearsal)",
              file=sys.stderr)
    if chosen.TINY_TASK and (unused := [k for k in TASK_VARS if env.get(k, "").strip()]):
        print(f"rpg.launch: warning: {', '.join(unused)} not used: RPG_BACKEND={req.backend} trains its own model and "
              "task; to train yours, override data.train_files / actor_rollout_ref.model.path", file=sys.stderr)
    overrides = plan(exp, req, user)
    if chosen.TINY_TASK:
        from rpg.trainer_process import build_command
        from rpg.paths.checkout import CHECKOUT, RECIPE_CONFIG_DIR, RECIPE_ENTRY

        # the model's own variables (SmolLM2's threads), as rehearse() gives them to the run: the dry run shows them
        run_env = {**env, **rehearsal.CpuModel(req.cpu_model).run_env(overrides, env)}
        argv, _ = build_command(overrides, entry=str(CHECKOUT / RECIPE_ENTRY), base_env=run_env, backend=req.backend)
        cfg = checked_config(argv[2:], CHECKOUT / RECIPE_CONFIG_DIR)  # keys and loggers, before anything is built
        if not req.dry:
            return rehearsal.rehearse(req, name, overrides, user, header(exp, cfg, launch_notes(exp, req, user)),
                                      cfg, script_command(name, req.cwd))
        rehearsal.check_out_dir(req, cfg)  # what the run would refuse in its OUT_DIR, refused by the dry run too
        rehearsal.build(req)  # the input paths are then checked as the run finds them
        return dry_run(req, exp, argv[2:], argv, user=user)
    if req.dry:
        return dry_run(req, exp, overrides, local_command(overrides), user=user)
    return Launch(list(overrides), lambda cfg: header(exp, cfg, launch_notes(exp, req, user)))


@dataclass(frozen=True)
class Launch:
    """A paper run through the launch's checks, for the driver: its overrides (the driver's command line, which its
    resume command repeats). ``cli`` composes them (``compose``) and hands the config to ``check`` inside
    ``before_ray``, then to verl's ``run_ppo``."""

    argv: list[str]
    header: Callable[[Any], str]

    def compose(self):
        """The run's config: Hydra's compose API on recipe/rpg/config/rpg_trainer.yaml with ``argv``, what Hydra's
        main would compose (a refusal: ``before_ray`` says it in one line)."""
        from hydra import compose, initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        from rpg.launch.experiments import CONFIG_NAME
        from rpg.paths.checkout import CHECKOUT, RECIPE_CONFIG_DIR

        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str((CHECKOUT / RECIPE_CONFIG_DIR).resolve()), version_base=None):
            return compose(config_name=CONFIG_NAME, overrides=list(self.argv))

    def prepare(self) -> tuple[Any, Any]:
        """The run's config and its ``RPGSettings``: composed once and checked once, inside ``before_ray`` (a
        refusal: one line, exit 2)."""
        with self.before_ray():
            config = self.compose()
            return config, self.check(config)

    def check(self, config) -> Any:
        """Every check the driver makes before Ray, once, on the run's composed ``config``: the keys its experiment
        file adds and ``trainer.logger`` (``rpg.launch.config_keys``), its header printed, then
        ``rpg.verl.main.prepare_config`` (the ``rpg:`` block, names, input paths, this node, the resume, verl's
        rules). Returns the ``RPGSettings`` of those checks; a refusal raises ``RPGConfigError``."""
        from rpg.launch.config_keys import check_composed
        from rpg.paths.checkout import CHECKOUT, RECIPE_CONFIG_DIR

        check_composed(config, self.argv, CHECKOUT / RECIPE_CONFIG_DIR)
        print(self.header(config), flush=True)
        from rpg.verl.main import prepare_config  # verl's import (seconds), once the config composes

        return prepare_config(config)

    @contextlib.contextmanager
    def before_ray(self):
        """Around the driver's composition and ``check``: a composition Hydra refuses or a refused check is one
        line (every key the config lacks: ``rpg.launch.config_keys``), exit 2; Ctrl-C (or SIGHUP/SIGTERM), one line,
        exit 128 + signum."""
        from hydra.errors import HydraException

        from rpg.launch.config_keys import compose_config
        from rpg.paths.checkout import CHECKOUT, RECIPE_CONFIG_DIR
        from rpg.stop_signals import StopSignal, raise_on_stop_signals

        handlers = raise_on_stop_signals()
        try:
            try:
                yield
            except HydraException:  # the keys it names, on one line: the launchers' own composition says why
                compose_config(self.argv, CHECKOUT / RECIPE_CONFIG_DIR)
                raise
        except StopSignal as e:
            handlers.hold()
            print(f"rpg.launch: stopped by {e.name} before the run started (nothing was started)", file=sys.stderr,
                  flush=True)
            sys.exit(e.code)
        except RPGConfigError as e:
            print(error_line(e), file=sys.stderr, flush=True)
            sys.exit(2)
        finally:
            handlers()


def check_backend(chosen, req) -> None:
    """The backend's checks of the launch environment (``launch_problems``): a bad value is one line (exit 2);
    what this machine lacks is one line too, a warning under DRY_RUN=1; a version note, a warning."""
    from rpg.launch.environment import LaunchError

    try:
        errors, warnings = chosen.launch_problems(req.env)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    for line in [*warnings, *(errors if req.dry else [])]:
        print(f"rpg.launch: warning: {line}", file=sys.stderr)
    if errors and not req.dry:
        raise LaunchError("; ".join(errors))

