"""verl platform "cpu": device ``cpu``, collective backend ``gloo``, no CUDA call anywhere.

verl routes every device question through ``verl.plugin.platform.get_platform()``; without this
class a GPU-less machine falls back to the ``nvidia`` platform (device ``cuda``, ``nccl``) and
fails. Registered with ``PlatformRegistry.register("cpu")`` and selected by ``VERL_PLATFORM=cpu``.

Ray resources: verl's placement groups ask for one accelerator per worker under
``ray_resource_name()``. We keep the name ``"GPU"`` and start Ray with a *logical* GPU count
(``ray_kwargs.ray_init.num_gpus``, see env_overrides.py); Ray only counts it, nothing touches CUDA.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from typing import Any, Optional

import torch
from verl.plugin.platform.platform_base import PlatformBase

from rpg.backends import on_cpu_platform


def _mem_info() -> tuple[int, int]:
    """(available, total) bytes of host RAM, the CPU analogue of ``cuda.mem_get_info``."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    except ImportError:  # pragma: no cover - psutil ships with ray
        return 0, 0


class CPUDeviceModule(types.SimpleNamespace):
    """What verl calls on ``get_torch_device()`` (normally ``torch.cuda``), answered for the CPU.

    Delegates to ``torch.cpu`` where it has the function (synchronize, current_stream, Stream,
    Event, ...) and supplies the CUDA-only memory/RNG helpers verl uses as no-ops or host
    equivalents. Memory counters report 0: there is no device memory to account for.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> torch.device:
        return torch.device("cpu")

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        return _mem_info()

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    max_memory_allocated = memory_allocated
    memory_reserved = memory_allocated
    max_memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)


class PlatformCPU(PlatformBase):
    """Host CPU as verl's accelerator: world size 1 per Ray worker, gloo collectives."""

    _device_module = CPUDeviceModule()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.SimpleNamespace:
        return self._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: the CPU platform is opt-in through VERL_PLATFORM=cpu only.
        return on_cpu_platform()

    def current_device(self) -> torch.device:
        # verl passes get_device_id() straight to .to()/torch.device(); an int would mean "accelerator 0".
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # logical only; see module docstring

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
