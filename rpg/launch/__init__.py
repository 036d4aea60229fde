"""Starting runs: run names -> Hydra overrides, the launcher, the local run harness, the memory plan.

Modules (nothing is imported here, so ``import rpg.launch.<x>`` stays light):

* ``variants``     the run-name grammar: one parser for the 84 paper scripts (``parse``, ``to_overrides``).
* ``experiments``  each script's settings written from its name as a Hydra experiment config
                   (recipe/rpg/config/experiment/<run name>.yaml), which the launch composes.
* ``cli``          ``python -m rpg.launch``: the launcher behind ``recipe/rpg/{7b,4b}/*.sh`` (local, Ray
                   job, ``DRY_RUN=1``, ``RPG_BACKEND=cpu``, ``--describe``, ``--list``); it reads the environment
                   once (``request``), plans the overrides (``plan``), builds the command (``commands``) and
                   prints what it was asked to describe (``describe``).
* ``args``, ``config_keys``  a launcher's command line, and the composed config's keys and loggers checked.
* ``harness``      run the trainer here in a subprocess (the CPU backend's runs, the GPU smoke run): a package,
                   one module per concern (command, run, process, reaping, metrics, result, and the tether
                   that stops a trainer, SIGTERM, when its launcher dies, even by SIGKILL); ``run_dir``:
                   where a run writes.
* ``memory``       per-GPU memory, checkpoint disk and host RAM per node of a composed config.
* ``job``, ``ray_job_api``  a Ray job's submission id, resume command and follow-up; the job API's checks.

Shared with the driver and the reports (layers below): ``rpg.common`` (overrides, run environment, signals,
metrics history and the one reader of verl's metrics file).
"""
