"""``rollout.name=hf``: a HuggingFace-generate rollout server for verl's async rollout interface.

verl 0.9.1 reaches rollout only through server backends (vLLM/SGLang/TRT-LLM), all GPU-only.
This package provides the three pieces verl's server mode expects, for tiny models on CPU:

* ``HFRolloutServer`` (server.py, a Ray actor, ``num_cpus=0``): keeps a float32 copy of the policy and
  serves ``generate(prompt_ids, sampling_params) -> TokenOutput`` (token ids + log-probs).
  On the CPU backend the copy lives on the CPU; elsewhere, when CUDA is visible, on the GPU of
  its replica (``rollout_device``, ``HFReplica._gpu_placement``; registered for CUDA by
  ``rpg.backends.gpu.register``). Every weight load prints the device.
  Requests that arrive together are decoded as one left-padded batch with ``model.generate``
  (sampling.py: the sampling semantics, and why two runs with the same seed sample the same responses).
* ``HFReplica`` (replica.py, a ``RolloutReplica``): launches one named server per replica.
* ``HFServerAdapter`` (adapter.py, a ``BaseRollout``, lives in the FSDP actor worker): receives the
  actor's weights from verl's weight-sync path (``ActorRolloutRefWorker.update_weights`` ->
  ``rollout.update_weights(per-tensor generator)``) and ships them to the server, so training
  and validation always sample from the current actor weights.

rpg/backends/cpu/register.py registers them with verl: ``HFReplica`` imported from here, and the
adapter by its dotted path ``rpg.backends.cpu.hf_rollout.HFServerAdapter``, which verl imports in the
actor worker. This file re-exports those names and the others that code outside the package imports.
"""

from rpg.backends.cpu.hf_rollout.adapter import HFServerAdapter
from rpg.backends.cpu.hf_rollout.replica import HFReplica
from rpg.backends.cpu.hf_rollout.sampling import SeededRowSampler
from rpg.backends.cpu.hf_rollout.server import HFRolloutServer, rollout_device

__all__ = ["HFReplica", "HFRolloutServer", "HFServerAdapter", "SeededRowSampler", "rollout_device"]
