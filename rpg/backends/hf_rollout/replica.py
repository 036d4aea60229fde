"""``HFReplica``, verl's ``RolloutReplica`` for ``rollout.name=hf`` (``RolloutReplicaRegistry``, see
rpg/backends/cpu/external_module.py): it launches one named ``HFRolloutServer`` Ray actor (server.py) per replica.
Off the CPU backend it places the server on the node and GPU of its replica's first worker, as verl places its
vLLM servers (``_gpu_placement``).

Two modes: hybrid (the server beside the FSDP actor workers, weights pushed by verl's ``naive`` sync) and
standalone (``trainer.v1.trainer_mode=separate_async``: verl's own ``init_standalone`` gives the replica its own
placement group of logical GPUs and a ``CheckpointEngineWorker`` per rank that receives the weights through the
configured checkpoint engine, rpg.backends.cpu.weight_sync on the CPU backend). That worker joins a
torch.distributed group of its replica's ranks at start (``initialize_global_process_group_ray``), through
``DIST_INIT_METHOD``; a ``file://`` rendezvous (the CPU backend's) is the trainer's own, so each replica's
workers meet in a file of their own beside it (``RolloutSyncWorker``).
"""

from __future__ import annotations

import os

import ray

from verl.checkpoint_engine.base import CheckpointEngineWorker
from verl.single_controller.ray import RayClassWithInitArgs
from verl.workers.rollout.replica import RolloutReplica

from rpg.backends import on_cpu_platform
from rpg.backends.hf_rollout.server import HFRolloutServer, server_name


class HFReplica(RolloutReplica):
    """One HF rollout server per replica (module's text)."""

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self):
        if self.rollout_mode is None:
            raise ValueError("HFReplica: launch_servers called before init_hybrid/init_colocated")
        kind = "_reward" if self.is_reward_model else ("_teacher" if self.is_teacher_model else "")
        name = server_name(self.replica_rank, kind + self.name_suffix)
        placement = await self._gpu_placement()
        server = (
            ray.remote(HFRolloutServer)
            .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency, **placement)
            .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank,
                    pool=self.rollout_mode.value)
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"hf://{name}"

    async def _gpu_placement(self) -> dict:
        """Off the CPU backend: the node and GPU of this replica's first worker, as verl places its vLLM
        servers (node affinity; Ray told not to touch ``CUDA_VISIBLE_DEVICES``, which is set to that
        GPU, so the server's ``cuda:0`` is its replica's GPU). On the CPU backend: nothing."""
        if on_cpu_platform() or not self.workers:
            return {}
        node_id, gpu = await self.workers[0].__ray_call__.remote(_node_and_gpu)
        if gpu is None:
            return {}
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        env = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": str(gpu)}
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                "runtime_env": {"env_vars": env}}

    def get_ray_class_with_init_args(self) -> RayClassWithInitArgs:
        """verl's worker for standalone and colocated replicas, meeting in its replica's own rendezvous file."""
        return RayClassWithInitArgs(cls=ray.remote(RolloutSyncWorker), rollout_config=self.config,
                                    model_config=self.model_config, replica_rank=self.replica_rank)


def replica_rendezvous(method: str, replica_rank: int) -> str:
    """The ``DIST_INIT_METHOD`` of one replica's workers: a ``file://`` rendezvous gets a file of its own beside the
    trainer's (which holds the FSDP ranks' keys and counts its own ranks); any other method is kept."""
    return f"{method}-rollout{replica_rank}" if method.startswith("file://") else method


class RolloutSyncWorker(CheckpointEngineWorker):
    """verl's ``CheckpointEngineWorker`` whose process group rendezvous is its replica's own (module's text)."""

    def __init__(self, rollout_config, model_config, server_adapter=None, *args, replica_rank: int = 0, **kwargs):
        if "DIST_INIT_METHOD" in os.environ:
            os.environ["DIST_INIT_METHOD"] = replica_rendezvous(os.environ["DIST_INIT_METHOD"], replica_rank)
        super().__init__(rollout_config, model_config, server_adapter, *args, replica_rank=replica_rank, **kwargs)


def _node_and_gpu(actor) -> tuple[str, str | None]:
    """(node id, first GPU id Ray assigned) of the actor it runs in (``__ray_call__`` target)."""
    ctx = ray.get_runtime_context()
    gpus = ctx.get_accelerator_ids().get("GPU") or [None]
    return ctx.get_node_id(), gpus[0]
