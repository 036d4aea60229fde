"""Which checkpoint a run resumes from, decided before Ray from the disk only (no Ray, no tensor loaded).

verl resumes from the step its tracker (``latest_checkpointed_iteration.txt``) names and, when the tracker or its
folder is missing, trains from step 0 over the run's checkpoints. ``plan_resume`` decides instead. A checkpoint is
complete when it holds ``MARKER`` (written by ``RPGTrainer`` after verl's save: every file with its size and SHA-256,
the run's RPG settings, model and lengths) and every listed file, verified when each digest matches, intact when
every ``.pt`` it loads is a whole zip archive. ``auto`` takes the tracker's checkpoint or the newest good one below it,
``resume_path`` that folder; other settings than the checkpoint's are refused unless
``rpg.resume.allow_changed_settings=true``. Each rule and its line: docs/verl-integration.md#resume. A refusal is ONE
line (``ResumeError``, exit code 2).
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rpg.config import RPGConfigError, config_value, declared_keys, recorded_keys
from rpg.verl.checkpoint_marker import DIGEST, MARKER, digests, file_digest, manifest, write_marker  # noqa: F401 (the
# marker's names, where the resume's users import them)

# verl.utils.checkpoint.checkpoint_manager.get_checkpoint_tracker_filename's name (a test pins it): not
# imported, because that module takes seconds and prints warnings, and the CPU launcher reads this
# after a SIGHUP, when its stderr must hold one line
TRACKER = "latest_checkpointed_iteration.txt"
STEP_DIR = re.compile(r"global_step_(\d+)")
# an asynchronous run's checkpoint also holds verl's TransferQueue state (the replay buffer: trainer_base.py:1000-1008)
# and the recipe's lag book (rpg.verl.sample_order_and_lag.LagBook.state_dict)
TQ_DIR, LAG_BOOK_FILE, ASYNC_MODES = "transfer_queue", "rpg_lag_book.json", ("colocate_async", "separate_async")
# every file or folder the recipe writes into a checkpoint folder is named with this prefix (the marker, the lag book,
# the step record, the reference state and shards; a test pins it): one of them without the marker is a save the
# recipe began and did not finish
RECIPE_PREFIX = "rpg_"
RESUME_MODES = ("auto", "disable", "resume_path")  # verl 0.9.1 trainer_base: any other value fails after Ray
ALLOW_CHANGED = next(k.path for k in declared_keys() if k.name == "allow_changed_settings")  # its config key
# what a checkpoint records of the run besides the rpg: block's recorded keys (rpg.config.recorded_keys):
# verl's keys that change the estimator: the advantage, verl's loss keys (rpg.loss.name=verl variants), the
# trainer mode (colocate_async weights each token by pi_old/mu, sync does not: rpg.math.behavior), the
# advantage's normalisation, a KL penalty in the reward, verl's rollout correction (its IS/RS weights)
VERL_RUN_KEYS = ("algorithm.adv_estimator", "actor_rollout_ref.actor.policy_loss.loss_mode",
                 "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.kl_loss_type",
                 "actor_rollout_ref.actor.kl_loss_coef", "trainer.v1.trainer_mode", "algorithm.norm_adv_by_std_in_grpo",
                 "algorithm.use_kl_in_reward", "algorithm.kl_penalty", "algorithm.kl_ctrl.type", "algorithm.kl_ctrl.kl_coef",
                 *(f"algorithm.rollout_correction.{k}" for k in ("rollout_is", "rollout_is_threshold", "rollout_rs",
                                                                  "rollout_rs_threshold", "bypass_mode", "loss_type")))
# what a checkpoint records of the run's model and lengths: weights continued as another model, with another
# tokenizer or at another context length are another experiment (verl's tokenizer_path null: the model's)
RUN_KEYS = ("actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path", "data.max_prompt_length",
            "data.max_response_length")
# a local model folder is also recorded by its config.json's digest (None: a hub id or a remote path), so that
# another model copied to the same path is told apart
MODEL_CONFIG = f"{DIGEST}(actor_rollout_ref.model.path/config.json)"


class ResumeError(RPGConfigError):
    """The run cannot resume where it stopped (one line: the directory and the choices)."""


@dataclass(frozen=True)
class ResumePlan:
    folder: str | None  # the global_step_N to load; None: from scratch
    note: str | None = None  # one line to print (checkpoints skipped), or None


# ----------------------------------------------------------------------------- settings


def resume_keys() -> tuple[str, ...]:
    """What a checkpoint records and a resume compares: the ``rpg:`` block's keys declared ``recorded`` (with
    the loss's verl actor keys; derived: a new ``RPGLossConfig`` field is recorded at once), ``VERL_RUN_KEYS``,
    ``RUN_KEYS`` and ``MODEL_CONFIG``. Not recorded: logging, validation and resume settings, data and output
    paths, batch sizes, the lr."""
    return (*recorded_keys(), *VERL_RUN_KEYS, *RUN_KEYS, MODEL_CONFIG)


def model_config_digest(cfg) -> str | None:
    """``DIGEST`` of ``config.json`` in the local folder ``actor_rollout_ref.model.path``; None when the path is
    remote, a hub id or has no ``config.json`` here."""
    path = config_value(cfg, "actor_rollout_ref.model.path")
    found = None if path is None or "://" in str(path) else Path(str(path)).expanduser() / "config.json"
    return file_digest(found) if found is not None and found.is_file() else None


def recorded_settings(cfg) -> dict:
    """{key: value} of ``resume_keys()`` in the run's config, as the driver applied it (the trainer
    records it at save; the driver compares it before Ray: the same config both times)."""
    return {key: model_config_digest(cfg) if key == MODEL_CONFIG else config_value(cfg, key) for key in resume_keys()}


def settings_changes(saved: dict, current: dict) -> list[str]:
    """``key: old -> new`` for every recorded key whose value differs (a key the checkpoint did not
    record, e.g. one added since, is not compared: ``unrecorded_keys``)."""
    return [f"{k}: {saved[k]!r} -> {current.get(k)!r}" for k in saved if k in current and saved[k] != current[k]]


def unrecorded_keys(saved: dict, current: dict) -> list[str]:
    """The keys of ``current`` that a checkpoint's ``saved`` settings lack (written before they were recorded)."""
    return [k for k in current if k not in saved]


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
    if not text.isdecimal():  # int() reads it (isdigit also takes '²')
        if not strict:
            return None
        raise ResumeError(f"{path}: verl's checkpoint tracker holds {text[:40]!r}, not a step number; "
                          f"{_choices(Path(root))}")
    return int(text)


def read_marker(folder: str | os.PathLike) -> dict | None:
    """The marker's record; None if there is none; ``ValueError`` if it is unreadable."""
    marker = Path(folder) / MARKER
    if not marker.is_file():
        return None
    try:
        record = json.loads(marker.read_text())
        if not isinstance(record, dict) or not isinstance(record["files"], dict):
            raise TypeError
        return record
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{marker}: unreadable") from None


def is_last_step(folder: str | os.PathLike | None) -> bool:
    """Whether ``folder`` is a checkpoint of its run's last training step (its marker's ``last_step``, which the
    trainer records); False when that is not recorded or the marker is unreadable."""
    try:
        record = None if folder is None else read_marker(folder)
    except ValueError:
        return False
    last = None if record is None else record.get("last_step")
    return isinstance(last, int) and isinstance(record.get("global_step"), int) and record["global_step"] >= last


def unfinished_save(folder: str | os.PathLike) -> str | None:
    """Why ``folder``, which has no ``MARKER``, is a save of this recipe that did not finish (None: nothing says
    so: verl's own trainer or an older run wrote it). verl writes its tracker as its own save ends, before the
    recipe's files and the marker (``rpg.verl.trainer``): the tracker names a folder killed in between. Such a folder
    holds a file of the recipe's (``RECIPE_PREFIX``) or sits beside a checkpoint with the marker (the recipe saved this run)."""
    folder = Path(folder)
    own = sorted(p.name for p in folder.iterdir() if p.name.startswith(RECIPE_PREFIX))
    if own:
        return (f"{folder}: incomplete (no {MARKER} beside the recipe's {', '.join(own)}: the save did not finish "
                f"after verl's {TRACKER} named it)")
    marked = next((p for _, p in step_dirs(folder.parent) if p != folder and (p / MARKER).is_file()), None)
    if marked is not None:
        return (f"{folder}: incomplete (no {MARKER}, which this run's {marked.name} has: the save did not finish "
                f"after verl's {TRACKER} named it)")
    return None


def step_mismatch(folder: str | os.PathLike, record: dict) -> str | None:
    """Why ``folder``'s name and its marker's step disagree (a renamed or copied folder: verl would resume the
    name's step with the marker's weights); None when they agree or the name is not ``global_step_N``."""
    folder = Path(folder)
    m = STEP_DIR.fullmatch(folder.name)
    saved = record.get("global_step")
    if m is None or saved == int(m.group(1)):
        return None
    if saved is None:  # every marker the recipe writes records its step
        return f"{folder}: its {MARKER} records no step (not one this recipe wrote), its name says step {m.group(1)}"
    return (f"{folder}: its {MARKER} records step {saved}, its name says step {m.group(1)} (renamed or copied from "
            f"global_step_{saved}?); verl would resume it as step {m.group(1)} with step {saved}'s weights")


@dataclass(frozen=True)
class Inspection:
    problem: str | None  # None: complete and intact (and verified when asked)
    note: str | None = None  # accepted, but not everything could be checked (no digests)


def inspect(folder: str | os.PathLike, tracked: bool = False, verify: bool = True) -> Inspection:
    """Is ``folder`` a complete, intact checkpoint (docs/verl-integration.md#resume)? ``verify``: also compare
    every file's digest with the marker's (reads every byte: ``file_digest``).

    ``tracked``: verl's tracker names this folder (accepted without the marker unless ``unfinished_save`` says the
    recipe's save of it did not finish). A marker whose step is not the folder's is refused (``step_mismatch``).
    """
    folder = Path(folder)
    if not folder.is_dir():
        return Inspection(f"{folder}: no such directory")
    try:
        record = read_marker(folder)
    except ValueError as e:
        return Inspection(str(e))
    note = None
    if record is not None and (why := step_mismatch(folder, record)) is not None:
        return Inspection(why)
    if record is not None:
        files = record["files"]
        for rel, entry in files.items():
            p, size = folder / rel, entry.get("size") if isinstance(entry, dict) else entry
            if not p.is_file():
                return Inspection(f"{folder}: {rel} is missing (listed in {MARKER})")
            if p.stat().st_size != size:
                return Inspection(f"{folder}: {rel} has {p.stat().st_size} bytes, {size} when it was saved")
        unhashed = [rel for rel, entry in files.items() if not (isinstance(entry, dict) and DIGEST in entry)]
        if unhashed:
            note = f"{folder / MARKER} records no {DIGEST} digests (written before they were): sizes checked only"
    elif not tracked:
        return Inspection(f"{folder}: incomplete (no {MARKER}: the save did not finish)")
    elif (why := unfinished_save(folder)) is not None:
        return Inspection(why)
    else:
        note = f"{folder} has no {MARKER} (verl's own trainer, or an older run): its contents are not verified"
    if not (folder / "actor").is_dir():
        return Inspection(f"{folder}: no actor/ (deleted by trainer.max_actor_ckpt_to_keep, or the save did not finish)")
    if not (folder / "data.pt").is_file():
        return Inspection(f"{folder}: no data.pt (the data order could not be restored)")
    for p in sorted(folder.rglob("*.pt")):
        if (why := pt_problem(p)) is not None:
            return Inspection(why)
    if verify and record is not None:
        hashed = [(rel, e[DIGEST]) for rel, e in record["files"].items() if isinstance(e, dict) and DIGEST in e]
        actual = digests([folder / rel for rel, _ in hashed])
        for (rel, want), got in zip(hashed, actual):
            if got != want:
                return Inspection(f"{folder / rel}: corrupted or replaced (its {DIGEST} differs from the one "
                                  f"recorded at the save in {MARKER})")
    return Inspection(None, note)


def checkpoint_problem(folder: str | os.PathLike, tracked: bool = False, verify: bool = True) -> str | None:
    """None if ``folder`` is a complete, intact (and, with ``verify``, verified) checkpoint; else the reason."""
    return inspect(folder, tracked, verify).problem


def _auto_order(root: Path, tracked: int | None) -> tuple[list[tuple[int, Path]], list[str]]:
    """The checkpoints ``auto`` may resume, in the order it tries them, and what it ignores (folders
    above the tracker's step: one reason each, without reading their contents)."""
    dirs = step_dirs(root)
    if tracked is None:
        return dirs, []
    ignored = []
    for n, p in dirs:
        if n > tracked:
            why = inspect(p, verify=False).problem
            ignored.append(why or f"{p}: complete, but not the run the tracker follows")
    return [(n, p) for n, p in dirs if n <= tracked], ignored


def last_complete(root: str | os.PathLike, verify: bool = False) -> Path | None:
    """The checkpoint ``auto`` would resume under ``root`` (None if there is none). Without ``verify``
    the digests are not compared (the stop line and the refusals' suggestions: no file is read whole)."""
    root = Path(root)
    tracked = tracker_step(root, strict=False)
    order, _ = _auto_order(root, tracked)
    return next((p for n, p in order if checkpoint_problem(p, tracked=n == tracked, verify=verify) is None), None)


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


def _settings_note(folder: Path, settings: dict | None, allow_changed: bool) -> str | None:
    """None if the checkpoint's recorded settings equal ``settings``; a note when they cannot be compared
    or differ with ``allow_changed``; ``ResumeError`` (one line naming each key) when they differ."""
    if settings is None:
        return None
    record = read_marker(folder)
    saved = None if record is None else record.get("settings")
    if not isinstance(saved, dict):
        return f"{folder} records no RPG settings (written before they were): not compared"
    changes = settings_changes(saved, settings)
    missing = unrecorded_keys(saved, settings)
    unknown = (f"{folder} records no {', '.join(missing)} (written before they were): not compared"
               if missing else None)
    if not changes:
        return unknown
    if allow_changed:
        return _join(f"settings changed since {folder} ({ALLOW_CHANGED}=true): {', '.join(changes)}", unknown)
    raise ResumeError(f"{folder} was trained with other RPG settings: {', '.join(changes)}; resume with the "
                      f"checkpoint's values, or set {ALLOW_CHANGED}=true to continue it with the new ones, or "
                      f"trainer.resume_mode=disable (another trainer.default_local_dir) to train from step 0")


def _world_size_note(folder: Path, world_size: int | None, strategy: str) -> str | None:
    """None if ``folder`` was saved at ``world_size``; what the workers do at another one; ``ResumeError``
    (one line, both world sizes, the way out) when it cannot be resharded."""
    if world_size is None:
        return None
    from rpg.verl.resume_world_size import world_size_change

    problem, note = world_size_change(folder, world_size, strategy)
    if problem is not None:
        raise ResumeError(problem)
    return note


def async_problem(folder: str | os.PathLike, trainer_mode: str | None) -> str | None:
    """None unless an asynchronous run (``trainer_mode``) would resume from a checkpoint without its replay buffer
    (verl would start a new one: the samples generated but not trained, whose prompts the saved dataloader has
    passed, would be lost) or its lag book (their lag could not be counted)."""
    folder = Path(folder)
    missing = [name for name, p in ((f"{TQ_DIR}/", folder / TQ_DIR / "metadata.json"),
                                    (LAG_BOOK_FILE, folder / LAG_BOOK_FILE)) if not p.is_file()]
    if trainer_mode not in ASYNC_MODES or not missing:
        return None
    why = ("a sync run's checkpoint, or one saved before the recipe kept them" if (folder / MARKER).is_file() else
           f"no {MARKER} either: verl's own trainer's checkpoint, or a save that did not finish")
    return (f"{folder} has no {' and no '.join(missing)} ({why}): trainer.v1.trainer_mode={trainer_mode} cannot take back the replay buffer and the samples' "
            "lag from it; set trainer.resume_mode=disable (another trainer.default_local_dir) to train from step 0")


def dropped_buffer_note(folder: str | os.PathLike, trainer_mode: str | None) -> str | None:
    """The warning when a sync run resumes an asynchronous run's checkpoint (``rpg.resume.allow_changed_settings``):
    verl loads its replay buffer in the asynchronous modes only (``trainer_base.py:900-908``), so the finished prompt
    groups in it, generated and not trained, whose prompts the saved data order has passed, are not trained."""
    folder = Path(folder)
    if trainer_mode != "sync" or not (folder / TQ_DIR / "metadata.json").is_file():
        return None
    return (f"warning: trainer.v1.trainer_mode={trainer_mode} does not load the replay buffer of {folder / TQ_DIR}: "
            "its finished prompt groups (generated, not yet trained) are dropped and their prompts, which the saved data "
            "order has passed, are not trained in this run")


def _join(*parts: str | None) -> str:
    return "; ".join(p for p in parts if p)


def plan_resume(mode: str, default_local_dir: str, resume_from_path: str | None = None,
                settings: dict | None = None, allow_changed: bool = False, world_size: int | None = None,
                strategy: str = "fsdp2", trainer_mode: str | None = None) -> ResumePlan:
    """What the run resumes from (docs/verl-integration.md#resume); ``ResumeError`` when it cannot continue.
    ``settings``: the run's ``recorded_settings`` (None: not compared). ``world_size``, ``strategy``: the
    run's world size and actor strategy (None: not compared; ``rpg.verl.resume_world_size``). ``trainer_mode``:
    an asynchronous mode needs the checkpoint's replay buffer and lag book (``async_problem``)."""
    if (why := resume_mode_problem(mode)) is not None:  # never read a typo as auto
        raise ResumeError(why)
    if mode == "disable":
        return ResumePlan(None)
    if mode == "resume_path":
        folder = _absolute(str(resume_from_path))
        found = inspect(folder, tracked=_tracked_by_parent(folder))
        if found.problem is not None:
            raise ResumeError(f"cannot resume from trainer.resume_from_path: {found.problem}; {_choices(folder.parent)}")
        if (why := async_problem(folder, trainer_mode)) is not None:
            raise ResumeError(why)
        return ResumePlan(str(folder), _join(f"resuming from {folder}", found.note,
                                             _settings_note(folder, settings, allow_changed),
                                             _world_size_note(folder, world_size, strategy),
                                             dropped_buffer_note(folder, trainer_mode)))
    root = _absolute(str(default_local_dir))
    tracked = tracker_step(root)
    order, ignored = _auto_order(root, tracked)
    if tracked is None and not order:
        return ResumePlan(None)  # nothing saved yet: from scratch
    skipped = []
    if tracked is not None and tracked not in {n for n, _ in order}:
        skipped.append(f"{root / f'global_step_{tracked}'}: missing (named by {TRACKER})")
    ignored_line = f"ignored (above the tracker's step, never resumed): {'; '.join(ignored)}" if ignored else None
    for n, p in order:
        found = inspect(p, tracked=n == tracked)
        if found.problem is None:
            if (why := async_problem(p, trainer_mode)) is not None:
                raise ResumeError(why)
            if tracked is None:
                why = f"the newest complete checkpoint (no {TRACKER} in {root})"
            elif n == tracked:
                why = f"step {n}, named by verl's tracker ({TRACKER})"
            else:
                why = f"the newest complete checkpoint below step {tracked}, which verl's tracker names but cannot be resumed"
            return ResumePlan(str(p), _join(f"resuming from {p}: {why}",
                                            f"skipped: {'; '.join(skipped)}" if skipped else None, ignored_line,
                                            found.note, _settings_note(p, settings, allow_changed),
                                            _world_size_note(p, world_size, strategy),
                                            dropped_buffer_note(p, trainer_mode)))
        skipped.append(found.problem)
    tracker_note = f" ({TRACKER} names step {tracked})" if tracked is not None else ""
    raise ResumeError(f"trainer.resume_mode=auto: no complete checkpoint in {root}{tracker_note}, but training "
                      f"from step 0 would overwrite what is there ({_join(*skipped, ignored_line) or 'no global_step_N left'}); "
                      f"{_choices(root)}")


def _tracked_by_parent(folder: Path) -> bool:
    m = STEP_DIR.fullmatch(folder.name)
    return bool(m) and tracker_step(folder.parent, strict=False) == int(m.group(1))
