"""What every part of the memory plan shares: units, the GPU's default size and the required headroom,
the one error the estimates raise, and the parsing of a size override (``--gpu-mem-gib`` /
``RPG_GPU_MEM_GIB`` here; the host's, ``--host-mem-gib``, in host.py).

Pure Python (no torch, verl or omegaconf import), like every module of this package.
"""

from __future__ import annotations

import math

GIB = 2**30
GB = 10**9
DEFAULT_GPU_MEM_GIB = 79.6        # what an 80 GB H100 reports as total memory (torch / nvidia-smi, GiB)
HEADROOM_FRACTION = 0.10          # a run "fits" when its peak leaves >= 10% of the GPU free
GPU_MEM_ENV = "RPG_GPU_MEM_GIB"   # DRY_RUN's GPU-size override (--describe: --gpu-mem-gib)


class MemoryEstimateError(ValueError):
    """The estimate cannot be made (unknown model, unsupported setting): one clear line."""


def parse_gib(raw: str | None, source: str, default: float, expected: str) -> float:
    """Parse a memory-size override in GiB (empty = ``default``); anything but a finite number > 0 fails."""
    if raw is None or not str(raw).strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise MemoryEstimateError(f"{source}={raw!r} is invalid; expected {expected}")
    return value


def gpu_mem_gib(raw: str | None, source: str) -> float:
    """Parse a GPU-size override (``--gpu-mem-gib`` / ``RPG_GPU_MEM_GIB``); empty = the default."""
    return parse_gib(raw, source, DEFAULT_GPU_MEM_GIB, "the GPU's memory in GiB, e.g. 80 or 139.8")
