"""A lost node does not stop an elastic run (NNODES=MIN:MAX): two Ray nodes on loopback (tests/support/multinode.py),
the tiny run submitted as users submit it, the second node's raylet killed mid-run. Unit tests of the pieces:
tests/cluster/test_elastic_units.py.

Distributed stage (``pytest -m distributed --distributed``): a few minutes of trainer launches.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from multinode import (NO_VALIDATION, SUBMISSION, LoopbackCluster, assert_run_gone, finish, loopback_cluster,
                       loopback_marks, run_processes, steps, submissions_ended, submit, wait_for)

pytestmark = loopback_marks(pytest.mark)
_ = submissions_ended  # autouse: a test's submissions left running end with it


@pytest.fixture(scope="module")
def cluster():
    with loopback_cluster("rpgel", port=47379, dashboard_port=49265) as c:
        yield c


def _history(logs: Path, name: str) -> list[int]:
    """The training steps of the run's metrics history as a report reads it (``rpg.metrics_log.history``: segments joined,
    a later segment replacing the steps it trained again)."""
    from rpg.metrics_log.history import TRAINING_STEP_KEY, read_segments
    from rpg.metrics_log.file import readable_records

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


def _elastic(cluster: LoopbackCluster, log: Path, steps: int, *overrides: str, spare: bool = False, **env: str):
    """The run submitted with ``NNODES=1:2`` on the two nodes (no validation), and with ``spare`` a third
    (``SPARE``), started here and stopped by the caller."""
    cluster.ensure_two_nodes()
    if spare:
        cluster.start_node(SPARE)
    return submit(cluster, log, f"trainer.total_training_steps={steps}", "trainer.save_freq=1",
                  "trainer.max_actor_ckpt_to_keep=null", *NO_VALIDATION, *overrides, NNODES="1:2", **env)


STEPS = 8
SPARE = "spare"  # separate_async's third node: the standalone rollout pool's, kept aside by the supervisor
_HOLDS_THE_RUN = r"rpg\.elastic: \d+ node\(s\) can hold the run now"


def _appears(path: Path, proc, timeout: float = 400) -> float:
    """When ``path`` appeared, polled on the disk: the job's log, read through Ray's job API, can trail the run by a
    step or more, so what the test times its actions by is read from the disk."""
    t0 = time.time()
    while not path.is_file():
        if proc.poll() is not None or time.time() - t0 > timeout:
            raise AssertionError(f"{path} never appeared (rc {proc.poll()})")
        time.sleep(0.1)
    return time.time()


@contextlib.contextmanager
def _held(submission: str, attempt: int):
    """The TaskRunner of the trainer's ``attempt`` (verl's training loop: it starts each step and writes each
    checkpoint's marker) stopped (SIGSTOP) for the block, continued after it whatever happens. Found among this
    submission's processes by the attempt's own rendezvous (``DIST_INIT_METHOD`` ending ``-a<attempt>``) and its
    process title (Ray's ``ray::RPGTaskRunner...``)."""
    def of_attempt(p: psutil.Process) -> bool:
        try:
            return p.environ().get("DIST_INIT_METHOD", "").endswith(f"-a{attempt}") and "TaskRunner" in " ".join(
                p.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False

    found = [p for p in run_processes(submission) if of_attempt(p)]
    assert len(found) == 1, found
    found[0].send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        found[0].send_signal(signal.SIGCONT)


@pytest.mark.parametrize("mode", ["sync", "colocate_async", "separate_async"])
def test_a_lost_node_restarts_the_run_on_the_node_left_and_it_grows_back(cluster, tmp_path, mode):
    """The node returns at a known step, whatever the machine's speed: once the run restarted on the node left has
    saved a step, its training loop is held (SIGSTOP) while the node comes back and the supervisor sees it, so it
    grows at a checkpoint after the held one (the next, unless the trainer saved again before the supervisor looked),
    a step before the last. In colocate_async and separate_async each restart and the grow resume its replay buffer
    too (the resume line of rpg.verl.async_resume), at the other world size. separate_async runs on three nodes,
    one kept aside for its standalone rollout pool (one rank): the trainer on 2, then 1 once the second node is
    lost (whichever of the trainer's and the pool's parts it held), then 2 again."""
    try:
        _lost_node_restart_and_grow(cluster, tmp_path, mode)
    finally:
        cluster.stop_node(SPARE)


def _lost_node_restart_and_grow(cluster: LoopbackCluster, tmp_path: Path, mode: str) -> None:
    from rpg.verl.checkpoints import MARKER, is_last_step, last_complete

    name = "elastic" if mode == "sync" else f"elastic-{mode}"
    log = tmp_path / f"{name}.log"
    ck = cluster.shared / "ck" / name
    pool = mode == "separate_async"
    # separate_async: the tiny task's 8 prompts in mini-batches of 2, one weight sync per step
    sync = ["trainer.v1.separate_async.parameter_sync_step=4"] if pool else []
    proc = _elastic(cluster, log, STEPS, f"trainer.v1.trainer_mode={mode}", *sync, spare=pool)
    submission = SUBMISSION.search(wait_for(log, SUBMISSION.pattern, proc)).group(0)
    _appears(ck / "global_step_2" / MARKER, proc, timeout=600)
    t_kill = time.time()
    cluster.raylet("worker").kill()
    # the new trainer of the restart (its Ray job id written once it joined Ray) resumes the last complete checkpoint
    t_joined = _appears(ck / ".rpg_elastic" / "attempt-1.job", proc, timeout=600)
    resumed = _step(last_complete(ck))
    assert resumed >= 2, resumed
    t_step = _appears(ck / f"global_step_{resumed + 1}" / MARKER, proc)
    with _held(submission, attempt=1):
        held = _step(last_complete(ck))  # the last checkpoint while the loop is held: the grow comes at the next
        assert held + 1 < STEPS, (held, STEPS)
        # the trainer handed over (verl's error names the lost node), or, when its surviving rank blocked in a
        # collective with the dead one, the supervisor's hang watch stopped it: either way the run restarted on the
        # node left
        lost, _ = _next(log, r"rpg: node .* lost .*the elastic supervisor decides|rpg\.elastic: \d node\(s\) alive of "
                             r"the \d the trainer .*runs? on for \d+ s", proc, 0, timeout=300)
        m, _ = _next(log, r"rpg\.elastic: restart 1/3: .*", proc, lost.end())
        line = m.group(0)
        why = "node 127.0.0.1" if lost.group(0).startswith("rpg: node") else "the trainer waited on a lost node"
        assert why in line and "world size 2 x 1 -> 1 x 1" in line and "restarts left 2" in line, line
        assert f"(step {resumed})" in line, (line, resumed)
        assert "rpg.elastic: starting on 2 node(s) x 1 GPU(s)" in log.read_text()[:m.start()], log.read_text()[-3000:]
        if pool:  # the pool's node kept aside at the start and at the restart
            assert re.search(r"rpg\.elastic: starting on 2 node\(s\) .*3 node\(s\) with 1 free GPU\(s\): 1 kept for "
                             r"the rollout pool's 1 node\(s\) x 1 GPU\(s\) .*, 2 for the trainer\)", log.read_text()), \
                log.read_text()[-3000:]
            assert "2 node(s) with 1 free GPU(s): 1 kept for the rollout pool's" in line, line
        r, _ = _next(log, r"rpg: resuming from \S*?global_step_(\d+)", proc, m.end())
        assert int(r.group(1)) == resumed, r.group(0)
        # from the restart on one node to here (its trainer started, its placement group made) only one node could
        # hold the run: a line saying more is a node counted twice
        assert re.search(_HOLDS_THE_RUN, log.read_text(errors="replace")) is None, log.read_text()[-5000:]
        cluster.stop_node("worker")
        cluster.start_node("worker")  # the node is back: the run grows at its next checkpoint
        _next(log, r"rpg\.elastic: 2 node\(s\) can hold the run now \(it runs on 1\): growing at the next checkpoint",
              proc, r.end(), timeout=120)
    g, _ = _next(log, r"rpg\.elastic: grown at a checkpoint: world size 1 x 1 -> 2 x 1; resuming \S+ \(step (\d+)\)",
                 proc, r.end())
    # the first checkpoint after the held one, or a later one when the trainer saved again before the supervisor's
    # next look (a poll every 2 s, Ray's state API slow on a loaded machine); never the last step
    grown = int(g.group(1))
    assert held + 1 <= grown < STEPS, (g.group(0), held)
    rc, text = finish(proc, log)
    assert rc == 0, text[-6000:]
    assert len(re.findall(_HOLDS_THE_RUN, text)) == 1, text[-6000:]  # no grow announced at the last step either
    if mode != "sync":  # the replay buffer taken back at the restart and at the grow, each at another world size
        for step in (resumed, grown):
            assert re.search(rf"rpg: resumed the replay buffer of \S+global_step_{step}: \d+ finished prompt groups "
                             rf"kept", text), (step, text[-6000:])
    # every step once in the history as a report reads it, trained at 2, then 1, then 2 ranks again
    assert _history(cluster.shared / "logs", name) == list(range(1, STEPS + 1))
    segs = steps(cluster.shared / "logs", name)
    assert all(len(seg) == len(set(seg)) for seg in segs), segs  # no step twice within a trainer's segment
    assert sorted({s for seg in segs for s in seg}) == list(range(1, STEPS + 1)), segs
    # the restart's first segment: the resumed step's saved record when that step was never logged (verl saves a
    # step before it logs it), else the step after it
    assert segs[1] == [resumed] and resumed not in segs[0] or segs[1][0] == resumed + 1, (segs, resumed)
    redone = json.loads(re.search(r"trained again( \[[\d, ]+\])?;", line).group(1) or "[]")
    assert [s for s in segs[0] if s > resumed] == redone, (segs, line)  # the restart line named what is re-trained
    sizes = _world_sizes(ck)
    want = {n: 2 if n <= resumed or n > grown else 1 for n in range(1, STEPS + 1)}
    assert sizes == want, (sizes, resumed, held)
    assert is_last_step(ck / f"global_step_{STEPS}") and not is_last_step(ck / f"global_step_{STEPS - 1}")
    assert_run_gone(submission)  # the supervisor, its lock holder, every trainer: all gone
    record = json.loads((ck / ".rpg_elastic" / "supervisor.json").read_text())
    assert record["submission"] == submission and record["pid"] > 0
    print(f"node loss -> the restart's trainer on Ray {t_joined - t_kill:.1f} s (Ray's health check, the handover, "
          f"settle, resources released, a new driver) -> step {resumed + 1} saved {t_step - t_joined:.1f} s (workers, "
          f"resharded load, rollout, update); grown at step {grown} (held at {held}); world sizes per step "
          f"{sorted(sizes.items())}")


def _step(checkpoint: Path | None) -> int:
    return 0 if checkpoint is None else int(checkpoint.name.removeprefix("global_step_"))


def test_with_no_restart_left_a_lost_node_stops_the_run_with_a_resume_command_that_fits(cluster, tmp_path):
    log = tmp_path / "nobudget.log"
    proc = _elastic(cluster, log, steps=6, RPG_MAX_RESTARTS="0")
    text = wait_for(log, r"step:2 ", proc)
    submission = SUBMISSION.search(text).group(0)
    cluster.raylet("worker").kill()
    rc, text = finish(proc, log, timeout=300)
    assert rc != 0 and "rpg.elastic: restart budget spent (--max-restarts 0): the run stops" in text, text[-5000:]
    # the trainer's one stop line: it names the lost node, or, when its surviving rank blocked in a collective with
    # the dead one and the supervisor's hang watch stopped it, the signal (the job's logs repeat lines: a set)
    stops = sorted({x for x in text.splitlines() if x.startswith(("rpg: stopped: node 127.0.0.1",
                                                                  "rpg: stopped by SIGTERM;"))})
    assert len(stops) == 1, text[-5000:]
    if stops[0].startswith("rpg: stopped by SIGTERM;"):
        assert re.search(r"rpg\.elastic: 1 node\(s\) alive of the 2 the trainer runs on for \d+ s", text), text[-5000:]
    resume = stops[0].split("; resume: ", 1)[1]
    assert " NNODES=1:2 " in resume and "trainer.resume_mode=auto" in resume, resume  # 1 node alive >= MIN
    assert_run_gone(submission)
