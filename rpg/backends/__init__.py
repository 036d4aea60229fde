"""Where verl runs: the CPU and the GPU backend behind one interface, selected by name
(``rpg.backends.registry.backend("cpu")``); what each backend module offers: docs/architecture.md#the-backend-interface.
This package holds what both share: which backend a composed run is on (``backend_of_run``), ``versions``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

BACKENDS = ("gpu", "cpu")  # RPG_BACKEND values; the first is the default
PLATFORM_ENV = "VERL_PLATFORM"  # "cpu" in every process of a CPU-backend run (rpg.backends.cpu.env_overrides.cpu_env)


def on_cpu_platform(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs verl on the CPU backend: ``VERL_PLATFORM=cpu`` (the CPU backend's run
    environment sets it in every process of a run; nothing else selects it)."""
    environ = os.environ if environ is None else environ
    return environ.get(PLATFORM_ENV, "").strip().lower() == "cpu"


def backend_of_run(cfg, environ: Mapping[str, str] | None = None) -> str | None:
    """``cpu`` when this process runs verl on the CPU backend (``VERL_PLATFORM=cpu``, or ``trainer.device=cpu``),
    ``gpu`` on verl's CUDA platform (``trainer.device=cuda``, its default), None for any other device."""
    from rpg.config import config_value

    if on_cpu_platform(environ):
        return "cpu"
    device = config_value(cfg, "trainer.device")
    return {"cuda": "gpu", "cpu": "cpu"}.get(str(device or "cuda"))
