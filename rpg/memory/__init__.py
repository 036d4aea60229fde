"""The memory plan of a composed run config (verl 0.9.1, FSDP + vLLM): per-GPU memory of each phase of a training
step, host RAM per node and checkpoint disk, each with its verdict, as a paper script's ``--describe`` and
``DRY_RUN=1`` print it (docs/memory.md). Pure Python; each module's docstring gives its formulas and sources.

Re-exports the names that code outside this package imports.
"""

from rpg.memory.architecture import KNOWN_ARCHITECTURES, architecture_for
from rpg.memory.sizes import (DEFAULT_GPU_MEM_GIB, GIB, GPU_MEM_ENV, HEADROOM_FRACTION, MemoryEstimateError,
                                      gpu_mem_gib)
from rpg.memory.disk import count_saves, estimate_disk
from rpg.memory.formatting import format_host, format_kv_check, report
from rpg.memory.gpu import CUDAGRAPH_GIB, RUNTIME_OVERHEAD_GIB, estimate
from rpg.memory.host import (DEFAULT_HOST_MEM_GIB, DRIVER_GIB, HOST_MEM_ENV, RAY_DAEMONS_GIB, SMALL_WORKER_GIB,
                                    TRAINER_PROCESS_GIB, VLLM_PROCESS_GIB, estimate_host, host_mem_gib,
                                    host_settings_from_config)
from rpg.memory.run_settings import settings_from_config

__all__ = [
    "CUDAGRAPH_GIB", "DEFAULT_GPU_MEM_GIB", "DEFAULT_HOST_MEM_GIB", "DRIVER_GIB", "GIB", "GPU_MEM_ENV",
    "HEADROOM_FRACTION", "HOST_MEM_ENV", "KNOWN_ARCHITECTURES", "RAY_DAEMONS_GIB", "RUNTIME_OVERHEAD_GIB",
    "SMALL_WORKER_GIB", "TRAINER_PROCESS_GIB", "VLLM_PROCESS_GIB", "MemoryEstimateError", "architecture_for",
    "count_saves", "estimate", "estimate_disk", "estimate_host", "format_host", "format_kv_check", "gpu_mem_gib",
    "host_mem_gib", "host_settings_from_config", "report", "settings_from_config",
]
