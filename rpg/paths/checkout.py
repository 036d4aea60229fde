"""Where the recipe lives, declared once: the project's checkout holding this package (README installs it with
``pip install -e .``, so the package runs from its checkout) and the recipe's paths relative to it. The
launchers, the tiny demo and the study find the driver script and the Hydra config here; the tiny task keeps
its cache in the checkout when there is one (``checkout_root``).
"""

from __future__ import annotations

from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]  # the folder holding rpg/ (a checkout when it holds pyproject.toml)
RECIPE_DIR = Path("recipe") / "rpg"  # the recipe: scripts per model (7b/, 4b/), tiny/, config/, main_rpg.py
RECIPE_ENTRY = RECIPE_DIR / "main_rpg.py"  # the driver script
RECIPE_CONFIG_DIR = RECIPE_DIR / "config"  # its Hydra config folder (rpg_trainer.yaml, paper/)


def checkout_root() -> Path | None:
    """The source checkout holding this package (it has pyproject.toml), or None if rpg is installed elsewhere."""
    return CHECKOUT if (CHECKOUT / "pyproject.toml").exists() else None
