"""RPG: Regularized Policy Gradient for LLM reasoning, as a verl recipe.

`rpg.math.formulas` states the paper's losses per token; `rpg.math.fused` is the loss library that computes them in
one pass (both import only torch). The verl glue lives in separate modules so the math stays importable and testable
without Ray or a GPU.
"""

__version__ = "0.1.0"
