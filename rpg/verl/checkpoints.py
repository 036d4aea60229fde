"""Which checkpoint a run resumes from, decided before Ray starts (docs/verl-integration.md, "Resume").

verl 0.9.1 resumes (``trainer.resume_mode=auto``) from the step in its tracker file
``<default_local_dir>/latest_checkpointed_iteration.txt``, written after a save returned; when the
tracker or its ``global_step_N`` is missing it trains from step 0 — over the run's existing
checkpoints — and a missing ``data.pt`` silently restarts the data order. This module decides,
from the disk only (no Ray, no tensor loaded), what the driver resumes from:

* complete checkpoint: ``global_step_N`` holding ``MARKER``, which ``RPGTrainer`` writes (write,
  then rename) after verl's save returned, listing every file with its size; all listed files
  must still be there with that size (verl's retention deletes ``actor/`` of old ones: no longer
  resumable). A folder without the marker (verl's own trainer, or a run from before the marker)
  counts as complete only when verl's tracker names it and it has ``actor/`` and ``data.pt``;
* intact: every ``.pt`` file the resume loads (actor, critic, reference shards, ``data.pt``) is a
  whole zip archive (torch's format): its central directory reads and every member lies inside
  the file. Reading the central directory touches a few KB, never the tensors;
* ``auto``: the newest complete, intact checkpoint (one line when newer folders or the tracker's
  step are skipped); no checkpoint at all: from scratch; folders or a tracker but none complete:
  refuse (training from step 0 would overwrite them);
* ``resume_path``: that folder, complete and intact, or refuse.

A refusal is ONE line naming the directory and the choices (``ResumeError``, exit code 2).
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rpg.verl.settings import RPGConfigError

MARKER = "rpg_checkpoint_complete.json"
# verl.utils.checkpoint.checkpoint_manager.get_checkpoint_tracker_filename's name (a test pins it): not
# imported, because that module takes seconds and prints warnings, and the CPU launcher reads this
# after a SIGHUP, when its stderr must hold one line
TRACKER = "latest_checkpointed_iteration.txt"
STEP_DIR = re.compile(r"global_step_(\d+)")
RESUME_MODES = ("auto", "disable", "resume_path")  # verl 0.9.1 trainer_base: any other value fails after Ray


class ResumeError(RPGConfigError):
    """The run cannot resume where it stopped (one line: the directory and the choices)."""


@dataclass(frozen=True)
class ResumePlan:
    folder: str | None  # the global_step_N to load; None: from scratch
    note: str | None = None  # one line to print (checkpoints skipped), or None


# ----------------------------------------------------------------------------- writing


def manifest(folder: str | os.PathLike) -> dict[str, int]:
    """{relative path: size in bytes} of every file under ``folder`` except the marker."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != MARKER and not p.name.startswith(MARKER)}


def write_marker(folder: str | os.PathLike, step: int) -> Path:
    """Declare ``folder`` complete: the marker (step + manifest), written to a temporary name and renamed."""
    folder = Path(folder)
    tmp, final = folder / f"{MARKER}.tmp", folder / MARKER
    tmp.write_text(json.dumps({"global_step": step, "files": manifest(folder)}, indent=1) + "\n")
    os.replace(tmp, final)
    return final


# ----------------------------------------------------------------------------- reading


def pt_problem(path: str | os.PathLike) -> str | None:
    """None if ``path`` is a whole zip archive (torch.save's format), else why not; no tensor is read."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if info.header_offset + info.compress_size > size:
                    return f"{path}: truncated ({info.filename} ends past the end of the file)"
    except FileNotFoundError:
        return f"{path}: missing"
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        return f"{path}: not a whole torch checkpoint ({e})"
    return None


def step_dirs(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """[(N, root/global_step_N)] of the directories under ``root``, newest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.fullmatch(p.name))]
    return sorted(found, reverse=True)


def tracker_step(root: str | os.PathLike, strict: bool = True) -> int | None:
    """The step in verl's tracker file; None if there is none. A tracker that is not an integer raises
    (``strict``) or counts as none."""
    path = Path(root) / TRACKER
    if not path.is_file():
        return None
    text = path.read_text().strip()
    if not text.isdigit():
        if not strict:
            return None
        raise ResumeError(f"{path}: verl's checkpoint tracker holds {text[:40]!r}, not a step number; "
                          f"{_choices(Path(root))}")
    return int(text)


def checkpoint_problem(folder: str | os.PathLike, tracked: bool = False) -> str | None:
    """None if ``folder`` is a complete, intact checkpoint (module docstring); else the reason.

    ``tracked``: verl's tracker names this folder (accepted without the marker).
    """
    folder = Path(folder)
    if not folder.is_dir():
        return f"{folder}: no such directory"
    marker = folder / MARKER
    if marker.is_file():
        try:
            files = json.loads(marker.read_text())["files"]
        except (ValueError, KeyError, TypeError):
            return f"{marker}: unreadable"
        for rel, size in files.items():
            p = folder / rel
            if not p.is_file():
                return f"{folder}: {rel} is missing (listed in {MARKER})"
            if p.stat().st_size != size:
                return f"{folder}: {rel} has {p.stat().st_size} bytes, {size} when it was saved"
    elif not tracked:
        return f"{folder}: incomplete (no {MARKER}: the save did not finish)"
    if not (folder / "actor").is_dir():
        return f"{folder}: no actor/ (deleted by trainer.max_actor_ckpt_to_keep, or the save did not finish)"
    if not (folder / "data.pt").is_file():
        return f"{folder}: no data.pt (the data order could not be restored)"
    for p in sorted(folder.rglob("*.pt")):
        if (why := pt_problem(p)) is not None:
            return why
    return None


def last_complete(root: str | os.PathLike) -> Path | None:
    """The newest complete, intact checkpoint under ``root`` (None if there is none)."""
    tracked = tracker_step(root, strict=False)
    return next((p for n, p in step_dirs(root) if checkpoint_problem(p, tracked=n == tracked) is None), None)


def _choices(root: Path) -> str:
    """The ways on, for a refusal's one line."""
    newest = last_complete(root)
    disable = f"trainer.resume_mode=disable to train from step 0 (overwrites the checkpoints in {root})"
    if newest is None:
        return f"no complete checkpoint is left: set {disable}, or another trainer.default_local_dir"
    return (f"choose trainer.resume_mode=resume_path trainer.resume_from_path={newest} (the newest complete "
            f"checkpoint), or {disable}")


def _absolute(path: str) -> Path:
    """verl's rule: relative to the current directory (no ``~`` expansion)."""
    return Path(path) if os.path.isabs(path) else Path(os.getcwd()) / path


def resume_mode_problem(mode) -> str | None:
    """None if verl knows ``trainer.resume_mode`` (anything else: verl logs it and fails after Ray)."""
    if mode not in RESUME_MODES:
        return f"trainer.resume_mode={mode!r} is invalid; allowed values: {', '.join(RESUME_MODES)}"
    return None


def plan_resume(mode: str, default_local_dir: str, resume_from_path: str | None = None) -> ResumePlan:
    """What the run resumes from (module docstring); ``ResumeError`` when it cannot continue."""
    if (why := resume_mode_problem(mode)) is not None:  # never read a typo as auto
        raise ResumeError(why)
    if mode == "disable":
        return ResumePlan(None)
    if mode == "resume_path":
        folder = _absolute(str(resume_from_path))
        if (why := checkpoint_problem(folder, tracked=_tracked_by_parent(folder))) is not None:
            raise ResumeError(f"cannot resume from trainer.resume_from_path: {why}; {_choices(folder.parent)}")
        return ResumePlan(str(folder), f"resuming from {folder}")
    root = _absolute(str(default_local_dir))
    tracked = tracker_step(root)
    dirs = step_dirs(root)
    if tracked is None and not dirs:
        return ResumePlan(None)  # nothing saved yet: from scratch
    skipped = []
    if tracked is not None and tracked not in {n for n, _ in dirs}:
        skipped.append(f"{root / f'global_step_{tracked}'}: missing (named by {TRACKER})")
    for n, p in dirs:
        why = checkpoint_problem(p, tracked=n == tracked)
        if why is None:
            return ResumePlan(str(p), f"resuming from {p}, the newest complete checkpoint"
                              + (f"; skipped: {'; '.join(skipped)}" if skipped else ""))
        skipped.append(why)
    tracker_note = f" ({TRACKER} names step {tracked})" if tracked is not None else ""
    raise ResumeError(f"trainer.resume_mode=auto: no complete checkpoint in {root}{tracker_note}, but training "
                      f"from step 0 would overwrite what is there ({'; '.join(skipped) or 'no global_step_N left'}); "
                      f"{_choices(root)}")


def _tracked_by_parent(folder: Path) -> bool:
    m = STEP_DIR.fullmatch(folder.name)
    return bool(m) and tracker_step(folder.parent, strict=False) == int(m.group(1))
