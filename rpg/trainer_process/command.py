"""The trainer's command line and environment, before anything starts.

The subprocess is ``python -m verl.trainer.main_ppo`` (or any ``entry``: a module name or a ``.py`` path such
as ``recipe/rpg/main_rpg.py``) with the backend's environment and overrides (``rpg.backends.<name>``:
``run_env``, ``run_overrides``; on the CPU backend ``rpg.backends.cpu.env_overrides``: ``cpu_env()``,
``cpu_overrides()``), the caller's overrides appended (later values win), ``trainer.logger`` including
``file`` and ``VERL_FILE_LOGGER_PATH`` (set by ``rpg.trainer_process.run``) pointing at
``<output_dir>/metrics.jsonl``: verl's FileLogger writes one JSON line ``{"step": s, "data": {...}}`` per
``logger.log`` call (the validation before training is logged at step 0).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from rpg.backends.registry import backend as select_backend
from rpg.metrics_log import history
from rpg.override_lists import hydra_list, merge_overrides, values
from rpg.verl.errors import LAUNCHED_ENV
DEFAULT_ENTRY = "verl.trainer.main_ppo"
DEFAULT_LOGGERS = ("console", "file")  # a run's loggers when none are given: the harness reads the file's


def entry_argv(entry: str) -> list[str]:
    """``-m module`` or an absolute script path (the run's cwd is its output directory)."""
    if not entry.endswith(".py"):
        return ["-m", entry]
    script = Path(entry).expanduser().resolve()
    if not script.is_file():
        raise ValueError(f"entry script not found: {entry!r} (resolved to {script})")
    return [str(script)]


def _with_file_logger(overrides: list[str]) -> list[str]:
    """``trainer.logger`` with verl's ``file`` logger added when missing (the harness reads its records:
    ``metrics.jsonl``); the user's other loggers are kept."""
    set_values = values(overrides)
    if "trainer.logger" not in set_values:
        return overrides + [f"trainer.logger={hydra_list(DEFAULT_LOGGERS, 'trainer.logger')}"]
    loggers = set_values["trainer.logger"]
    loggers = [loggers] if isinstance(loggers, str) else list(loggers or [])
    if history.logs_to_file(loggers):
        return overrides
    return merge_overrides(overrides, [f"trainer.logger={hydra_list([*loggers, 'file'], 'trainer.logger')}"])


def build_command(
    overrides: Iterable[str] = (),
    entry: str = DEFAULT_ENTRY,
    extra_modules: Iterable[str] = (),
    base_env: Mapping[str, str] | None = None,
    backend: str = "cpu",
    joins_cluster: bool = False,
) -> tuple[list[str], dict[str, str]]:
    """(argv, env) for a run of ``entry`` with ``overrides`` on the backend named ``backend`` (no process started).

    The backend's environment and its overrides first (``rpg.backends``: ``run_env``, ``run_overrides``), then
    ``overrides`` (they win), then verl's file logger when missing (the harness reads its records). On the CPU
    backend the world size ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` of ``overrides`` (default 1 x 1) gives
    the private local Ray its logical GPUs (``rpg.backends.cpu.world.ray_resources``; an explicit
    ``ray_kwargs.ray_init.*`` wins); on the GPU backend only the external modules are added (the caller's
    overrides carry the GPU settings). ``joins_cluster``: a job on a running Ray cluster (no private Ray's
    resources; the environment travels in the job's runtime env, ``rpg.backends.cpu.env_overrides.cluster_job_env``).
    """
    chosen = select_backend(backend)
    base_env = dict(os.environ if base_env is None else base_env)
    # the launch's checks are the caller's: main_rpg.py runs the command line as it is (rpg.launch.entry)
    env = {**base_env, **chosen.run_env(extra_modules, base=base_env), LAUNCHED_ENV: "1"}
    overrides = list(overrides)
    ov = _with_file_logger(merge_overrides(chosen.run_overrides(env, overrides, joins_cluster=joins_cluster), overrides))
    return [sys.executable, *entry_argv(entry), *ov], env


def trainer_overrides(overrides: Iterable[str] = (), entry: str = DEFAULT_ENTRY, base_env: Mapping[str, str] | None = None,
                      backend: str = "cpu") -> list[str]:
    """The overrides the trainer of ``run_trainer`` gets (the backend's, then ``overrides``; no process started):
    what a launcher checks against the composed config before it starts anything."""
    argv, _ = build_command(overrides, entry, (), base_env, backend)
    return argv[1 + len(entry_argv(entry)):]
