"""RPG recipe entry point: ``python recipe/rpg/main_rpg.py [+experiment=<run>] [hydra overrides]``.

Composes ``config/rpg_trainer.yaml`` (verl's installed ``ppo_trainer`` + the ``rpg:`` block) and runs verl's
``run_ppo`` with the RPG task runner, in the driver's context ``rpg.verl.main.driver`` (validation before Ray, the stop
and resume lines; the RPG trainer and worker: rpg.verl). A paper run, ``+experiment=<run>`` (every
paper script runs this through recipe/rpg/launch.sh), is launched by ``rpg.launch.entry`` first: the environment's
paths and sizes, its checks and header before anything starts, ``DRY_RUN=1``, ``--describe`` and
``RPG_BACKEND=cpu`` (docs/launch-scripts.md); the launch composes the run's config once (Hydra's compose API) and
the driver runs that config, so Hydra's main composes only a command line without a run.

The command line is read first with Hydra's own parsers (``rpg.override_lists.bad_override_line``): an
override Hydra cannot read is one line naming it, exit code 2, before verl is imported. Hydra's flags (``--cfg
job``, ``-m``, ``--config-name``, ``hydra.*`` overrides, ...) pass through unchanged.
"""

import sys

import hydra



@hydra.main(config_path="config", config_name="rpg_trainer", version_base=None)
def main(config):
    run(config)


def run(config, settings=None):
    """verl's ``run_ppo`` with the RPG task runner, in the driver's context (``rpg.verl.main.driver``: the checks
    before Ray unless ``settings`` says they were made, the stop and resume lines, the cluster's checks)."""
    import rpg.verl.main as driver

    with driver.driver(config, settings) as task_runner:
        driver.run_ppo(config, task_runner_class=task_runner)


if __name__ == "__main__":
    from rpg.launch.entry import main as launch

    launched = launch(sys.argv[1:])  # an exit code when the launch answered (a dry run, a rehearsal) or refused
    if isinstance(launched, int):
        sys.exit(launched)
    try:  # Ctrl-C while verl is imported or Hydra composes (before rpg.verl.main's own stop handling): one line
        # verl's import (seconds) once the command line is known to be readable, and before Hydra sets up
        # logging: its warnings of a GPU-less machine go to stderr, not to Hydra's job log on stdout
        import rpg.verl.main

        if isinstance(launched, list):  # no run, Hydra's flags, a launcher's command: Hydra composes
            sys.argv[1:] = launched
            main()
        else:  # a paper run, composed and checked once by its launch: the driver runs that config
            sys.argv[1:] = launched.argv  # the run's resume command repeats them
            run(launched.config, launched.settings)
    except KeyboardInterrupt:
        print("rpg: stopped by SIGINT while starting (before Ray: nothing was started)", file=sys.stderr, flush=True)
        sys.exit(130)
