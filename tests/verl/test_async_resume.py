"""An asynchronous run resumed from its checkpoint (docs/verl-integration.md#resume): the lag book kept with the
checkpoint (the samples generated before the stop keep the version that sampled them), the replay buffer's census
and the samples of the checkpoint's own step cleared (``rpg.verl.async_resume``), and the driver's refusal of a
checkpoint without them. The whole path, run: tests/e2e/test_async_resume_e2e.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from messages import names, one_line

from rpg.verl.async_resume import AsyncResumeMixin, census, resume_line
from rpg.verl.checkpoints import LAG_BOOK_FILE, ResumeError, TQ_DIR, async_problem, plan_resume, write_marker
from rpg.verl.sample_order_and_lag import LagBook, RunOrderMixin


def _book_to_step_2() -> LagBook:
    book = LagBook(0)
    book.add_updates(4)
    book.publish(1)
    book.add_updates(4)
    book.publish(2)
    return book


def test_the_lag_book_survives_the_stop():
    """Saved at step 2 (4 updates a step), the resumed book counts a version-1 sample trained at step 3 one version
    and 4 updates behind, as the uninterrupted book does; a book started anew at step 2 (what a resume did before it
    was kept) cannot count it at all."""
    book = _book_to_step_2()
    resumed = LagBook.from_state(json.loads(json.dumps(book.state_dict())), 2)
    assert resumed.lags(3, [1, 2]) == book.lags(3, [1, 2]) == ([1, 0], [4, 0])
    resumed.add_updates(4)
    book.add_updates(4)
    resumed.publish(3)
    book.publish(3)
    assert resumed.lags(4, [1, 2, 3]) == book.lags(4, [1, 2, 3]) == ([2, 1, 0], [8, 4, 0])
    with pytest.raises(ValueError, match=r"versions \[1\]"):
        LagBook(2).lags(3, [1])
    with pytest.raises(ValueError, match="not at the checkpoint's step 4"):
        LagBook.from_state(book.state_dict(), 4)  # the book ends at version 3


class _Base:
    def on_init_end(self):
        self.synced = True

    def _save_checkpoint(self):
        Path(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}").mkdir(parents=True)


class _Trainer(RunOrderMixin, _Base):
    def __init__(self, root: Path, step: int, resumed: bool):
        self.config = SimpleNamespace(trainer=SimpleNamespace(default_local_dir=str(root)))
        self.global_steps, self._resumed = step, resumed

    def _resumed_folder(self):
        return str(Path(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")) if self._resumed else None


def test_the_trainer_saves_the_book_with_its_checkpoint_and_takes_it_back(tmp_path):
    saving = _Trainer(tmp_path, 2, resumed=False)
    saving._lag_book = _book_to_step_2()
    saving._save_checkpoint()
    assert json.loads((tmp_path / "global_step_2" / LAG_BOOK_FILE).read_text()) == saving._lag_book.state_dict()
    resumed = _Trainer(tmp_path, 2, resumed=True)
    resumed.on_init_end()
    assert resumed.synced and resumed._lag_book.lags(3, [1]) == ([1], [4])
    fresh = _Trainer(tmp_path / "new", 0, resumed=False)
    fresh.on_init_end()
    assert fresh._lag_book.lags(1, [0]) == ([0], [0])


# a training partition restored at step 2: p1-0 trained at step 2 (its prompt key cleared at sampling: its two
# samples left behind by the save), p2-0 finished with version 1, p2-1 running (one partial sample), p2-2 pending
ITEMS = {
    "p1-0_0_0": {"min_global_steps": 0}, "p1-0_1_0": {"min_global_steps": 0},
    "p2-0": {"is_prompt": True, "status": "finished", "global_steps": 2},
    "p2-0_0_0": {"min_global_steps": 1}, "p2-0_1_0": {"min_global_steps": 1},
    "p2-1": {"is_prompt": True, "status": "running", "global_steps": 2}, "p2-1_0_0": {"min_global_steps": 1},
    "p2-2": {"is_prompt": True, "status": "pending", "global_steps": 2},
}


def test_the_census_tells_kept_in_flight_and_trained_samples_apart():
    c = census(ITEMS)
    assert c.finished == {"p2-0"} and c.in_flight == {"p2-1", "p2-2"} and c.samples == {"p2-0": 2}
    assert c.versions == {1} and c.dispatched == {2} and sorted(c.trained) == ["p1-0_0_0", "p1-0_1_0"]
    line = one_line(resume_line("/c/global_step_2", 2, c))
    # what was kept, re-issued and cleared, with the counts, versions and steps
    names(line, "/c/global_step_2", "1 finished prompt groups kept", "2 samples", "weight versions [1]",
          "dispatched at steps [2]", "2 prompts in flight re-issued at step 3", "2 samples of step 2's batch", "cleared")


class _Loaded:
    def _load_checkpoint(self):
        self.global_steps = self.step


class _Resuming(AsyncResumeMixin, _Loaded):
    def __init__(self, mode: str, step: int):
        self.trainer_mode, self.step = mode, step

    def _resumed_folder(self):
        return f"/c/global_step_{self.step}"


@pytest.mark.parametrize("mode,step,cleared", [("colocate_async", 2, ["p1-0_0_0", "p1-0_1_0"]),
                                               ("separate_async", 2, ["p1-0_0_0", "p1-0_1_0"]),
                                               ("sync", 2, None), ("separate_async", 0, None)])
def test_only_the_samples_trained_before_the_save_are_cleared(mode, step, cleared, monkeypatch, capsys):
    """Nothing trained twice, nothing lost: after verl's restore the keys without a prompt key (trained at the
    checkpoint's step) go, the finished groups and the prompts in flight stay for verl to sample and re-issue. A
    sync run or a fresh start touches nothing."""
    import rpg.verl.async_resume as A

    calls = []
    monkeypatch.setattr(A.tq, "kv_list", lambda partition: {partition: dict(ITEMS)})
    monkeypatch.setattr(A.tq, "kv_clear", lambda keys, partition_id: calls.append((sorted(keys), partition_id)))
    _Resuming(mode, step)._load_checkpoint()
    out = capsys.readouterr().out
    if cleared is None:
        assert calls == [] and out == ""
    else:
        assert calls == [(cleared, "train")]
        assert out.startswith("rpg: ")
        names(one_line(out), "/c/global_step_2", "1 finished prompt groups kept")


def _async_ckpt(root: Path, step: int, tq: bool = True, book: bool = True) -> Path:
    import torch

    d = root / f"global_step_{step}"
    (d / "actor").mkdir(parents=True)
    torch.save({"w": torch.arange(4.0)}, d / "actor" / "model_world_size_1_rank_0.pt")
    torch.save({"index": step}, d / "data.pt")
    if tq:
        (d / TQ_DIR).mkdir()
        (d / TQ_DIR / "metadata.json").write_text("{}")
    if book:
        (d / LAG_BOOK_FILE).write_text(json.dumps(_book_to_step_2().state_dict()))
    write_marker(d, step)
    return d


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_the_driver_resumes_an_async_checkpoint_and_refuses_one_without_its_replay_buffer(mode, tmp_path):
    good = _async_ckpt(tmp_path / "a", 2)
    assert plan_resume("auto", str(tmp_path / "a"), trainer_mode=mode).folder == str(good)
    assert plan_resume("resume_path", "", str(good), trainer_mode=mode).folder == str(good)
    for kw, missing in (({"tq": False}, f"has no {TQ_DIR}/"), ({"book": False}, f"has no {LAG_BOOK_FILE}")):
        root = tmp_path / missing.split()[-1].strip("/.")
        bad = _async_ckpt(root, 2, **kw)
        for args in (("auto", str(root)), ("resume_path", "", str(bad))):
            with pytest.raises(ResumeError) as err:
                plan_resume(*args, trainer_mode=mode)
            line = str(err.value)
            assert "\n" not in line and line.startswith(f"{bad} {missing}") and f"trainer_mode={mode}" in line
            assert "trainer.resume_mode=disable" in line
        assert plan_resume("auto", str(root), trainer_mode="sync").folder == str(bad)  # sync needs neither
    assert async_problem(good, "sync") is None and async_problem(good, mode) is None


class _Sampling:
    def on_sample_begin(self):
        self.calls.append("sample")

    def _save_checkpoint(self):
        self.calls.append("save")


class _Held(AsyncResumeMixin, _Sampling):
    def __init__(self, mode: str, step: int, trigger: int = 0):
        self.trainer_mode, self.global_steps, self.local_trigger_step, self.calls = mode, step, trigger, []


def test_the_test_switches_hold_at_a_step_and_save_only_finished_groups(tmp_path, monkeypatch, capsys):
    """The resume tests' switches (tests/e2e/test_async_kill_resume_e2e.py): the trainer holds at the named step's
    first sampling after writing the marker, nowhere else; a save waits while a prompt group is in flight."""
    import rpg.verl.async_resume as A

    assert A.hold_point("") is None and A.hold_point(f"3:{tmp_path}/m") == (3, f"{tmp_path}/m")
    for bad in ("3", "x:/m", "0:/m", "3: "):
        with pytest.raises(ValueError, match=f"{A.HOLD_ENV}="):
            A.hold_point(bad)
    waits = []
    monkeypatch.setattr(A.threading, "Event", lambda: type("E", (), {"wait": lambda self: waits.append(1)})())
    marker = tmp_path / "held.json"
    monkeypatch.setenv(A.HOLD_ENV, f"3:{marker}")
    for step, trigger in ((2, 0), (3, 1)):
        _Held("colocate_async", step, trigger).on_sample_begin()
    assert not marker.exists() and waits == []
    held = _Held("colocate_async", 3)
    held.on_sample_begin()
    assert held.calls == ["sample"] and waits == [1] and json.loads(marker.read_text())["step"] == 3
    assert "holding step 3 before its sampling" in capsys.readouterr().out

    states = [{"p2-1": {"is_prompt": True, "status": "running", "global_steps": 2}},
              {"p2-1": {"is_prompt": True, "status": "finished", "global_steps": 2}}]
    polls = []
    monkeypatch.setattr(A.tq, "kv_list", lambda partition: {partition: states[min(len(polls), 1)]})
    monkeypatch.setattr(A.time, "sleep", lambda s: polls.append(s))
    saving = _Held("separate_async", 2)
    saving._save_checkpoint()
    assert saving.calls == ["save"] and polls == []  # the switch off: verl's save at once
    monkeypatch.setenv(A.FINISHED_ENV, "1")
    saving._save_checkpoint()
    assert saving.calls == ["save", "save"] and len(polls) == 1  # once the running group finished
    in_save = tmp_path / "in_save.json"
    monkeypatch.setenv(A.SAVE_HOLD_ENV, f"2:{in_save}")
    monkeypatch.delenv(A.FINISHED_ENV)
    _Held("colocate_async", 1)._save_checkpoint()
    assert not in_save.exists() and waits == [1]
    saving = _Held("colocate_async", 2)
    saving._save_checkpoint()  # verl's save first, then the hold
    assert saving.calls == ["save"] and waits == [1, 1] and json.loads(in_save.read_text())["step"] == 2


def _killed_save(root: Path, point: str) -> None:
    """Run tests/support/killed_save.py (the recipe's real save, step 2 whole, step 4 held at ``point``) and SIGKILL
    it there: ``root`` holds what such a kill leaves."""
    import signal
    import subprocess
    import sys
    import time

    support = Path(__file__).resolve().parents[1] / "support"
    ready = root.parent / f"{point}.ready"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(support), str(Path(__file__).parent),
                                                         os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(support / "killed_save.py"), str(root), point, str(ready)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 300
        while not ready.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert ready.exists(), proc.communicate(timeout=30)[0].decode()[-3000:] if proc.poll() is not None else "not held"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("point", ["before_book", "mid_book"])
def test_a_save_killed_after_verls_tracker_resumes_from_the_last_whole_checkpoint(point, tmp_path, monkeypatch, capsys):
    """Killed inside step 4's save after verl's tracker names it, before the lag book (``before_book``) or halfway
    through it (``mid_book``): the driver, before Ray, names global_step_4 incomplete and pins global_step_2 (whole,
    its marker verified) in verl's own trainer.resume_from_path; never a refusal to train from step 0 over it, never a
    partial lag book under its name."""
    import rpg.backends.gpu.backend
    import rpg.verl.main
    from test_resume import _cfg, _prepare

    from rpg.verl.checkpoints import MARKER, TRACKER

    root = tmp_path / "ckpt"
    _killed_save(root, point)
    newest, whole = root / "global_step_4", root / "global_step_2"
    assert (root / TRACKER).read_text() == "4" and not (newest / MARKER).exists() and (whole / MARKER).is_file()
    assert (newest / TQ_DIR / "metadata.json").is_file() and (newest / "data.pt").is_file()  # verl's save ended
    if (newest / LAG_BOOK_FILE).exists():  # a book under its name is whole
        assert LagBook.from_state(json.loads((newest / LAG_BOOK_FILE).read_text()), 4).updates == 4
    for mode in ("colocate_async", "separate_async", "sync"):
        plan = plan_resume("auto", str(root), trainer_mode=mode)
        assert plan.folder == str(whole), plan
        assert f"{newest}: incomplete" in plan.note and "\n" not in plan.note
    monkeypatch.setattr(rpg.verl.main, "check_verl_config", lambda *args, **kwargs: None)
    monkeypatch.setattr(rpg.backends.gpu.backend, "check_driver", lambda *args, **kwargs: None)
    cfg = _cfg(tmp_path, "trainer.v1.trainer_mode=colocate_async", "actor_rollout_ref.rollout.calculate_log_probs=true",
               "rpg.resume.allow_changed_settings=true")  # the stand-in trainer's config records no settings
    _prepare(cfg)
    assert (cfg.trainer.resume_mode, cfg.trainer.resume_from_path) == ("resume_path", str(whole))
    note = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("rpg: resuming")]
    assert len(note) == 1 and f"{newest}: incomplete" in note[0], note
