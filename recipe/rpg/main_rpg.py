"""RPG recipe entry point: ``python recipe/rpg/main_rpg.py [hydra overrides]``.

Composes ``config/rpg_trainer.yaml`` (verl's installed ``ppo_trainer`` + the ``rpg:`` block) and
hands over to ``rpg.verl.main`` (validation before Ray, RPG TaskRunner/trainer/worker).
See docs/verl-integration.md.

The command line is read first with Hydra's own parsers (``rpg.common.override_lists.exit_on_bad_argv``):
an override Hydra cannot read is one line naming it, exit code 2, before verl is imported (Hydra's
own report is three lines without the override's name, exit code 1). Hydra's flags (``--cfg job``,
``-m``, ``--config-name``, ``hydra.*`` overrides, ...) pass through unchanged.
"""

import sys

import hydra

from rpg.common.override_lists import exit_on_bad_argv
from rpg.verl.errors import ERROR_PREFIX


@hydra.main(config_path="config", config_name="rpg_trainer", version_base=None)
def main(config):
    from rpg.verl.main import main_from_hydra

    main_from_hydra(config)


if __name__ == "__main__":
    exit_on_bad_argv(sys.argv[1:], ERROR_PREFIX)
    try:  # Ctrl-C while verl is imported or Hydra composes (before rpg.verl.main's own stop handling): one line
        # verl's import (seconds) once the command line is known to be readable, and before Hydra sets up
        # logging: its warnings of a GPU-less machine go to stderr, not to Hydra's job log on stdout
        import rpg.verl.main  # noqa: F401

        main()
    except KeyboardInterrupt:
        print("rpg: stopped by SIGINT while starting (before Ray: nothing was started)", file=sys.stderr, flush=True)
        sys.exit(130)
