"""The paper's formulas in torch: the RPG losses, their KL pieces, advantages and behaviour weights (docs/math.md)."""
