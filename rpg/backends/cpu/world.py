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

A ``trainer.v1.trainer_mode=separate_async`` run adds verl's standalone rollout pool (``rollout_ranks``:
``actor_rollout_ref.rollout.nnodes`` x ``.n_gpus_per_node``): each of its ranks takes a bundle ``{"CPU": 2,
"GPU": 1}`` of its replica's own placement group (verl/workers/rollout/replica.py, ``init_standalone``:
``max_colocate_count=2``), so the local Ray counts ``W + R`` logical GPUs and ``2 R`` more CPUs.
``SEPARATE_ASYNC_POOL`` is the pool the CPU backend gives such a run unless the overrides name one: one replica
of one rank (verl's default ``n_gpus_per_node`` is the trainer's, 8 unless set).

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
# A standalone rollout rank is two processes (its CheckpointEngineWorker, a Ray worker with torch and verl, and its
# HF server): counted as two FSDP ranks, not measured on its own.
ROLLOUT_RANK_GIB = 2 * RANK_GIB
ROLLOUT_CPUS_PER_RANK = 2  # verl's standalone bundle {"CPU": max_colocate_count=2, "GPU": 1}
SEPARATE_ASYNC = "separate_async"
TRAINER_MODE = "trainer.v1.trainer_mode"
ROLLOUT_NNODES, ROLLOUT_GPUS = "actor_rollout_ref.rollout.nnodes", "actor_rollout_ref.rollout.n_gpus_per_node"
SEPARATE_ASYNC_POOL = {ROLLOUT_NNODES: 1, ROLLOUT_GPUS: 1}


def ray_resources(nnodes: int = 1, n_gpus_per_node: int = 1, rollout_ranks: int = 0) -> dict[str, int]:
    """The logical resources of a private local Ray for ``nnodes * n_gpus_per_node`` ranks and ``rollout_ranks``
    standalone rollout ranks (``ray.init`` keyword arguments). Not for a run that connects to an existing cluster
    (see the module's text)."""
    world = nnodes * n_gpus_per_node
    return {"num_gpus": world + rollout_ranks,
            "num_cpus": BASE_CPUS + CPUS_PER_RANK * world + ROLLOUT_CPUS_PER_RANK * rollout_ranks}


def ray_resource_overrides(nnodes: int = 1, n_gpus_per_node: int = 1, rollout_ranks: int = 0) -> list[str]:
    """The world size and ``ray_resources`` as Hydra overrides (``+`` for num_gpus: not in verl's config)."""
    res = ray_resources(nnodes, n_gpus_per_node, rollout_ranks)
    return [f"{NNODES}={nnodes}", f"{GPUS}={n_gpus_per_node}",
            f"{RAY_CPUS}={res['num_cpus']}", f"+{RAY_GPUS}={res['num_gpus']}"]


def rollout_ranks_of(cfg_values: Mapping[str, Any]) -> int:
    """The standalone rollout pool's ranks of a run (0 unless ``trainer.v1.trainer_mode=separate_async``; the pool
    ``SEPARATE_ASYNC_POOL`` where the values do not name one). A value that is not an integer >= 1 raises
    ``ValueError`` naming the key."""
    if cfg_values.get(TRAINER_MODE) != SEPARATE_ASYNC:
        return 0
    ranks = 1
    for key in (ROLLOUT_NNODES, ROLLOUT_GPUS):
        value = cfg_values.get(key, SEPARATE_ASYNC_POOL[key])
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}={value!r} is invalid with {TRAINER_MODE}={SEPARATE_ASYNC}: expected an integer "
                             f">= 1 (its standalone rollout pool is {ROLLOUT_NNODES} x {ROLLOUT_GPUS} logical GPUs)")
        ranks *= value
    return ranks


def host_ram_gib(world: int, rollout_ranks: int = 0) -> float:
    """Host RAM a CPU run of ``world`` ranks (and ``rollout_ranks`` standalone rollout ranks) of the tiny model
    needs (RANK_GIB per rank, ROLLOUT_RANK_GIB per rollout rank, + BASE_GIB)."""
    return BASE_GIB + RANK_GIB * world + ROLLOUT_RANK_GIB * rollout_ranks


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
        rollout = rollout_ranks_of(cfg_values)
    except ValueError as e:
        return str(e)
    world = nnodes * gpus
    ray_gpus = cfg_values.get(RAY_GPUS)
    pool = (f" + the standalone rollout pool {ROLLOUT_NNODES} x {ROLLOUT_GPUS} = {rollout} ({TRAINER_MODE}="
            f"{SEPARATE_ASYNC})") if rollout else ""
    if ray_gpus is not None and (isinstance(ray_gpus, bool) or not isinstance(ray_gpus, (int, float))
                                 or ray_gpus < world + rollout):
        return (f"{RAY_GPUS}={ray_gpus!r} is below the world size {NNODES}={nnodes} x {GPUS}={gpus} = {world}{pool}: "
                f"each rank takes one logical GPU of the local Ray; remove {RAY_GPUS} (the CPU backend sets "
                f"{world + rollout}) or set it to >= {world + rollout}")
    total = _total_ram_gib() if total_gib is None else total_gib
    if host_ram_gib(world, rollout) > total:
        return (f"{NNODES}={nnodes} x {GPUS}={gpus} = {world} FSDP ranks{pool} on the CPU backend need about "
                f"{host_ram_gib(world, rollout):.0f} GiB of RAM ({RANK_GIB:g} GiB per rank, {ROLLOUT_RANK_GIB:g} per "
                f"rollout rank + {BASE_GIB:g} GiB, measured on the tiny model) but this machine has {total:.1f} GiB: "
                f"allowed world size 1..{max_world_size(total - ROLLOUT_RANK_GIB * rollout)}")
    return None


def world_problems(cfg, environ: Mapping[str, str] | None = None) -> tuple[list[str], list[str]]:
    """``check_world_fits``'s refusal (at most one line) on the CPU device (``trainer.device=cpu``), as
    (what the config and the environment decide: a world size that is not an integer >= 1, a
    ``ray_kwargs.ray_init.num_gpus`` below it; what this machine's RAM decides). A run that joins a Ray cluster
    (``RAY_ADDRESS``) is placed by that cluster: only the integer rule applies."""
    import math
    import os

    from omegaconf import OmegaConf

    from rpg.backends import backend_of_run

    environ = os.environ if environ is None else environ
    if backend_of_run(cfg, environ) != "cpu":
        return [], []
    keys = (NNODES, GPUS, RAY_GPUS, TRAINER_MODE, ROLLOUT_NNODES, ROLLOUT_GPUS)
    found = {k: OmegaConf.select(cfg, k, default=None) for k in keys}
    found = {k: v for k, v in found.items() if v is not None}
    if environ.get("RAY_ADDRESS", "").strip():
        try:
            world_size_of(found)
        except ValueError as e:
            return [str(e)], []
        return [], []
    if (problem := world_size_problem(found, total_gib=math.inf)) is not None:  # the rules but the RAM's
        return [problem], []
    problem = world_size_problem(found)
    return [], [problem] if problem else []


def check_world_fits(cfg, environ: Mapping[str, str] | None = None) -> None:
    """The driver's check before Ray (``rpg.verl.main.prepare_config``): ``world_problems`` as one
    ``RPGConfigError`` line."""
    from rpg.config import RPGConfigError

    config, machine = world_problems(cfg, environ)
    if config or machine:
        raise RPGConfigError((config or machine)[0])
