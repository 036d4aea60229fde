"""Elastic node counts without Ray: NNODES=MIN:MAX read, the micro-batches re-split at the same global batch, the
sizes a run may take, the resume command's NNODES, and the supervisor's decisions with a fake cluster and fake
trainers (small Python scripts that exit as the real one does). The loopback run: tests/e2e/test_elastic.py."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from messages import names, one_line

from rpg.node_counts import NodeCount, largest_fit, nnodes_for_resume, parse_nnodes, resized_values, with_nnodes
from rpg.cluster.elastic.cluster import Cluster, counting_cluster, run_nodes
from rpg.cluster.elastic.attempts import (JOB_CONFIG_ENV, Plan, attempt_env, parse_args, set_aside_incomplete,
                                        wandb_run_id)
from rpg.cluster.elastic.supervisor import Supervisor
from rpg.launch.environment import DEFAULT_MAX_RESTARTS, LaunchError, Request
from rpg.verl.checkpoints import MARKER
from rpg.verl.errors import ELASTIC_EXIT, ELASTIC_STATUS_ENV

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("raw, want", [("2", NodeCount(2, 2, False)), (" 1:2 ", NodeCount(1, 2, True)),
                                       ("3:3", NodeCount(3, 3, True))])
def test_nnodes_reads_a_count_or_a_range(raw, want):
    assert parse_nnodes(raw) == want
    assert str(want) == raw.strip()


@pytest.mark.parametrize("raw", ["0", "2:1", "0:2", "a", "1:", ":2", "1:2:3", "-1", "1.5", "1-2"])
def test_nnodes_refuses_anything_else_in_one_line(raw):
    with pytest.raises(ValueError) as e:
        parse_nnodes(raw)
    assert str(e.value).startswith(f"NNODES={raw!r} is invalid") and "\n" not in str(e.value)


def test_the_request_reads_elastic_nnodes_and_the_restart_budget():
    req = Request.read({"NNODES": "1:4"}, ROOT, cluster=True)
    assert (req.nnodes, req.elastic, req.max_restarts) == (4, True, DEFAULT_MAX_RESTARTS)
    assert Request.read({"NNODES": "1:4", "RPG_MAX_RESTARTS": "0"}, ROOT, cluster=True).max_restarts == 0
    assert not Request.read({"NNODES": "2"}, ROOT).elastic
    for env, cluster, says in [({"NNODES": "1:2"}, False, "needs a Ray cluster (RAY_ADDRESS)"),
                               ({"NNODES": "2", "RPG_MAX_RESTARTS": "1"}, True, "applies to an elastic run only"),
                               ({"RPG_MAX_RESTARTS": "1"}, False, "applies to an elastic run only"),
                               ({"NNODES": "1:2", "RPG_MAX_RESTARTS": "-1"}, True, "expected an integer >= 0")]:
        with pytest.raises(LaunchError, match=says.replace("(", r"\(").replace(")", r"\)")):
            Request.read(env, ROOT, cluster=cluster)


def _sequences_per_step(values: dict, micro: str) -> int:
    return values[micro] * values["trainer.nnodes"] * values["trainer.n_gpus_per_node"]


def test_resizing_keeps_the_micro_batches_of_a_smaller_world_and_splits_them_for_a_larger_one():
    # the tiny task at 2 nodes x 1 rank: 64 responses per mini-batch, 32 per rank and micro-batch
    current = {"trainer.nnodes": 2, "trainer.n_gpus_per_node": 1,
               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 32,
               "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 64,
               "actor_rollout_ref.actor.ppo_mini_batch_size": 8, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": None}
    micros = ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu")
    for k in (1, 2):  # a rank's share grows: more micro-batches of the same size (the same memory per GPU)
        changed = resized_values(current, k)
        assert changed["trainer.nnodes"] == k and all(changed[m] == current[m] for m in micros), changed
    changed = resized_values(current, 4)  # a rank's share shrinks: the same sequences per micro-batch step
    after = {**current, **changed}
    for m in micros:
        assert _sequences_per_step(after, m) == _sequences_per_step(current, m)
    assert "actor_rollout_ref.actor.ppo_mini_batch_size" not in changed  # global: never changed
    assert "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu" not in changed  # unset: verl's default
    with pytest.raises(ValueError, match="does not re-split evenly over 3 x 1 ranks"):
        resized_values(current, 3)


def test_the_largest_fitting_size_and_the_resume_commands_nnodes():
    assert largest_fit([1, 2, 4], 3) == 2 and largest_fit([2, 4], 1) is None
    elastic, fixed = NodeCount(2, 4, True), NodeCount(4, 4, False)
    assert nnodes_for_resume(elastic, [2, 4], 3) == "2:4"  # MIN alive: the elastic count as given
    assert nnodes_for_resume(elastic, [2, 4], 1) is None  # nothing fits: the command is kept
    assert nnodes_for_resume(fixed, [1, 2, 4], 3) == "2"
    assert nnodes_for_resume(fixed, [1, 2, 4], 4) == "4"
    cmd = "cd /w && RAY_ADDRESS=http://h:8265 NNODES=4 bash recipe/rpg/7b/x.sh a=1 trainer.resume_mode=auto"
    assert with_nnodes(cmd, "2") == cmd.replace("NNODES=4", "NNODES=2")
    assert with_nnodes("cd /w && bash x.sh trainer.nnodes=4 b=2", "1") == "cd /w && bash x.sh trainer.nnodes=1 b=2"
    assert with_nnodes("cd /w && RAY_ADDRESS=a bash x.sh", "1") == "cd /w && NNODES=1 RAY_ADDRESS=a bash x.sh"
    assert with_nnodes("bash x.sh", "1:2") == "NNODES=1:2 bash x.sh"
    assert with_nnodes("cd /w && A=B NNODES=1:4 bash x.sh", "1:4") == "cd /w && A=B NNODES=1:4 bash x.sh"


def _plan(tmp_path: Path, script: Path, low=1, high=2, sizes=(1, 2), restarts=1, nnodes=2) -> Plan:
    overrides = [f"trainer.nnodes={nnodes}", "trainer.n_gpus_per_node=1", f"trainer.default_local_dir={tmp_path / 'ck'}",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32"]
    return Plan(low, high, list(sizes), restarts, [sys.executable, str(script), *overrides])


def test_the_supervisors_command_line(tmp_path):
    plan = parse_args(["--nnodes", "1:2", "--sizes", "2,1", "--max-restarts", "3", "--", "py", "main.py", "a=1"])
    assert (plan.low, plan.high, plan.sizes, plan.max_restarts, plan.argv) == (1, 2, [1, 2], 3, ["py", "main.py", "a=1"])
    for bad in (["--nnodes", "1:2", "--sizes", "3", "--max-restarts", "1", "--", "py", "m.py"],
                ["--nnodes", "1:2", "--sizes", "1", "--max-restarts", "-1", "--", "py", "m.py"],
                ["--nnodes", "1:2", "--sizes", "1", "--max-restarts", "1", "--"]):
        with pytest.raises(SystemExit) as e:
            parse_args(bad)
        assert e.value.code == 2
    cmd = _plan(tmp_path, Path("main.py")).command(1, resume=True)
    assert "trainer.nnodes=1" in cmd and "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32" in cmd
    assert cmd.count("trainer.resume_mode=auto") == 1 and "trainer.nnodes=2" not in cmd
    assert "trainer.resume_mode=auto" not in _plan(tmp_path, Path("main.py")).command(2, resume=False)


def test_each_attempt_has_its_own_rendezvous_and_the_same_wandb_run_for_its_workers(tmp_path):
    job = {"runtime_env": {"env_vars": {"DIST_INIT_METHOD": "file:///ck/.rendezvous/rpg-1", "A": "b"}},
           "metadata": {"job_submission_id": "rpg-1"}}
    environ = {"DIST_INIT_METHOD": "file:///ck/.rendezvous/rpg-1", JOB_CONFIG_ENV: json.dumps(job)}
    envs = [attempt_env(environ, a, tmp_path / f"s{a}", "run1") for a in (0, 1)]
    workers = [json.loads(e[JOB_CONFIG_ENV])["runtime_env"]["env_vars"] for e in envs]
    assert envs[0]["DIST_INIT_METHOD"] != envs[1]["DIST_INIT_METHOD"]
    assert [w["DIST_INIT_METHOD"] for w in workers] == [e["DIST_INIT_METHOD"] for e in envs]
    assert envs[0]["WANDB_RUN_ID"] == envs[1]["WANDB_RUN_ID"] == workers[1]["WANDB_RUN_ID"] == "run1"
    assert workers[0]["A"] == "b" and envs[1][ELASTIC_STATUS_ENV] == str(tmp_path / "s1")


def test_the_wandb_run_is_kept_while_there_is_a_checkpoint_to_continue(tmp_path):
    plan = _plan(tmp_path, Path("main.py"))
    first = wandb_run_id(plan, {})
    assert wandb_run_id(plan, {}) != first  # no complete checkpoint: a fresh run, a new W&B run
    again = wandb_run_id(plan, {})
    _complete(plan.folder, 2)
    assert wandb_run_id(plan, {}) == again  # a checkpoint to continue: the same W&B run, later jobs too
    assert wandb_run_id(plan, {"WANDB_RUN_ID": "mine"}) == "mine"


def _complete(folder: Path, step: int) -> Path:
    import zipfile

    d = folder / f"global_step_{step}"
    (d / "actor").mkdir(parents=True)
    with zipfile.ZipFile(d / "data.pt", "w") as z:
        z.writestr("x", "y")
    (d / MARKER).write_text(json.dumps({"global_step": step, "files": {}}))
    return d


def test_step_folders_without_their_marker_above_the_last_complete_are_set_aside_not_deleted(tmp_path):
    _complete(tmp_path, 1)
    _complete(tmp_path, 2)
    (tmp_path / "global_step_3" / "actor").mkdir(parents=True)  # a save cut short
    (tmp_path / "global_step_0").mkdir()  # below the last complete one: left as it is
    assert set_aside_incomplete(tmp_path, 1) == ["global_step_3.incomplete-a1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_0", "global_step_1", "global_step_2",
                                                          "global_step_3.incomplete-a1"]


TRAINER = """
import json, os, sys
from pathlib import Path
script = json.loads(Path(sys.argv[0]).with_suffix(".json").read_text())
calls = Path(sys.argv[0]).with_suffix(".calls")
with calls.open("a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
n = len(calls.read_text().splitlines()) - 1
step = script[n]
if step["rc"] == 75:
    Path(os.environ["RPG_ELASTIC_STATUS"]).write_text(json.dumps({"reason": "node 10.0.0.2 (id ab) lost (X)",
        "stop_line": "rpg: stopped: node 10.0.0.2 lost; resume: NNODES=1:2 bash x.sh", "logged_steps": [1, 2, 3]}))
sys.exit(step["rc"])
"""


def _fake_trainer(tmp_path: Path, rcs: list[int]) -> Path:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    script.with_suffix(".json").write_text(json.dumps([{"rc": rc} for rc in rcs]))
    return script


def _calls(script: Path) -> list[list[str]]:
    return [json.loads(x) for x in script.with_suffix(".calls").read_text().splitlines()]


def _supervisor(plan: Plan, alive, free=None, released: bool = True, cluster: Cluster | None = None,
                hang_s: float = 60.0) -> Supervisor:
    """A supervisor of fake trainers on a fake cluster: ``alive`` and ``free`` (default: ``alive``: the nodes that
    can hold the run) are the node counts it reports: a function, or a list answered one per question (the last one
    repeats). The hang watch waits ``hang_s`` (long, unless a test is about it: a fake trainer slow to start on a
    loaded machine is not a hang)."""
    def answers(values):
        if callable(values):
            return values
        left = list(values)
        return lambda *_: left.pop(0) if len(left) > 1 else left[0]

    cluster = cluster or Cluster(answers(alive), answers(alive if free is None else free), lambda _job: released)
    return Supervisor(plan, cluster, {}, settle_s=0, wait_for_nodes_s=0.2, release_timeout_s=0.2, hang_s=hang_s,
                      poll_s=0.05)


def _once_started(script: Path, before: int, after: int):
    """A node count that is ``before`` until the fake trainer has run (written its call), ``after`` from then on: the
    count changes after the trainer started, however slowly it starts."""
    return lambda *_: after if script.with_suffix(".calls").exists() else before


def _free_once_announced(script: Path, before: int = 1, after: int = 2):
    """Free nodes for a grow: ``before`` until the trainer has run, then ``after``, except that the second question
    after that gets no answer (Ray's state API timed out: the grow announced on the first one stays announced); from
    the third on, the file ``<script>.announced`` exists, and the fake trainer waits for it before it saves: the
    checkpoint comes after the announcement, as in a real run, whose checkpoints are minutes apart."""
    asked = []

    def free(*_):
        if not script.with_suffix(".calls").exists():
            return before
        asked.append(after)
        if len(asked) == 2:
            raise TimeoutError("the state API did not answer")
        if len(asked) >= 3:
            script.with_suffix(".announced").touch()
        return after
    return free


HEAD, WORKER, WORKER_BACK = "aa" * 28, "bb" * 28, "cc" * 28  # Ray node ids (hex); a node back has a new id


def _group(state: str, *nodes: str, gpus: float = 1.0) -> dict:
    """A placement group record as ``list_placement_groups(detail=True)`` gives it: one bundle per node ('' while
    pending)."""
    return {"placement_group_id": "pg", "creator_job_id": "01000000", "state": state,
            "bundles": [{"bundle_id": {"bundle_index": i}, "unit_resources": {"CPU": 3.0, "GPU": gpus}, "node_id": n}
                        for i, n in enumerate(nodes)]}


@pytest.mark.parametrize("alive, free, groups, want", [
    # the run restarted on the one node left: before its trainer's groups exist the node is free, after it holds
    # them; one node either way (free + the running trainer's count said 2)
    ([HEAD], {HEAD: {"GPU": 1.0}}, [], 1),
    ([HEAD], {HEAD: {"GPU": 1.0}}, [_group("PENDING", "")], 1),
    ([HEAD], {HEAD: {"GPU": 0.0}}, [_group("CREATED", HEAD)], 1),
    ([HEAD], {HEAD: {"GPU": 1.0}}, [_group("CREATED", HEAD)], 1),  # read as the group is created: still one node
    # the lost node: dead in Ray's node table, its last resource report still there: never counted
    ([HEAD], {HEAD: {"GPU": 0.0}, WORKER: {"GPU": 1.0}}, [_group("CREATED", HEAD)], 1),
    ([HEAD], {HEAD: {"GPU": 0.0}, WORKER: {"GPU": 0.0}}, [_group("RESCHEDULING", HEAD, WORKER)], 1),
    # the node back, free: the run can take both
    ([HEAD, WORKER_BACK], {HEAD: {"GPU": 0.0}, WORKER_BACK: {"GPU": 1.0}}, [_group("CREATED", HEAD)], 2),
    # another job's GPUs are not the run's; a removed group holds nothing
    ([HEAD, WORKER_BACK], {HEAD: {"GPU": 0.0}, WORKER_BACK: {"GPU": 0.0}}, [_group("CREATED", HEAD)], 1),
    ([HEAD], {HEAD: {"GPU": 0.0}}, [_group("REMOVED", HEAD)], 0),
])
def test_each_node_that_can_hold_the_run_is_counted_once(alive, free, groups, want):
    assert run_nodes(alive, free, groups, gpus=1) == want


def test_a_rank_group_of_several_gpus_counts_the_trainers_own_and_the_free_ones_of_a_node():
    two = {HEAD: {"GPU": 1.0}, WORKER: {"GPU": 1.0}}
    assert run_nodes([HEAD, WORKER], two, [_group("CREATED", HEAD)], gpus=2) == 1  # HEAD: 1 free + 1 the trainer's
    assert run_nodes([HEAD, WORKER], two, [], gpus=2) == 0


def test_a_run_restarted_on_the_node_left_sees_no_larger_count_before_its_groups_exist(tmp_path, capsys):
    """Ray's state as it was after a node loss: the worker dead, its last report still in the available resources;
    the new trainer joins Ray (its job id written) and creates its group a few questions later. The supervisor
    counts one node throughout: no grow announced, the trainer runs to its end once."""
    script = tmp_path / "trainer.py"
    script.write_text("""
import json, os, sys, time
from pathlib import Path
calls = Path(sys.argv[0]).with_suffix(".calls")
with calls.open("a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
Path(os.environ["RPG_ELASTIC_STATUS"]).with_suffix(".job").write_text("01000000")
time.sleep(1.0)
""")
    asked = []

    def groups_of(job_id):
        asked.append(job_id)
        return [] if len(asked) < 4 else [_group("CREATED", HEAD)]

    def available():
        return {HEAD: {"GPU": 1.0 if len(asked) < 4 else 0.0}, WORKER: {"GPU": 1.0}}

    nodes = [{"id": HEAD, "ip": "10.0.0.1", "gpus": 1.0}]
    cluster = counting_cluster(lambda: nodes, available, groups_of, lambda _job: True)
    assert _supervisor(_plan(tmp_path, script), [], cluster=cluster).run() == 0
    assert len(_calls(script)) == 1 and set(asked) == {"01000000"} and len(asked) > 4, asked
    out = capsys.readouterr().out
    assert "starting on 1 node(s)" in out and "can hold the run now" not in out, out


def test_a_node_loss_restarts_the_trainer_at_the_size_that_remains(tmp_path, capsys):
    script = _fake_trainer(tmp_path, [ELASTIC_EXIT, 0])
    ck = tmp_path / "ck" / "global_step_2"
    (ck / "actor").mkdir(parents=True)
    assert _supervisor(_plan(tmp_path, script), alive=_once_started(script, 2, 1)).run() == 0
    first, second = _calls(script)
    assert "trainer.nnodes=2" in first and not any(a.startswith("trainer.resume_mode") for a in first)
    assert "trainer.nnodes=1" in second and "trainer.resume_mode=auto" in second
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32" in second  # global batch kept
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "restart 1/1" in x)
    assert "node 10.0.0.2 (id ab) lost (X)" in line and "world size 2 x 1 -> 1 x 1" in line
    assert "restarts left 0" in line and "3 logged step(s) after it trained again [1, 2, 3]" in line


def test_with_the_budget_spent_the_trainers_stop_line_ends_the_run(tmp_path, capsys):
    script = _fake_trainer(tmp_path, [ELASTIC_EXIT])
    assert _supervisor(_plan(tmp_path, script, restarts=0), alive=_once_started(script, 2, 1)).run() == 1
    captured = capsys.readouterr()
    assert "restart budget spent" in captured.out
    line = one_line(captured.err.strip())
    assert line.startswith("rpg: stopped: ")
    names(line, "node 10.0.0.2", "resume: NNODES=1:2 bash x.sh")  # the node lost, the command that resumes
    assert len(_calls(script)) == 1


def test_a_restart_waits_for_the_old_trainers_ray_job_to_be_gone_or_stops(tmp_path, capsys):
    """Never a second trainer beside the first one's workers: a Ray job not gone in time stops the run."""
    script = _fake_trainer(tmp_path, [ELASTIC_EXIT, 0])
    assert _supervisor(_plan(tmp_path, script), alive=_once_started(script, 2, 1), released=False).run() == 1
    captured = capsys.readouterr()
    assert "Ray job was not gone within" in captured.out and "rpg: stopped: node 10.0.0.2 lost" in captured.err
    assert len(_calls(script)) == 1


def test_a_trainer_waiting_on_a_lost_node_is_stopped_and_restarted(tmp_path, capsys):
    """Fewer nodes alive than the trainer runs on, and it does not stop (verl waiting on a placement group or a
    collective): the supervisor stops it and restarts it on what remains, counting a restart."""
    script = tmp_path / "trainer.py"
    script.write_text("""
import json, sys, time
from pathlib import Path
calls = Path(sys.argv[0]).with_suffix(".calls")
with calls.open("a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if len(calls.read_text().splitlines()) == 1:
    time.sleep(60)  # hangs; SIGTERM's default action ends it
""")
    # one node alive once the trainer runs (it holds the run's GPUs: none free); its own nodes free after it stops
    started = _once_started(script, 2, 1)
    assert _supervisor(_plan(tmp_path, script), alive=started, free=started, hang_s=0.3).run() == 0
    first, second = _calls(script)
    assert "trainer.nnodes=2" in first and "trainer.nnodes=1" in second and "trainer.resume_mode=auto" in second
    out = capsys.readouterr().out
    assert "has not stopped (waiting on a lost node): stopping it" in out and "restart 1/1" in out


def test_below_min_the_run_stops_and_other_exits_are_the_trainers_own(tmp_path, capsys):
    script = _fake_trainer(tmp_path, [ELASTIC_EXIT])
    # two nodes until the trainer has run (a slow start of it is not read as a node lost), one after its exit
    nodes = _once_started(script, 2, 1)
    cluster = Cluster(nodes, nodes, lambda _job: True)
    assert _supervisor(_plan(tmp_path, script, low=2, sizes=(2,)), alive=[], cluster=cluster).run() == 1
    assert "fewer than 2 node(s)" in capsys.readouterr().out and len(_calls(script)) == 1
    for rc in (0, 1, 2, 143):  # done, a bug, a refused config, a stop signal: never restarted
        (tmp_path / str(rc)).mkdir()
        script = _fake_trainer(tmp_path / str(rc), [rc])
        assert _supervisor(_plan(tmp_path / str(rc), script), alive=[2]).run() == rc
        assert len(_calls(script)) == 1


def test_nodes_back_grow_the_run_at_the_next_complete_checkpoint(tmp_path, capfd):
    """The trainer runs at 1 node; a second one is free; when a newer complete checkpoint appears the supervisor asks
    the trainer to stop (a grow request, then SIGTERM) and starts it at 2 nodes, resuming; growing costs no restart."""
    script = tmp_path / "trainer.py"
    ck = tmp_path / "ck"
    script.write_text(f"""
import json, os, signal, sys, time, zipfile
from pathlib import Path
calls = Path(sys.argv[0]).with_suffix(".calls")
with calls.open("a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if len(calls.read_text().splitlines()) > 1:
    sys.exit(0)
status = Path(os.environ["RPG_ELASTIC_STATUS"])
def stop(*_):
    print("GROW-REQUEST=" + str(status.with_suffix(".grow").is_file()), flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
while not Path(sys.argv[0]).with_suffix(".announced").exists():
    time.sleep(0.02)
d = Path({str(ck)!r}) / "global_step_1"
(d / "actor").mkdir(parents=True)
with zipfile.ZipFile(d / "data.pt", "w") as z:
    z.writestr("x", "y")
(d / {MARKER!r}).write_text(json.dumps({{"global_step": 1, "files": {{}}}}))
time.sleep(60)
sys.exit(1)
""")
    plan = _plan(tmp_path, script, restarts=0, nnodes=2)
    assert _supervisor(plan, alive=[2], free=_free_once_announced(script)).run() == 0
    first, second = _calls(script)
    assert "trainer.nnodes=1" in first and "trainer.nnodes=2" in second and "trainer.resume_mode=auto" in second
    out = capfd.readouterr().out
    assert "GROW-REQUEST=True" in out and out.count("growing at the next checkpoint") == 1, out
    assert "grown at a checkpoint: world size 1 x 1 -> 2 x 1" in out


LAST_STEP_TRAINER = """
import json, sys, time, zipfile
from pathlib import Path
sys.path.insert(0, {root!r})
from rpg.verl.checkpoints import write_marker
calls = Path(sys.argv[0]).with_suffix(".calls")
with calls.open("a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if len(calls.read_text().splitlines()) > 1:
    sys.exit(0)
while not Path(sys.argv[0]).with_suffix(".announced").exists():
    time.sleep(0.02)
d = Path({ck!r}) / "global_step_{step}"
(d / "actor").mkdir(parents=True)
with zipfile.ZipFile(d / "data.pt", "w") as z:
    z.writestr("x", "y")
write_marker(d, {step}, None, last_step={last})
time.sleep({wait})  # verl validates and logs the last step after saving it (a grow stops it before)
"""


@pytest.mark.parametrize("step, last, grows", [(1, 2, True), (2, 2, False)])
def test_no_grow_once_the_last_step_is_saved(tmp_path, capsys, step, last, grows):
    """A second node frees up while the trainer runs at 1: a checkpoint before the run's last step grows the run;
    the last step's checkpoint does not (the trainer only validates and ends: stopping it would only log and
    validate that step again on more nodes)."""
    script = tmp_path / "trainer.py"
    script.write_text(LAST_STEP_TRAINER.format(root=str(ROOT), ck=str(tmp_path / "ck"), step=step, last=last,
                                               wait=60 if grows else 1.5))
    assert _supervisor(_plan(tmp_path, script, restarts=0), alive=[2], free=_free_once_announced(script)).run() == 0
    calls = _calls(script)
    out = capsys.readouterr().out
    assert out.count("growing at the next checkpoint") == 1, out
    if grows:
        assert len(calls) == 2 and "trainer.nnodes=2" in calls[1], out
        assert "grown at a checkpoint: world size 1 x 1 -> 2 x 1" in out
    else:
        assert len(calls) == 1 and "grown" not in out, out
        line = [x for x in out.splitlines() if "can hold the run" in x][-1]  # after "growing at the next checkpoint"
        names(line, "2 node(s)", "runs on 1", "global_step_2", "ends on 1")


# ----------------------------------------------------------------------------- the launcher


def _launch(capsys, *argv: str, **env: str):
    from launching import env as _env, launch

    rc = launch(list(argv), _env(DRY_RUN="1", RAY_ADDRESS="http://127.0.0.1:9", **env))
    cap = capsys.readouterr()
    return rc, [x for x in cap.err.splitlines() if x.startswith("rpg.launch: ")], cap.out


PAPER = "run_rpg_7b_ufkl1e-4"


CLUSTER_STAGE = pytest.mark.distributed  # a composed config each, or a Ray of its own: the distributed stage's time


@CLUSTER_STAGE
def test_an_elastic_submission_runs_the_supervisor_with_the_counts_that_keep_the_global_batch(capsys):
    rc, err, out = _launch(capsys, PAPER, NNODES="1:4", RPG_MAX_RESTARTS="2")
    assert rc == 0, err
    skipped = [x for x in err if "NNODES=1:4: 3 node(s) skipped" in x]
    assert len(skipped) == 1 and "24 data-parallel ranks" in skipped[0], err  # 32 x 16 responses over 24 ranks
    command = out[out.index("# command:"):out.index("# ----")]
    words = [x.lstrip("#").strip().rstrip("\\").strip() for x in command.splitlines()]  # one word a line
    at = next(i for i, w in enumerate(words) if w.endswith("rpg.cluster.elastic"))
    assert words[at + 1:at + 5] == ["--nnodes", "1:4", "--sizes", "1,2,4"], command
    at = words.index("--max-restarts")
    assert words[at:at + 3] == ["--max-restarts", "2", "--"], command
    plan = re.search(r'"RPG_NODE_PLAN": "(.*?)"}', command).group(1).replace('\\"', '"')
    assert json.loads(plan) == {"nnodes": "1:4", "sizes": [1, 2, 4]}
    rc, err, out = _launch(capsys, PAPER, NNODES="2")  # a fixed count: the counts a stop line may ask for
    assert rc == 0 and "rpg.cluster.elastic" not in out
    assert '{\\"nnodes\\": \\"2\\", \\"sizes\\": [1, 2]}' in out


@CLUSTER_STAGE
@pytest.mark.parametrize("env, argv, says", [
    ({"NNODES": "3:3"}, [], "NNODES=3:3: no node count in it runs this run at its global batch (3: "),
    ({"NNODES": "1:2"}, ["trainer.nnodes=2"], "both set the node count"),
    ({"NNODES": "1:2"}, ["trainer.save_freq=-1"], "trainer.save_freq=-1 saves none"),
    ({"NNODES": "1:2"}, ["algorithm.adv_estimator=gae", "critic.enable=true"], "its checkpoint is not resharded"),
    ({"NNODES": "1:2"}, ["actor_rollout_ref.actor.strategy=fsdp"], "only fsdp2 checkpoints load at another world"),
])
def test_what_an_elastic_run_cannot_do_is_refused_before_it_is_queued(capsys, env, argv, says):
    rc, err, _ = _launch(capsys, PAPER, *argv, **env)
    refusals = [x for x in err if "warning" not in x]
    assert rc == 2 and len(refusals) == 1 and says in refusals[0], err


@CLUSTER_STAGE
def test_a_colocate_async_run_is_elastic_too(capsys):
    """Asynchronous runs resume (docs/verl-integration.md#resume-of-an-asynchronous-run), so an elastic colocate_async
    run restarts from its last checkpoint like a sync one (tests/e2e/test_elastic.py runs one; separate_async:
    tests/cluster/test_elastic_pool.py)."""
    rc, err, out = _launch(capsys, PAPER, "trainer.v1.trainer_mode=colocate_async", NNODES="1:4")
    assert rc == 0, err
    assert "rpg.cluster.elastic \\\n#   --nnodes \\\n#   1:4" in out, out[-3000:]


FOLLOWER = """
import signal, sys
from rpg.cluster.job import follow
sys.exit(follow([{tail!r}], {{}}, "http://127.0.0.1:9", "rpg-x", {detach}))
"""
TAIL = """#!{python}
import sys, time
from pathlib import Path
calls = Path({calls!r})
with calls.open("a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
t0 = time.time()
while sys.argv[1:2] != ["job"] and time.time() - t0 < 60:  # the tail: ends when the job is stopped
    time.sleep(0.1)
    if "job stop" in calls.read_text():
        break
"""


@pytest.mark.parametrize("detach", [True, False])
def test_a_closed_terminal_stops_following_an_elastic_job_but_not_the_job(tmp_path, detach):
    """``follow`` on SIGHUP: an elastic job goes on (only its tail ends); a fixed one is stopped (``ray job stop``).
    The fake ``ray`` records its arguments: the follower runs it as the tail, and as ``ray job stop``."""
    import signal
    import subprocess
    import time

    calls, ray = tmp_path / "calls", tmp_path / "ray"
    ray.write_text(TAIL.format(python=sys.executable, calls=str(calls)))
    ray.chmod(0o755)
    code = FOLLOWER.format(tail=str(ray), detach="(signal.SIGHUP,)" if detach else "()")
    follower = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=ROOT)
    t0 = time.time()
    while not calls.exists() and time.time() - t0 < 30:
        time.sleep(0.1)
    t_signal = time.time()
    follower.send_signal(signal.SIGHUP)
    _, err = follower.communicate(timeout=60)
    assert follower.returncode == 128 + signal.SIGHUP, err
    stopped = any(line.startswith("job stop") for line in calls.read_text().splitlines())
    assert stopped is not detach and time.time() - t_signal < 30, calls.read_text()
    if detach:
        assert "stopped following job rpg-x, which goes on" in err and "ray job stop stops it" in err, err


# ----------------------------------------------------------------------------- the driver


def test_the_stop_line_after_a_node_loss_asks_for_a_count_the_cluster_holds(monkeypatch, tmp_path):
    from omegaconf import OmegaConf

    from rpg.verl.errors import NODE_PLAN_ENV, RESUME_COMMAND_ENV
    from rpg.verl.main import run_stopped_line

    cfg = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path / "ck"), "logger": ["console"],
                                        "project_name": "p", "experiment_name": "e", "v1": {"trainer_mode": "sync"}}})
    monkeypatch.setenv(RESUME_COMMAND_ENV, "cd /w && RAY_ADDRESS=http://h:8265 NNODES=4 bash x.sh trainer.resume_mode=auto")
    monkeypatch.setenv(NODE_PLAN_ENV, json.dumps({"nnodes": "4", "sizes": [1, 2, 4]}))
    line = run_stopped_line(cfg, "stopped: node 10.0.0.3 lost (X)", ["main_rpg.py"], alive=3)
    assert line.endswith("resume: cd /w && RAY_ADDRESS=http://h:8265 NNODES=2 bash x.sh trainer.resume_mode=auto"), line
    assert "NNODES=4" in run_stopped_line(cfg, "stopped by SIGTERM", ["main_rpg.py"])  # no node lost: as submitted
    monkeypatch.setenv(NODE_PLAN_ENV, json.dumps({"nnodes": "2:4", "sizes": [2, 4]}))
    monkeypatch.setenv(RESUME_COMMAND_ENV, "cd /w && NNODES=2:4 bash x.sh trainer.resume_mode=auto")
    assert "NNODES=2:4 bash" in run_stopped_line(cfg, "stopped: node lost", ["m.py"], alive=2)
    assert "NNODES=2:4 bash" in run_stopped_line(cfg, "stopped: node lost", ["m.py"], alive=1)  # none fits: kept


LOCK = """
import json, os, sys
import ray
from rpg.config import RPGConfigError
from rpg.verl import folder_lock
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
folder = sys.argv[1]
out = {}
actor, token = folder_lock.acquire(folder, "the first driver")
try:
    folder_lock.acquire(folder, "the second driver")
except RPGConfigError as e:
    out["second"] = str(e)
out["parent"] = folder_lock.held_by_parent(folder, {folder_lock.TOKEN_ENV: token})
out["stranger"] = folder_lock.held_by_parent(folder, {folder_lock.TOKEN_ENV: "0" * 32})
out["other_folder"] = folder_lock.holder(folder + "-other") is None
ray.kill(actor)
import time
t0 = time.time()
while folder_lock.holder(folder) is not None and time.time() - t0 < 30:
    time.sleep(0.2)
actor2, _ = folder_lock.acquire(folder, "a later driver")
out["again"] = folder_lock.holder_record(folder)["who"]
print("LOCK=" + json.dumps(out))
"""


@CLUSTER_STAGE
def test_one_writer_per_checkpoint_folder(tmp_path):
    """A second holder of a folder is refused in one line naming the first; the token tells a supervisor's own trainer
    from a stranger; a holder gone frees the folder."""
    import subprocess

    import os

    from rpg.backends.run_env import RUN_ENV, ray_auth_env

    env = {**os.environ, **RUN_ENV, **ray_auth_env({})}  # a private Ray on loopback, with a token of its own
    r = subprocess.run([sys.executable, "-c", LOCK, str(tmp_path / "ck")], capture_output=True, text=True, timeout=180,
                       cwd=ROOT, env=env)
    line = next((x for x in r.stdout.splitlines() if x.startswith("LOCK=")), None)
    assert line is not None, r.stderr[-3000:]
    out = json.loads(line[len("LOCK="):])
    assert out["second"].startswith(f"trainer.default_local_dir={tmp_path / 'ck'} is being written by another run "
                                    "(the first driver)"), out
    assert (out["parent"], out["stranger"], out["other_folder"], out["again"]) == (True, False, True, "a later driver")
