"""Single source of truth: the environment variables and Hydra overrides that put verl on CPU.

Everything that runs verl on the CPU backend (recipe/rpg/tiny/run_tiny_cpu.sh, the tests, the
RPG recipe's e2e tests and the variant launcher) takes these from here; never copy them.

    from rpg.backends.cpu.env_overrides import cpu_env, cpu_overrides
    env = {**os.environ, **cpu_env()}
    argv = [sys.executable, "-m", "verl.trainer.main_ppo", *cpu_overrides(), *your_overrides]

Why each item is needed is written next to it (details: docs/cpu-backend.md). Model/data/batch-size
choices are *not* here: they belong to the run (see rpg.tiny.overrides for the tiny demo). What every
local run sets, whatever the backend: rpg.backends.run_env.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from rpg.backends import PLATFORM_ENV
from rpg.backends.cpu import vllm_cpu
from rpg.backends.cpu import world
from rpg.backends.cpu.world import ray_resource_overrides
from rpg.backends.hf_rollout.verl_registries import AGENT_LOOP, ROLLOUT_NAME
from rpg.override_lists import merge_overrides
from rpg.backends.run_env import (EXTERNAL_MODULES_ENV, QUIET_RAY_ENV, RUN_ENV, external_modules,
                                  forwarded_env_overrides)

REGISTER_MODULE = "rpg.backends.cpu.external_module"
CHECKPOINT_ENGINE_ROOT = "actor_rollout_ref.rollout.checkpoint_engine"
CHECKPOINT_ENGINE = f"{CHECKPOINT_ENGINE_ROOT}.backend"
# the weight sync of a standalone rollout pool (separate_async): its registered name and the module verl imports
# (checkpoint_engine.custom_backend_module) to register it
ENGINE_NAME, ENGINE_MODULE = "rpg_cpu_object_store", "rpg.backends.cpu.weight_sync"

# The actor's micro-batches as prefix trees (rpg.backends.cpu.tree_engine); 0: verl's packed forward
PREFIX_TREE_ENV = "RPG_CPU_PREFIX_TREE"


def prefix_tree_on(env: Mapping[str, str] | None = None) -> bool:
    """The prefix tree is on unless ``RPG_CPU_PREFIX_TREE`` is ``0``; another value than 0 or 1 is a ValueError."""
    value = (os.environ if env is None else env).get(PREFIX_TREE_ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{PREFIX_TREE_ENV}={value!r} is invalid; allowed: 0 (verl's packed forward) or 1 (the "
                         f"prefix tree, the default)")
    return value == "1"


# Forwarded to every Ray process through ray_kwargs.ray_init.runtime_env.env_vars as well
# (Ray workers on this node also inherit the driver's environment; the explicit forward keeps it
# correct when they do not, e.g. on a pre-started cluster).
_FORWARDED = (PLATFORM_ENV, EXTERNAL_MODULES_ENV, "TORCH_COMPILE_DISABLE", "OMP_NUM_THREADS",
              "TQ_NUM_THREADS", PREFIX_TREE_ENV, *vllm_cpu.FORWARDED)


def cpu_env(extra_modules: Iterable[str] = (), base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment variables for a CPU run (merge into os.environ of the launching process).

    ``extra_modules`` are appended to VERL_USE_EXTERNAL_MODULES (e.g. a recipe's registration
    module); modules already listed in ``base`` (default: os.environ) are kept. ``RPG_CPU_ROLLOUT=vllm``
    in ``base`` adds the vLLM-CPU variables (``rpg.backends.cpu.vllm_cpu.vllm_env``).
    """
    base = os.environ if base is None else base
    vllm = vllm_cpu.vllm_env(base) if vllm_cpu.rollout_of(base) == "vllm" else {}
    return {
        PLATFORM_ENV: "cpu",  # selects rpg.backends.cpu.platform.PlatformCPU (else verl falls back to cuda)
        EXTERNAL_MODULES_ENV: external_modules(extra_modules, base.get(EXTERNAL_MODULES_ENV), first=(REGISTER_MODULE,)),
        "TORCH_COMPILE_DISABLE": "1",  # no inductor/triton on CPU for these tiny runs
        "OMP_NUM_THREADS": base.get("OMP_NUM_THREADS", "1"),  # several Ray processes share 2 cores
        # TransferQueue (verl's v1 data plane) wraps every put/get in torch.set_num_threads(TQ_NUM_THREADS,
        # default 8, capped at the physical cores) and back: on 2 cores each call grew the intra-op pool to 2
        # threads beside the other busy processes and logged one warning line (about 100 a step, forwarded
        # through Ray's log monitor); 1 keeps the OMP_NUM_THREADS=1 rule inside TransferQueue too
        "TQ_NUM_THREADS": base.get("TQ_NUM_THREADS", "1"),
        # the actor's micro-batches as prefix trees (rpg.backends.cpu.prefix_tree; 0: verl's packed forward)
        PREFIX_TREE_ENV: "1" if prefix_tree_on(base) else "0",
        **RUN_ENV,
        **{key: base.get(key, value) for key, value in QUIET_RAY_ENV.items()},
        **vllm,
    }


def cpu_overrides(env: Mapping[str, str] | None = None, nnodes: int = 1, n_gpus_per_node: int = 1, *,
                  joins_cluster: bool = False, rollout_ranks: int = 0, model_path: str | None = None) -> list[str]:
    """Hydra overrides that make verl's trainer run on the CPU backend (any model size).

    ``env`` (default: ``cpu_env()``) supplies the values forwarded to Ray workers; with
    ``RPG_CPU_ROLLOUT=vllm`` in it, verl's vLLM rollout replaces the HF one (``vllm_cpu.vllm_overrides``; its
    weight-sync bucket holds the largest tensor of the model at ``model_path``, ``actor_rollout_ref.model.path``).
    ``nnodes`` x ``n_gpus_per_node`` is the world size (FSDP ranks, gloo): the private local Ray gets
    that many *logical* GPUs and the CPUs their placement needs (``rpg.backends.cpu.world.ray_resources``;
    the harness reads both from the run's overrides), plus ``rollout_ranks`` for a standalone rollout pool.

    ``joins_cluster=True``: a job on a running Ray cluster (``ray job submit``, ``cluster_job_env``): its nodes
    declared their logical GPUs when they started (``ray start --num-gpus``), ``ray.init`` refuses resource
    arguments when it connects, and the job's runtime environment carries ``env`` to every process (Ray
    refuses a variable set both there and in ``ray_init.runtime_env``): only the world size is set.
    """
    env = cpu_env() if env is None else env
    world = ([f"trainer.nnodes={nnodes}", f"trainer.n_gpus_per_node={n_gpus_per_node}"] if joins_cluster
             else [*ray_resource_overrides(nnodes, n_gpus_per_node, rollout_ranks), "+ray_kwargs.ray_init.include_dashboard=False"])
    ov = [
        # device and Ray resources: one logical "GPU" per rank (never touched, see platform.py)
        "trainer.device=cpu",
        *world,
        # FSDP2 (fully_shard) works on CPU with gloo; FSDP1 needs CUDA (sync_module_states, device_id)
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.fsdp_config.strategy=fsdp2",
        "actor_rollout_ref.ref.fsdp_config.strategy=fsdp2",
        # float32 compute (FSDP mixed precision defaults to bf16 params): the HF rollout server
        # samples in float32, so actor and rollout log-probs agree (training/rollout_probs_diff_*)
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        "+actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=False",
        # no flash-attention on CPU
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        # rollout: the HF-generate server of rpg.backends.hf_rollout, one process
        f"actor_rollout_ref.rollout.name={ROLLOUT_NAME}",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        # each request carries its sample's identity, which seeds it on whichever server (hf_rollout/agent_loop.py)
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_LOOP}",
        f"{CHECKPOINT_ENGINE}=naive",
        # one reward worker (each is a ~300 MB Ray process) and one TransferQueue storage unit
        # (the default 8 units each hold a CPU and the v1 trainer hangs waiting for them)
        "reward.num_workers=1",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        # no DataLoader worker processes (each is a fork of the TaskRunner; 8 by default)
        "data.dataloader_num_workers=0",
    ]
    if vllm_cpu.rollout_of(env) == "vllm":
        ov = merge_overrides(ov, vllm_cpu.vllm_overrides(model_path))  # rollout.name=vllm in place of hf
    return ov if joins_cluster else ov + forwarded_env_overrides(env, _FORWARDED)


def separate_async_overrides(given: Mapping[str, object]) -> list[str]:
    """What ``trainer.v1.trainer_mode=separate_async`` (in ``given``, the run's override values) needs on this backend
    and the overrides leave unset: the weight sync of rpg.backends.cpu.weight_sync (the backend's other runs keep
    ``naive``) and the pool ``world.SEPARATE_ASYNC_POOL``. Nothing for another mode."""
    if given.get(world.TRAINER_MODE) != world.SEPARATE_ASYNC:
        return []
    wanted = {CHECKPOINT_ENGINE: ENGINE_NAME, f"{CHECKPOINT_ENGINE_ROOT}.custom_backend_module": ENGINE_MODULE,
              **world.SEPARATE_ASYNC_POOL}
    return [f"{key}={value}" for key, value in wanted.items() if key not in given]


# Set for a private local Ray only: on a cluster its nodes' addresses are theirs (``ray start --node-ip-address``);
# in the job's driver the guard would make Ray take 127.0.0.1 for the head's address; a cluster's dashboard may read
# Ray's metrics (QUIET_RAY_ENV: its nodes' own settings decide).
_LOCAL_ONLY = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", *QUIET_RAY_ENV)


def cluster_job_env(base: Mapping[str, str], rendezvous: str) -> dict[str, str]:
    """The runtime environment's variables of a CPU-backend job on a running Ray cluster (``ray job submit
    --runtime-env-json``): ``cpu_env`` without what only a private local Ray takes, and torch.distributed's
    rendezvous through ``rendezvous`` (``file://`` on a folder every node sees) instead of a TCPStore, whose
    server binds every interface with no token (as the harness does for a local run, ``DIST_INIT_METHOD``;
    a user's value wins). Ray hands the job's variables to the driver and to every worker of the job."""
    env = {k: v for k, v in cpu_env(base=base).items() if k not in _LOCAL_ONLY}
    env["DIST_INIT_METHOD"] = base.get("DIST_INIT_METHOD") or rendezvous
    return env
