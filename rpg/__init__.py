"""RPG: Regularized Policy Gradient for LLM reasoning, as a verl recipe.

`rpg.math.losses` is the exact loss library (imports only torch). The verl glue lives in
separate modules so the math stays importable and testable without Ray or a GPU.
"""

__version__ = "0.1.0"
