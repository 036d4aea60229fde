"""Markers of the GPU tests (tests/gpu/), decided at collection time without touching a GPU.

    pytestmark = GPU                       # marker ``gpu`` + skipped with its reason without CUDA
    @requires_gpus(2)                      # skipped with its reason below 2 visible GPUs
    @REQUIRES_VLLM                         # skipped with its reason when vLLM is not installed

``python -m pytest -m gpu`` selects them; on a machine without CUDA each one is collected and
reported as skipped with the reason (``-ra``), so CI stays green and its time does not grow:
nothing here creates a CUDA context or imports vLLM.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

CUDA = torch.cuda.is_available()
N_GPUS = torch.cuda.device_count() if CUDA else 0
NO_CUDA = ("needs a CUDA GPU (torch.cuda.is_available() is False here); "
           "run `python -m pytest -m gpu` on a GPU node (docs/gpu-smoke.md)")

GPU = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason=NO_CUDA)]
REQUIRES_VLLM = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                   reason="needs vLLM (`import vllm` is not available; pip install -e '.[gpu]')")


def requires_gpus(n: int):
    return pytest.mark.skipif(N_GPUS < n, reason=f"needs {n} CUDA GPUs, {N_GPUS} visible")
