"""End to end: a colocate_async run killed inside a save, after verl's tracker named the step and before the recipe's
lag book and marker, then resumed with ``trainer.resume_mode=auto`` (docs/verl-integration.md#resume); both launches
under a TMPDIR of 60 bytes or more, where Ray's socket paths would not fit (rpg.paths.ray_temp). Two
launches into one output folder, on the CPU backend with the tiny model, a checkpoint every 2 steps.

Where the kill lands follows from the run: the trainer holds in step 4's save once verl's save returned
(``RPG_TEST_HOLD_IN_SAVE``) and writes a marker; the test SIGKILLs the driver (its own child, by PID) then. What a
kill there leaves: ``latest_checkpointed_iteration.txt`` names step 4, ``global_step_4`` has verl's files and no lag
book or completion marker, ``global_step_2`` is whole. The resume names ``global_step_4`` incomplete, loads
``global_step_2`` (the driver pins it in verl's ``trainer.resume_from_path`` before Ray), trains steps 3-4 and saves
``global_step_4`` whole.
"""

from __future__ import annotations

import signal
import tempfile
import threading
from pathlib import Path

import pytest
from e2e_recipe import ENTRY
from test_async_kill_resume_e2e import _killed_at_the_marker

pytestmark = [pytest.mark.e2e, pytest.mark.resume_e2e]  # a CI stage: README's suite has no room

STEPS, MODE = 4, "colocate_async"
COMMON = ["trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=2"]


def _launch(tiny_assets, out: Path, resume: str, env: dict, stop: threading.Event | None = None):
    from rpg.trainer_process import run_trainer
    from rpg.tiny.overrides import tiny_overrides

    return run_trainer([*tiny_overrides(tiny_assets, steps=STEPS, algo="rpg", world_size=1, trainer_mode=MODE),
                        "trainer.n_gpus_per_node=1", f"trainer.v1.trainer_mode={MODE}", *COMMON,
                        f"trainer.resume_mode={resume}", f"trainer.default_local_dir={out / 'ckpt'}"],
                       output_dir=out / "run", entry=ENTRY, timeout_s=1500, check=False, stop=stop,
                       env={"RAY_DEDUP_LOGS": "0", **env})


def test_a_run_killed_inside_a_save_resumes_from_the_last_whole_checkpoint_under_a_long_tmpdir(
        tiny_assets, tmp_path, monkeypatch):
    from rpg.paths.ray_temp import fits
    from rpg.verl.async_resume import SAVE_HOLD_ENV
    from rpg.verl.checkpoints import LAG_BOOK_FILE, MARKER, TRACKER, plan_resume, read_marker

    long = tmp_path / ("t" * max(1, 60 - len(str(tmp_path)) - 1))
    long.mkdir()
    assert not fits(str(long))
    monkeypatch.setattr(tempfile, "tempdir", str(long))  # this process's TMPDIR, where run_trainer makes Ray's folder
    env = {"TMPDIR": str(long)}
    out, marker = tmp_path / "out", tmp_path / "held.json"
    first, _ = _killed_at_the_marker(
        lambda stop: _launch(tiny_assets, out, "disable", {**env, SAVE_HOLD_ENV: f"{STEPS}:{marker}"}, stop),
        out, marker, signal.SIGKILL)
    first_log = first.log  # the second launch appends to the same log
    # steps 1-4 trained; verl logs a step after its save, so step 4's record never came
    assert first.returncode == -signal.SIGKILL and first.last_step() == STEPS - 1, first.tail()
    ckpt = out / "ckpt"
    newest, whole = ckpt / f"global_step_{STEPS}", ckpt / "global_step_2"
    assert (ckpt / TRACKER).read_text().strip() == str(STEPS)
    assert (newest / "data.pt").is_file() and not (newest / MARKER).exists() and not (newest / LAG_BOOK_FILE).exists()
    assert (whole / MARKER).is_file()
    assert plan_resume("auto", str(ckpt), trainer_mode=MODE).folder == str(whole)  # the driver's rule, before Ray
    assert any("Ray's temporary folder is" in n and str(long) in n for n in first.notes), first.notes

    second = _launch(tiny_assets, out, "auto", env)
    log = second.log[len(first_log):]
    assert second.returncode == 0 and second.last_step() == STEPS, second.tail()
    line = next(ln for ln in log.splitlines() if "rpg: resuming from" in ln)
    assert f"rpg: resuming from {whole}: " in line and f"{newest}: incomplete" in line, line
    assert f"rpg: resumed the replay buffer of {whole}" in log
    assert read_marker(newest)["global_step"] == STEPS and (newest / LAG_BOOK_FILE).is_file()  # saved whole again
    assert not second.leftover_pids and not list(long.glob("rpgray*"))  # Ray's folders elsewhere, and removed
