"""Run verl's real trainer on this machine in a subprocess and return its per-step metrics: on the CPU
backend (rpg.backends.cpu: the tiny demo, ``RPG_BACKEND=cpu``, the tests, the study) or, with
``backend="gpu"``, on CUDA (the GPU smoke run of rpg.demo.gpu_smoke). Each backend supplies its
environment and overrides (``rpg.backends.<name>.settings``); the process tree, output directory,
metrics history and stop handling are this package's.

    from rpg.launch.harness import run_trainer
    run = run_trainer(overrides, output_dir=tmp_path)           # raises TrainerRunError on failure
    run.metrics[2]["training/global_step"]                       # step -> merged metrics dict

One concern per module, each importing the ones below it directly:

* ``command``  the trainer's argv and environment (``build_command``, ``trainer_overrides``): the backend's
               settings, the caller's overrides, verl's file logger;
* ``run``      ``run_trainer``: the output directory's lock, start, wait, stop, clean-up, metrics;
* ``process``  while it runs: the output copied to ``trainer.log``, memory (RSS, PSS) and CPU sampled, new
               metric records forwarded;
* ``reaping``  every process of the run ended, and only those (pid and start time), its /dev/shm files;
* ``tether``   the trainer stopped (SIGTERM) when its launcher dies, even by SIGKILL;
* ``metrics``  the run's metrics history across resumes (segments folded into ``metrics.jsonl``), read
               with ``rpg.common.metrics_file``'s rules;
* ``result``   ``TrainerRun``, ``TrainerRunError`` and a launcher's words about a run that did not finish.

This module re-exports what code outside the package uses; a test that patches a name patches it in the
module that looks it up (``rpg.launch.harness.run``).
"""

from rpg.launch.harness.command import build_command, trainer_overrides
from rpg.launch.harness.metrics import fold_segments, read_metrics
from rpg.launch.harness.reaping import SHM_DIR
from rpg.launch.harness.result import (TrainerRun, TrainerRunError, checkpoint_dir, report_failure, report_stop,
                                       resume_decision)
from rpg.launch.harness.run import LOG_FILE, run_trainer
from rpg.launch.run_dir import METRICS_FILE

__all__ = ["LOG_FILE", "METRICS_FILE", "SHM_DIR", "TrainerRun", "TrainerRunError",
           "build_command", "checkpoint_dir", "fold_segments", "read_metrics", "report_failure", "report_stop",
           "resume_decision", "run_trainer", "trainer_overrides"]
