"""The GPU backend's run settings: the environment of every process of a run on verl's own CUDA path.

Nothing selects a platform there (verl's default, CUDA, runs); the additions, handed to every Ray process on
every node, are the list of verl's external modules (``VERL_USE_EXTERNAL_MODULES``) and vLLM's log level
(``rpg.backends.run_env.vllm_log_env``). The tiny GPU smoke run's own settings (its overrides and their
checks) are the demo's: ``rpg_lab.demo.smoke_settings``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rpg.backends.run_env import (EXTERNAL_MODULES_ENV, RUN_ENV, VLLM_LOG_ENV, external_modules,
                                  forwarded_env_overrides, vllm_log_env)

REGISTER_MODULE = "rpg.backends.gpu.external_module"  # loaded in every process of a run with rollout.name=hf on CUDA
_FORWARDED = (EXTERNAL_MODULES_ENV, VLLM_LOG_ENV)


def gpu_env(extra_modules: Iterable[str] = (), base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a GPU run: the shared run environment and, if any, the external modules.

    Nothing selects a platform: verl's default (CUDA) runs.
    """
    base = {} if base is None else base
    env = dict(RUN_ENV)
    env.update(vllm_log_env(base))
    mods = external_modules(extra_modules, base.get(EXTERNAL_MODULES_ENV))
    if mods:
        env[EXTERNAL_MODULES_ENV] = mods
    return env


def gpu_forwarded_overrides(env: Mapping[str, str]) -> list[str]:
    """Hand the external-module list (as the CPU settings do) and vLLM's log level to every Ray process."""
    return forwarded_env_overrides(env, _FORWARDED)


# verl's checkpoint engine for a standalone rollout pool on GPUs (trainer.v1.trainer_mode=separate_async): NCCL
# broadcasts from the trainer's rank 0 to every rollout GPU (verl/checkpoint_engine/nccl_checkpoint_engine.py)
CHECKPOINT_ENGINE, ENGINE_NAME = "actor_rollout_ref.rollout.checkpoint_engine.backend", "nccl"
TRAINER_MODE, SEPARATE_ASYNC = "trainer.v1.trainer_mode", "separate_async"


def separate_async_overrides(given: Mapping[str, object]) -> list[str]:
    """What ``trainer.v1.trainer_mode=separate_async`` (in ``given``, the run's override values) needs on GPUs and
    the overrides leave unset: verl's nccl weight sync (verl's default is naive, which its trainer refuses). The
    rollout pool (``actor_rollout_ref.rollout.nnodes`` x ``.n_gpus_per_node``) is the user's to size: the driver
    refuses a run without one. Nothing for another mode."""
    if given.get(TRAINER_MODE) != SEPARATE_ASYNC or CHECKPOINT_ENGINE in given:
        return []
    return [f"{CHECKPOINT_ENGINE}={ENGINE_NAME}"]
