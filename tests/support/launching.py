"""A paper run's launch in the tests, in this process: ``launch`` routes a script's command line as
recipe/rpg/launch.sh does (``rpg.cluster.submit`` with ``RAY_ADDRESS``, else ``rpg.launch.entry``, the launcher
``python -m rpg.launch``); ``recipe_main`` runs recipe/rpg/main_rpg.py's Hydra main on a config; ``planned`` gives
the overrides a run plans; ``generator`` loads ``scripts/experiments.py``, the run-name grammar and the check of the
shipped experiment files against it."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLEAN_ENV_KEYS = ("MODEL_PATH", "RPG_GPU_MEM_GIB", "RPG_HOST_MEM_GIB", "DATA_DIR", "TRAIN_FILE", "VAL_FILES",
                  "CKPTS_DIR", "NNODES", "N_GPUS_PER_NODE", "RAY_ADDRESS", "LOGGER", "PROJECT_NAME", "EXP_NAME",
                  "DRY_RUN", "RPG_BACKEND", "RPG_CPU_MODEL", "OUT_DIR", "RPG_CLUSTER_ROOT", "RAY_JOB_WAIT",
                  "VERL_FILE_LOGGER_ROOT", "TENSORBOARD_DIR", "RPG_LAUNCHED", "RPG_MAX_RESTARTS")


def env(**kw) -> dict[str, str]:
    """This process's environment without the launch's variables, then ``kw``."""
    out = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV_KEYS}
    out.update(kw)
    return out


def launch(argv: list[str], environ: dict[str, str]) -> int | list[str]:
    """``recipe/rpg/launch.sh RUN [overrides]`` in this process: an exit code, or (a run on this machine that
    passed every check) the command line the driver would run. As in the launcher's own process, which imports verl
    only after a CPU dry run has set its platform's variables, whatever the tests before it imported; and what the
    launch sets in ``os.environ`` (those variables) ends with it."""
    if environ.get("RAY_ADDRESS", "").strip():
        from rpg.cluster.submit import main

        return main(argv, environ)
    from rpg.launch.entry import Launch, main

    saved = dict(os.environ)
    if environ.get("RPG_BACKEND") == "cpu" and "verl" in sys.modules:
        _register_cpu_platform()
    try:
        launched = main([f"+experiment={argv[0]}", *argv[1:]] if argv and not argv[0].startswith("-") else argv,
                        environ)
        if isinstance(launched, Launch):  # the launcher composes the run and checks it before Ray
            try:
                launched.prepare()
            except SystemExit as e:
                return e.code
        return launched
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _register_cpu_platform() -> None:
    """verl's CPU platform, which verl registers (``rpg.backends.cpu.external_module``) when it is first imported
    under ``VERL_PLATFORM=cpu``: here verl was imported before, by another test."""
    from verl.plugin.platform.platform_manager import PlatformRegistry

    from rpg.backends.cpu.platform import PlatformCPU

    if PlatformRegistry.get("cpu") is None:
        PlatformRegistry.register("cpu")(PlatformCPU)


def recipe_main(config) -> None:
    """recipe/rpg/main_rpg.py's Hydra main on a composed ``config`` (Hydra's main runs a config given to it as it is):
    verl's ``run_ppo`` inside the driver's context, ``rpg.verl.main.run_ppo`` looked up when it runs."""
    spec = importlib.util.spec_from_file_location("main_rpg", ROOT / "recipe" / "rpg" / "main_rpg.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(config)


def planned(name: str, environ: dict[str, str] | None = None, user=(), cwd: Path = ROOT, backend: str | None = None,
            cluster: bool = False) -> list[str]:
    """Every override the run ``name`` plans (``rpg.launch.plan.plan``), ``backend`` in place of RPG_BACKEND."""
    from rpg.cluster.submit import cluster_root
    from rpg.launch.environment import Request
    from rpg.launch.experiments import find
    from rpg.launch.plan import plan

    environ = {**(environ or {}), **({"RPG_BACKEND": backend} if backend else {})}
    root = cluster_root(environ) if cluster else ROOT
    return plan(find(name, list(user)), Request.read(environ, cwd, root, cluster), list(user))


@functools.lru_cache(maxsize=1)
def generator():
    """scripts/experiments.py as a module."""
    spec = importlib.util.spec_from_file_location("experiments_generator", ROOT / "scripts" / "experiments.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
