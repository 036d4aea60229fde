"""End-to-end: a tiny run (recipe/rpg/tiny/run_tiny_cpu.sh, verl's real trainer through the RPG
driver; 5 steps, a checkpoint per step) gets SIGHUP from a closed terminal once step 2 is logged.

Expected: within 60 s no process of the run is left (launcher, driver, Ray daemons and workers: the
run's private Ray temp dir and the trainer's session are the markers), exit code 129, ONE line on
stderr naming the log, the last complete checkpoint and the resume command; the driver shut Ray
down itself (its own line in the log). (Running the printed resume command as well, to step 5 with
every step once in metrics.jsonl, passed too but doubles the test's 2-3 min; the resume chain is
covered by tests/test_resume.py: the checkpoint pinned before Ray, the history folded.)
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from test_resume import _Lines, _wait_until

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[1]


def _run_processes(launcher: int, trainer: int, ray_tmp: str) -> list[int]:
    alive = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            mine = p.info["pid"] in (launcher, trainer) or os.getsid(p.info["pid"]) == trainer \
                or any(ray_tmp in a for a in (p.info["cmdline"] or []))
            if mine and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            pass
    return alive


def test_sighup_to_the_tiny_launcher_stops_every_process_with_one_line(tiny_assets, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "STEPS": "5", "TEST_FREQ": "5",
           "RPG_TINY_CACHE": str(tiny_assets.root.parent)}  # this session's tiny build, wherever rpg comes from
    # no validation before training: nothing here reads it, and it cost a validation's time before step 1
    p = subprocess.Popen(["bash", str(ROOT / "recipe" / "rpg" / "tiny" / "run_tiny_cpu.sh"), "trainer.save_freq=1",
                          "trainer.val_before_train=False"],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out_lines, err_lines = _Lines(p.stdout), _Lines(p.stderr)
    stdout = out_lines.lines
    trainer = ray_tmp = None
    try:  # until step 2 is logged or the launcher ended (no guess of how long a loaded machine needs)
        _wait_until(lambda: p.poll() is not None or any("step   2/5" in ln for ln in stdout), "step 2")
        assert any("step   2/5" in ln for ln in stdout), "".join(stdout)[-3000:] + "".join(err_lines.lines)[-3000:]
        child = next(c for c in psutil.Process(p.pid).children() if "python" in c.name())
        trainer = child.pid
        ray_tmp = next(a.split("=", 1)[1] for a in child.cmdline() if a.startswith("+ray_kwargs.ray_init._temp_dir="))
        assert len(_run_processes(p.pid, trainer, ray_tmp)) > 5  # launcher, driver, Ray daemons, workers

        before = len(err_lines.lines)
        t0 = time.time()
        p.send_signal(signal.SIGHUP)
        p.wait(timeout=60)
        err_lines.thread.join(10)
        while _run_processes(p.pid, trainer, ray_tmp) and time.time() - t0 < 60:
            time.sleep(0.5)
        left = _run_processes(p.pid, trainer, ray_tmp)
        print(f"SIGHUP: {len(left)} processes of the run left after {time.time() - t0:.1f} s")
    finally:
        if trainer is not None:  # never leave a run behind, whatever failed above
            for pid in _run_processes(p.pid, trainer, ray_tmp):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if p.poll() is None:
            p.kill()
    stderr = "".join(err_lines.lines)
    assert left == [], left
    assert p.returncode == 128 + signal.SIGHUP, stderr[-3000:]
    lines = err_lines.after(before)  # what the stop printed (not what start-up may have warned about)
    assert len(lines) == 1 and "stopped by SIGHUP" in lines[0] and "Traceback" not in stderr, stderr[-3000:]
    ckpt = re.search(r"last complete checkpoint (\S+);", lines[0]).group(1)
    assert 2 <= int(re.search(r"global_step_(\d+)$", ckpt).group(1)) < 5, lines[0]  # step 2 is logged after its save
    assert f"--out {out}" in lines[0] and lines[0].endswith("trainer.resume_mode=auto")
    log = (out / "trainer.log").read_text(errors="replace")
    assert "rpg: stopped by SIGTERM; Ray shut down" in log  # the driver's own handler ran


_DRIVER = """
import sys, time, ray
from omegaconf import OmegaConf
from rpg.verl.main import stop_on_signals

cfg = OmegaConf.create({"trainer": {"default_local_dir": sys.argv[2], "logger": ["console", "file"],
                                    "project_name": "p", "experiment_name": "e"}})
with stop_on_signals(cfg):
    ray.init(num_cpus=1, include_dashboard=False, _temp_dir=sys.argv[1])

    @ray.remote
    def train():
        time.sleep(600)

    print("ready", flush=True)
    ray.get(train.remote())
"""


def test_driver_shuts_its_ray_cluster_down_on_sighup(tmp_path):
    """The GPU launcher execs the driver: SIGHUP reaches it directly (Ray's own SIGTERM handler, installed
    by ray.init, is replaced; a signal during ray.get arrives as Ray's SystemExit(1) and is still ours)."""
    from rpg.verl.checkpoints import write_marker

    ckpt = tmp_path / "ckpt" / "global_step_3"
    (ckpt / "actor").mkdir(parents=True)
    import torch

    torch.save({}, ckpt / "actor" / "model_world_size_1_rank_0.pt")
    torch.save({}, ckpt / "data.pt")
    write_marker(ckpt, 3)
    ray_tmp = tempfile.mkdtemp(prefix="rpgray")  # short: Ray's socket paths are length-limited
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    p = subprocess.Popen([sys.executable, str(script), ray_tmp, str(tmp_path / "ckpt"), "trainer.resume_mode=disable"],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        ready = p.stdout.readline().strip()
        assert ready == "ready", p.communicate(timeout=60)[1][-3000:]
        t0 = time.time()
        p.send_signal(signal.SIGHUP)
        _, stderr = p.communicate(timeout=60)
        while _run_processes(p.pid, p.pid, ray_tmp) and time.time() - t0 < 60:
            time.sleep(0.5)
        assert _run_processes(p.pid, p.pid, ray_tmp) == []
    finally:
        for pid in _run_processes(p.pid, p.pid, ray_tmp):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert p.returncode == 128 + signal.SIGHUP
    line = [ln for ln in stderr.splitlines() if ln.startswith("rpg: stopped")]
    assert len(line) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert f"last complete checkpoint {ckpt};" in line[0] and str(Path("p") / "e.jsonl") in line[0]
    assert line[0].endswith(f"{script} {ray_tmp} {tmp_path / 'ckpt'} trainer.resume_mode=auto")
