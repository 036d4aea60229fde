"""The recipe's configuration, declared once and torch-free (docs/verl-integration.md, "Config keys").

* ``loss``    ``RPGLossConfig`` and its ``RULES``: every setting of one RPG loss (the loss library,
              ``rpg.losses``, re-exports them), and the names they allow (``DIVERGENCES``, ``FORMS``, ...).
* ``block``   ``RPGSettings``: the whole ``rpg:`` block as frozen dataclasses, each key with its default,
              what it allows and its doc; ``parse_rpg_settings`` validates a block against it.
* ``kinds``   what a key allows (a choice, a flag, an integer, a number, ...), checked strictly, one line.
* ``render``  the recipe YAML's ``rpg:`` block and the docs table, written from the declaration.
* ``access``  ``RPGConfigError`` and ``config_value``: how every layer refuses a config and reads its keys.

Nothing here imports torch, verl, Ray or the recipe's driver (``rpg.verl``), launchers (``rpg.launch``)
or backends, so that each of them can read the same declaration; omegaconf is imported only when a
composed config is read.
"""

from rpg.config.access import GPUS, NNODES, ULYSSES_KEYS, RPGConfigError, config_value, ulysses_sizes, world_size_of
from rpg.config.block import (ACTOR_FIELDS, BLOCK_RULES, LOSS_NAMES, OPTIMIZERS, PAPER_SAMPLES_PER_PROBLEM, RECIPE_REWARD,
                              REFERENCE_MODES, RESETTING_MODES, RPG_LOSSES, BlockRule, Key, ReferenceSettings,
                              RPGSettings, build_loss_config, declared_keys, loss_error, loss_fields, loss_key,
                              parse_rpg_settings, recorded_keys)
from rpg.config.loss import (AGG_MODES, BEHAVIOR_LEVELS, BRANCH_RULES, DIVERGENCES, FD_CLIP_MODES, FORMS, RULES,
                             RPGLossConfig, RPGLossConfigError, Rule, loss_defaults)
from rpg.config.render_block import render_rpg_block, settings_table

__all__ = [
    "ACTOR_FIELDS", "AGG_MODES", "BLOCK_RULES", "BEHAVIOR_LEVELS", "BRANCH_RULES", "DIVERGENCES", "FD_CLIP_MODES", "FORMS",
    "LOSS_NAMES", "OPTIMIZERS", "PAPER_SAMPLES_PER_PROBLEM", "RECIPE_REWARD", "REFERENCE_MODES", "RESETTING_MODES",
    "RPG_LOSSES", "RULES", "ULYSSES_KEYS", "BlockRule", "Key", "RPGConfigError", "RPGLossConfig", "RPGLossConfigError",
    "RPGSettings", "ReferenceSettings", "Rule", "build_loss_config", "config_value", "declared_keys", "loss_defaults",
    "loss_error", "loss_fields", "loss_key", "parse_rpg_settings", "recorded_keys", "render_rpg_block", "settings_table",
    "ulysses_sizes", "GPUS", "NNODES", "world_size_of",
]
