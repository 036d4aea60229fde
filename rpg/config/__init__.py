"""The recipe's configuration, declared once and torch-free.

* ``loss``    ``RPGLossConfig`` and its ``RULES``: every setting of one RPG loss (the loss library,
              ``rpg.losses``, re-exports them), and the names they allow (``DIVERGENCES``, ``FORMS``, ...).
* ``access``  ``RPGConfigError`` and ``config_value``: how every layer refuses a config and reads its keys.

Nothing here imports torch, verl, Ray or the recipe's driver (``rpg.verl``), launchers (``rpg.launch``)
or backends, so that each of them can read the same declaration; omegaconf is imported only when a
composed config is read.
"""

from rpg.config.access import ULYSSES_KEYS, RPGConfigError, config_value, ulysses_sizes
from rpg.config.loss import (AGG_MODES, BEHAVIOR_LEVELS, BRANCH_RULES, DIVERGENCES, FD_CLIP_MODES, FORMS, RULES,
                             RPGLossConfig, RPGLossConfigError, Rule, loss_defaults)

__all__ = [
    "AGG_MODES", "BEHAVIOR_LEVELS", "BRANCH_RULES", "DIVERGENCES", "FD_CLIP_MODES", "FORMS", "RULES", "ULYSSES_KEYS",
    "RPGConfigError", "RPGLossConfig", "RPGLossConfigError", "Rule", "config_value", "loss_defaults", "ulysses_sizes",
]
