"""The backends by name: ``backend("cpu")``, ``backend("gpu")`` (the interface: ``rpg.backends``).

The registry sits above both backends (it imports them, lazily, so that selecting one never imports the
other); the launcher, the harness and the driver select through it.
"""

from __future__ import annotations

from types import ModuleType

from rpg.backends import BACKENDS


def backend(name: str) -> ModuleType:
    """The backend called ``name`` (``ValueError`` naming the allowed values)."""
    if name == "cpu":
        from rpg.backends.cpu import backend as cpu

        return cpu
    if name == "gpu":
        from rpg.backends.gpu import backend as gpu

        return gpu
    raise ValueError(f"backend={name!r} is invalid; allowed values: {', '.join(BACKENDS)}")
