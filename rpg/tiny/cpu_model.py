"""The tiny model and task as a CPU model (``rpg.launch.rehearsal.CpuModel``, ``RPG_CPU_MODEL=tiny``, the demo's
default): its run's defaults, where its assets are before they are built, how they are built, its task's overrides."""

from __future__ import annotations

from pathlib import Path

import rpg.tiny
from rpg.tiny.build import TinyAssets, builder_key, default_cache_root
from rpg.tiny.overrides import check_world_size, tiny_task_overrides as task_overrides  # noqa: F401 (declared)

TASK = "tiny task"
STEPS, TEST_FREQ, LR = 30, 10, 5e-4
VALIDATES_ONLY_AT_THE_ENDS = False  # a rehearsal validates as the task's overrides do by default
TIMEOUT_S = 1800.0  # the default run takes about 2 minutes; the limit stops a hung one


def planned() -> TinyAssets:
    return TinyAssets.at(default_cache_root() / builder_key())


def build(prefix: str, model: bool = True) -> TinyAssets:
    return rpg.tiny.build_tiny_assets(prefix=prefix)  # the package's, looked up at the call


def folder(assets: TinyAssets) -> Path:
    return assets.root  # the whole build's


def threads(overrides: dict, cores: int) -> int | None:
    return None  # the CPU backend's one torch thread per process
