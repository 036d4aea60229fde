"""A CPU weight-sync engine for verl's standalone rollout pool (``trainer.v1.trainer_mode=separate_async``).

verl moves the actor's weights to standalone replicas through a checkpoint engine chosen by
``actor_rollout_ref.rollout.checkpoint_engine.backend``; every engine verl ships is CUDA-bound (NCCL, CUDA
buffers) and ``naive`` reaches colocated adapters only. This module registers ``ENGINE_NAME`` with verl's
public registry (``CheckpointEngineRegistry.register``); verl imports it in the TaskRunner, the actor workers
and the replicas' ``CheckpointEngineWorker`` from ``checkpoint_engine.custom_backend_module``
(``rpg.backends.cpu.env_overrides.ENGINE_MODULE``, set with the name by ``separate_async_overrides``).

The bytes travel through Ray's object store, so nothing new listens on any interface. Per sync (verl's
``CheckpointEngineManager.update_weights`` calls, in order, ``prepare`` on every worker, ``build_topology``,
``init_process_group``, ``send_weights`` / ``receive_weights`` concurrently, ``finalize``):

* the actor's rank 0 keeps one mailbox actor (``num_cpus=0``) and draws a fresh key for this sync;
  ``build_topology`` hands both to every worker;
* every actor rank drains the weight generator (``full_tensor()`` of an FSDP2 shard is a collective);
  rank 0 ``ray.put``s buckets of up to ``bucket_size`` bytes of ``(name, tensor)`` and posts their
  references under the key, prints the digest of what it sent (``rpg.backends.weight_digest``; the HF rollout
  server prints the digest of what it loaded, naming its pool and replica) and returns it as the float
  ``{CHECKSUM_METRIC: digest_metric(digest)}`` (verl logs it with the step's metrics);
* each replica's worker awaits the references and yields ``(name, tensor)`` to its server adapter;
* ``finalize``: rank 0 drops the post, so the buckets are freed.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import ray

from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

from rpg.backends.cpu.env_overrides import ENGINE_NAME
from rpg.backends.weight_digest import CHECKSUM_METRIC, WeightDigest, digest_metric


class Mailbox:
    """One post of bucket references per sync key; receivers wait for it (an async Ray actor)."""

    def __init__(self):
        self._posts: dict[str, list] = {}
        self._events: dict[str, asyncio.Event] = {}

    def _event(self, key: str) -> asyncio.Event:
        return self._events.setdefault(key, asyncio.Event())

    async def post(self, key: str, refs: list) -> None:
        self._posts[key] = refs
        self._event(key).set()

    async def fetch(self, key: str) -> list:
        await self._event(key).wait()
        return self._posts[key]

    async def drop(self, key: str) -> None:
        self._posts.pop(key, None)
        self._events.pop(key, None)


@CheckpointEngineRegistry.register(ENGINE_NAME)
class ObjectStoreCheckpointEngine(CheckpointEngine):
    """See the module's text. Re-entrant: verl runs prepare .. finalize on every sync."""

    def __init__(self, bucket_size: int, is_master: bool = False, **kwargs):
        if kwargs:
            raise ValueError(f"checkpoint_engine.engine_kwargs.{ENGINE_NAME} takes no options, got {sorted(kwargs)}")
        self.bucket_size, self.is_master = int(bucket_size), is_master
        self._mailbox = None  # the master's own actor
        self._peer: dict[str, Any] = {}  # this sync's mailbox and key (init_process_group)

    def prepare(self) -> dict[str, Any]:
        if not self.is_master:
            return {}
        if self._mailbox is None:
            self._mailbox = ray.remote(Mailbox).options(num_cpus=0).remote()
        return {"mailbox": self._mailbox, "key": uuid.uuid4().hex}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        master = metadata[0]  # the actor group's rank 0 comes first (CheckpointEngineManager.build_process_group)
        if "mailbox" not in master:
            raise RuntimeError(f"{ENGINE_NAME}: the actor's rank 0 did not open a mailbox (is_master unset?)")
        return ({"rank": list(range(actor_wg_world_size)), "master": [master] * actor_wg_world_size},
                {"rank": list(range(rollout_world_size)), "master": [master] * rollout_world_size})

    def init_process_group(self, rank: int, master: dict):
        self._peer = dict(master)

    def finalize(self):
        if self.is_master and self._peer:
            self._mailbox.drop.remote(self._peer["key"])
        self._peer = {}

    async def send_weights(self, weights, global_steps: int | None = None) -> dict:
        refs, bucket, size, digest = [], [], 0, WeightDigest()
        async for name, tensor in ensure_async_iterator(weights):  # every rank: the gather is collective
            if not self.is_master:
                continue
            tensor = tensor.detach().to("cpu")
            digest.add(name, tensor)
            bucket.append((name, tensor))
            size += tensor.nbytes
            if size >= self.bucket_size:
                refs.append(ray.put(bucket))
                bucket, size = [], 0
        if not self.is_master:
            return {}
        if bucket:
            refs.append(ray.put(bucket))
        await self._mailbox.post.remote(self._peer["key"], refs)
        sent = digest.hexdigest()
        print(f"[rpg-weight-sync] sent {len(refs)} buckets (global_steps={global_steps}, tensors={len(digest)}, "
              f"digest={sent})", flush=True)
        return {CHECKSUM_METRIC: digest_metric(sent)}

    async def receive_weights(self, global_steps: int | None = None):
        refs = await self._peer["mailbox"].fetch.remote(self._peer["key"])
        for ref in refs:
            for name, tensor in await ref:
                yield name, tensor
