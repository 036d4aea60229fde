"""An elastic separate_async run (NNODES=MIN:MAX): the supervisor keeps the standalone rollout pool's nodes
(``actor_rollout_ref.rollout.nnodes`` x ``.n_gpus_per_node``) aside before it picks the trainer's node count, refuses
to start when MIN trainer nodes and the pool's do not fit, and counts the pool's nodes in its hang watch. A fake
cluster and fake trainers, as in tests/cluster/test_elastic_units.py; the loopback run: tests/e2e/test_elastic.py."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from messages import names, one_line

from rpg.cluster.elastic.attempts import Plan, parse_args
from rpg.cluster.elastic.cluster import Cluster
from rpg.cluster.elastic.supervisor import Supervisor
from rpg.verl.errors import ELASTIC_EXIT

TRAINER = """
import json, os, sys, time
from pathlib import Path
calls = Path(sys.argv[0]).with_suffix(".calls")
with calls.open("a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
rcs = json.loads(Path(sys.argv[0]).with_suffix(".json").read_text())
rc = rcs[len(calls.read_text().splitlines()) - 1]
if rc == "hang":
    time.sleep(60)  # waits on a lost node; SIGTERM's default action ends it
if rc == 75:
    Path(os.environ["RPG_ELASTIC_STATUS"]).write_text(json.dumps({"reason": "node 10.0.0.3 (id cd) lost (X)"}))
sys.exit(0 if rc == "hang" else rc)
"""


def _trainer(tmp_path: Path, rcs: list) -> Path:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    script.with_suffix(".json").write_text(json.dumps(rcs))
    return script


def _calls(script: Path) -> list[list[str]]:
    path = script.with_suffix(".calls")
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _plan(tmp_path: Path, script: Path, low=1, high=2, sizes=(1, 2), pool=(1, 1), gpus=1, restarts=1) -> Plan:
    overrides = [f"trainer.nnodes={high}", f"trainer.n_gpus_per_node={gpus}",
                 f"trainer.default_local_dir={tmp_path / 'ck'}", "trainer.v1.trainer_mode=separate_async"]
    return Plan(low, high, list(sizes), restarts, [sys.executable, str(script), *overrides], *pool)


def _supervisor(plan: Plan, nodes, alive=None, asked: list | None = None, hang_s: float = 60.0) -> Supervisor:
    """A supervisor on a fake cluster: ``nodes(started)`` nodes can hold a rank group (free, or the trainer's own),
    ``alive(started)`` are alive (default: ``nodes``), ``started``: whether the fake trainer has run; the GPUs each
    question asks for are kept in ``asked``."""
    script = Path(plan.argv[1])

    def count(of):
        def ask(gpus, *_):
            if asked is not None:
                asked.append(gpus)
            return of(script.with_suffix(".calls").exists())
        return ask

    cluster = Cluster(count(alive or nodes), count(nodes), lambda _job: True)
    return Supervisor(plan, cluster, {}, settle_s=0, wait_for_nodes_s=0.2, release_timeout_s=0.2, hang_s=hang_s,
                      poll_s=0.05)


@pytest.mark.parametrize("nodes, sizes, want", [(3, (1, 2), 2), (2, (1, 2), 1), (4, (1, 2, 4), 2), (5, (1, 2, 4), 4)])
def test_the_trainer_takes_the_largest_allowed_count_the_nodes_hold_besides_the_pool(tmp_path, capsys, nodes, sizes,
                                                                                       want):
    script = _trainer(tmp_path, [0])
    plan = _plan(tmp_path, script, high=max(sizes), sizes=sizes)
    assert _supervisor(plan, lambda _started: nodes).run() == 0
    (call,) = _calls(script)
    assert f"trainer.nnodes={want}" in call
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "starting on" in x]
    names(line, f"starting on {want} node(s) x 1 GPU(s)", f"NNODES=1:{max(sizes)}", f"allowed {list(sizes)}",
          "restarts left 1", f"{nodes} node(s) with 1 free GPU(s)", "1 kept for the rollout pool",
          "actor_rollout_ref.rollout.nnodes=1", f"{want} for the trainer")


def test_a_node_counts_when_it_holds_a_rank_group_or_a_pool_node_whichever_is_larger(tmp_path, capsys):
    """A node counts when it has the larger of ``trainer.n_gpus_per_node`` and ``rollout.n_gpus_per_node`` free:
    whichever nodes Ray gives the trainer's groups (created first), the nodes left each hold a pool node."""
    for gpus, pool, want in [(4, (2, 8), 8), (8, (1, 2), 8), (2, (0, 0), 2)]:
        asked: list[int] = []
        folder = tmp_path / f"{gpus}-{pool[1]}"
        folder.mkdir()
        script = _trainer(folder, [0])
        assert _supervisor(_plan(folder, script, gpus=gpus, pool=pool), lambda _s: 4, asked=asked).run() == 0
        assert asked and set(asked) == {want}, (gpus, pool, asked)
        assert f"trainer.nnodes={2}" in _calls(script)[0]  # 4 nodes, the pool's kept aside (2 of them, 1, or none)


@pytest.mark.parametrize("low, nodes", [(1, 1), (2, 2)])
def test_too_few_nodes_for_min_with_the_pool_kept_starts_nothing_in_one_line(tmp_path, capsys, low, nodes):
    script = _trainer(tmp_path, [0])
    plan = _plan(tmp_path, script, low=low, sizes=(2,) if low == 2 else (1, 2))
    assert _supervisor(plan, lambda _started: nodes).run() == 1
    assert _calls(script) == []
    line = one_line(capsys.readouterr().out)
    assert line.startswith("rpg.elastic: ")
    names(line, f"fewer than {low + 1} node(s)", f"NNODES={low}:2", f"{low} for the trainer",
          "actor_rollout_ref.rollout.nnodes=1", f"{nodes} counted", f"{plan.sizes}", "nothing started")


def test_a_lost_node_restarts_the_trainer_on_what_is_left_once_the_pool_is_kept(tmp_path, capsys):
    """Three nodes: the trainer on 2, the pool on 1; one lost: the trainer restarts on 1, the pool keeps one."""
    script = _trainer(tmp_path, [ELASTIC_EXIT, 0])
    (tmp_path / "ck" / "global_step_2" / "actor").mkdir(parents=True)
    assert _supervisor(_plan(tmp_path, script), lambda started: 2 if started else 3).run() == 0
    first, second = _calls(script)
    assert "trainer.nnodes=2" in first and "trainer.nnodes=1" in second and "trainer.resume_mode=auto" in second
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "restart 1/1" in x)
    assert "world size 2 x 1 -> 1 x 1" in line and "2 node(s) with 1 free GPU(s): 1 kept for the rollout pool's" \
        in line and "1 for the trainer" in line, line


def test_the_hang_watch_counts_the_pools_nodes(tmp_path, capsys):
    """The trainer on 2 nodes and the pool on 1: with 2 alive (the pool's node, or one of the trainer's, lost) and
    the trainer still running, it waits on the lost node: the supervisor stops it and restarts it on 1 node."""
    script = _trainer(tmp_path, ["hang", 0])
    after = lambda started: 2 if started else 3  # noqa: E731
    assert _supervisor(_plan(tmp_path, script), after, hang_s=0.3).run() == 0
    first, second = _calls(script)
    assert "trainer.nnodes=2" in first and "trainer.nnodes=1" in second
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if "node(s) alive" in x]
    names(line, "2 node(s) alive of the 3", "trainer (2)", "rollout pool (1)", "not stopped")


def test_the_supervisors_command_line_names_the_pool():
    argv = ["--nnodes", "1:2", "--sizes", "1,2", "--max-restarts", "1"]
    plan = parse_args([*argv, "--rollout-nnodes", "2", "--rollout-gpus-per-node", "8", "--", "py", "main.py"])
    assert (plan.pool_nodes, plan.pool_gpus, plan.argv) == (2, 8, ["py", "main.py"])
    assert (parse_args([*argv, "--", "py", "main.py"]).pool_nodes, plan.node_gpus) == (0, 8)
    for bad in (["--rollout-nnodes", "1"], ["--rollout-gpus-per-node", "8"], ["--rollout-nnodes", "-1",
                                                                           "--rollout-gpus-per-node", "-1"]):
        with pytest.raises(SystemExit) as e:
            parse_args([*argv, *bad, "--", "py", "main.py"])
        assert e.value.code == 2


@pytest.mark.distributed  # a composed config: the distributed stage's time, as the launcher tests beside it
def test_an_elastic_separate_async_submission_hands_the_pool_to_the_supervisor(capsys):
    """Accepted, and the supervisor's command names the pool of the composed config, which it keeps aside."""
    from launching import env, launch

    argv = ["run_rpg_7b_ufkl1e-4", "trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=2",
            "actor_rollout_ref.rollout.n_gpus_per_node=8"]
    rc = launch(argv, env(DRY_RUN="1", RAY_ADDRESS="http://127.0.0.1:9", NNODES="1:4"))
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    command = cap.out[cap.out.index("# command:"):cap.out.index("# ----")]
    words = [x.lstrip("#").strip().rstrip("\\").strip() for x in command.splitlines()]  # one word a line
    at = words.index("--max-restarts")
    assert words[at:at + 7] == ["--max-restarts", "3", "--rollout-nnodes", "2", "--rollout-gpus-per-node", "8", "--"], \
        command
    plan = re.search(r'"RPG_NODE_PLAN": "(.*?)"}', command).group(1).replace('\\"', '"')
    assert json.loads(plan) == {"nnodes": "1:4", "sizes": [1, 2, 4], "rollout_nnodes": 2}


def test_the_stop_line_after_a_node_loss_keeps_the_pools_nodes_aside(monkeypatch, tmp_path):
    """The driver's resume command asks for a count the alive nodes hold once the pool's are kept aside (the launch
    puts them in ``NODE_PLAN_ENV``)."""
    from omegaconf import OmegaConf

    from rpg.node_counts import NodeCount, nnodes_for_resume
    from rpg.verl.errors import NODE_PLAN_ENV, RESUME_COMMAND_ENV
    from rpg.verl.main import run_stopped_line

    assert nnodes_for_resume(NodeCount(4, 4, False), [1, 2, 4], 4, reserved=1) == "2"
    assert nnodes_for_resume(NodeCount(2, 4, True), [2, 4], 3, reserved=1) == "2:4"  # MIN left for the trainer
    assert nnodes_for_resume(NodeCount(2, 4, True), [2, 4], 2, reserved=1) is None  # none fits: the command kept
    cfg = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path / "ck"), "logger": ["console"],
                                        "project_name": "p", "experiment_name": "e",
                                        "v1": {"trainer_mode": "separate_async"}}})
    monkeypatch.setenv(RESUME_COMMAND_ENV, "cd /w && NNODES=4 bash x.sh trainer.resume_mode=auto")
    monkeypatch.setenv(NODE_PLAN_ENV, json.dumps({"nnodes": "4", "sizes": [1, 2, 4], "rollout_nnodes": 1}))
    line = run_stopped_line(cfg, "stopped: node 10.0.0.3 lost (X)", ["main_rpg.py"], alive=4)
    assert line.endswith("resume: cd /w && NNODES=2 bash x.sh trainer.resume_mode=auto"), line
