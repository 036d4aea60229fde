"""Where verl runs: the CPU and the GPU backend behind one small interface, selected by name.

Layer: above the math, the leaves, ``rpg.common`` and the typed configuration; below the verl glue, the
driver and the launcher, which select a backend by name (``rpg.backends.registry.backend("cpu")``) and read
what it declares instead of testing its name. A backend imports nothing above it: this package (what both
backends share: ``backend_of_run``, ``versions``), then ``cpu``, ``gpu``, and last the ``registry`` that
imports them. Each backend is the module ``rpg.backends.<name>.backend`` with:

* ``NAME``; ``TINY_TASK``: whether a launch on it runs the tiny model/task (``rpg.tiny``) in place of the
  variant's model, data and sizes, through the launcher's harness (``rpg.launch.harness``), the variant's
  algorithm settings kept (the CPU backend); otherwise the recipe's entry runs the variant itself;
* ``IMPORT_ENV``: the variables of ``run_env`` that verl reads when it is imported (its platform): a launcher
  that composes the run's config in its own process sets them first;
* ``run_env(extra_modules, base) -> dict``: the environment every process of a run gets;
* ``run_overrides(env, overrides, *, joins_cluster) -> list``: the Hydra overrides it puts before the
  caller's ``overrides`` (which win); ``joins_cluster``: a job on a running Ray cluster;
* ``mode_overrides(given) -> list``: what the trainer mode of ``given`` (the run's override values) needs on
  this backend and the overrides leave unset (``trainer.v1.trainer_mode=separate_async``: its weight sync, and on
  the CPU backend its rollout pool); the recipe's entry gets them from the launcher, a harness run through
  ``run_overrides``;
* ``owned_keys() -> set``: the keys ``run_overrides`` sets, which a launch takes from the backend rather
  than from the variant (the user's overrides still win);
* ``launch_problems(env) -> (errors, warnings)``: what this machine lacks for a launch asked by its environment
  alone, before anything is composed (a malformed variable: ``ValueError``);
* ``config_problems(cfg, settings, environ) -> list``: the refusals of ``check_driver`` that the composed config and
  the environment decide, wherever it runs (``DRY_RUN=1`` refuses on them too, exit 2);
* ``node_problems(cfg, settings, environ) -> (errors, warnings)``: what this node lacks for a composed run
  (``DRY_RUN=1`` prints both as warnings);
* ``check_driver(cfg, settings, environ)``: the driver's checks before Ray, one line each (``RPGConfigError``):
  ``config_problems`` and the errors of ``node_problems``;
* ``rank_node_check(cfg, settings) -> (fn, args) | None``: on a Ray cluster the driver joined, what to run on each
  node that will hold a rank group, in a task holding that group's GPUs (``fn(*args)`` returns
  ``(errors, warnings)``, one line each): the node's own checks, where they hold;
* ``cluster_job_env(env, rendezvous) -> dict``: what a job on a running Ray cluster adds to its runtime env;
  ``private_run_env(private_dir) -> dict``: what a run with its own private Ray on this machine adds.

``backend_of_run``: which backend a composed run is on (the one answer the driver and every check use).
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
