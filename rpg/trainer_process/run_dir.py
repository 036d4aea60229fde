"""Where a run of this machine writes, decided in one place: its output folder and checkpoint folder.

* ``new_run_dir(parent)``: a new ``parent/<time>`` folder (``<time>-2``, ... when taken), created
  atomically (``mkdir``), when the user names none (the tiny demo's ``outputs/tiny_cpu/<time>``, the
  launcher's ``outputs/cpu/<run name>/<time>`` with ``RPG_BACKEND=cpu``);
* ``default_checkpoint_dir(project, experiment)``: verl's default ``trainer.default_local_dir``,
  ``checkpoints/<project>/<experiment>`` (verl/trainer/config/ppo_trainer.yaml), relative to the run's cwd;
* ``checkpoint_root(out, cfg)``: ``trainer.default_local_dir`` of the composed config, relative to the
  output folder (the harness runs the trainer there; verl's default is ``checkpoints/<project>/<experiment>``);
* ``check_fresh_start``: a fresh start (``trainer.resume_mode=disable``, the tiny demo's default) in a folder
  that already holds a run (records in its ``metrics.jsonl`` or its segments, read by ``rpg.metrics_log.file``'s
  rules: a broken line before the last is refused too, naming the file and line; or a ``global_step_N`` / verl's
  tracker in its checkpoint folder) would replace that run's metrics and checkpoints. It is refused before anything
  starts, in ONE line naming what was found and the two ways on: another output folder, or
  ``trainer.resume_mode=auto`` to continue it (as Hugging Face's Trainer refuses a non-empty
  ``output_dir`` unless told). A resume (``auto``, ``resume_path``) is checked by the driver instead
  (``rpg.verl.checkpoints``: the checkpoint, its integrity and the settings it was trained with), but for
  one case the driver cannot see: ``auto`` with nothing to resume under this run's experiment name while
  the folder holds another variant's run (its metrics would be replaced from step 0).
"""

from __future__ import annotations

import time
from pathlib import Path

from rpg.metrics_log import history
from rpg.metrics_log.file import MetricsFileError, records
from rpg.verl.checkpoints import TRACKER  # verl's tracker file

METRICS_FILE = "metrics.jsonl"  # a run's metrics in its output folder (the harness, the study, the demo)


def default_checkpoint_dir(project: str, experiment: str) -> str:
    """verl's default checkpoint folder of a run (``trainer.default_local_dir: checkpoints/${trainer.project_name}/
    ${trainer.experiment_name}``), relative to the run's cwd: each run's own, never one every run of a variant
    shares (verl's tracker and retention assume one run per folder)."""
    return f"checkpoints/{project}/{experiment}"


class RunDirError(ValueError):
    """A run that would overwrite another one (one line: what was found, the ways on; exit code 2)."""


def new_run_dir(parent: Path | str, stamp: str | None = None) -> Path:
    """A new directory ``parent/<time>`` (``<time>-2``, ``-3``, ... when taken), created here: ``mkdir``
    fails when the name exists, so two launches in the same second never share one."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    n = 1
    while True:
        d = parent / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            d.mkdir()
            return d
        except FileExistsError:
            n += 1


def checkpoint_root(out: Path | str, default_local_dir: str) -> Path:
    """The run's checkpoint folder: ``default_local_dir``, relative to the output folder ``out``."""
    p = Path(default_local_dir)
    return p if p.is_absolute() else Path(out) / p


def _metric_steps(out: Path) -> list[int]:
    """The steps recorded in ``out/metrics.jsonl`` and its segments (``rpg.metrics_log.history.segments``), read by
    ``rpg.metrics_log.file``'s rules: a last line cut off by a kill is skipped; any other line that is not a
    record (not UTF-8, not JSON, no integer step) is a ``MetricsFileError`` naming the file and line."""
    return sorted({step for path in history.segments(Path(out) / METRICS_FILE) for _, step, _ in records(path)})


def _checkpoints(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    found = sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith("global_step_")),
                   key=lambda p: int(p.name.rsplit("_", 1)[1]) if p.name.rsplit("_", 1)[1].isdecimal() else -1)
    return [str(p) for p in found] + ([str(root / TRACKER)] if (root / TRACKER).is_file() else [])


def run_found(out: Path | str, ckpt_root: Path | str | None) -> str | None:
    """What ``out`` holds of an earlier run (metrics records, checkpoints in ``ckpt_root``), or None;
    ``MetricsFileError`` (file:line) when its metrics cannot be read."""
    out = Path(out)
    parts = []
    steps = _metric_steps(out) if out.is_dir() else []
    if steps:
        parts.append(f"{out / METRICS_FILE} with steps {steps[0]}..{steps[-1]}")
    ckpts = _checkpoints(Path(ckpt_root)) if ckpt_root is not None else []
    if ckpts:
        parts.append(f"checkpoints {ckpts[-1] if not ckpts[-1].endswith(TRACKER) else ckpts[0]}"
                     + (f" and {len(ckpts) - 1} more" if len(ckpts) > 1 else ""))
    return " and ".join(parts) or None


def _check_other_run(out: Path, ckpt_root: Path, another: str) -> None:
    """``trainer.resume_mode=auto`` with nothing to resume in this run's checkpoint folder, in an output folder
    holding another run (metrics, and checkpoints under another experiment name beside this run's: another
    variant, ``checkpoints/<project>/<other>``): the run would start at step 0 and replace that run's metrics."""
    if _checkpoints(ckpt_root) or not ckpt_root.parent.is_dir() or not _metric_steps(out):
        return
    others = sorted(d for d in ckpt_root.parent.iterdir() if d.is_dir() and d != ckpt_root and _checkpoints(d))
    if others:
        raise RunDirError(f"{out} holds another run ({others[0]}), and {ckpt_root} has no checkpoint to resume: "
                          f"trainer.resume_mode=auto would start at step 0 and replace that run's {METRICS_FILE}; "
                          f"choose another output folder ({another}), or resume that run with its own settings")


def check_fresh_start(out: Path | str, resume_mode, ckpt_root: Path | str | None, another: str) -> None:
    """``RunDirError`` (one line) when a fresh start (``resume_mode=disable``) would overwrite the run that
    ``out`` holds; ``another``: how the user names another output folder (``OUT=... (--out)``, ``OUT_DIR=...``).
    Its metrics are read only when the check needs them; a metrics file that cannot be read then (a broken line
    before the last: ``rpg.metrics_log.file``) is a ``RunDirError`` too, naming the file and line: what it
    holds cannot be told (and the harness, reading it by the same rules, would fail on it after the run)."""
    try:
        if resume_mode == "auto" and ckpt_root is not None:
            _check_other_run(Path(out), Path(ckpt_root), another)
        found = run_found(out, ckpt_root) if resume_mode == "disable" else None
    except MetricsFileError as e:
        raise RunDirError(f"{e}; nothing was started: repair that file, or choose another output folder "
                          f"({another})") from None
    if found is None:
        return
    raise RunDirError(f"{out} already holds a run ({found}); a fresh start (trainer.resume_mode=disable) would "
                      f"overwrite it: choose another output folder ({another}), or add trainer.resume_mode=auto "
                      "to continue that run")
