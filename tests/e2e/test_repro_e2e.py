"""End-to-end: the tiny demo (``python -m rpg_lab.demo.cpu``, what recipe/rpg/tiny/run_tiny_cpu.sh runs) twice in sync
mode with the same seed gives the same metrics at every step, validations included (before training, mid-run and
at the end), to the last bit.

What makes it repeat (docs/testing.md, "Reproducible runs"): the batch in the prompts' fetch order, not in the
order rollouts finished (``rpg.verl.sample_order_and_lag``); each sample's random numbers from its identity, whichever
rollout server answers (``rpg.backends.hf_rollout``); verl's ``rollout.full_determinism``, which decodes every
sequence alone (a batched product's numbers depend on the batch on CPU); validation metrics of the samples in a
canonical order (verl's bootstrap ``best@N`` / ``maj@N`` draw by position with a fixed seed,
``verl/trainer/ppo/metric_utils.py:835``, so they repeat once the order does). Only what measures the machine
differs: times, throughput, memory.

Both runs are the tiny reference run (``rpg_lab.demo.reference``: its command, and the CPU kernels pinned to a path
every x86-64 machine takes), and the first is compared with the committed reference too: a change of the
computation fails here in one line until ``python -m rpg_lab.demo.reference --regenerate --reason TEXT`` records it.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest

from rpg_lab.demo import reference
from rpg_lab.demo.cpu import STARTUP_STAGES
from multinode import wait_for
from rpg.trainer_process import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.repro]  # a CI stage: two trainer runs do not fit README's suite
ROOT = Path(__file__).resolve().parents[2]
STEPS, TEST_FREQ = reference.STEPS, reference.TEST_FREQ  # validations before training, after step 2 and step 4
MACHINE = reference.MACHINE  # what measures the machine, not the run


def _start(out: Path) -> subprocess.Popen:
    with open(out.parent / f"{out.name}.log", "wb") as log:
        return subprocess.Popen(reference.command(out), cwd=ROOT, env=reference.pinned_env(), stdout=log,
                                stderr=subprocess.STDOUT)


RAY_UP = STARTUP_STAGES[0][0]  # Ray's own line once a private Ray is up (the demo's first start-up stage)


def _finish(proc: subprocess.Popen, out: Path) -> dict[int, dict]:
    try:
        proc.wait(timeout=1500)
    finally:
        if proc.poll() is None:  # timed out: the demo stops its own Ray on SIGTERM
            proc.terminate()
            proc.wait(timeout=120)
    log = (out.parent / f"{out.name}.log").read_text(errors="replace")
    assert proc.returncode == 0, log[-6000:]
    return read_metrics(out / "metrics.jsonl")


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_two_sync_runs_with_the_same_seed_log_the_same_metrics(tmp_path):
    # the two runs side by side (each its own Ray, output folder and seed's draws), the second started once the
    # first's Ray is up: a lone launch leaves about a third of the 2 cores idle while its processes start one after
    # another; their timing differs, which is what must not change a metric
    outs = [tmp_path / "first", tmp_path / "second"]
    procs = [_start(outs[0])]
    try:  # Ray gives a raylet a fixed 30 s to register (ray/_private/node.py): three Ray start-ups at once (these two
        # and a launch of the other xdist worker) on 2 loaded cores exceeded it once
        wait_for(outs[0] / "trainer.log", re.escape(RAY_UP), procs[0], timeout=900)
    except AssertionError:
        procs[0].terminate()  # the demo stops its own Ray on SIGTERM
        procs[0].wait(timeout=120)
        raise
    procs.append(_start(outs[1]))
    try:
        first = _finish(procs[0], outs[0])
    finally:
        second = _finish(procs[1], outs[1])
    assert_same_runs(first, second)
    observed, ran_on = reference.observe(outs[0])
    assert ran_on["kernels"]["capability"] == "AVX2"  # the pinned kernels reached the run
    ok, line = reference.verdict(observed, json.loads(reference.reference_file("tiny").read_text()), ran_on["kernels"])
    print(line)
    assert ok, line


def assert_same_runs(first: dict[int, dict], second: dict[int, dict]) -> None:
    assert sorted(first) == sorted(second) == list(range(STEPS + 1))
    compared = 0
    for step in first:
        keys = {k for k in first[step] if not MACHINE.search(k)}
        assert keys == {k for k in second[step] if not MACHINE.search(k)}, step
        differ = {k: (first[step][k], second[step][k]) for k in sorted(keys)
                  if not _same(first[step][k], second[step][k])}
        assert not differ, f"step {step}: {differ}"
        compared += len(keys)
    # what the comparison covered: each validation (verl's bootstrap best@N / maj@N included), every update
    for step in (0, TEST_FREQ, STEPS):
        assert any(k.startswith("val-core/") and "/best@" in k for k in first[step])
    for step in range(1, STEPS + 1):
        for key in ("actor/grad_norm", "actor/rpg/ratio_max", "actor/pg_loss", "critic/score/mean",
                    "training/rollout_probs_diff_max", "training/rpg/lag_versions_max"):
            assert key in first[step], (step, key)
        assert first[step]["training/rpg/lag_versions_max"] == first[step]["training/rpg/lag_updates_max"] == 0
    assert first[STEPS]["actor/rpg/ratio_max"] != 1.0  # off-policy mini-batches: membership matters
    assert compared > 100 * (STEPS + 1) // 2
