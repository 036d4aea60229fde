"""SmolLM2-135M-Instruct and its arithmetic task as a CPU model (``rpg.launch.rehearsal.CpuModel``,
``RPG_CPU_MODEL=smol``, docs/smol.md): its run's defaults, where its assets are before they are built, how they are
built, its task's overrides, its torch threads per process."""

from __future__ import annotations

from pathlib import Path

from rpg.config import world_size_of
import rpg.smol
from rpg.smol.build import SmolAssets, planned_assets as planned  # noqa: F401 (declared)
from rpg.smol.overrides import LR, STEPS, TEST_FREQ, TIMEOUT_S, check_world_size, omp_threads  # noqa: F401
from rpg.smol.overrides import smol_task_overrides as task_overrides  # noqa: F401 (declared)

TASK = "SmolLM2-135M-Instruct, arithmetic"
VALIDATES_ONLY_AT_THE_ENDS = True  # its validation takes minutes: a rehearsal validates before training and at its end


def build(prefix: str, model: bool = True) -> SmolAssets:
    """``model=False``: the task's files alone (a run given the model elsewhere)."""
    return rpg.smol.build_smol_assets(prefix=prefix, model=model)  # the package's, looked up at the call


def folder(assets: SmolAssets) -> Path:
    return assets.model_dir


def threads(overrides: dict, cores: int) -> int | None:
    """Torch threads per Ray process (``omp_threads``) from the run's trainer mode and world size."""
    nnodes, gpus = world_size_of(overrides)
    return omp_threads(cores, overrides.get("trainer.v1.trainer_mode"), nnodes * gpus)
