"""A benchmark under benchmarks/ imported as a module, for tests of its arithmetic and arguments."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module named ``name``; ``sys.path`` as it was (a benchmark may put benchmarks/
    on it to import another)."""
    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module
