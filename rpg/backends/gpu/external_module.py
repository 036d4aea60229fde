"""``rollout.name=hf`` on CUDA (the smoke run's ``ROLLOUT=hf``): a rollout without vLLM.

Loaded in every process that imports verl when listed in ``VERL_USE_EXTERNAL_MODULES`` (the smoke
run lists it only with ``--rollout hf``). It registers the HF rollout replica and the worker-side
adapter of rpg.backends.hf_rollout with verl's registries (``rpg.backends.hf_rollout.verl_registries``, which
the CPU backend calls too), and nothing else: no platform, no engine, no patch (verl's own CUDA
platform and FSDP engines run). The server keeps its float32
model on the GPU (``hf_rollout.rollout_device``); sleep/wake are no-ops for it, the weight sync is
verl's real path (``update_weights`` -> the adapter -> the server).
"""

from __future__ import annotations

from rpg.backends import on_cpu_platform
from rpg.backends.hf_rollout.verl_registries import register_hf_rollout

# On the CPU backend rpg.backends.cpu.external_module does this (and more); never twice, never instead.
if not on_cpu_platform():
    register_hf_rollout()
