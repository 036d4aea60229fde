"""The GPU backend's run settings: the environment of every process of a run on verl's own CUDA path.

Nothing selects a platform there (verl's default, CUDA, runs); the only addition is the list of
verl's external modules (``VERL_USE_EXTERNAL_MODULES``), handed to every Ray process. The tiny GPU
smoke run's own settings (its overrides and their checks) are the demo's: ``rpg.demo.smoke_settings``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rpg.common.run_env import EXTERNAL_MODULES_ENV, RUN_ENV, external_modules, forwarded_env_overrides

REGISTER_MODULE = "rpg.backends.gpu.register"  # loaded in every process of a run with rollout.name=hf on CUDA
_FORWARDED = (EXTERNAL_MODULES_ENV,)


def gpu_env(extra_modules: Iterable[str] = (), base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a GPU run: the shared run environment and, if any, the external modules.

    Nothing selects a platform: verl's default (CUDA) runs.
    """
    base = {} if base is None else base
    env = dict(RUN_ENV)
    mods = external_modules(extra_modules, base.get(EXTERNAL_MODULES_ENV))
    if mods:
        env[EXTERNAL_MODULES_ENV] = mods
    return env


def gpu_forwarded_overrides(env: Mapping[str, str]) -> list[str]:
    """Hand the external-module list to every Ray process (as the CPU settings do)."""
    return forwarded_env_overrides(env, _FORWARDED)
