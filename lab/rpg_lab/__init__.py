"""The RPG project's lab: what the project uses to test and study itself, beside the recipe (``rpg``).

``rpg_lab.exact``: exact enumeration over small categorical distributions and sequences (float64 oracles);
``rpg_lab.conformance``: the KL-gradient conformance report (``python -m rpg_lab.conformance``). The recipe never
imports the lab (import-linter's contract in pyproject.toml).
"""
