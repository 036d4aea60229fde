"""The GPU backend's interface (``rpg.backends``): verl's own CUDA path, vLLM rollouts, FSDP actors.

Its settings are ``rpg.backends.gpu.env_overrides`` (the run environment), its checks of this node
``rpg.backends.gpu.preflight`` (CUDA, the GPUs, the driver, vLLM, flash-attn; one line each).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rpg.backends.gpu.preflight import check_gpu_node, node_report, rank_node_problems, request_from_config
from rpg.backends.gpu.env_overrides import gpu_env, gpu_forwarded_overrides, separate_async_overrides
from rpg.override_lists import values

NAME = "gpu"
TINY_TASK = False
IMPORT_ENV = ()  # verl's default platform (CUDA): nothing to set before verl is imported


def run_env(extra_modules: Iterable[str] = (), base: Mapping[str, str] | None = None) -> dict[str, str]:
    return gpu_env(extra_modules, base=base)


def run_overrides(env: Mapping[str, str], overrides: Iterable[str] = (), *, joins_cluster: bool = False) -> list[str]:
    """The external-module list, handed to every Ray process, and what the trainer mode needs
    (``mode_overrides``): the caller's overrides carry the GPU settings."""
    return [*gpu_forwarded_overrides(env), *mode_overrides(values(list(overrides)))]


def mode_overrides(given: Mapping[str, object]) -> list[str]:
    return separate_async_overrides(given)


def owned_keys() -> set[str]:
    return set()


def launch_problems(env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    return [], []


def config_problems(cfg, settings, environ: Mapping[str, str]) -> list[str]:
    """None: every rule of ``check_driver`` is about this node (``rpg.backends.gpu.preflight``)."""
    return []


def node_problems(cfg, settings, environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """What the driver would refuse on this node for the run, then the version notes."""
    report = node_report(cfg, settings, environ)
    return ([], []) if report is None else (list(report.errors), list(report.warnings))


def check_driver(cfg, settings, environ: Mapping[str, str] | None = None) -> None:
    check_gpu_node(cfg, settings, environ)


def rank_node_check(cfg, settings):
    """The node rules and the software checks, run on each GPU node of a joined cluster (``rank_node_problems``)."""
    return rank_node_problems, (request_from_config(cfg, settings),)


def cluster_job_env(env: Mapping[str, str], rendezvous: str) -> dict[str, str]:
    """Nothing: verl's CUDA path needs no variable of its own in a job (NCCL meets through Ray)."""
    return {}


def private_run_env(private_dir: str) -> dict[str, str]:
    """Nothing: NCCL's rendezvous is verl's own on CUDA."""
    return {}
