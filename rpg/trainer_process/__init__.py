"""Run verl's real trainer on this machine in a subprocess and return its per-step metrics (the CPU backend's runs,
the GPU smoke run): ``run_trainer(overrides, output_dir=...)`` gives a ``TrainerRun`` or raises ``TrainerRunError``.

Re-exports what code outside the package uses; a test that patches a name patches it in the module that looks it
up (``rpg.trainer_process.run``).
"""

from rpg.trainer_process.command import build_command, trainer_overrides
from rpg.trainer_process.metrics import fold_segments, read_metrics
from rpg.trainer_process.reaping import SHM_DIR
from rpg.trainer_process.result import (TrainerRun, TrainerRunError, checkpoint_dir, report_failure, report_stop,
                                       resume_decision)
from rpg.trainer_process.run import LOG_FILE, run_trainer
from rpg.trainer_process.run_dir import METRICS_FILE

__all__ = ["LOG_FILE", "METRICS_FILE", "SHM_DIR", "TrainerRun", "TrainerRunError",
           "build_command", "checkpoint_dir", "fold_segments", "read_metrics", "report_failure", "report_stop",
           "resume_decision", "run_trainer", "trainer_overrides"]
