"""End-to-end: one tiny run through the tiny launcher (recipe/rpg/tiny/run_tiny_cpu.sh, verl's real trainer
through the RPG driver; 5 steps, a checkpoint per step) gets SIGHUP from a closed terminal once step 2 is
logged; beside it, a one-step run of the fully differentiable form is compared with that run's first step.

SIGHUP. Expected: within 60 s no process of the run is left (launcher, driver, Ray daemons and workers:
the run's private Ray temp dir and the trainer's session are the markers), exit code 129, ONE line on
stderr naming the log, the last complete checkpoint and the resume command; the driver shut Ray down itself
(its own line in the log). (Running the printed resume command as well, to step 5 with every step once in
metrics.jsonl, passed too but doubles the test's 2-3 min; the resume chain is covered by
tests/verl/test_resume.py: the checkpoint pinned before Ray, the history folded.)

Same update. The launcher's run trains REINFORCE-style UFKL without clipping (the settings below), so its
step 1, logged before the signal, is the REINFORCE-style half of the comparison with the fully
differentiable form: the gradient of L_RF = -E[SG(Weight) log pi] equals that of L_FD at every theta
(docs/math.md#fully-differentiable-losses), not only at theta = pi_old, so both make the same update.
(One launch carries both checks: each trainer launch costs the suite a minute or more on 2 cores.)
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
from types import SimpleNamespace

import psutil
import pytest
from e2e_recipe import RPG_LOSS_KEYS, assert_off_policy, at, keys, rpg_defaults, rpg_run, synced_weights
from messages import names
from test_resume import _Lines, _wait_until

from rpg.trainer_process import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.resume_e2e]  # a CI stage: README's suite has no room
ROOT = Path(__file__).resolve().parents[2]

# Both forms: UFKL without clipping, sampler anchor, one step trained in 2 epochs over one mini-batch of the
# 8 prompts: the first update is on-policy (ratio 1, where the KL gradient vanishes), the second off-policy
# (ratio != 1, KL gradient != 0), so the comparison covers the KL term. The rollouts agree because the CPU
# rollout seeds each sample by its identity, verl's data order is seeded and the RPG trainer orders a batch by
# prompt and sample (rpg.verl.sample_order_and_lag).
SAME = ["rpg.loss.divergence=ufkl", "rpg.loss.clip=false", "actor_rollout_ref.actor.ppo_epochs=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64"]


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


@pytest.fixture(scope="module")
def stopped(tiny_assets, tmp_path_factory):
    """The launcher's REINFORCE-style run, stopped by SIGHUP once step 2 is logged: what the stop left
    (processes, exit code, stderr lines after the signal) and what the run wrote (metrics, log)."""
    out = tmp_path_factory.mktemp("sighup") / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "STEPS": "5", "TEST_FREQ": "5",
           "RPG_TINY_CACHE": str(tiny_assets.root.parent)}  # this session's tiny build, wherever rpg comes from
    # no validation (nothing here reads it); the demo's algorithm with rpg_run's defaults and the form under test
    overrides = [*rpg_defaults(mini=8), *SAME, "rpg.loss.form=reinforce", "trainer.save_freq=1"]
    p = subprocess.Popen(["bash", str(ROOT / "recipe" / "rpg" / "tiny" / "run_tiny_cpu.sh"), *overrides],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out_lines, err_lines = _Lines(p.stdout), _Lines(p.stderr)
    stdout = out_lines.lines
    trainer = ray_tmp = None
    found = SimpleNamespace(out=out, before=0, left=None, processes_at_signal=0)
    try:  # until step 2 is logged or the launcher ended (no guess of how long a loaded machine needs)
        _wait_until(lambda: p.poll() is not None or any("step   2/5" in ln for ln in stdout), "step 2")
        assert any("step   2/5" in ln for ln in stdout), "".join(stdout)[-3000:] + "".join(err_lines.lines)[-3000:]
        child = next(c for c in psutil.Process(p.pid).children() if "python" in c.name())
        trainer = child.pid
        ray_tmp = next(a.split("=", 1)[1] for a in child.cmdline() if a.startswith("+ray_kwargs.ray_init._temp_dir="))
        found.processes_at_signal = len(_run_processes(p.pid, trainer, ray_tmp))

        found.before = len(err_lines.lines)
        t0 = time.time()
        p.send_signal(signal.SIGHUP)
        p.wait(timeout=60)
        err_lines.thread.join(10)
        while _run_processes(p.pid, trainer, ray_tmp) and time.time() - t0 < 60:
            time.sleep(0.5)
        found.left = _run_processes(p.pid, trainer, ray_tmp)
        print(f"SIGHUP: {len(found.left)} processes of the run left after {time.time() - t0:.1f} s")
    finally:
        if trainer is not None:  # never leave a run behind, whatever failed above
            for pid in _run_processes(p.pid, trainer, ray_tmp):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if p.poll() is None:
            p.kill()
    found.returncode, found.err_lines, found.stdout = p.returncode, err_lines, stdout
    found.log = (out / "trainer.log").read_text(errors="replace")
    found.metrics = read_metrics(out / "metrics.jsonl")
    return found


def test_sighup_to_the_tiny_launcher_stops_every_process_with_one_line(stopped):
    assert stopped.processes_at_signal > 5  # launcher, driver, Ray daemons, workers
    stderr = "".join(stopped.err_lines.lines)
    assert stopped.left == [], stopped.left
    assert stopped.returncode == 128 + signal.SIGHUP, stderr[-3000:]
    lines = stopped.err_lines.after(stopped.before)  # what the stop printed (not what start-up may have warned about)
    assert len(lines) == 1 and "stopped by SIGHUP" in lines[0] and "Traceback" not in stderr, stderr[-3000:]
    ckpt = re.search(r"last complete checkpoint (\S+);", lines[0]).group(1)
    assert 2 <= int(re.search(r"global_step_(\d+)$", ckpt).group(1)) < 5, lines[0]  # step 2 is logged after its save
    assert f"--out {stopped.out}" in lines[0] and lines[0].endswith("trainer.resume_mode=auto")
    assert "rpg: stopped by SIGTERM; Ray shut down" in stopped.log  # the driver's own handler ran
    # the driver's resume decision reached the demo's terminal (it was in trainer.log only)
    ckpts = stopped.out / "checkpoints" / "rpg_tiny" / "tiny_rpg_reinforce_ufkl"
    started = [ln for ln in "".join(stopped.stdout).splitlines() if ln.startswith("[tiny] fresh start (step 0)")]
    assert len(started) == 1, "".join(stopped.stdout)[-3000:]
    names(started[0], "trainer.resume_mode=disable", str(ckpts))


def test_rpg_fd_and_reinforce_ufkl_sampler_anchor_same_first_update(cpu_trainer, tmp_path, stopped):
    """Fully differentiable (a one-step run here) and REINFORCE-style UFKL (step 1 of the launcher's run),
    same seed: the same rollout, then the same gradients, ratios and KL, and the same weights after the
    step's two updates."""
    fd = rpg_run(cpu_trainer, tmp_path, ["rpg.loss.form=differentiable", *SAME], steps=1, mini=8, name="fd")
    assert "anchor=sampler (pi_old; no reference model)" in fd.log
    all_keys = keys(fd)
    assert "timing_s/ref" not in all_keys and "rpg/ref_kl" not in all_keys  # no reference forward ever
    assert "actor/kl_loss" not in all_keys  # verl's KL term is not used
    assert "actor/pg_clipfrac_lower" not in all_keys  # verl's vanilla loss did not run
    for key in RPG_LOSS_KEYS:
        at(fd, 1, key)
    assert_off_policy(fd, (1,))

    rf = SimpleNamespace(metrics=stopped.metrics, log=stopped.log)
    assert "form=reinforce" in rf.log and "form=differentiable" in fd.log
    assert_off_policy(rf, (1,))
    # the same rollout (same weights, seeded per-sequence sampling, seeded data order) ...
    for key in ("critic/score/mean", "response_length/mean", "actor/entropy"):
        assert at(rf, 1, key) == pytest.approx(at(fd, 1, key), rel=1e-5), key
    # ... (the two surrogates' values differ by construction, but no bound on how much is guaranteed:
    # the forms are told apart by the driver's description line above) ...
    # ... the same gradients, the same ratios and KL after the first update, the same weights after both.
    # Equal in exact arithmetic; in float32 the gradients differ by rounding only, and Adam's first
    # step is lr * g / |g| per parameter, so the weights after it are the same but for parameters
    # whose gradient is at rounding level. The KL (k3, cancellation near w = 1) gets an absolute
    # floor of its float32 rounding.
    for key in ("actor/grad_norm", "actor/rpg/ratio_max", "actor/rpg/ratio_min", "actor/rpg/kl_estimate"):
        assert at(rf, 1, key) == pytest.approx(at(fd, 1, key), rel=1e-4, abs=1e-7), key
    assert at(rf, 1, "actor/grad_norm") > 0  # a non-zero gradient: the updates move the weights
    rf_w, fd_w = synced_weights(rf), synced_weights(fd)
    assert rf_w["0"] == fd_w["0"] and rf_w["1"] != rf_w["0"]  # same start (one model file); the updates moved it
    assert rf_w["1"] == pytest.approx(fd_w["1"], rel=0, abs=5e-3)  # sum of 340k parameters


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
