"""A lost node does not stop an elastic run (NNODES=MIN:MAX): two Ray nodes on loopback (tests/multinode.py), the tiny
run submitted as users submit it, the second node's raylet killed mid-run. Unit tests of the pieces:
tests/test_elastic_units.py.

Distributed stage (``pytest -m distributed --distributed``): a few minutes of trainer launches.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from multinode import SUBMISSION, LoopbackCluster, finish, loopback_cluster, loopback_marks, run_processes, steps, submit, wait_for

pytestmark = loopback_marks(pytest.mark)


@pytest.fixture(scope="module")
def cluster():
    with loopback_cluster("rpgel", port=47379, dashboard_port=49265) as c:
        yield c


def _history(logs: Path, name: str) -> list[int]:
    """The training steps of the run's metrics history as a report reads it (``rpg.common.history``: segments joined,
    a later segment replacing the steps it trained again)."""
    from rpg.common.history import TRAINING_STEP_KEY, read_segments
    from rpg.common.metrics_file import readable_records

    def read_one(path):
        out: dict[str, dict[int, float]] = {}
        for step, data in readable_records(path)[0]:
            for key, value in data.items():
                out.setdefault(key, {})[step] = value
        return out

    metrics, _ = read_segments(logs / "rpg" / f"{name}.jsonl", read_one)
    return sorted(metrics.get(TRAINING_STEP_KEY, {}))


def _next(log: Path, pattern: str, proc, after: int, timeout: float = 400) -> tuple[re.Match, float]:
    """The first match of ``pattern`` in ``log`` past character ``after``, and when it was seen."""
    t0 = time.time()
    while (m := re.compile(pattern).search(text := log.read_text(errors="replace"), after)) is None:
        if proc.poll() is not None or time.time() - t0 > timeout:
            raise AssertionError(f"{pattern!r} never appeared (rc {proc.poll()}):\n{text[-5000:]}")
        time.sleep(0.2)
    return m, time.time()


def _world_sizes(ck: Path) -> dict[int, int]:
    """The world size each complete step folder was saved at (its actor shards' names)."""
    out = {}
    for d in ck.glob("global_step_*"):
        if not re.fullmatch(r"global_step_\d+", d.name):
            continue
        names = [p.name for p in (d / "actor").glob("model_world_size_*_rank_*.pt")]
        sizes = {int(re.search(r"world_size_(\d+)", n).group(1)) for n in names}
        if len(sizes) == 1:
            out[int(d.name.removeprefix("global_step_"))] = sizes.pop()
    return out


def _elastic(cluster: LoopbackCluster, log: Path, steps: int, **env: str):
    cluster.ensure_two_nodes()
    return submit(cluster, log, f"trainer.total_training_steps={steps}", "trainer.save_freq=1",
                  "trainer.max_actor_ckpt_to_keep=null", NNODES="1:2", **env)


def test_a_lost_node_restarts_the_run_on_the_node_left_and_it_grows_back(cluster, tmp_path):
    log = tmp_path / "elastic.log"
    proc = _elastic(cluster, log, steps=8)
    text = wait_for(log, r"step:2 ", proc)
    submission = SUBMISSION.search(text).group(0)
    assert "rpg.elastic: starting on 2 node(s) x 1 GPU(s)" in text, text[-3000:]
    t_kill = time.time()
    cluster.raylet("worker").kill()
    # the trainer hands over (verl's error names the lost node), or, when its surviving rank blocks in a collective
    # with the dead one, the supervisor's hang watch stops it: either way the run restarts on the node left
    lost, t_lost = _next(log, r"rpg: node .* lost .*the elastic supervisor decides|rpg\.elastic: 1 node\(s\) alive of "
                              r"the 2 the trainer runs on for \d+ s", proc, 0, timeout=300)
    m, t_line = _next(log, r"rpg\.elastic: restart 1/3: .*", proc, lost.end())
    line = m.group(0)
    why = "node 127.0.0.1" if lost.group(0).startswith("rpg: node") else "the trainer waited on a lost node"
    assert why in line and "world size 2 x 1 -> 1 x 1" in line and "restarts left 2" in line, line
    resumed = int(re.search(r"\(step (\d+)\)", line).group(1))
    assert resumed >= 2, line
    r, t_resume = _next(log, r"rpg: resuming from \S*?global_step_(\d+)", proc, m.end())
    assert int(r.group(1)) == resumed, r.group(0)
    _, t_step = _next(log, rf"step:{resumed + 1} ", proc, r.end())
    cluster.stop_node("worker")
    cluster.start_node("worker")  # the node is back: the run grows at its next checkpoint
    _next(log, r"rpg\.elastic: grown at a checkpoint: world size 1 x 1 -> 2 x 1", proc, 0)
    rc, text = finish(proc, log)
    assert rc == 0, text[-6000:]
    # every step once in the history as a report reads it, trained at 2, then 1, then 2 ranks again
    assert _history(cluster.shared / "logs", "elastic") == list(range(1, 9))
    segs = steps(cluster.shared / "logs", "elastic")
    assert all(len(seg) == len(set(seg)) for seg in segs), segs  # no step twice within a trainer's segment
    assert sorted({s for seg in segs for s in seg}) == list(range(1, 9)), segs
    # the restart's first segment: the resumed step's saved record when that step was never logged (verl saves a
    # step before it logs it), else the step after it
    assert segs[1] == [resumed] and resumed not in segs[0] or segs[1][0] == resumed + 1, (segs, resumed)
    redone = json.loads(re.search(r"trained again( \[[\d, ]+\])?;", line).group(1) or "[]")
    assert [s for s in segs[0] if s > resumed] == redone, (segs, line)  # the restart line named what is re-trained
    sizes = _world_sizes(cluster.shared / "ck" / "elastic")
    assert sizes.get(1) == 2 and sizes.get(8) == 2 and 1 in sizes.values(), sizes
    time.sleep(5)
    assert run_processes(submission) == []  # the supervisor, its lock holder, every trainer: all gone
    record = json.loads((cluster.shared / "ck" / "elastic" / ".rpg_elastic" / "supervisor.json").read_text())
    assert record["submission"] == submission and record["pid"] > 0
    print(f"node loss -> the trainer's handover {t_lost - t_kill:.1f} s (Ray's health check, verl's error, Ray shut "
          f"down) -> restart line {t_line - t_lost:.1f} s (settle, resources released) -> trainer resuming "
          f"{t_resume - t_line:.1f} s (a new driver: Ray workers, checks) -> step {resumed + 1} logged "
          f"{t_step - t_resume:.1f} s (workers, resharded load, rollout, update); total {t_step - t_kill:.1f} s; world "
          f"sizes per step {sorted(sizes.items())}")


def test_with_no_restart_left_a_lost_node_stops_the_run_with_a_resume_command_that_fits(cluster, tmp_path):
    log = tmp_path / "nobudget.log"
    proc = _elastic(cluster, log, steps=6, RPG_MAX_RESTARTS="0")
    text = wait_for(log, r"step:2 ", proc)
    submission = SUBMISSION.search(text).group(0)
    cluster.raylet("worker").kill()
    rc, text = finish(proc, log, timeout=300)
    assert rc != 0 and "rpg.elastic: restart budget spent (--max-restarts 0): the run stops" in text, text[-5000:]
    stops = sorted({x for x in text.splitlines() if x.startswith("rpg: stopped: node 127.0.0.1")})
    assert len(stops) == 1, text[-5000:]
    resume = stops[0].split("; resume: ", 1)[1]
    assert " NNODES=1:2 " in resume and "trainer.resume_mode=auto" in resume, resume  # 1 node alive >= MIN
    time.sleep(5)
    assert run_processes(submission) == []
