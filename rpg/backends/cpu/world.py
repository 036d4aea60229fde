"""World size of a CPU run: how many FSDP ranks (``trainer.nnodes`` x ``trainer.n_gpus_per_node``), the
logical Ray resources that serve them, and whether this machine can.

On the CPU backend each rank is a Ray worker that asks verl's placement group for one *logical* GPU
(``rpg.backends.cpu.platform``: the resource keeps the name ``GPU``, nothing touches CUDA), so the private
local Ray that verl starts must count as many GPUs as there are ranks. ``ray_resources`` is that rule, in
one place:

    ray_resources(nnodes, n_gpus_per_node) -> {"num_gpus": W, "num_cpus": BASE_CPUS + CPUS_PER_RANK * W}

Why these CPU counts (logical: Ray only counts them; oversubscribing 2 real cores is fine): every rank's
placement-group bundle reserves ``{"CPU": 3, "GPU": 1}`` (verl/single_controller/ray/base.py:146, with
``ResourcePoolManager.max_colocate_count=3``, base.py:192), and the TaskRunner, the reward worker, the
agent-loop worker and TransferQueue's controller and storage unit hold one CPU each outside the
placement groups (BASE_CPUS). ``W = 1`` gives the backend's earlier fixed 8.

A run that joins an existing Ray cluster (``RAY_ADDRESS``, ``ray job submit``) must NOT pass these: Ray's
``ray.init`` refuses ``num_cpus``/``num_gpus`` when connecting; such a cluster declares its resources when
its nodes start (``ray start --num-gpus``). ``ray_resource_overrides`` is the Hydra form for a private one.

``check_world_fits`` (the driver, before Ray, CPU device only): a world size that is not an integer >= 1,
a ``ray_kwargs.ray_init.num_gpus`` below it, or more ranks than this machine's RAM holds, is one line
naming the keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rpg.config.access import GPUS, NNODES, world_size_of

RAY_GPUS, RAY_CPUS = "ray_kwargs.ray_init.num_gpus", "ray_kwargs.ray_init.num_cpus"
CPUS_PER_RANK = 3  # verl's placement bundle {"CPU": max_colocate_count=3, "GPU": 1} per rank
BASE_CPUS = 5  # TaskRunner, reward worker, agent-loop worker, TransferQueue controller + storage unit
# Host RAM of one run, from the tiny demo (peak summed PSS of the run's processes, 2 steps, HF rollout, a
# checkpoint saved): 3.7 GiB at world size 1, 4.3-4.4 GiB at world size 2, i.e. ~0.7 GiB per FSDP rank (a Ray
# worker with torch and verl imported), rounded up to RANK_GIB; the rest (Ray's daemons, the TaskRunner,
# reward, agent-loop and rollout processes) to BASE_GIB. A larger model adds its weights, gradients and
# optimizer states on top (sharded: their sum does not grow with the world size), not counted here.
RANK_GIB = 1.0
BASE_GIB = 3.0


def ray_resources(nnodes: int = 1, n_gpus_per_node: int = 1) -> dict[str, int]:
    """The logical resources of a private local Ray for ``nnodes * n_gpus_per_node`` ranks (``ray.init``
    keyword arguments). Not for a run that connects to an existing cluster (see the module's text)."""
    world = nnodes * n_gpus_per_node
    return {"num_gpus": world, "num_cpus": BASE_CPUS + CPUS_PER_RANK * world}


def ray_resource_overrides(nnodes: int = 1, n_gpus_per_node: int = 1) -> list[str]:
    """The world size and ``ray_resources`` as Hydra overrides (``+`` for num_gpus: not in verl's config)."""
    res = ray_resources(nnodes, n_gpus_per_node)
    return [f"{NNODES}={nnodes}", f"{GPUS}={n_gpus_per_node}",
            f"{RAY_CPUS}={res['num_cpus']}", f"+{RAY_GPUS}={res['num_gpus']}"]


def host_ram_gib(world: int) -> float:
    """Host RAM a CPU run of ``world`` ranks of the tiny model needs (RANK_GIB per rank + BASE_GIB)."""
    return BASE_GIB + RANK_GIB * world


def max_world_size(total_gib: float) -> int:
    """The largest world size whose ``host_ram_gib`` fits in ``total_gib``."""
    return max(int((total_gib - BASE_GIB) // RANK_GIB), 0)


def _total_ram_gib() -> float:
    import psutil

    return psutil.virtual_memory().total / 2**30


def world_size_problem(cfg_values: Mapping[str, Any], total_gib: float | None = None) -> str | None:
    """Why this machine cannot run a CPU run of this world size (one line naming the keys), or None.

    ``cfg_values``: the run's dotted keys (``trainer.nnodes``, ``trainer.n_gpus_per_node``,
    ``ray_kwargs.ray_init.num_gpus``); ``total_gib``: the machine's RAM (default: psutil's total, a fixed
    property of the machine, so the verdict does not depend on what else happens to run)."""
    try:
        nnodes, gpus = world_size_of(cfg_values)
    except ValueError as e:
        return str(e)
    world = nnodes * gpus
    ray_gpus = cfg_values.get(RAY_GPUS)
    if ray_gpus is not None and (isinstance(ray_gpus, bool) or not isinstance(ray_gpus, (int, float))
                                 or ray_gpus < world):
        return (f"{RAY_GPUS}={ray_gpus!r} is below the world size {NNODES}={nnodes} x {GPUS}={gpus} = {world}: "
                f"each FSDP rank takes one logical GPU of the local Ray; remove {RAY_GPUS} (the CPU backend sets "
                f"{world}) or set it to >= {world}")
    total = _total_ram_gib() if total_gib is None else total_gib
    if host_ram_gib(world) > total:
        return (f"{NNODES}={nnodes} x {GPUS}={gpus} = {world} FSDP ranks on the CPU backend need about "
                f"{host_ram_gib(world):.0f} GiB of RAM ({RANK_GIB:g} GiB per rank + {BASE_GIB:g} GiB, measured on the "
                f"tiny model) but this machine has {total:.1f} GiB: allowed world size 1..{max_world_size(total)}")
    return None


def check_world_fits(cfg, environ: Mapping[str, str] | None = None) -> None:
    """The driver's check before Ray (``rpg.verl.main.prepare_config``) on the CPU device (``trainer.device=cpu``):
    ``world_size_problem`` as one ``RPGConfigError`` line. A run that joins a Ray cluster (``RAY_ADDRESS``) is
    placed by that cluster: only the integer rule applies."""
    import os

    from omegaconf import OmegaConf

    from rpg.backends import backend_of_run
    from rpg.config import RPGConfigError

    environ = os.environ if environ is None else environ
    if backend_of_run(cfg, environ) != "cpu":
        return
    keys = (NNODES, GPUS, RAY_GPUS)
    found = {k: OmegaConf.select(cfg, k, default=None) for k in keys}
    found = {k: v for k, v in found.items() if v is not None}
    if environ.get("RAY_ADDRESS", "").strip():
        try:
            world_size_of(found)
        except ValueError as e:
            raise RPGConfigError(str(e)) from None
        return
    problem = world_size_problem(found)
    if problem:
        raise RPGConfigError(problem)
