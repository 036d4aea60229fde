"""``rollout.name=hf``: a HuggingFace-generate rollout server for verl's async rollout interface.

verl 0.9.1 reaches rollout only through server backends (vLLM/SGLang/TRT-LLM), all GPU-only.
This package provides the three pieces verl's server mode expects, for tiny models on CPU:

* ``HFRolloutServer`` (server.py, a Ray actor, ``num_cpus=0``): keeps a float32 copy of the policy and
  serves ``generate(prompt_ids, sampling_params) -> TokenOutput`` (token ids + log-probs).
  On the CPU backend the copy lives on the CPU; elsewhere, when CUDA is visible, on the GPU of
  its replica (``rollout_device``, ``HFReplica._gpu_placement``; registered for CUDA by
  ``rpg.backends.gpu.external_module``). Every weight load prints the device.
  Requests that arrive together are decoded as one left-padded batch with ``model.generate``
  (sampling.py: the sampling semantics, and why two runs with the same seed sample the same responses).
* ``HFReplica`` (replica.py, a ``RolloutReplica``): launches one named server per replica.
* ``HFServerAdapter`` (adapter.py, a ``BaseRollout``, lives in the FSDP actor worker): receives the
  actor's weights from verl's weight-sync path (``ActorRolloutRefWorker.update_weights`` ->
  ``rollout.update_weights(per-tensor generator)``) and ships them to the server, so training
  and validation always sample from the current actor weights.

Used by both backends: the CPU backend's ``rollout.name=hf`` and the GPU smoke run's ``ROLLOUT=hf``.
verl_registries.py registers the pieces with verl (``register_hf_rollout``: ``HFReplica`` loaded when verl first
asks for it, the adapter by its dotted path ``rpg.backends.hf_rollout.adapter.HFServerAdapter``, which verl
imports in the actor worker); ``rpg.backends.cpu.external_module`` and ``rpg.backends.gpu.external_module`` call it.
This file names the pieces that code outside the package imports, each loaded on first use (PEP 562), so
importing the registration costs no torch, transformers or verl worker import.
"""

from __future__ import annotations

import importlib

_HOMES = {"HFServerAdapter": "adapter", "HFReplica": "replica", "SeededRowSampler": "sampling",
          "HFRolloutServer": "server", "rollout_device": "server"}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
