"""Test probe of the vLLM-CPU runs (tests/e2e/test_vllm_cpu.py): records every actor -> vLLM weight sync at
both ends, and drops the syncs of one step on request (the negative control).

Loaded in every process of the run through ``VERL_USE_EXTERNAL_MODULES`` (the harness's
``extra_modules``; this directory on ``PYTHONPATH``); it does nothing unless ``SYNC_LOG_ENV`` names a file.
Each record is one JSON line appended to that file (one ``write`` of a short line, so the two
processes' lines never interleave):

* ``{"side": "sent", "global_steps": g, "skipped": bool, "n": count, "sum": S, "sumsq": Q}`` in the actor
  worker, around verl's ``ServerAdapter.update_weights`` (``verl/workers/rollout/vllm_rollout/vllm_rollout.py``):
  S and Q are the float64 sums of w and w^2 over every tensor the actor streams, except ``lm_head.*``
  (the tiny model ties it to the embedding, and vLLM's Qwen2 skips it when tied);
* ``{"side": "loaded", "sum": S, "sumsq": Q}`` in vLLM's worker process, after verl's
  ``update_weights_from_ipc`` (``vllm_rollout/utils.py``) returned, i.e. after the load and vLLM's
  ``process_weights_after_loading``: the same sums over the parameters vLLM computes with (each once:
  tied ones are one parameter; the embedding's rows beyond the real vocabulary, vLLM's padding, left out).
  Sums are invariant under vLLM's fusing of q/k/v and gate/up into one tensor, so S and Q agree with the
  sent ones exactly when the weights vLLM holds are the actor's (up to float64 summation order).

``SKIP_ENV=N``: every sync with ``global_steps == N`` is dropped in the actor worker: the weight
generator is drained (the FSDP gathers still run) and nothing reaches vLLM.
"""

from __future__ import annotations

import functools
import json
import os

SYNC_LOG_ENV = "RPG_TEST_SYNC_LOG"
SKIP_ENV = "RPG_TEST_SKIP_SYNC_STEP"


def _record(**fields) -> None:
    line = json.dumps({**fields, "pid": os.getpid()}) + "\n"
    fd = os.open(os.environ[SYNC_LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


class _Sums:
    def __init__(self):
        self.n, self.sum, self.sumsq = 0, 0.0, 0.0

    def add(self, tensor) -> None:
        t = tensor.detach().double()
        self.n += 1
        self.sum += float(t.sum())
        self.sumsq += float((t * t).sum())


def _patch_adapter(module) -> None:
    """Actor side: ``ServerAdapter.update_weights`` streams through a tap (or is drained, when skipped)."""
    from verl.workers.rollout.utils import ensure_async_iterator

    cls = module.ServerAdapter
    original = cls.update_weights
    skip = os.environ.get(SKIP_ENV)

    @functools.wraps(original)
    async def update_weights(self, weights, global_steps=None, wire_format="named_tensors", **kwargs):
        sums = _Sums()
        if skip is not None and global_steps == int(skip):
            async for name, tensor in ensure_async_iterator(weights):
                if not name.startswith("lm_head."):
                    sums.add(tensor)
            _record(side="sent", global_steps=global_steps, skipped=True, n=sums.n, sum=sums.sum, sumsq=sums.sumsq)
            return None

        async def tap():
            async for name, tensor in ensure_async_iterator(weights):
                if not name.startswith("lm_head."):
                    sums.add(tensor)
                yield name, tensor

        result = await original(self, tap(), global_steps=global_steps, wire_format=wire_format, **kwargs)
        _record(side="sent", global_steps=global_steps, skipped=False, n=sums.n, sum=sums.sum, sumsq=sums.sumsq)
        return result

    cls.update_weights = update_weights


def _patch_worker_extension(module) -> None:
    """vLLM side: after verl's ``update_weights_from_ipc``, the sums of what vLLM computes with."""
    cls = module.vLLMColocateWorkerExtension
    original = cls.update_weights_from_ipc

    @functools.wraps(original)
    def update_weights_from_ipc(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        model = self.model_runner.model
        rows = {id(m.weight): m.org_vocab_size for m in model.modules() if isinstance(m, VocabParallelEmbedding)}
        sums, seen = _Sums(), set()
        for _, p in model.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            sums.add(p[: rows[id(p)]] if id(p) in rows else p)
        _record(side="loaded", n=sums.n, sum=sums.sum, sumsq=sums.sumsq)
        return result

    cls.update_weights_from_ipc = update_weights_from_ipc


if os.environ.get(SYNC_LOG_ENV):
    from rpg.backends.cpu.external_module import when_imported

    when_imported("verl.workers.rollout.vllm_rollout.vllm_rollout", _patch_adapter)
    when_imported("verl.workers.rollout.vllm_rollout.utils", _patch_worker_extension)
