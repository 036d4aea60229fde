"""Math reward for the RPG runs: the paper's scorer (``rpg.reward.scorer``), verl's custom reward function
(``reward.custom_reward_function.path=pkg://rpg.reward``, ``name=compute_score``; the recipe sets it through
``rpg.reward_function``). Imports are absolute: the driver hands verl this file's path, and verl loads it as a
module of its own.
"""

from rpg.reward.scorer import (MATH_DAPO, MATH_VERIFY, MAX_ANSWER_CHARS, OPTIONS, VERL_DEFAULT, check_reward_kwargs,
                               compute_score, scorer_for)

__all__ = ["compute_score", "scorer_for", "check_reward_kwargs", "OPTIONS", "MATH_DAPO", "MATH_VERIFY",
           "VERL_DEFAULT", "MAX_ANSWER_CHARS"]
