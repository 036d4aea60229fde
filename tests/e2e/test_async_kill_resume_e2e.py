"""End to end: an asynchronous run whose driver is killed (SIGKILL, SIGTERM) in the middle of a step, while the trainer
waits on that step's generation, then resumed with ``trainer.resume_mode=auto`` to the same final step
(docs/verl-integration.md#resume-of-an-asynchronous-run). Two launches per case, into one output folder, on the CPU
backend with the tiny model, a checkpoint each step:

* colocate_async, world size 1, SIGKILL, every group dispatched before a save finished before it
  (``RPG_TEST_SAVE_FINISHED``): the resume always keeps samples generated before the stop;
* separate_async, world size 2 (two trainer ranks, one standalone rollout rank), SIGTERM: the driver's stop line.

Where the stop lands follows from the run, not from timing: the trainer holds at step 3's first sampling
(``RPG_TEST_HOLD_AT_GENERATION``: step 3's prompts dispatched and generating, step 2's checkpoint complete, step 3
not trained) and writes a marker; the test kills the driver (its own child, by PID) once the marker is there.

What holds for a kill at that point, and is checked: the resume is from ``global_step_2``, the last complete
checkpoint; steps 1-2 come from the first launch, 3-4 from the resume, each once in the metrics history; the
prompts the killed run dispatched at step 3 were fetched after the save, so the resume fetches them again (the
dataloader position of ``data.pt``): 24 prompts fetched at the save, (1 warm-up + 4) x 8 = 40 at step 4, an
uninterrupted run's count; every sample trained at steps 1-4 is trained once, 64 a step (verl's rollout dump);
the samples kept across the stop keep their behaviour policy (version 1, trained against pi_old = version 2: weights
pi_old/mu away from 1, a whole update's KL(mu || pi_old) > 1e-4 when all 8 groups are kept), the staleness bound
holds. (A kill after a step's training and before its checkpoint is complete redoes that step after the resume: the
history then holds the redone step once, the later segment replacing it, as tests/e2e/test_elastic.py checks.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
import torch
from e2e_recipe import ENTRY, ON_POLICY, at

pytestmark = [pytest.mark.e2e, pytest.mark.resume_e2e]  # a CI stage: README's suite has no room

B = "actor/rpg/behavior_"
PROMPTS, N, STEPS, HELD = 8, 8, 4, 3  # data.train_batch_size, rollout.n; the step the driver is killed in
COMMON = ["trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=1"]
CASES = [("colocate_async", 1, signal.SIGKILL, True), ("separate_async", 2, signal.SIGTERM, False)]


def _launch(tiny_assets, out: Path, mode: str, world: int, resume: str, env: dict, stop: threading.Event | None = None):
    from rpg.trainer_process import run_trainer
    from rpg.tiny.overrides import tiny_overrides

    return run_trainer([*tiny_overrides(tiny_assets, steps=STEPS, algo="rpg", world_size=world, trainer_mode=mode),
                        f"trainer.n_gpus_per_node={world}", f"trainer.v1.trainer_mode={mode}", *COMMON,
                        f"trainer.resume_mode={resume}", f"trainer.default_local_dir={out / 'ckpt'}",
                        f"trainer.rollout_data_dir={out / 'rollouts'}"],
                       output_dir=out / "run", entry=ENTRY, timeout_s=1500, check=False, stop=stop,
                       env={"RAY_DEDUP_LOGS": "0", **env})


def _children_naming(text: str) -> list[psutil.Process]:
    """This process's live children whose command line holds ``text``. A child that ended and is not reaped yet (a
    zombie, whose command line cannot be read: one another test left) or ended meanwhile is none of them."""
    found = []
    for p in psutil.Process().children():
        try:
            if text in " ".join(p.cmdline()):
                found.append(p)
        except (psutil.ZombieProcess, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _killed_at_the_marker(launch, out: Path, marker: Path, sig: int):
    """``launch(stop)`` in a thread; once the trainer wrote ``marker`` (it holds then), ``sig`` to the driver: the
    child of this process whose command line names ``out``. Returns the run and the driver's PID. Should anything
    fail on the way, ``stop`` is set: run_trainer ends the run and its processes then (a held trainer left running
    would hold until its 1500-s timeout, beside every later test)."""
    done: dict = {}
    stop = threading.Event()
    thread = threading.Thread(target=lambda: done.update(run=launch(stop)), daemon=True)
    thread.start()
    try:
        while not marker.is_file():  # a poll of the condition: the trainer holds until killed
            assert thread.is_alive(), "the run ended before the trainer held"
            time.sleep(0.2)
        drivers = _children_naming(str(out / "ckpt"))
        assert len(drivers) == 1, drivers
        drivers[0].send_signal(sig)
        thread.join(timeout=600)
        assert not thread.is_alive()
    except BaseException:
        stop.set()
        thread.join(timeout=120)
        raise
    return done["run"], drivers[0].pid


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-ws{c[1]}-{c[2].name}")
def killed(request, tiny_assets, tmp_path_factory):
    from rpg.verl.async_resume import FINISHED_ENV, HOLD_ENV

    mode, world, sig, finished = request.param
    out = tmp_path_factory.mktemp(f"{mode}-{world}")
    marker = out / "held.json"
    env = {FINISHED_ENV: "1"} if finished else {}
    first, _ = _killed_at_the_marker(
        lambda stop: _launch(tiny_assets, out, mode, world, "disable", {**env, HOLD_ENV: f"{HELD}:{marker}"}, stop),
        out, marker, sig)
    first_log = first.log
    saved = sorted(p.name for p in (out / "ckpt").glob("global_step_*"))  # what the killed run left
    second = _launch(tiny_assets, out, mode, world, "auto", env)
    assert second.returncode == 0 and second.last_step() == STEPS, second.tail()
    assert not second.leftover_pids
    held = json.loads(marker.read_text())
    return dict(mode=mode, world=world, sig=sig, finished=finished, out=out, first=first, first_log=first_log,
                saved=saved, log=second.log[len(first_log):], run=second, held=held)


def test_the_kill_stops_the_run_in_step_3_and_the_resume_is_from_step_2(killed):
    from rpg.verl.checkpoints import last_complete

    first, out, sig = killed["first"], killed["out"], killed["sig"]
    assert killed["held"]["step"] == HELD
    assert first.returncode == (-signal.SIGKILL if sig == signal.SIGKILL else 128 + signal.SIGTERM), first.tail()
    assert first.last_step() == 2 and killed["saved"] == ["global_step_1", "global_step_2"], (killed["saved"],
                                                                                             first.tail())
    if sig == signal.SIGTERM:  # the driver's own stop line: Ray shut down, the checkpoint the resume takes
        line = re.search(r"rpg: stopped by SIGTERM;.*", killed["first_log"])[0]  # the log's lines carry a time
        assert f"last complete checkpoint {out / 'ckpt' / 'global_step_2'};" in line, line
        resume = line.split("; resume: ", 1)[1]  # the same command with the resume mode replaced
        assert "trainer.resume_mode=auto" in resume and "resume_mode=disable" not in resume, line
        assert not first.leftover_pids, first.leftover_pids
    # the second launch resumes the last complete checkpoint, before which nothing of step 3 was saved
    assert last_complete(out / "ckpt") == out / "ckpt" / f"global_step_{STEPS}"
    assert f"rpg: resuming from {out / 'ckpt' / 'global_step_2'}: step 2" in killed["log"], killed["log"][-3000:]


def test_each_step_once_in_the_history(killed):
    from rpg.metrics_log.history import TRAINING_STEP_KEY, readable_records, segments

    trained = Counter(step for path in segments(killed["run"].metrics_file) for step, data in readable_records(path)[0]
                      if TRAINING_STEP_KEY in data)
    assert trained == {1: 1, 2: 1, 3: 1, 4: 1}, trained  # steps 1-2 by the killed launch, 3-4 by the resume


def test_the_replay_buffer_line_and_the_behaviour_policy_of_kept_samples(killed):
    """With every group finished before the save (the colocate_async case) all 8 of step 3's groups are kept
    (none re-issued), so the kept branch always runs: drawn by version 1, trained at step 3 against pi_old = version
    2, lag 1 version and 4 updates (4 mini-batches a step), the weights pi_old/mu far from 1 and a whole update's
    KL(mu || pi_old) > 1e-4; a resume that re-weighted them as if the resumed policy had drawn them (mu := pi_old)
    gives weights 1 up to noise and KL ~0. Otherwise the split follows the killed run's timing and each kind has its
    own guarantee (a re-issued prompt is drawn by the resumed weights: lag 0)."""
    log, run = killed["log"], killed["run"]
    line = re.search(r"rpg: resumed the replay buffer of \S+global_step_2: (\d+) finished prompt groups kept \((\d+) "
                     r"samples .*versions (\[[\d, ]*\]), dispatched at steps (\[[\d, ]*\])\); (\d+) prompts in flight "
                     r"re-issued at step 3 .*; (\d+) samples of step 2's batch", log)
    assert line is not None, log[-3000:]
    kept, samples, reissued, cleared = int(line[1]), int(line[2]), int(line[5]), int(line[6])
    assert kept + reissued == PROMPTS and samples == kept * N and cleared == PROMPTS * N, line[0]
    if killed["finished"]:
        assert (kept, json.loads(line[3]), json.loads(line[4])) == (PROMPTS, [1], [2]), line[0]
    lo, hi = (at(run, 3, f"training/off_policy/trajectory_staleness/{k}") for k in ("min", "max"))
    assert (lo, hi) == ((1, 1) if kept == PROMPTS else (0, 1) if kept else (0, 0)), (kept, lo, hi)
    if kept:
        assert at(run, 3, "training/rpg/lag_versions_max") == 1 and at(run, 3, "training/rpg/lag_updates_max") == 4
        assert at(run, 3, B + "weight_max") > 1 + ON_POLICY or at(run, 3, B + "weight_min") < 1 - ON_POLICY
    if kept == PROMPTS:
        assert at(run, 3, B + "kl_k3") > 1e-4 and at(run, 3, "rollout_corr/k3_kl") > 1e-4
    for s in (3, 4):  # within verl's max_off_policy_threshold of 8, nothing capped
        assert 0 <= at(run, s, "training/off_policy/trajectory_staleness/max") <= 8, s
        assert at(run, s, B + "weight_capped_frac") == 0.0


def test_the_rollout_gets_the_saved_weights_before_its_first_generation(killed):
    from rpg.backends.weight_digest import loaded_digests

    before = [d for g, _, _, d in loaded_digests(killed["first_log"]) if g == "2"]
    after = loaded_digests(killed["log"])
    assert before and after and after[0][0] == "2", after
    pool = "standalone" if killed["mode"] == "separate_async" else "hybrid"
    first_load = next(x for x in killed["log"].splitlines() if "[hf-rollout] weights v1 loaded" in x
                      and f"pool={pool}," in x)
    assert f"received_digest={before[-1]}" in first_load and "batches since last: []" in first_load, first_load


def test_prompts_fetched_and_samples_trained_as_an_uninterrupted_run(killed):
    out = killed["out"]
    dumped = {int(p.stem): [json.loads(x)["uid"] for x in p.read_text().splitlines() if x.strip()]
              for p in (out / "rollouts").glob("*.jsonl")}
    assert sorted(dumped) == list(range(1, STEPS + 1)), sorted(dumped)
    keys = [k for step in sorted(dumped) for k in dumped[step]]
    assert all(len(dumped[s]) == PROMPTS * N for s in dumped) and len(set(keys)) == len(keys)
    prompts = Counter(k.split("_", 1)[0] for k in keys)
    assert set(prompts.values()) == {N} and len(prompts) == STEPS * PROMPTS
    dispatched = {f"p1-{n}" for n in range(2 * PROMPTS)} | {f"p{s}-{n}" for s in (2, 3, 4) for n in range(PROMPTS)}
    assert set(prompts) <= dispatched
    # the dataloader: 1 warm-up batch and one a step; step 3's batch, fetched by the killed run after the save, is
    # fetched again by the resume
    yielded = {s: torch.load(out / "ckpt" / f"global_step_{s}" / "data.pt", weights_only=False)["_num_yielded"]
               for s in (2, STEPS)}
    assert yielded == {2: (1 + 2) * PROMPTS, STEPS: (1 + STEPS) * PROMPTS}, yielded
