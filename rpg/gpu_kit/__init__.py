"""The GPU kit: the project's first checks on a GPU node, prepared on a machine with the package registry
(``rpg.gpu_kit.build``) and run in one time-boxed call on a node without network (``rpg.gpu_kit.run``);
standard library and pip only (docs/gpu-smoke.md, "The GPU kit").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CARRY_DIR = ".gpu_kit"  # the carry, relative to the checkout (ignored by git; the device call carries it)
SITE_DIR = ".gpu_kit_site"  # where the run installs the carry (ignored; kept on a node between calls)
MANIFEST = "manifest.json"
CARRY_FILE = "wheels.tar.xz"
TARGET_PYTHON = "3.12"  # the node's Python (CPython)
# a device call's command: budget + 30 s. The default steps (docs/gpu-smoke.md's first call) took 373 s on an H200 node
# (2026-11-28); with the machine's start (about 30 s) the device time left is about 8 minutes
DEFAULT_BUDGET_S = 450
# The kit's steps' vLLM variables (a value already set wins; with --installed too): the vLLM parts hold no FlashInfer
# kernels nor nvcc to compile them, so PyTorch's top-p/top-k sampling; vLLM's own start-up lines (model load,
# compilation, CUDA graphs, KV cache) in the trainer's log, which verl sets to WARN unless the variable is already set
# (trainer/constants_ppo.py get_ppo_ray_runtime_env): the H200's first vLLM smoke run logged nothing for its last
# 93 s before its box ended
KIT_VLLM_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_LOGGING_LEVEL": "INFO"}


def report(result: dict, path: Path | None, program: str) -> int:
    """A check's result as JSON (on stdout, and in ``path`` when given), each problem one line on stderr; exit 1 when
    there is any."""
    if path:
        path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    for line in result["problems"]:
        print(f"{program}: {line}", file=sys.stderr)
    return 1 if result["problems"] else 0


def conclude(result: dict, path: Path | None, program: str) -> int:
    """An install's result: as JSON in ``path`` when given, each problem one line on stderr, its summary line on
    stdout; exit 1 when there is any problem."""
    if path:
        path.write_text(json.dumps(result, indent=1) + "\n")
    for line in result["problems"]:
        print(f"{program}: {line}", file=sys.stderr)
    if "line" in result:
        print(f"{program}: {result['line']}")
    return 1 if result["problems"] else 0
