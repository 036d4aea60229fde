"""RPG recipe entry point: ``python recipe/rpg/main_rpg.py [+experiment=<run>] [hydra overrides]``.

Composes ``config/rpg_trainer.yaml`` (verl's installed ``ppo_trainer`` + the ``rpg:`` block), makes the checks
before Ray in one call and runs verl's ``run_ppo`` with the RPG task runner, in the driver's context
``rpg.verl.main.driver`` (the stop and resume lines; the RPG trainer and worker: rpg.verl). A paper run,
``+experiment=<run>`` (every paper script runs this through recipe/rpg/launch.sh), goes through its launch first
(``rpg.launch.entry``: the environment's paths and sizes and their checks; ``DRY_RUN=1``, ``--describe`` and
``RPG_BACKEND=cpu`` answer there, docs/launch-scripts.md), which gives back the run's overrides; they are composed
here once (Hydra's compose API) and checked by ``Launch.check``, so Hydra's main composes only a command line without
a run.

The command line is read first with Hydra's own parsers (``rpg.override_lists.bad_override_line``): an
override Hydra cannot read is one line naming it, exit code 2, before verl is imported. Hydra's flags (``--cfg
job``, ``-m``, ``--config-name``, ``hydra.*`` overrides, ...) pass through unchanged.
"""

import sys
from pathlib import Path

import hydra

CONFIG_DIR = Path(__file__).resolve().parent / "config"


@hydra.main(config_path="config", config_name="rpg_trainer", version_base=None)
def main(config):
    run(config)


def compose(overrides):
    """A paper run's config: Hydra's compose API on ``config/rpg_trainer.yaml`` with the launch's overrides."""
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra.compose(config_name="rpg_trainer", overrides=list(overrides))


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
        if isinstance(launched, list):  # no run, Hydra's flags, a launcher's command: Hydra composes
            # verl's import (seconds) once the command line is known to be readable, and before Hydra sets up
            # logging: its warnings of a GPU-less machine go to stderr, not to Hydra's job log on stdout
            import rpg.verl.main  # noqa: F401

            sys.argv[1:] = launched
            main()
        else:  # a paper run: composed here once, checked once (one line and exit 2 on a refusal), then run
            sys.argv[1:] = launched.argv  # the run's resume command repeats them
            with launched.before_ray():
                config = compose(launched.argv)
                settings = launched.check(config)
            run(config, settings)
    except KeyboardInterrupt:
        print("rpg: stopped by SIGINT while starting (before Ray: nothing was started)", file=sys.stderr, flush=True)
        sys.exit(130)
