"""Driver and TaskRunner of the RPG recipe (``recipe/rpg/main_rpg.py`` is a thin Hydra shell).

``run(config)`` mirrors verl's ``verl.trainer.main_ppo.main`` (auto_set_device ->
validate_config -> run_ppo) with two differences:

1. ``rpg.verl.settings.validate_and_apply`` checks the ``rpg:`` block and writes the verl keys it
   implies, and ``rpg.verl.preflight.check_input_paths`` checks every local input path (data
   files, model/tokenizer directories, resume checkpoint), BEFORE verl's ``validate_config`` and
   before Ray starts (bad value -> one-line ``RPGConfigError`` naming the key, exit code 2);
2. ``run_ppo`` gets ``RPGTaskRunner``, whose ``run`` is verl's ``TaskRunnerV1.run`` with the
   trainer class fixed to ``RPGTrainer`` (``trainer.v1.trainer_mode`` stays ``sync``: verl
   compares that string to pick the replay buffer, so no new trainer name is registered), and
   verl's file logger pointed at a new segment of the run's metrics history for the duration of
   ``fit`` (``log_segment``: a resume never truncates the history; ``rpg.reports.history``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pprint import pprint

import ray
from omegaconf import DictConfig, OmegaConf

from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device
from verl.utils.logging_utils import configure_verl_logging

import rpg.verl.register  # noqa: F401  (registrations in the driver even without the entry point)
from rpg.reports.history import PATH_ENV, base_path, claim_segment
from rpg.verl.preflight import check_input_paths, error_line
from rpg.verl.settings import RPGConfigError, RPGSettings, describe, validate_and_apply


class RPGTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's v1 TaskRunner with the RPG trainer."""

    def run(self, config: DictConfig):
        configure_verl_logging()
        import transfer_queue as tq

        import rpg.verl.register  # noqa: F401  (advantage estimators run in this process)
        from rpg.verl.trainer import RPGTrainer

        config.transfer_queue.enable = True
        pprint(OmegaConf.to_container(config, resolve=True))
        OmegaConf.resolve(config)
        self.config = config
        tq.init(config.transfer_queue)
        succeeded = False
        try:
            self.trainer = RPGTrainer(config=config)
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
    history (read by verl's ``FileLogger``, which opens it with "wb", when ``fit`` starts)."""
    loggers = config.trainer.logger
    if "file" not in ([loggers] if isinstance(loggers, str) else list(loggers or ())):
        yield None
        return
    before = os.environ.get(PATH_ENV)
    path = claim_segment(base_path(config.trainer.project_name, config.trainer.experiment_name))
    os.environ[PATH_ENV] = str(path)
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(PATH_ENV, None)
        else:
            os.environ[PATH_ENV] = before


def prepare_config(config: DictConfig, *, check_paths: bool = True) -> RPGSettings:
    """Everything the driver does before Ray: RPG validation/translation, input paths, verl's checks.

    ``check_paths=False``: the caller reports missing paths itself (``rpg.launch`` under DRY_RUN=1
    or before a Ray submission, where the files live on the cluster).
    """
    auto_set_device(config)
    settings = validate_and_apply(config)
    if check_paths:
        check_input_paths(config)
    print(describe(config, settings), flush=True)
    validate_config(
        config=config,
        use_reference_policy=need_reference_policy(config),
        use_critic=need_critic(config),
    )
    return settings


def run(config: DictConfig) -> None:
    prepare_config(config)
    run_ppo(config, task_runner_class=ray.remote(RPGTaskRunner))


def main_from_hydra(config: DictConfig) -> None:
    """Body of the Hydra main: one clear line on a bad ``rpg:`` value or input path, then exit code 2."""
    try:
        prepare_config(config)
    except RPGConfigError as e:
        print(error_line(e), file=sys.stderr)
        sys.exit(2)
    run_ppo(config, task_runner_class=ray.remote(RPGTaskRunner))
