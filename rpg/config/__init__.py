"""The recipe's configuration, declared once and torch-free: the ``rpg:`` block and ``RPGLossConfig`` with their
rules, and what is written from them (docs/verl-integration.md#config-keys). Nothing here imports torch, verl, Ray
or the layers above, so that each of them reads the same declaration; omegaconf only when a composed config is read.
"""

from rpg.config.access import GPUS, NNODES, ULYSSES_KEYS, RPGConfigError, config_value, ulysses_sizes, world_size_of
from rpg.config.block import (ACTOR_FIELDS, BLOCK_RULES, LOSS_NAMES, OPTIMIZERS, PAPER_SAMPLES_PER_PROBLEM, RECIPE_REWARD,
                              REFERENCE_MODES, RESETTING_MODES, RPG_LOSSES, BlockRule, Key, ReferenceSettings,
                              RPGSettings, declared_keys, loss_error, loss_fields, loss_key,
                              parse_rpg_settings, recorded_keys)
from rpg.config.loss import (AGG_MODES, BEHAVIOR_LEVELS, BRANCH_RULES, DIVERGENCES, FD_CLIP_MODES, FORMS, RULES,
                             RPGLossConfig, RPGLossConfigError, Rule, build_loss_config, loss_config, loss_defaults)
from rpg.config.render_block import render_rpg_block, settings_table

__all__ = [
    "ACTOR_FIELDS", "AGG_MODES", "BLOCK_RULES", "BEHAVIOR_LEVELS", "BRANCH_RULES", "DIVERGENCES", "FD_CLIP_MODES", "FORMS",
    "LOSS_NAMES", "OPTIMIZERS", "PAPER_SAMPLES_PER_PROBLEM", "RECIPE_REWARD", "REFERENCE_MODES", "RESETTING_MODES",
    "RPG_LOSSES", "RULES", "ULYSSES_KEYS", "BlockRule", "Key", "RPGConfigError", "RPGLossConfig", "RPGLossConfigError",
    "RPGSettings", "ReferenceSettings", "Rule", "build_loss_config", "config_value", "declared_keys", "loss_config",
    "loss_defaults", "loss_error", "loss_fields", "loss_key", "parse_rpg_settings", "recorded_keys", "render_rpg_block", "settings_table",
    "ulysses_sizes", "GPUS", "NNODES", "world_size_of",
]
