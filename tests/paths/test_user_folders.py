"""A folder the user names is where the user said: the tiny demo, the GPU smoke run, the study and the launcher
take a relative path from the caller's folder (``rpg.paths.user``), every line names a path that opens
from there, and every printed resume command (the demo's, the launcher's, the driver's: one builder,
``rpg.override_lists.resume_command``) works pasted in any folder, with ``trainer.resume_mode`` once."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB_PATH = os.pathsep.join((str(ROOT), str(ROOT / "lab")))  # the checkout and its lab (the demo is rpg_lab.demo)
TINY = ROOT / "recipe" / "rpg" / "tiny" / "run_tiny_cpu.sh"
GPU = ROOT / "recipe" / "rpg" / "tiny" / "run_tiny_gpu.sh"


def test_a_relative_path_is_taken_from_the_callers_folder(tmp_path, monkeypatch):
    from rpg.paths.user import user_folder, user_path

    monkeypatch.chdir(tmp_path)
    assert user_folder("my run") == tmp_path / "my run"
    assert user_folder("my run", tmp_path / "x") == tmp_path / "x" / "my run"
    assert user_folder(tmp_path / "abs") == tmp_path / "abs"
    assert user_path("s3://bucket/x", tmp_path) == "s3://bucket/x"


def _shim(tmp_path: Path) -> Path:
    """A PYTHON that prints where it runs and what it gets, and starts nothing."""
    shim = tmp_path / "shim.sh"
    shim.write_text('#!/bin/sh\necho "cwd=$(pwd)"\necho "pythonpath=$PYTHONPATH"\nfor a in "$@"; do echo "arg=$a"; done\n')
    shim.chmod(0o755)
    return shim


def test_the_tiny_scripts_run_in_the_callers_folder(tmp_path):
    """Before: run_tiny_cpu.sh changed to the checkout, so OUT="my run" given from another folder wrote
    <checkout>/my run; ENTRY= and every relative path were the checkout's too."""
    here = tmp_path / "elsewhere"
    here.mkdir()
    for script in (TINY, GPU):
        p = subprocess.run(["bash", os.path.relpath(script, here), "trainer.save_freq=1"], cwd=here, text=True,
                           capture_output=True, timeout=60,
                           env={**os.environ, "PYTHON": str(_shim(tmp_path)), "OUT": "my run", "PYTHONPATH": "x"})
        assert p.returncode == 0, p.stderr
        lines = p.stdout.splitlines()
        assert lines[0] == f"cwd={here}", lines
        assert lines[1] == f"pythonpath={ROOT}:{ROOT}/lab:x", lines  # this checkout's rpg and rpg_lab first, the
        # caller's path kept
        assert "arg=--out" in lines and lines[lines.index("arg=--out") + 1] == "arg=my run", lines


def test_the_demo_writes_where_the_user_said_and_its_resume_command_works_from_anywhere(tmp_path, monkeypatch,
                                                                                       capsys):
    """Before: the resume command of a demo stopped by a signal was ``python -m rpg_lab.demo.cpu --out 'my run' ...``
    with a relative --out and no cd (pasted elsewhere: a fresh run at step 0), and each stop of a resumed run
    added another trainer.resume_mode=auto."""
    import rpg_lab.demo.cpu as demo
    from rpg import trainer_process as harness

    seen = {}

    def stopped(overrides, **kw):
        seen["out"] = Path(kw["output_dir"])
        run = harness.TrainerRun(None, 1.0, seen["out"], seen["out"] / "trainer.log", seen["out"] / "m.jsonl", [])
        run.stop_signal = int(signal.SIGINT)
        raise harness.TrainerRunError("stopped", run)

    monkeypatch.setattr(demo, "run_trainer", stopped)
    monkeypatch.setattr("rpg.tiny.build_tiny_assets", lambda *a, **k: SimpleNamespace(root=tmp_path / "cache"))
    monkeypatch.delenv("RPG_CPU_ROLLOUT", raising=False)
    monkeypatch.setenv("RPG_TINY_CACHE", str(tmp_path / "cache"))
    here = tmp_path / "launched here"
    here.mkdir()
    monkeypatch.chdir(here)
    out = here / "my run"
    for argv in (["--steps", "3", "trainer.save_freq=1"],  # a first run, then its resume (resume_mode given)
                 ["--steps", "3", "trainer.save_freq=1", "trainer.resume_mode=auto"]):
        assert demo.main(["--out", "my run", *argv]) == 128 + signal.SIGINT
        cap = capsys.readouterr()
        assert seen["out"] == out
        assert f"full log: {out / 'trainer.log'}" in cap.out
        resume = cap.err.split("; resume: ", 1)[1].strip()
        assert shlex.split(resume) == ["cd", str(here), "&&", "RPG_TINY_CACHE=" + str(tmp_path / "cache"),
                                       sys.executable, "-m", "rpg_lab.demo.cpu", "--out", str(out), "--steps", "3",
                                       "trainer.save_freq=1", "trainer.resume_mode=auto"], resume


def test_the_drivers_resume_command_goes_back_to_its_folder(tmp_path, monkeypatch):
    from rpg.verl.main import driver_resume_command

    monkeypatch.chdir(tmp_path)
    words = shlex.split(driver_resume_command(["recipe/rpg/main_rpg.py", "trainer.resume_mode=auto", "a=1"]))
    assert words == ["cd", str(tmp_path), "&&", sys.executable, "recipe/rpg/main_rpg.py", "trainer.resume_mode=auto",
                     "a=1"]


def test_the_study_takes_its_folders_from_the_callers_folder(tmp_path, monkeypatch, capsys):
    from rpg_lab.study.__main__ import main

    monkeypatch.chdir(tmp_path)
    assert main(["--render-only", "--out", "my study"]) == 2
    assert f"no study in --out {tmp_path / 'my study'} (no {tmp_path / 'my study' / 'runs'})" in capsys.readouterr().err


def _demo(out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rpg_lab.demo.cpu", "--out", str(out), "--steps", "2"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": LAB_PATH})


def test_the_demo_refuses_an_output_folder_it_cannot_write_in_one_line(tmp_path):
    """OUT under a file, and OUT on a read-only file system (a read-only tmpfs mounted in a mount namespace of its
    own: root writes through permissions, not through a read-only mount): exit code 2 and one line naming the folder,
    before the assets and the trainer, instead of a traceback."""
    blocker = tmp_path / "a file"
    blocker.write_text("x")
    done = _demo(blocker / "run")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(blocker / "run") in lines[0] and f"{blocker} is not a folder" in lines[0], lines
    if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("a read-only mount needs root and unshare -m")
    ro = tmp_path / "ro"
    ro.mkdir()
    cmd = [sys.executable, "-m", "rpg_lab.demo.cpu", "--out", str(ro / "run"), "--steps", "2"]
    done = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro tmpfs {shlex.quote(str(ro))} && exec "
                           + shlex.join(cmd)], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": LAB_PATH})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(ro / "run") in lines[0] and f"{ro} is on a read-only file system" in lines[0], lines
