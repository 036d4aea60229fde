"""RPG recipe entry point: ``python recipe/rpg/main_rpg.py [hydra overrides]``.

Composes ``config/rpg_trainer.yaml`` (verl's installed ``ppo_trainer`` + the ``rpg:`` block) and
hands over to ``rpg.verl.main`` (validation before Ray, RPG TaskRunner/trainer/worker).
See docs/verl-integration.md.
"""

import hydra

from rpg.verl.main import main_from_hydra


@hydra.main(config_path="config", config_name="rpg_trainer", version_base=None)
def main(config):
    main_from_hydra(config)


if __name__ == "__main__":
    main()
