"""``HFServerAdapter``, the worker-side half of ``rollout.name=hf``: a ``BaseRollout`` living in the FSDP actor
worker. It receives the actor's weights from verl's weight-sync path (``ActorRolloutRefWorker.update_weights``
-> ``rollout.update_weights(per-tensor generator)``), gathered to full float32 host tensors, and ships them
to its replica's server (server.py), so training and validation always sample from the current actor weights.

verl builds it from a dotted path: verl_registries.py puts ``rpg.backends.hf_rollout.adapter.HFServerAdapter`` in
``verl.workers.rollout.base._ROLLOUT_REGISTRY``.
"""

from __future__ import annotations

import os

import ray
import torch

from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout

from rpg.backends.hf_rollout.server import server_name


class HFServerAdapter(BaseRollout):
    """Worker-side adapter: forwards the actor's weights to this replica's HF server."""

    def __init__(self, config: RolloutConfig, model_config: HFModelConfig, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.is_sender = rank % world == 0
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs):
        if wire_format != "named_tensors":
            raise ValueError(f"rollout.name=hf supports wire_format='named_tensors' only, got {wire_format!r}")
        state: dict[str, torch.Tensor] = {}
        if hasattr(weights, "__aiter__"):
            async for name, t in weights:
                state[name] = _to_host(t)
        else:
            for name, t in weights:
                state[name] = _to_host(t)
        if self.is_sender:
            await self._server_handle().load_weights.remote(state, global_steps=kwargs.get("global_steps"))


def _to_host(t: torch.Tensor) -> torch.Tensor:
    if hasattr(t, "full_tensor"):  # DTensor shard -> full tensor (collective across the FSDP group)
        t = t.full_tensor()
    return t.detach().to("cpu", torch.float32).clone()
