"""RPG recipe entry point: ``python recipe/rpg/main_rpg.py [hydra overrides]``.

Hydra composes ``config/rpg_trainer.yaml`` (verl's installed ``ppo_trainer`` + the ``rpg:`` block) and verl's
``run_ppo`` runs with the RPG task runner inside the driver's context ``rpg.verl.main.driver``: the checks before Ray
in one call (one line naming the key or file, exit code 2), the stop and resume lines (the RPG trainer and worker:
rpg.verl). Hydra's flags (``--cfg job``, ``-m``, ``--config-name``, ``hydra.*`` overrides, ...) are Hydra's.

A paper run (``+experiment=<run>``: every paper script runs one, through recipe/rpg/launch.sh), ``DRY_RUN=1``,
``--describe`` and an override Hydra cannot read go to the paper runs' launcher in this process
(``rpg.launch.entry.cli``, also ``python -m rpg.launch``: the environment's paths and sizes, the dry run, the memory
plan, the CPU rehearsal, a paper run composed, checked and run once; docs/launch-scripts.md).
"""

import os
import sys

import hydra


@hydra.main(config_path="config", config_name="rpg_trainer", version_base=None)
def main(config):
    from rpg.verl.main import driver, run_ppo

    with driver(config) as task_runner:
        run_ppo(config, task_runner_class=task_runner)


if __name__ == "__main__":
    from rpg.launch.entry import cli, hydra_reads

    if not hydra_reads(sys.argv[1:], os.environ):
        sys.exit(cli(sys.argv[1:]))
    try:  # Ctrl-C while verl is imported or Hydra composes (before the driver's own stop handling): one line
        # verl's import (seconds) before Hydra sets up logging: its warnings of a GPU-less machine go to stderr,
        # not to Hydra's job log on stdout
        import rpg.verl.main  # noqa: F401

        main()
    except KeyboardInterrupt:
        print("rpg: stopped by SIGINT while starting (before Ray: nothing was started)", file=sys.stderr, flush=True)
        sys.exit(130)
