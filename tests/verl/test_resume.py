"""Long runs survive interrupts, resumes and bad input (no verl trainer, no Ray: stand-in entry scripts
and checkpoint folders written here).

* the resume checkpoint is decided before Ray (rpg.verl.checkpoints via the driver's prepare_config):
  the one verl's tracker names (a newer folder is named and ignored), complete and verified by the
  SHA-256 digests of its marker (a flipped byte or a same-size file from another save is named and
  not loaded), trained with the same RPG settings (else one line naming each key), or one line
  refusing; never from step 0 over existing checkpoints; a CPU run's checkpoints live under its OUT_DIR;
* the CPU harness keeps a resumed run's history: metrics.jsonl and trainer.log are appended to, a
  re-run step replaces its earlier record with one line saying so, a lost training step is one line;
* SIGHUP / SIGINT / SIGTERM stop every process of a harness run, print one line, exit 128 + signum;
* output directories are unique per launch; run names cannot leave their directory; the driver's exit
  code survives the tiny launcher.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from messages import names, one_line
import torch
from data_files import model_folder, verl_file
from hydra import compose, initialize_config_dir

from rpg.config import RPGConfigError
from rpg.verl.checkpoints import MARKER, TRACKER, ResumeError, last_complete, plan_resume, write_marker

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- checkpoints


def _ckpt(root: Path, step: int, *, marker: bool = True, data: bool = True, tracker: bool = False) -> Path:
    """A global_step_<step> as verl + RPGTrainer write it: actor shard, data.pt (torch zips), marker last."""
    d = root / f"global_step_{step}"
    (d / "actor").mkdir(parents=True)
    torch.save({"w": torch.arange(64.0)}, d / "actor" / "model_world_size_1_rank_0.pt")
    if data:
        torch.save({"epoch": 0, "index": step}, d / "data.pt")
    if tracker:
        (root / TRACKER).write_text(str(step))
    if marker:
        write_marker(d, step)
    return d


def _truncate(path: Path) -> None:
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])


def _cfg(tmp_path: Path, *overrides: str):
    for name in ("train.parquet", "val.parquet"):
        verl_file(tmp_path / name)
    model_folder(tmp_path / "model")
    base = [f"data.train_files={tmp_path / 'train.parquet'}", f"data.val_files=['{tmp_path / 'val.parquet'}']",
            f"actor_rollout_ref.model.path={tmp_path / 'model'}", "trainer.device=cpu",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}", "trainer.resume_mode=auto",
            "trainer.n_gpus_per_node=1",  # the stand-in checkpoints are world-size-1 saves
            # a world-size-1 run's sizes (verl's engine workers assert them: rpg.verl.verl_rules)
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "actor_rollout_ref.actor.use_dynamic_bsz=true"]
    with initialize_config_dir(config_dir=str(ROOT / "recipe" / "rpg" / "config"), version_base=None):
        return compose(config_name="rpg_trainer", overrides=[*base, *overrides])


@pytest.fixture(autouse=True)
def _no_verl_batch_checks(monkeypatch):
    """prepare_config ends with verl's validate_config (batch sizes, irrelevant here) and checks this
    node's GPUs first (verl runs trainer.device=cpu on CUDA unless VERL_PLATFORM=cpu; irrelevant here)."""
    import rpg.backends.gpu.backend
    import rpg.verl.main

    monkeypatch.setattr(rpg.verl.main, "check_verl_config", lambda *args, **kwargs: None)
    monkeypatch.setattr(rpg.backends.gpu.backend, "check_driver", lambda *args, **kwargs: None)


def _prepare(cfg):
    from rpg.verl.main import prepare_config

    return prepare_config(cfg)


def test_auto_resume_skips_a_missing_newest_checkpoint_before_ray(tmp_path, capsys):
    """The tracker names step 8 but global_step_8 is gone: verl would train from step 0 over
    global_step_4; the driver pins global_step_4 instead and says so in one line."""
    root = tmp_path / "ckpt"
    _ckpt(root, 4)
    (root / TRACKER).write_text("8")
    cfg = _cfg(tmp_path)
    _prepare(cfg)
    assert cfg.trainer.resume_mode == "resume_path"
    assert cfg.trainer.resume_from_path == str(root / "global_step_4")
    note = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("rpg: resuming")]
    assert len(note) == 1 and "global_step_8" in note[0] and "missing" in note[0], note


def test_auto_resume_skips_incomplete_and_truncated_checkpoints(tmp_path):
    root = tmp_path / "ckpt"
    _ckpt(root, 4)
    _ckpt(root, 8, tracker=True)
    _truncate(root / "global_step_8" / "data.pt")  # the marker's size no longer matches
    _ckpt(root, 12, marker=False)  # killed during the save: no marker, not in the tracker
    plan = plan_resume("auto", str(root))
    assert plan.folder == str(root / "global_step_4")
    assert "global_step_12: incomplete" in plan.note and "global_step_8: data.pt has" in plan.note
    assert last_complete(root) == root / "global_step_4"


def test_auto_resume_skips_an_incomplete_newest_checkpoint_with_one_line(tmp_path, capsys):
    """Killed during the save of step 8 (no marker, verl's tracker still at 4): the driver pins
    global_step_4, the tracker's, and says so in one line naming the folder it ignored and why."""
    root = tmp_path / "ckpt"
    _ckpt(root, 4, tracker=True)
    _ckpt(root, 8, marker=False)
    cfg = _cfg(tmp_path)
    _prepare(cfg)
    assert (cfg.trainer.resume_mode, cfg.trainer.resume_from_path) == ("resume_path", str(root / "global_step_4"))
    note = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("rpg: resuming")]
    (line,) = note
    assert line.startswith(f"rpg: resuming from {root / 'global_step_4'}: ")
    names(line, "step 4", TRACKER, f"{root / 'global_step_8'}: incomplete", MARKER, "no RPG settings")


def test_truncated_checkpoint_is_refused_by_the_driver_before_ray(tmp_path):
    """recipe/rpg/main_rpg.py itself: exit code 2, one line naming the truncated file and the choices,
    before Ray starts (verl loaded it inside a Ray worker: a 60-line traceback)."""
    from rpg.backends.cpu.env_overrides import cpu_env

    root = tmp_path / "ckpt"
    _ckpt(root, 4, marker=False, tracker=True)
    _truncate(root / "global_step_4" / "actor" / "model_world_size_1_rank_0.pt")
    for name in ("train.parquet", "val.parquet"):
        verl_file(tmp_path / name)
    model_folder(tmp_path / "model")
    p = subprocess.run([sys.executable, str(ROOT / "recipe" / "rpg" / "main_rpg.py"),
                        f"data.train_files={tmp_path / 'train.parquet'}", f"data.val_files=['{tmp_path / 'val.parquet'}']",
                        f"actor_rollout_ref.model.path={tmp_path / 'model'}", "trainer.device=cpu",
                        f"trainer.default_local_dir={root}", "trainer.resume_mode=auto"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={**os.environ, **cpu_env(), "PYTHONPATH": str(ROOT)})  # CPU backend: no GPU checks here
    ours = [ln for ln in p.stderr.splitlines() if ln.startswith("rpg config error")]
    assert p.returncode == 2 and len(ours) == 1, p.stderr[-3000:]
    assert "model_world_size_1_rank_0.pt: not a whole torch checkpoint" in ours[0] and str(root) in ours[0]
    assert "trainer.resume_mode=disable" in ours[0]
    assert "Traceback" not in p.stderr and "ray init" not in (p.stdout + p.stderr).lower()


def test_a_truncated_pt_without_marker_is_caught_by_its_zip_directory(tmp_path):
    root = tmp_path / "ckpt"
    _ckpt(root, 4, marker=False, tracker=True)  # verl's own trainer: the tracker vouches for it
    assert plan_resume("auto", str(root)).folder == str(root / "global_step_4")
    _truncate(root / "global_step_4" / "actor" / "model_world_size_1_rank_0.pt")
    with pytest.raises(ResumeError, match="model_world_size_1_rank_0.pt: not a whole torch checkpoint"):
        plan_resume("auto", str(root))


def test_missing_data_pt_refuses_instead_of_restarting_the_data_order(tmp_path):
    root = tmp_path / "ckpt"
    _ckpt(root, 4, data=False, tracker=True, marker=False)
    with pytest.raises(RPGConfigError) as err:
        _prepare(_cfg(tmp_path))
    msg = str(err.value)
    assert "\n" not in msg and "no data.pt" in msg and str(root) in msg
    assert "trainer.resume_mode=disable" in msg and "no complete checkpoint is left" in msg


def test_resume_path_to_an_incomplete_checkpoint_names_the_newest_complete_one(tmp_path):
    root = tmp_path / "ckpt"
    _ckpt(root, 4)
    _ckpt(root, 8, marker=False)
    with pytest.raises(RPGConfigError) as err:
        _prepare(_cfg(tmp_path, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={root / 'global_step_8'}"))
    msg = str(err.value)
    assert "\n" not in msg and "global_step_8: incomplete" in msg
    assert f"trainer.resume_from_path={root / 'global_step_4'}" in msg


def test_auto_never_trains_from_step_0_over_existing_checkpoints(tmp_path):
    root = tmp_path / "ckpt"
    _ckpt(root, 4, marker=False)  # no marker, no tracker: nothing complete
    with pytest.raises(ResumeError, match="no complete checkpoint in .*would overwrite"):
        plan_resume("auto", str(root))
    for text in ("garbage", "²", "-4"):  # '²'.isdigit() holds, int('²') raises: still one line
        (root / TRACKER).write_text(text)
        with pytest.raises(ResumeError, match="not a step number"):
            plan_resume("auto", str(root))
    assert plan_resume("auto", str(tmp_path / "empty")).folder is None  # nothing saved: from scratch
    assert plan_resume("disable", str(root)).folder is None


def test_marker_is_written_last_and_follows_verls_retention(tmp_path):
    """RPGTrainer._save_checkpoint (verl's real save underneath) marks each checkpoint complete; a
    checkpoint whose actor verl's retention removed is no longer resumable."""
    from test_verl_reference import RetainingWorkerGroup, _save_steps, _saving_trainer

    class TorchFiles(RetainingWorkerGroup):  # shards in torch's format (the resume check reads them)
        def save_checkpoint(self, local_path, *args, **kwargs):
            super().save_checkpoint(local_path, *args, **kwargs)
            torch.save({"w": torch.zeros(4)}, Path(local_path) / "model_world_size_1_rank_0.pt")

        def save_reference(self, directory):
            super().save_reference(directory)
            torch.save({"w": torch.zeros(4)}, Path(directory) / "reference_rank_0.pt")

    t = _saving_trainer(tmp_path, keep=2)
    t.actor_rollout_wg = TorchFiles()
    _save_steps(t, range(1, 5))
    marker = json.loads((tmp_path / "global_step_4" / MARKER).read_text())
    assert marker["global_step"] == 4 and "data.pt" in marker["files"] and "rpg_reference.json" in marker["files"]
    assert plan_resume("auto", str(tmp_path)).folder == str(tmp_path / "global_step_4")
    from verl.utils.checkpoint.checkpoint_manager import get_checkpoint_tracker_filename

    assert Path(get_checkpoint_tracker_filename(str(tmp_path))) == tmp_path / TRACKER  # verl's own name
    (tmp_path / TRACKER).unlink()  # even without verl's tracker the marker is enough
    assert plan_resume("auto", str(tmp_path)).folder == str(tmp_path / "global_step_4")
    assert "actor" not in {p.name for p in (tmp_path / "global_step_2").iterdir()}
    assert last_complete(tmp_path) == tmp_path / "global_step_4"
    with pytest.raises(ResumeError, match="global_step_2: actor/model_world_size_1_rank_0.pt is missing"):
        plan_resume("resume_path", str(tmp_path), str(tmp_path / "global_step_2"))


def _flip_byte(path: Path) -> None:
    """One byte inside the tensor data (the zip directory and the size stay as they were)."""
    blob = bytearray(path.read_bytes())
    at = blob.find(struct.pack("<f", 33.0))  # an element of _ckpt's torch.arange(64.0)
    assert at > 0
    blob[at + 1] ^= 0xFF
    path.write_bytes(bytes(blob))


def test_a_flipped_byte_in_the_newest_checkpoint_is_named_and_not_loaded(tmp_path, capsys):
    """The tracker's checkpoint (8) has one byte flipped inside its actor tensor: same size, whole zip
    directory (accepted before: sizes only). The driver pins the next complete, verified one (4) and its
    one line names the corrupted file and why the tracker's step was not taken."""
    root = tmp_path / "ckpt"
    _ckpt(root, 4, tracker=True)
    _ckpt(root, 8, tracker=True)
    shard = root / "global_step_8" / "actor" / "model_world_size_1_rank_0.pt"
    _flip_byte(shard)
    assert plan_resume("auto", str(root)).folder == str(root / "global_step_4")
    cfg = _cfg(tmp_path)
    _prepare(cfg)
    assert (cfg.trainer.resume_mode, cfg.trainer.resume_from_path) == ("resume_path", str(root / "global_step_4"))
    note = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("rpg: resuming")]
    assert len(note) == 1, note
    assert note[0].startswith(f"rpg: resuming from {root / 'global_step_4'}: ")
    names(note[0], "step 8", "tracker")  # the step the tracker names, passed over
    assert f"skipped: {shard}: corrupted or replaced (its sha256 differs" in note[0]


def test_an_explicit_resume_path_with_a_same_size_file_from_another_save_is_refused(tmp_path):
    """A shard of another save, the same size (and a whole zip): refused with one line naming the file."""
    root = tmp_path / "ckpt"
    _ckpt(root, 4, tracker=True)
    shard = root / "global_step_4" / "actor" / "model_world_size_1_rank_0.pt"
    other = tmp_path / "other_save" / shard.name  # torch names the archive's folder after the file
    other.parent.mkdir()
    torch.save({"w": torch.arange(64.0) * 2}, other)
    assert other.stat().st_size == shard.stat().st_size and other.read_bytes() != shard.read_bytes()
    other.replace(shard)
    with pytest.raises(RPGConfigError) as err:
        _prepare(_cfg(tmp_path, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={root / 'global_step_4'}"))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"cannot resume from trainer.resume_from_path: {shard}: corrupted or "
                                              "replaced"), msg
    with pytest.raises(ResumeError, match="corrupted or replaced"):  # auto: nothing else to fall back to
        plan_resume("auto", str(root))


def test_a_marker_without_digests_is_accepted_with_a_note(tmp_path):
    """Checkpoints written before the digests (sizes only) stay resumable: their sizes and zip
    directories are checked, and the resume line says that their contents were not verified."""
    root = tmp_path / "ckpt"
    d = _ckpt(root, 4, tracker=True)
    record = json.loads((d / MARKER).read_text())
    (d / MARKER).write_text(json.dumps({"global_step": 4, "files": {k: v["size"] for k, v in record["files"].items()}}))
    plan = plan_resume("auto", str(root))
    assert plan.folder == str(d) and f"{d / MARKER} records no sha256 digests" in plan.note
    _truncate(d / "data.pt")
    with pytest.raises(ResumeError, match="data.pt has .* bytes"):
        plan_resume("auto", str(root))


def test_auto_follows_the_tracker_and_names_a_newer_folder_it_ignores(tmp_path):
    """verl's tracker at 4 and a complete global_step_9 of an earlier run (what trainer.resume_mode=disable
    leaves behind): step 4, the tracker's, with the reason; step 9 is named as ignored (it was resumed
    without a word before). No tracker at all: the newest complete checkpoint, saying so."""
    root = tmp_path / "ckpt"
    _ckpt(root, 9, tracker=True)  # the earlier run
    _ckpt(root, 4, tracker=True)  # this run (resume_mode=disable): tracker back at 4
    plan = plan_resume("auto", str(root))
    assert plan.folder == str(root / "global_step_4")
    assert plan.note.startswith(f"resuming from {root / 'global_step_4'}: step 4, named by verl's tracker ({TRACKER})")
    assert (f"ignored (above the tracker's step, never resumed): {root / 'global_step_9'}: complete, but not the run "
            "the tracker follows") in plan.note and "\n" not in plan.note
    assert last_complete(root) == root / "global_step_4"  # the stop line names the same one
    (root / TRACKER).unlink()
    plan = plan_resume("auto", str(root))
    assert plan.folder == str(root / "global_step_9")
    assert plan.note.startswith(f"resuming from {root / 'global_step_9'}: the newest complete checkpoint (no {TRACKER}")


def _applied_cfg(tmp_path: Path, *overrides: str):
    cfg = _cfg(tmp_path, "trainer.resume_mode=disable", *overrides)
    _prepare(cfg)  # the rpg: block applied, as the trainer sees it
    return cfg


def test_trainer_records_digests_and_settings_and_a_resume_with_another_divergence_is_refused(tmp_path, capsys):
    """RPGTrainer's save (verl's real _save_checkpoint underneath, the driver-applied config) writes every
    file's digest and the run's RPG settings; the driver refuses a resume with another rpg.loss.divergence
    (one line naming each differing key, old -> new), accepts it with rpg.resume.allow_changed_settings=true
    (saying what changed) and accepts the same settings silently."""
    from test_verl_reference import _saving_trainer

    from rpg.verl.checkpoints import file_digest, recorded_settings
    from rpg.config import parse_rpg_settings

    cfg = _applied_cfg(tmp_path)
    t = _saving_trainer(tmp_path / "ckpt", keep=None)
    cfg.trainer.default_local_dir = str(tmp_path / "ckpt")
    t.config, t.rpg = cfg, parse_rpg_settings(cfg.rpg)
    t.global_steps = 2
    t._save_checkpoint()
    d = tmp_path / "ckpt" / "global_step_2"
    record = json.loads((d / MARKER).read_text())
    assert record["settings"] == recorded_settings(cfg) and record["settings"]["rpg.loss.divergence"] == "ufkl"
    assert record["settings"]["actor_rollout_ref.actor.clip_ratio_high"] == 0.28
    assert record["files"]["data.pt"] == {"size": (d / "data.pt").stat().st_size, "sha256": file_digest(d / "data.pt")}
    (d / "actor" / "model_world_size_1_rank_0.pt").unlink()  # the stand-in's shard is not a torch zip
    torch.save({"w": torch.arange(64.0)}, d / "actor" / "model_world_size_1_rank_0.pt")
    torch.save({"epoch": 0}, d / "data.pt")
    write_marker(d, 2, record["settings"])
    capsys.readouterr()

    with pytest.raises(RPGConfigError) as err:
        _prepare(_cfg(tmp_path, "rpg.loss.divergence=rkl", "rpg.loss.form=differentiable"))
    msg = str(err.value)
    assert one_line(msg).startswith(f"{d} "), msg
    names(msg, "rpg.loss.divergence: 'ufkl' -> 'rkl'", "rpg.loss.form: 'reinforce' -> 'differentiable'")
    assert "rpg.resume.allow_changed_settings=true" in msg
    allowed = _cfg(tmp_path, "rpg.loss.divergence=rkl", "rpg.resume.allow_changed_settings=true")
    _prepare(allowed)
    assert allowed.trainer.resume_from_path == str(d)
    note = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("rpg: resuming")]
    assert len(note) == 1 and ("settings changed since" in note[0] and "rpg.loss.divergence: 'ufkl' -> 'rkl'" in note[0])
    same = _cfg(tmp_path)
    _prepare(same)
    note = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("rpg: resuming")]
    assert note == [f"rpg: resuming from {d}: step 2, named by verl's tracker ({TRACKER})"]


def test_allow_changed_settings_is_declared_once_and_checked():
    """rpg.resume.allow_changed_settings: false in the shipped YAML (the parser's default), a bool or one line."""
    from omegaconf import OmegaConf

    from rpg.config import parse_rpg_settings

    yaml = OmegaConf.load(ROOT / "recipe" / "rpg" / "config" / "rpg_trainer.yaml")
    assert OmegaConf.to_container(yaml.rpg.resume) == {"allow_changed_settings": False}
    assert parse_rpg_settings({}).allow_changed_settings is False
    assert parse_rpg_settings({"resume": {"allow_changed_settings": True}}).allow_changed_settings is True
    with pytest.raises(RPGConfigError, match=r"^rpg.resume.allow_changed_settings='yes' is invalid; allowed values: true, false$"):
        parse_rpg_settings({"resume": {"allow_changed_settings": "yes"}})
    with pytest.raises(RPGConfigError, match=r"^rpg.resume.force is not a known key"):
        parse_rpg_settings({"resume": {"force": True}})


def test_a_resume_with_another_divergence_is_refused_by_the_driver_before_ray(tmp_path):
    """recipe/rpg/main_rpg.py itself: exit code 2 and one line naming the key, old -> new, before Ray."""
    from rpg.backends.cpu.env_overrides import cpu_env
    from rpg.verl.checkpoints import recorded_settings

    root = tmp_path / "ckpt"
    d = _ckpt(root, 4, tracker=True)
    write_marker(d, 4, recorded_settings(_applied_cfg(tmp_path)))
    p = subprocess.run([sys.executable, str(ROOT / "recipe" / "rpg" / "main_rpg.py"),
                        f"data.train_files={tmp_path / 'train.parquet'}", f"data.val_files=['{tmp_path / 'val.parquet'}']",
                        f"actor_rollout_ref.model.path={tmp_path / 'model'}", "trainer.device=cpu",
                        f"trainer.default_local_dir={root}", "trainer.resume_mode=auto", "rpg.loss.divergence=fkl"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={**os.environ, **cpu_env(), "PYTHONPATH": str(ROOT)})
    ours = [ln for ln in p.stderr.splitlines() if ln.startswith("rpg config error")]
    assert p.returncode == 2 and len(ours) == 1, p.stderr[-3000:]
    names(ours[0], str(d), "rpg.loss.divergence: 'ufkl' -> 'fkl'")
    assert "Traceback" not in p.stderr and "ray init" not in (p.stdout + p.stderr).lower()


def test_a_cpu_runs_checkpoints_live_under_its_output_directory(tmp_path, monkeypatch):
    """RPG_BACKEND=cpu: trainer.default_local_dir was <root>/ckpts/rpg/<name> whatever OUT_DIR was, one
    folder shared by every CPU run of a variant; now the run's own, under OUT_DIR (CKPTS_DIR still wins)."""
    from rpg import trainer_process as harness
    from launching import launch as main

    seen = []

    def fake_run(overrides, *, output_dir, **kwargs):
        run = harness.TrainerRun(0, 0.0, Path(output_dir), Path(output_dir) / "trainer.log",
                                 Path(output_dir) / "metrics.jsonl", [], list(overrides))
        seen.append(run)
        return run

    monkeypatch.setattr(harness, "run_trainer", fake_run)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "CKPTS_DIR", "OUT_DIR")}
    name = "run_rpg_7b_ufkl1e-4"
    for out in ("a", "b"):
        assert main([name], {**env, "RPG_BACKEND": "cpu", "OUT_DIR": str(tmp_path / out)}) == 0
    assert [harness.checkpoint_dir(r) for r in seen] == [tmp_path / o / "checkpoints" / "rpg" / name for o in "ab"]
    assert main([name], {**env, "RPG_BACKEND": "cpu", "OUT_DIR": str(tmp_path / "c"),
                         "CKPTS_DIR": str(tmp_path / "mine")}) == 0
    assert harness.checkpoint_dir(seen[-1]) == tmp_path / "mine"


# ----------------------------------------------------------------------------- names, output dirs


@pytest.mark.parametrize("key, value", [("EXP_NAME", "../../x"), ("PROJECT_NAME", "a/b"), ("EXP_NAME", ".."),
                                        ("EXP_NAME", " "), ("PROJECT_NAME", "a\\b")])
def test_run_names_that_leave_their_directory_are_refused(key, value, capsys):
    from launching import launch as main

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RPG_BACKEND")}
    rc = main(["run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28"], {**env, "DRY_RUN": "1", key: value})
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and key in err[0] and "must stay inside it" in err[0], err


def test_driver_refuses_names_that_leave_their_directory(tmp_path):
    with pytest.raises(RPGConfigError, match="trainer.experiment_name='../x'"):
        _prepare(_cfg(tmp_path, "trainer.experiment_name=../x"))


def test_output_dirs_are_unique_within_a_second(tmp_path, monkeypatch):
    from rpg import trainer_process as harness
    from rpg.launch import rehearsal
    from rpg.launch.environment import Request

    seen = []

    def fake_run(overrides, *, output_dir, **kwargs):
        seen.append(Path(output_dir))
        return harness.TrainerRun(0, 0.0, Path(output_dir), Path(output_dir) / "trainer.log",
                                  Path(output_dir) / "metrics.jsonl", [])

    monkeypatch.setattr(harness, "run_trainer", fake_run)
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20260101-000000")  # the same second
    name = "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28"
    req = Request.read({"RPG_BACKEND": "cpu"}, tmp_path)
    with initialize_config_dir(config_dir=str(ROOT / "recipe" / "rpg" / "config"), version_base=None):
        cfg = compose(config_name="rpg_trainer", overrides=[f"+experiment={name}"])  # its resume mode and folder
    for _ in range(3):
        assert rehearsal.rehearse(req, name, [], [], f"run {name}", cfg, "bash x.sh") == 0
    assert len(set(seen)) == 3 and all(p.is_dir() for p in seen), seen


# ----------------------------------------------------------------------------- harness: history across resumes


def _entry(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


_LOGGER = """
    import json, os, sys
    steps = json.loads(next(a for a in sys.argv if a.startswith("+rpg_test.steps=")).split("=", 1)[1])
    with open(os.environ["VERL_FILE_LOGGER_PATH"], "wb") as f:   # verl's FileLogger: "wb"
        for s in steps:
            data = {"val-core/acc": 0.5} if s == steps[0] and s % 4 == 0 else {}
            if s > 0 and not (s == steps[0] and s % 4 == 0):
                data.update({"training/global_step": s, "loss": float(s)})
            f.write((json.dumps({"step": s, "data": data}) + "\\n").encode())
            print(f"logged step {s}", flush=True)
"""


def _steps(steps) -> str:
    return f"+rpg_test.steps={json.dumps(list(steps)).replace(' ', '')}"


def test_resumed_run_appends_to_the_history_and_says_which_steps_it_replaced(tmp_path):
    from rpg.trainer_process import read_metrics, run_trainer

    entry, out = _entry(tmp_path, "entry.py", _LOGGER), tmp_path / "out"
    run_trainer([_steps(range(0, 11))], output_dir=out, entry=entry, timeout_s=60)  # killed at 10, checkpoint 8
    run = run_trainer([_steps(range(8, 13))], output_dir=out, entry=entry, timeout_s=60)  # resumed from 8
    lines = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(13))  # every step once, in order
    assert lines[8]["data"] == {"training/global_step": 8, "loss": 8.0, "val-core/acc": 0.5}  # merged at 8
    assert sorted(read_metrics(out / "metrics.jsonl")) == list(range(13))
    assert not list(out.glob("metrics.part*.jsonl"))
    replaced = [n for n in run.notes if "replaced" in n]
    assert len(replaced) == 1 and "restart at step 8: re-ran steps 9-10" in replaced[0], run.notes
    log = (out / "trainer.log").read_text()
    assert "logged step 2" in log and "logged step 12" in log and log.index("logged step 2") < log.index("started again")


def test_a_training_step_lost_between_checkpoint_and_log_is_one_warning(tmp_path):
    from rpg.trainer_process import run_trainer

    entry, out = _entry(tmp_path, "entry.py", _LOGGER), tmp_path / "out"
    run_trainer([_steps(range(0, 8))], output_dir=out, entry=entry, timeout_s=60)  # saved 8, killed before its log
    run = run_trainer([_steps(range(9, 11))], output_dir=out, entry=entry, timeout_s=60)  # resumed from 8
    lost = [n for n in run.notes if "no training metrics" in n]
    assert len(lost) == 1 and "steps 8 " in lost[0] and "9" not in lost[0].split("steps 8")[1][:3], run.notes


def test_leftover_segment_of_a_killed_launcher_is_folded_at_the_next_start(tmp_path):
    from rpg.trainer_process import fold_segments, read_metrics

    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": {"x": s}}) + "\n" for s in range(6)))
    (out / "metrics.part2.jsonl").write_text("".join(json.dumps({"step": s, "data": {"x": -s}}) + "\n"
                                                     for s in (4, 5)) + '{"step": 6, "da')  # cut by kill -9
    assert read_metrics(out / "metrics.jsonl")[5] == {"x": -5}  # joined on read already
    line = fold_segments(out / "metrics.jsonl")
    assert "re-ran steps 5" in line
    assert [json.loads(ln)["data"]["x"] for ln in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3, -4, -5]
    assert fold_segments(out / "metrics.jsonl") is None  # idempotent


def test_a_broken_middle_line_is_named_and_never_folded_away(tmp_path):
    """Only the last line may be cut by a kill; a broken line before it is one error naming the file and
    line, and no segment is rewritten or removed (before: the line was skipped and the fold deleted it)."""
    from rpg.metrics_log.file import MetricsFileError
    from rpg.trainer_process import fold_segments, run_trainer, TrainerRunError

    out = tmp_path / "out"
    out.mkdir()
    first = "".join(json.dumps({"step": s, "data": {"x": s}}) + "\n" for s in range(3))
    first = first.replace('{"step": 1, "data": {"x": 1}}', '{"step": 1, "da\x00ta"')
    second = json.dumps({"step": 2, "data": {"x": -2}}) + "\n"
    (out / "metrics.jsonl").write_text(first)
    (out / "metrics.part2.jsonl").write_text(second)
    with pytest.raises(MetricsFileError, match=r"metrics\.jsonl:2: not a JSON line"):
        fold_segments(out / "metrics.jsonl")
    assert (out / "metrics.jsonl").read_text() == first and (out / "metrics.part2.jsonl").read_text() == second
    quick = _entry(tmp_path, "quick.py", "print('ran')\n")
    with pytest.raises(TrainerRunError, match=r"metrics\.jsonl:2: not a JSON line"):  # refused before the trainer starts
        run_trainer([], output_dir=out, entry=quick, timeout_s=60)
    assert (out / "metrics.jsonl").read_text() == first and (out / "metrics.part2.jsonl").read_text() == second


def test_two_runs_in_one_output_directory_are_refused(tmp_path):
    import threading

    from rpg.trainer_process import TrainerRunError, run_trainer

    entry = _entry(tmp_path, "slow.py", "import time\ntime.sleep(30)\n")
    stop = threading.Event()
    first = threading.Thread(target=lambda: run_trainer([], output_dir=tmp_path / "out", entry=entry, timeout_s=60,
                                                        stop=stop, check=False), daemon=True)
    first.start()
    # the first run holds the directory once its trainer started (its log is opened after the lock is taken)
    _wait_until(lambda: (tmp_path / "out" / "trainer.log").exists() or not first.is_alive(), "the first run", 60)
    assert first.is_alive()
    with pytest.raises(TrainerRunError, match="in use by another run"):
        run_trainer([], output_dir=tmp_path / "out", entry=entry, timeout_s=60)
    stop.set()
    first.join(60)


# ----------------------------------------------------------------------------- signals, exit codes

_STUBBORN = """
    import os, signal, subprocess, sys, time
    marker = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("+ray_kwargs.ray_init._temp_dir="))
    # like Ray's agents: a process in its own session that ignores SIGTERM, and a plain child
    subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "time.sleep(600)", marker], start_new_session=True)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker])
    print("ready", flush=True)
    time.sleep(600)
"""


def _run_marker_procs(marker_prefix: str, pid: int) -> list[int]:
    """Processes of the test's run: the launcher and everything carrying its Ray temp dir."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.info["pid"] == pid or any(marker_prefix in a for a in (p.info["cmdline"] or [])):
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


class _Lines:
    """A pipe read line by line in a thread, so that a test can tell the lines printed before and after
    an event (the stop signal) without a deadline."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self.thread = threading.Thread(target=lambda: self.lines.extend(iter(stream.readline, "")), daemon=True)
        self.thread.start()

    def after(self, n: int) -> list[str]:
        return [ln.rstrip("\n") for ln in self.lines[n:] if ln.strip()]


def _wait_until(condition, what: str, cap_s: float = 900.0) -> None:
    """Wait for ``condition()``; ``cap_s`` only keeps a broken run from hanging the suite (the wait ends
    on the condition, not on a guess of how long a loaded machine needs)."""
    t0 = time.time()
    while not condition():
        assert time.time() - t0 < cap_s, f"gave up waiting for {what} after {cap_s:.0f} s"
        time.sleep(0.2)


@pytest.mark.parametrize("signum, stubborn", [(signal.SIGHUP, True), (signal.SIGINT, False), (signal.SIGTERM, False)])
def test_stop_signal_ends_every_process_of_the_run_with_one_line(tiny_assets, tmp_path, signum, stubborn):
    """SIGHUP with a child that ignores SIGTERM in its own session (as Ray's agents: about 25 s, the
    harness waits for stragglers, then terminates and kills them); SIGINT and SIGTERM with children in
    the trainer's process group (a few seconds).

    The launcher reuses the tiny assets built by the ``tiny_assets`` fixture (building them inside the
    launcher took up to minutes under load and printed progress on stderr); the test waits for the
    stand-in's "ready" or the launcher's end, and asserts on what stderr holds after the signal."""
    body = _STUBBORN if stubborn else _STUBBORN.replace("signal.signal(signal.SIGTERM, signal.SIG_IGN); ", "").replace(
        "start_new_session=True", "start_new_session=False")
    entry = _entry(tmp_path, "stubborn.py", body)
    out = tmp_path / "out"
    # the run's Ray temp dir lands here: a short folder (under pytest's long tmp_path Ray's socket paths would not
    # fit, and the launcher would make it elsewhere: rpg.paths.ray_temp)
    short = Path(tempfile.mkdtemp(prefix="rs"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "lab"))), "TMPDIR": str(short)}
    p = subprocess.Popen([sys.executable, "-m", "rpg_lab.demo.cpu", "--out", str(out), "--entry", entry,
                          "--steps", "2", "--echo"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    _, stderr = _Lines(p.stdout), _Lines(p.stderr)  # both drained (--echo fills stdout)
    log, marker = out / "trainer.log", str(short / "rpgray")
    try:
        _wait_until(lambda: p.poll() is not None or (log.exists() and "ready" in log.read_text(errors="replace")),
                    "the stand-in trainer's 'ready'")
        assert p.poll() is None, "".join(stderr.lines)[-3000:]
        # "ready" is printed after both children started: launcher, trainer, two children
        assert len(_run_marker_procs(marker, p.pid)) >= 4, _run_marker_procs(marker, p.pid)
        before = len(stderr.lines)
        t0 = time.time()
        p.send_signal(signum)
        p.wait(timeout=60)
        stderr.thread.join(10)
        while _run_marker_procs(marker, p.pid) and time.time() - t0 < 60:
            time.sleep(0.5)
        assert _run_marker_procs(marker, p.pid) == [] and time.time() - t0 < 60
    finally:  # never leave the stand-ins behind, whatever failed
        for pid in _run_marker_procs(marker, p.pid):
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        shutil.rmtree(short, ignore_errors=True)
    text = "".join(stderr.lines)
    assert p.returncode == 128 + signum, text[-2000:]
    lines = stderr.after(before)
    assert len(lines) == 1 and "Traceback" not in text, text[-2000:]
    name = signal.Signals(signum).name
    assert f"stopped by {name}" in lines[0] and str(out / "trainer.log") in lines[0]
    assert f"--out {out}" in lines[0] and "trainer.resume_mode=auto" in lines[0]
    assert f"stopped by {name}" in (out / "trainer.log").read_text()


def test_drivers_stop_line_names_the_workers_log_the_checkpoint_and_the_resume_command(tmp_path):
    """The launcher passes VERL_FILE_LOGGER_ROOT to the workers through Ray's runtime env, not to the
    driver; the resume command is the same one with trainer.resume_mode=auto replacing the earlier mode."""
    from omegaconf import OmegaConf

    from rpg.verl.main import signal_stop_line

    ckpt = _ckpt(tmp_path / "ckpt", 6)
    cfg = OmegaConf.create({
        "trainer": {"default_local_dir": str(tmp_path / "ckpt"), "logger": ["console", "file"],
                    "project_name": "rpg", "experiment_name": "run_x"},
        "ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": {"VERL_FILE_LOGGER_ROOT": str(tmp_path / "logs")}}}}})
    line = signal_stop_line(cfg, "SIGTERM", ["recipe/rpg/main_rpg.py", "a.b=1", "trainer.resume_mode=disable", "c=2"])
    assert "\n" not in line and line.startswith("rpg: stopped by SIGTERM; Ray shut down")
    assert f"metrics log {tmp_path / 'logs' / 'rpg' / 'run_x.jsonl'};" in line
    assert f"last complete checkpoint {ckpt};" in line
    assert line.endswith("recipe/rpg/main_rpg.py a.b=1 trainer.resume_mode=auto c=2")


def test_async_stop_lines_carry_the_resume_command(tmp_path):
    """Asynchronous runs resume (docs/verl-integration.md#resume), so the stop lines of the driver and of the CPU
    runner end with the same resume command in every trainer mode."""
    from omegaconf import OmegaConf

    from rpg_lab.demo.cpu import resume_part
    from rpg.verl.main import signal_stop_line

    ckpt = _ckpt(tmp_path / "ckpt", 4)
    cfg = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path / "ckpt"), "logger": ["console"],
                                        "project_name": "rpg", "experiment_name": "run_x",
                                        "v1": {"trainer_mode": "colocate_async"}}})
    for mode in ("colocate_async", "separate_async", "sync"):
        cfg.trainer.v1.trainer_mode = mode
        line = signal_stop_line(cfg, "SIGINT", ["recipe/rpg/main_rpg.py", f"trainer.v1.trainer_mode={mode}"])
        assert "\n" not in line and f"last complete checkpoint {ckpt};" in line and "cannot be resumed" not in line
        assert line.endswith("; resume: " + shlex.join(["cd", os.getcwd()]) + f" && {sys.executable} "
                             f"recipe/rpg/main_rpg.py trainer.v1.trainer_mode={mode} trainer.resume_mode=auto"), line

    out = tmp_path / "out"
    part = resume_part(["--steps", "6"], ["trainer.v1.trainer_mode=colocate_async"], out)
    assert part.startswith("resume: ") and f"{sys.executable} -m rpg_lab.demo.cpu --out {out} --steps 6" in part
    assert part.endswith("trainer.v1.trainer_mode=colocate_async trainer.resume_mode=auto"), part


_SLOW_TO_STOP = """
    import pathlib, signal, sys, time
    flag = pathlib.Path(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("+rpg_test.flag=")))

    def stop(signum, frame):  # like the RPG driver: SIGTERM -> shut Ray down (a few seconds) -> exit
        flag.write_text(signal.Signals(signum).name)
        t0 = time.time()  # stopping until the test has seen the directory refused (the release file), 60 s at most
        while not flag.with_suffix(".release").exists() and time.time() - t0 < 60:
            time.sleep(0.05)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    time.sleep(600)
"""

_LAUNCHER = """
import sys
from rpg.trainer_process import run_trainer
run_trainer([sys.argv[3]], output_dir=sys.argv[2], entry=sys.argv[1], timeout_s=600)
"""


def test_a_launcher_killed_with_sigkill_still_stops_its_trainer(tmp_path):
    """kill -9 of the launcher runs no clean-up at all: the kernel's parent-death signal
    (rpg.trainer_process.stop_with_launcher) stops the trainer, and the directory stays locked until the trainer has ended (a restart into it is
    refused meanwhile, then accepted). Before: the trainer trained on unseen into the directory."""
    from rpg.trainer_process import TrainerRunError, run_trainer

    entry, out, flag = _entry(tmp_path, "slow_to_stop.py", _SLOW_TO_STOP), tmp_path / "out", tmp_path / "flag"
    # TMPDIR: the killed launcher cannot remove the run's Ray temp dir; it lands in tmp_path, not in /tmp
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER, entry, str(out), f"+rpg_test.flag={flag}"],
                                cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)})
    log = out / "trainer.log"
    trainer = None
    try:
        _wait_until(lambda: launcher.poll() is not None or (log.exists() and "ready" in log.read_text()), "ready", 300)
        assert launcher.poll() is None
        (trainer,) = [c for c in psutil.Process(launcher.pid).children() if "python" in c.name()]
        launcher.kill()
        launcher.wait(10)
        # the content, not the file: write_text creates the file before it writes (CI read '' in between once)
        _wait_until(lambda: flag.exists() and flag.read_text() != "", "the trainer's SIGTERM", 30)
        assert flag.read_text() == "SIGTERM"
        with pytest.raises(TrainerRunError, match="in use by another run"):  # the old trainer is still stopping
            run_trainer([f"+rpg_test.flag={tmp_path / 'unused'}"], output_dir=out, entry=entry, timeout_s=60)
        flag.with_suffix(".release").touch()  # the old trainer's stop ends
        _wait_until(lambda: not trainer.is_running() or trainer.status() == psutil.STATUS_ZOMBIE, "its end", 30)
    finally:
        for p in [launcher] + ([trainer] if trainer is not None else []):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                p.kill()
    quick = _entry(tmp_path, "quick.py", "print('ran')\n")
    assert "ran" in run_trainer([], output_dir=out, entry=quick, timeout_s=60).log  # the directory is free again


def test_drivers_resume_command_keeps_flags_and_other_arguments():
    """Only what Hydra's parser reads as an override is merged (trainer.resume_mode=auto replaces the
    earlier mode); Hydra's flags and any other argument are kept as given. The stop handler builds this
    command: it must not fail on a command line that is not only overrides."""
    from rpg.verl.main import driver_resume_command

    line = driver_resume_command(["recipe/rpg/main_rpg.py", "--config-name", "rpg_trainer",
                           "data.val_files=[data/a.parquet,data/b.parquet]", "trainer.resume_mode=disable", "~x.y"])
    assert line.endswith("recipe/rpg/main_rpg.py --config-name rpg_trainer 'data.val_files=[data/a.parquet,"
                         "data/b.parquet]' trainer.resume_mode=auto '~x.y'"), line
    assert driver_resume_command(["driver.py", "ray_dir", "trainer.resume_mode=disable"]).endswith(
        "driver.py ray_dir trainer.resume_mode=auto")


def test_a_stop_signal_before_the_monitor_exists_still_cleans_up(tmp_path, monkeypatch):
    """A SIGTERM can land between starting the trainer and creating its monitor: the trainer (and its
    group) is still terminated, the Ray temp dir removed, and the run reports the signal."""
    from rpg import trainer_process as harness
    from rpg.trainer_process import run as harness_run

    entry = _entry(tmp_path, "slow.py", "import time\ntime.sleep(60)\n")
    real, calls = harness_run.Monitor, []

    def signalled_first(*args, **kwargs):  # the first monitor is never made: SIGTERM arrives instead
        calls.append(args)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the harness's handler raises StopSignal here
        return real(*args, **kwargs)

    monkeypatch.setattr(harness_run, "Monitor", signalled_first)  # where run_trainer looks it up
    t0 = time.time()
    with pytest.raises(harness.TrainerRunError, match="stopped by SIGTERM") as err:
        harness.run_trainer([], output_dir=tmp_path / "out", entry=entry, timeout_s=60, reap_after_s=5)
    run = err.value.run
    assert run.stop_signal == signal.SIGTERM and run.returncode is not None  # the trainer was ended
    assert time.time() - t0 < 40


@pytest.mark.parametrize("mode", ["disabled", "Auto", None])
def test_an_unknown_resume_mode_is_refused_not_read_as_auto(tmp_path, mode):
    """verl knows auto, disable and resume_path; a typo used to resume (plan) or to fail after Ray (verl)."""
    from omegaconf import OmegaConf

    from rpg.verl.input_paths import check_run_names

    _ckpt(tmp_path / "ckpt", 4, marker=True, tracker=True)
    with pytest.raises(ResumeError, match="trainer.resume_mode=.* is invalid; allowed values: auto, disable, resume_path"):
        plan_resume(mode, str(tmp_path / "ckpt"))
    cfg = OmegaConf.create({"trainer": {"project_name": "p", "experiment_name": "e", "resume_mode": mode}})
    with pytest.raises(RPGConfigError, match="allowed values: auto, disable, resume_path"):
        check_run_names(cfg)


# ----------------------------------------------------------------------------- the decision on the terminal, the trainer mode


def test_every_run_prints_its_resume_decision_and_the_launchers_show_it(tmp_path, capsys):
    """The driver printed a line only when it resumed; a fresh start said nothing, and the launchers showed
    none of it (trainer.log only). Now one line per run, which both launchers put on the terminal."""
    from rpg_lab.demo.cpu import PREFIX, STARTUP_STAGES
    from rpg_lab.demo.progress import StartupProgress
    from rpg.trainer_process import resume_decision

    _prepare(_cfg(tmp_path, "trainer.resume_mode=disable"))
    lines = [ln for ln in capsys.readouterr().out.splitlines() if resume_decision(ln)]
    (line,) = lines
    assert line.startswith("rpg: fresh start (step 0) ")
    names(line, "trainer.resume_mode=disable", str(tmp_path / "ckpt"))
    _prepare(_cfg(tmp_path))
    lines = [ln for ln in capsys.readouterr().out.splitlines() if resume_decision(ln)]
    assert lines == [f"rpg: fresh start (step 0) because {tmp_path / 'ckpt'} holds no checkpoint yet "
                     "(trainer.resume_mode=auto)"]
    root = tmp_path / "ckpt"
    _ckpt(root, 2)
    shard = _ckpt(root, 4, tracker=True) / "actor" / "model_world_size_1_rank_0.pt"
    _flip_byte(shard)
    _prepare(_cfg(tmp_path))
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if resume_decision(ln)]
    assert line.startswith(f"rpg: resuming from {root / 'global_step_2'}: ") and f"skipped: {shard}: corrupted" in line

    progress = StartupProgress(STARTUP_STAGES, PREFIX, heartbeat_s=60)  # the demo's terminal
    progress.on_line(line + "\n")
    progress.finish()
    progress.on_line("rpg: fresh start (step 0) because x\n")  # before or after the first metrics
    assert capsys.readouterr().out.splitlines() == [f"[tiny] {resume_decision(line)}", "[tiny] fresh start (step 0) because x"]


def test_the_cpu_launcher_shows_the_resume_decision(tmp_path, capsys, monkeypatch):
    from rpg import trainer_process as harness
    from launching import launch as main

    def fake_run(overrides, *, output_dir, on_line=None, **kwargs):
        on_line("rpg: resuming from /x/global_step_2: step 2, named by verl's tracker\n")
        on_line("(TaskRunner pid=1) anything else\n")
        return harness.TrainerRun(0, 0.0, Path(output_dir), Path(output_dir) / "trainer.log",
                                  Path(output_dir) / "metrics.jsonl", [], list(overrides))

    monkeypatch.setattr(harness, "run_trainer", fake_run)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "CKPTS_DIR", "LOGGER", "DRY_RUN")}
    assert main(["run_rpg_7b_ufkl1e-4"], {**env, "RPG_BACKEND": "cpu", "OUT_DIR": str(tmp_path / "o")}) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("[cpu] resuming from /x/global_step_2")]
    names(line, "step 2", "tracker")
    assert "anything" not in out


def test_a_sync_resume_of_an_async_runs_checkpoint_is_refused(tmp_path):
    """trainer.v1.trainer_mode changes the estimator (colocate_async weights each token by pi_old/mu): a
    checkpoint records it and a resume in another mode is refused as for any recorded setting."""
    from rpg.verl.checkpoints import recorded_settings, resume_keys

    for key in ("trainer.v1.trainer_mode", "algorithm.norm_adv_by_std_in_grpo", "algorithm.use_kl_in_reward",
                "algorithm.rollout_correction.rollout_is"):
        assert key in resume_keys(), key
    root = tmp_path / "ckpt"
    d = _ckpt(root, 2, tracker=True)
    saved = recorded_settings(_applied_cfg(tmp_path))
    assert saved["trainer.v1.trainer_mode"] == "sync"
    write_marker(d, 2, {**saved, "trainer.v1.trainer_mode": "colocate_async"})
    with pytest.raises(ResumeError) as err:
        _prepare(_cfg(tmp_path))
    assert "trainer.v1.trainer_mode: 'colocate_async' -> 'sync'" in str(err.value) and "\n" not in str(err.value)
    allowed = _cfg(tmp_path, "rpg.resume.allow_changed_settings=true")
    _prepare(allowed)
    assert allowed.trainer.resume_from_path == str(d)


def test_a_resume_compares_the_keys_declared_recorded_and_no_others(tmp_path):
    """Each rpg: key declares whether a checkpoint records it (rpg.config.recorded_keys): a changed reference
    schedule is refused; changed validation sampling, reference logging or the compiled loss (the same loss)
    resume."""
    from rpg.config import declared_keys
    from rpg.verl.checkpoints import recorded_settings, resume_keys

    recorded = {k.path for k in declared_keys(actor_fields=True) if k.recorded}
    assert {"rpg.reference.mode", "rpg.reference.update_every", "rpg.optimizer", "rpg.loss.divergence"} <= recorded
    free = ("rpg.loss.compile", "rpg.validation.samples_per_problem", "rpg.reference.log_weight_diff",
            "rpg.resume.allow_changed_settings")
    assert not set(free) & set(resume_keys())
    d = _ckpt(tmp_path / "ckpt", 2, tracker=True)
    write_marker(d, 2, recorded_settings(_applied_cfg(tmp_path, "rpg.reference.mode=periodic",
                                                      "rpg.reference.update_every=2")))
    with pytest.raises(ResumeError) as err:
        _prepare(_cfg(tmp_path))
    assert "rpg.reference.mode: 'periodic' -> 'sampler'" in str(err.value) and "\n" not in str(err.value)
    write_marker(d, 2, recorded_settings(_applied_cfg(tmp_path)))
    changed = _cfg(tmp_path, "rpg.validation.samples_per_problem=null", "rpg.loss.compile=true")
    _prepare(changed)
    assert changed.trainer.resume_from_path == str(d)


def test_a_resume_of_another_model_tokenizer_or_length_is_refused_before_ray(tmp_path):
    """run_grpo_7b_7binstruct pointed at run_grpo_7b's checkpoints (Qwen2.5-Math-7B weights continued as the
    Instruct model) or a ctx4k checkpoint resumed at ctx8k: refused in one line naming each key, old -> new,
    before Ray; another config.json at the same model path too (its digest); allowed with
    rpg.resume.allow_changed_settings=true."""
    from rpg.verl.checkpoints import MODEL_CONFIG, RUN_KEYS, recorded_settings, resume_keys

    assert set(RUN_KEYS) | {MODEL_CONFIG} <= set(resume_keys())
    math, instruct = tmp_path / "Qwen2.5-Math-7B", tmp_path / "Qwen2.5-7B-Instruct"
    for folder, arch in ((math, "math"), (instruct, "instruct")):  # a model folder each, their configs different
        model_folder(folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "name": arch}))
    d = _ckpt(tmp_path / "ckpt", 2, tracker=True)
    saved = recorded_settings(_applied_cfg(tmp_path, f"actor_rollout_ref.model.path={math}"))
    assert saved[MODEL_CONFIG] is not None and saved["data.max_response_length"] is not None
    write_marker(d, 2, saved)
    refusals = {f"actor_rollout_ref.model.path={instruct}": f"actor_rollout_ref.model.path: '{math}' -> '{instruct}'",
                f"actor_rollout_ref.model.tokenizer_path={instruct}":
                    f"actor_rollout_ref.model.tokenizer_path: None -> '{instruct}'",
                f"data.max_response_length={2 * saved['data.max_response_length']}":
                    f"data.max_response_length: {saved['data.max_response_length']} -> "
                    f"{2 * saved['data.max_response_length']}",
                f"data.max_prompt_length={2 * saved['data.max_prompt_length']}": "data.max_prompt_length: "}
    for override, named in refusals.items():
        with pytest.raises(ResumeError) as err:
            _prepare(_cfg(tmp_path, f"actor_rollout_ref.model.path={math}", override))
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith(f"{d} was trained with other RPG settings: ") and named in msg, msg
        assert "rpg.resume.allow_changed_settings=true" in msg
    config = json.loads((math / "config.json").read_text())
    (math / "config.json").write_text(json.dumps({**config, "name": "another model copied to the same path"}))
    with pytest.raises(ResumeError, match=rf"{MODEL_CONFIG.replace('(', '.').replace(')', '.')}: '[0-9a-f]{{64}}' -> "):
        _prepare(_cfg(tmp_path, f"actor_rollout_ref.model.path={math}"))
    allowed = _cfg(tmp_path, f"actor_rollout_ref.model.path={instruct}", "rpg.resume.allow_changed_settings=true")
    _prepare(allowed)
    assert allowed.trainer.resume_from_path == str(d)


def test_an_old_marker_without_the_model_and_lengths_resumes_saying_what_it_cannot_compare(tmp_path, capsys):
    """A marker written before the model, tokenizer and lengths were recorded resumes (nothing to compare them
    with) and the resume line names each key it could not compare; one line."""
    from rpg.verl.checkpoints import MODEL_CONFIG, RUN_KEYS, recorded_settings

    d = _ckpt(tmp_path / "ckpt", 2, tracker=True)
    saved = recorded_settings(_applied_cfg(tmp_path))
    write_marker(d, 2, {k: v for k, v in saved.items() if k not in (*RUN_KEYS, MODEL_CONFIG)})
    capsys.readouterr()
    cfg = _cfg(tmp_path, "data.max_response_length=64")
    _prepare(cfg)
    assert cfg.trainer.resume_from_path == str(d)
    note = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("rpg: resuming")]
    assert len(note) == 1 and note[0].endswith(
        f"; {d} records no {', '.join((*RUN_KEYS, MODEL_CONFIG))} (written before they were): not compared"), note


def test_a_stopped_cpu_launch_prints_a_resume_command_that_runs_the_same_launch(tmp_path, monkeypatch, capsys):
    """``RPG_BACKEND=cpu`` of a paper script stopped by a signal: its resume command goes back to the folder
    it was launched from (relative paths mean the same), repeats the variables the user set (RPG_BACKEND=cpu first of
    all: without it the same command starts a GPU launch), names the run's folder and keeps the user's overrides
    with trainer.resume_mode=auto."""
    import shlex

    from rpg import trainer_process as harness
    from launching import env as _env, launch as main

    out = tmp_path / "o u t"

    def stopped(overrides, **kw):
        run = harness.TrainerRun(None, 1.0, Path(kw["output_dir"]), tmp_path / "log", tmp_path / "m.jsonl", [])
        run.stop_signal = int(signal.SIGHUP)
        raise harness.TrainerRunError("stopped", run)

    monkeypatch.setattr(harness, "run_trainer", stopped)
    monkeypatch.setattr("rpg.tiny.build_tiny_assets", lambda *a, **k: None)
    here = tmp_path / "launched here"
    here.mkdir()
    monkeypatch.chdir(here)  # CKPTS_DIR is relative to it: the resume command goes back there first
    env = _env(RPG_BACKEND="cpu", OUT_DIR=str(out), LOGGER="console,file", CPU_TIMEOUT="900", DRY_RUN="0",
               CKPTS_DIR="ck")
    rc = main(["run_rpg_7b_ufkl1e-4", "trainer.save_freq=1", "trainer.resume_mode=disable"], env)
    err = capsys.readouterr().err
    assert rc == 128 + signal.SIGHUP, err
    resume = err.split("; resume: ", 1)[1].strip()
    words = shlex.split(resume)
    assert words[:3] == ["cd", str(here), "&&"], words
    assert words[3:8] == ["RPG_BACKEND=cpu", "CKPTS_DIR=ck", "LOGGER=console,file", f"OUT_DIR={out}",
                          "CPU_TIMEOUT=900"], words
    assert words[8:] == ["bash", str(ROOT / "recipe/rpg/7b/run_rpg_7b_ufkl1e-4.sh"), "trainer.save_freq=1",
                         "trainer.resume_mode=auto"], words


def test_a_renamed_checkpoint_is_refused_naming_both_steps(tmp_path):
    """global_step_2 renamed global_step_4: verl would resume it as step 4 with step 2's weights. Its marker's step
    is compared with the folder's name: refused in one line naming the folder and both steps, by resume_path and
    by auto."""
    root = tmp_path / "ckpt"
    _ckpt(root, 2)
    (root / "global_step_2").rename(root / "global_step_4")
    (root / TRACKER).write_text("4")
    renamed = root / "global_step_4"
    for args in (("resume_path", str(root), str(renamed)), ("auto", str(root))):
        with pytest.raises(ResumeError) as err:
            plan_resume(*args)
        line = str(err.value)
        assert "\n" not in line and f"{renamed}: its {MARKER} records step 2, its name says step 4" in line, line
    _ckpt(root, 1)  # an older whole one: auto takes it and names the renamed folder
    plan = plan_resume("auto", str(root))
    assert plan.folder == str(root / "global_step_1") and "records step 2, its name says step 4" in plan.note


def test_every_file_the_recipe_writes_into_a_checkpoint_carries_its_prefix(tmp_path):
    """A file of the recipe's without the marker is a save that did not finish (rpg.verl.checkpoints.unfinished_save):
    each one the recipe writes is named with RECIPE_PREFIX; a folder verl's tracker names that holds one, or sits
    beside a marked checkpoint, is incomplete, while verl's own trainer's checkpoint (neither) is accepted."""
    from rpg.metrics_log.history import STEP_RECORD
    from rpg.verl.checkpoint_digests import REFERENCE_DIR
    from rpg.verl.checkpoints import LAG_BOOK_FILE, RECIPE_PREFIX
    from rpg.verl.trainer import REFERENCE_STATE_FILE

    for name in (MARKER, LAG_BOOK_FILE, STEP_RECORD, REFERENCE_DIR, REFERENCE_STATE_FILE):
        assert name.startswith(RECIPE_PREFIX), name
    verls = _ckpt(tmp_path / "verl", 2, marker=False, tracker=True)
    assert plan_resume("auto", str(tmp_path / "verl")).folder == str(verls)  # noted: not verified
    (verls / STEP_RECORD).write_text("{}")
    with pytest.raises(ResumeError, match=f"global_step_2: incomplete .no {MARKER} beside the recipe's {STEP_RECORD}"):
        plan_resume("auto", str(tmp_path / "verl"))
    root = tmp_path / "ckpt"
    _ckpt(root, 2)
    _ckpt(root, 4, marker=False, tracker=True)
    plan = plan_resume("auto", str(root))
    assert plan.folder == str(root / "global_step_2")
    assert f"global_step_4: incomplete (no {MARKER}, which this run's global_step_2 has" in plan.note


def test_an_async_checkpoint_resumed_as_sync_says_its_replay_buffer_is_dropped(tmp_path, capsys):
    """rpg.resume.allow_changed_settings=true lets a sync run continue a colocate_async checkpoint; verl does not load
    the replay buffer in sync mode, so the resume line says, once, that its finished groups are dropped (and names the
    folder); a sync checkpoint, or an asynchronous resume, says nothing of it."""
    from rpg.verl.checkpoints import TQ_DIR, recorded_settings

    root = tmp_path / "ckpt"
    d = _ckpt(root, 2, tracker=True)
    saved = recorded_settings(_applied_cfg(tmp_path))
    write_marker(d, 2, {**saved, "trainer.v1.trainer_mode": "colocate_async"})
    capsys.readouterr()
    _prepare(_cfg(tmp_path, "rpg.resume.allow_changed_settings=true"))
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("rpg: resuming")]
    assert len(line) == 1 and "dropped" not in line[0]  # no replay buffer saved
    (d / TQ_DIR).mkdir()
    (d / TQ_DIR / "metadata.json").write_text("{}")
    write_marker(d, 2, {**saved, "trainer.v1.trainer_mode": "colocate_async"})
    _prepare(_cfg(tmp_path, "rpg.resume.allow_changed_settings=true"))
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("rpg: resuming")]
    assert len(line) == 1 and line[0].count("dropped") == 1, line
    names(line[0], "warning: trainer.v1.trainer_mode=sync", f"replay buffer of {d / TQ_DIR}")
    (d / "rpg_lag_book.json").write_text('{"updates": 0, "at_version": {"2": 0}}')
    write_marker(d, 2, {**saved, "trainer.v1.trainer_mode": "colocate_async"})
    assert plan_resume("auto", str(root), trainer_mode="colocate_async").note.count("dropped") == 0
