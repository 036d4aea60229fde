"""The recipe's configuration declared once (``rpg.config``): torch-free, below every layer that reads it."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import rpg.config

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(m.name for m in pkgutil.iter_modules(rpg.config.__path__, "rpg.config."))


def test_rpg_config_imports_without_torch_and_nothing_above_it():
    """Every module of rpg.config imports with torch absent, and pulls in none of the driver, the launchers,
    the backends, verl, Hydra or Ray (omegaconf only when a composed config is read)."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "import importlib, rpg.config\n"
            f"for m in {MODULES!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('rpg', 'verl', 'hydra', 'ray', 'omegaconf')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    loaded = eval(out.strip())
    assert set(MODULES) <= set(loaded)
    assert all(m == "rpg" or m.startswith(("rpg.config", "rpg.reward")) for m in loaded), loaded
    assert {"rpg.config.access", "rpg.config.loss"} <= set(MODULES)
