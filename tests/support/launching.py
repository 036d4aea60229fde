"""A paper run's launch in the tests, in this process: ``launch`` routes a script's command line as
recipe/rpg/launch.sh does (``rpg.cluster.submit`` with ``RAY_ADDRESS``, else ``rpg.launch.entry``, what
recipe/rpg/main_rpg.py runs first); ``planned`` gives the overrides a run plans; ``generator`` loads
``scripts/experiments.py``, the run-name grammar and the check of the shipped experiment files against it."""

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
    passed every check) the command line the driver would run."""
    if environ.get("RAY_ADDRESS", "").strip():
        from rpg.cluster.submit import main

        return main(argv, environ)
    from rpg.launch.config_keys import compose_config
    from rpg.launch.entry import Launch, main
    from rpg.paths.checkout import CHECKOUT, RECIPE_CONFIG_DIR

    launched = main([f"+experiment={argv[0]}", *argv[1:]] if argv and not argv[0].startswith("-") else argv, environ)
    if isinstance(launched, Launch):  # main_rpg.py composes the run and checks it before Ray: an exit code or the run
        try:
            with launched.before_ray():
                launched.check(compose_config(launched.argv, CHECKOUT / RECIPE_CONFIG_DIR))
        except SystemExit as e:
            return e.code
    return launched


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
