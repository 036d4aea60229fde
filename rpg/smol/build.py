"""What a run on SmolLM2 reads: the model (``rpg.smol.asset``) and the arithmetic task's files (``rpg.smol.task``),
each built once into the tiny assets' cache and keyed by its own builder's source (an edit of the task writes new
files without rebuilding the model)."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

from rpg.tiny.build_cache import build_once
from rpg.smol.asset import build_smol_model, model_dir
from rpg.tiny.build import default_cache_root


@dataclass(frozen=True)
class SmolAssets:
    """What a run on SmolLM2 reads: the HF folder and the task's files (``rpg.smol.task``; the fields a task's
    overrides read, as ``rpg.tiny.build.TinyAssets``)."""

    model_dir: Path
    task_dir: Path

    @property
    def train_file(self) -> Path:
        return self.task_dir / "train.parquet"

    @property
    def val_file(self) -> Path:
        return self.task_dir / "val.parquet"

    def task_complete(self) -> bool:
        return self.train_file.exists() and self.val_file.exists()


def task_key() -> str:
    """The task files' key: the generator's source (an edit of the task writes new files)."""
    from rpg.smol import task

    return hashlib.sha256(Path(task.__file__).read_bytes()).hexdigest()[:12]


def planned_assets(cache_root: Path | str | None = None) -> SmolAssets:
    """Where the assets are (built or not)."""
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    return SmolAssets(model_dir(root), root / f"smol-task-{task_key()}")


def _write_task(out: Path) -> None:
    from rpg.data.io import write_parquet_atomic
    from rpg.smol import task

    train, val = task.split()
    write_parquet_atomic(task.rows(train, "train"), out / "train.parquet")
    write_parquet_atomic(task.rows(val, "test"), out / "val.parquet")


def build_smol_assets(cache_root: Path | str | None = None, wheel: Path | str | None = None, quiet: bool = False,
                      prefix: str = "[smol]", model: bool = True) -> SmolAssets:
    """The model (``build_smol_model``; not with ``model=False``: a run given another copy of it) and the task's
    train and validation files, each built once."""
    cache_root = Path(cache_root) if cache_root is not None else default_cache_root()
    assets = planned_assets(cache_root)
    if model:
        build_smol_model(cache_root, wheel, quiet=quiet, prefix=prefix)

    def log(message: str) -> None:
        if not quiet:
            print(f"{prefix} {message}", file=sys.stderr, flush=True)

    build_once(cache_root, assets.task_dir, assets.task_complete, _write_task, log, "the arithmetic task's files")
    return assets
