"""The multi-node pieces without a cluster: the driver's capacity rule, lost-node reason and node watch
(rpg.verl.joined_cluster), a step saved but never logged (rpg.metrics_log.history), the CPU backend's job on a cluster
and the submitted job's resume command and Ctrl-C (rpg.cluster.submit, rpg.cluster.job). The two-node runs:
tests/e2e/test_multinode.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launching import recipe_main
from messages import names, one_line

from rpg.metrics_log import history
from rpg.verl import joined_cluster as C

ROOT = Path(__file__).resolve().parents[2]
NODE = lambda i, gpus=1.0: {"id": f"{i:02d}" * 28, "ip": f"10.0.0.{i}", "gpus": gpus}  # noqa: E731


@pytest.mark.parametrize("nodes,nnodes,gpus,ok", [
    ([NODE(1), NODE(2)], 2, 1, True),
    ([NODE(1, 8), NODE(2, 8)], 2, 8, True),
    ([NODE(1), NODE(2)], 4, 1, False),  # too few nodes and GPUs
    ([NODE(1, 16)], 2, 8, False),  # enough GPUs in all, one node: verl places one group per node
    ([NODE(1, 8), NODE(2, 4)], 2, 8, False),  # a node with fewer GPUs than a group
    ([NODE(1, 8), NODE(2, 4), NODE(3, 8)], 2, 8, True),
    ([NODE(1, 0), NODE(2), NODE(3)], 2, 1, True),  # a CPU-only head: its node does not count
])
def test_capacity_rule_counts_nodes_that_hold_a_group(nodes, nnodes, gpus, ok):
    problem = C.capacity_problem(nodes, nnodes, gpus)
    assert (problem is None) == ok, problem
    if not ok:
        assert problem.startswith(f"trainer.nnodes={nnodes} x trainer.n_gpus_per_node={gpus} = {nnodes * gpus} ranks")
        assert f"the cluster has {len(nodes)} alive node(s)" in problem and "\n" not in problem


def test_joined_cluster_is_read_from_ray_address_or_the_config():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"ray_kwargs": {"ray_init": {}}})
    assert not C.joined_cluster(cfg, {}) and C.joined_cluster(cfg, {"RAY_ADDRESS": "127.0.0.1:6379"})
    assert C.joined_cluster(OmegaConf.create({"ray_kwargs": {"ray_init": {"address": "auto"}}}), {})


class _Wrapped(Exception):  # how Ray hands a task's error to the driver: RayTaskError(..).cause
    def __init__(self, cause):
        super().__init__("task failed")
        self.cause = cause


def test_lost_reason_names_the_nodes_gone_since_the_start(monkeypatch):
    import ray.exceptions as rx

    run = C.ClusterRun(None)
    run.start_nodes = [NODE(1), NODE(2)]
    monkeypatch.setattr(C, "alive_nodes", lambda: [NODE(1)])
    err = _Wrapped(rx.ActorDiedError())
    assert run.lost_reason(err, wait_s=0) == f"node 10.0.0.2 (id {NODE(2)['id'][:12]}) lost (ActorDiedError)"
    # verl's own error for a replica lost mid-rollout: a node gone is a node loss whatever the error
    replay = RuntimeError("Sync replay buffer selected terminal groups with no materializable trajectories.")
    assert run.lost_reason(_Wrapped(replay), wait_s=0) == f"node 10.0.0.2 (id {NODE(2)['id'][:12]}) lost (_Wrapped)"
    monkeypatch.setattr(C, "alive_nodes", lambda: [NODE(1), NODE(2)])  # a worker died, every node alive
    assert run.lost_reason(err, wait_s=0) == "a process of the run lost (ActorDiedError)"
    assert run.lost_reason(_Wrapped(ValueError("a bug")), wait_s=0) is None  # not ours: the traceback stays


class _Alive:
    """The alive nodes read by the node watch: ``readings`` in turn, then the last one for ever; a reading that is an
    exception is raised (the GCS gone)."""

    def __init__(self, *readings):
        self.readings, self.calls = list(readings), 0

    def __call__(self):
        self.calls += 1
        reading = self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]
        if isinstance(reading, BaseException):
            raise reading
        return reading


def _watch(alive, held=lambda: {NODE(2)["id"]}):
    stops = []
    return C.NodeWatch([NODE(1), NODE(2), NODE(3)], held, lambda: stops.append(1), alive=alive), stops


def test_the_node_watch_stops_the_trainer_once_when_a_node_holding_part_of_the_run_is_lost(capsys):
    watch, stops = _watch(_Alive([NODE(1), NODE(2), NODE(3)], [NODE(1), NODE(2), NODE(3)], [NODE(1), NODE(3)]))
    assert watch.check() and watch.check() and not stops and capsys.readouterr().err == ""  # all alive: nothing
    assert not watch.check() and stops == [1]  # node 2 gone, it held part of the run: stopped, the watch ends
    assert capsys.readouterr().err == (f"rpg: node 10.0.0.2 (id {NODE(2)['id'][:12]}) lost and it held part of this "
                                       "run: stopping the trainer\n")


def test_the_node_watch_goes_on_when_the_lost_node_held_nothing_of_the_run(capsys):
    watch, stops = _watch(_Alive([NODE(1), NODE(2)], [NODE(1), NODE(2)], [NODE(1)]))  # node 3 then node 2 lost
    assert watch.check() and not stops
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"rpg: node 10.0.0.3 (id {NODE(3)['id'][:12]}) ")
    names(line, "held nothing", "goes on")
    assert watch.check() and capsys.readouterr().err == ""  # node 3 judged once
    assert not watch.check() and stops == [1] and "10.0.0.2" in capsys.readouterr().err


def test_the_node_watch_stops_the_trainer_when_ray_cannot_say_what_the_node_held(capsys):
    def state_api_down():
        raise ConnectionError("the dashboard does not answer")

    watch, stops = _watch(_Alive([NODE(1), NODE(3)]), held=state_api_down)
    assert not watch.check() and stops == [1]
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"rpg: node 10.0.0.2 (id {NODE(2)['id'][:12]}) ")
    names(line, "ConnectionError: the dashboard does not answer", "stopping the trainer")


def test_the_node_watch_ends_quietly_when_the_gcs_is_gone_or_it_is_stopped(monkeypatch, capsys):
    watch, stops = _watch(_Alive(ConnectionError("GCS gone")))
    assert not watch.check() and not stops
    alive = _Alive([NODE(1), NODE(2), NODE(3)], [NODE(1)])
    watch, stops = _watch(alive)
    watch.stop()  # before the thread's first reading
    watch.begin()
    watch._thread.join(timeout=5)
    assert not watch._thread.is_alive() and alive.calls == 0
    monkeypatch.setattr(C, "WATCH_POLL_S", 0.01)  # the thread: two readings, the second finds node 2 lost
    watch, stops = _watch(_Alive([NODE(1), NODE(2), NODE(3)], [NODE(1), NODE(3)]))
    watch.begin()._thread.join(timeout=5)
    assert stops == [1] and not watch._thread.is_alive()
    watch, stops = _watch(_Alive([NODE(1)]))  # stopped while it asked Ray what the lost node held: no trainer stop
    watch.held = lambda: (watch._stop.set(), {NODE(2)["id"]})[1]
    assert not watch.check() and not stops
    assert "10.0.0.2" in capsys.readouterr().err  # only the first thread's line


def test_the_node_watch_runs_only_on_a_joined_cluster_of_several_nodes(monkeypatch):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"ray_kwargs": {"ray_init": {}}})
    run = C.ClusterRun(cfg)
    run.start_nodes = [NODE(1), NODE(2)]
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert run.node_watch("01000000", lambda: None) is None  # a private Ray: one machine
    monkeypatch.setenv("RAY_ADDRESS", "http://10.0.0.1:8265")
    run.start_nodes = [NODE(1)]
    assert run.node_watch("01000000", lambda: None) is None
    run.start_nodes = [NODE(1), NODE(2)]
    monkeypatch.setattr(C, "WATCH_POLL_S", 3600.0)
    watch = run.node_watch("01000000", lambda: None)
    assert watch is not None and watch._thread.is_alive()
    watch.stop()
    assert not watch._thread.is_alive()


def test_the_driver_stops_a_trainer_waiting_on_a_lost_node_with_the_stop_line(monkeypatch, capsys, tmp_path):
    """verl's TaskRunner waits for a lost node's groups for ever (``run_ppo``'s ``ray.get`` has no timeout): the
    driver's node watch kills it by name (its ``ray.get`` then raises ``ActorDiedError``) and the driver prints the
    stop line naming the node. Ray is faked: ``run_ppo`` runs Ray's post-init hooks, then blocks until the trainer is
    killed (at most 10 s: without the watch the test fails instead of hanging)."""
    import threading

    import ray
    import ray.exceptions as rx
    from ray._private import worker as ray_worker
    from recipe_config import compose_cfg

    import rpg.verl.main as driver

    killed, names = threading.Event(), []
    others = list(ray_worker._post_init_hooks)  # Ray's own (usage stats: they need a running Ray)
    alive = _Alive([NODE(1), NODE(2)], [NODE(1), NODE(2)], [NODE(1)])

    def run_ppo(config, task_runner_class):
        names.append(task_runner_class._default_options.get("name"))
        for hook in [h for h in ray_worker._post_init_hooks if h not in others]:  # the driver's own
            hook()
        if not killed.wait(10):
            raise AssertionError("the TaskRunner was never stopped: the driver waits for ever")
        raise rx.ActorDiedError()

    def kill(handle, no_restart):
        assert handle == ("actor", names[0]) and no_restart
        killed.set()

    def checks(run):
        run.start_nodes = alive()

    monkeypatch.setenv("RAY_ADDRESS", "http://10.0.0.1:8265")
    monkeypatch.setattr(C, "WATCH_POLL_S", 0.05)
    monkeypatch.setattr(C, "alive_nodes", alive)
    monkeypatch.setattr(C, "job_nodes", lambda job_id: {NODE(2)["id"]} if job_id == "02000000" else set())
    monkeypatch.setattr(C.ClusterRun, "checks_after_ray_init", checks)
    monkeypatch.setattr(driver, "hold_checkpoint_folder", lambda config: [])
    monkeypatch.setattr(driver, "prepare_config", lambda config: None)
    monkeypatch.setattr(driver, "run_ppo", run_ppo)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: type("Ctx", (), {"get_job_id": lambda self: "02000000"})())
    monkeypatch.setattr(ray, "get_actor", lambda name: ("actor", name))
    monkeypatch.setattr(ray, "kill", kill)
    monkeypatch.setattr(sys, "argv", ["main_rpg.py", "trainer.v1.trainer_mode=sync"])
    monkeypatch.chdir(tmp_path)
    cfg = compose_cfg("trainer.default_local_dir=ckpt")
    t0 = time.time()
    with pytest.raises(SystemExit) as code:
        recipe_main(cfg)
    err = capsys.readouterr().err.strip().splitlines()
    node = f"node 10.0.0.2 (id {NODE(2)['id'][:12]}) lost"
    assert code.value.code == 1 and killed.is_set() and time.time() - t0 < 10, err
    assert names[0].startswith("rpg_task_runner_") and len(names[0]) == len("rpg_task_runner_") + 8
    assert err[0] == f"rpg: {node} and it held part of this run: stopping the trainer", err
    assert len(err) == 2 and err[1].startswith(f"rpg: stopped: {node} (ActorDiedError); Ray shut down; "), err


def test_a_step_saved_but_never_logged_is_logged_on_resume(tmp_path):
    base = tmp_path / "logs" / "rpg" / "run.jsonl"
    base.parent.mkdir(parents=True)
    base.write_text("".join(json.dumps({"step": s, "data": {"training/global_step": s, "actor/loss": 0.1 * s}}) + "\n"
                            for s in (1, 2)))
    ckpt = tmp_path / "ck" / "global_step_3"
    ckpt.mkdir(parents=True)
    import numpy as np

    history.write_step_record(ckpt, 3, {"actor/loss": np.float64(0.3), "flag": True, "text": "x"})
    note = history.restore_step_record(base, ckpt)
    assert note and "step 3 was saved but its metrics were never logged" in note
    seg = history.segment_path(base, 2)
    assert json.loads(seg.read_text()) == {"step": 3, "data": {"actor/loss": 0.3, "training/global_step": 3.0}}
    assert history.logged_training_steps(base) == {1, 2, 3}
    assert history.restore_step_record(base, ckpt) is None  # logged now: never twice
    step2 = tmp_path / "ck" / "global_step_2"
    step2.mkdir()
    history.write_step_record(step2, 2, {})
    assert history.restore_step_record(base, step2) is None  # step 2 was logged by the run itself
    assert history.restore_step_record(base, tmp_path / "ck" / "missing") is None


def test_cpu_overrides_for_a_cluster_job_carry_no_private_ray_resources():
    from rpg.backends.cpu.env_overrides import cluster_job_env, cpu_env, cpu_overrides

    ov = cpu_overrides(cpu_env(base={}), 2, 1, joins_cluster=True)
    assert "trainer.nnodes=2" in ov and "trainer.n_gpus_per_node=1" in ov
    assert not [o for o in ov if "ray_kwargs" in o]  # ray.init refuses resources when it connects; env via the job
    local = cpu_overrides(cpu_env(base={}), 2, 1)
    assert [o for o in local if "ray_init.num_gpus" in o] and [o for o in local if "runtime_env.env_vars" in o]
    env = cluster_job_env({}, "file:///shared/ck/.rendezvous/x")
    assert env["VERL_PLATFORM"] == "cpu" and env["DIST_INIT_METHOD"] == "file:///shared/ck/.rendezvous/x"
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in env  # the nodes' addresses are theirs
    assert cluster_job_env({"DIST_INIT_METHOD": "tcp://h:1"}, "file:///x")["DIST_INIT_METHOD"] == "tcp://h:1"


def _stub_ray(tmp_path: Path, submit_sleeps: float = 0.0) -> tuple[Path, Path]:
    """A `ray` that records each call (one JSON line) and answers the job API check; `job submit` (the tail of a
    job) lasts ``submit_sleeps`` seconds, or until `job stop` is called, as a stopped job's tail ends."""
    bin_dir, record, stopped = tmp_path / "bin", tmp_path / "calls.jsonl", tmp_path / "stopped"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text(
        f"#!{sys.executable}\nimport json, os, sys, time\n"
        f"open({str(record)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"if sys.argv[1:3] == ['job', 'stop']:\n    open({str(stopped)!r}, 'w').close()\n"
        f"t0 = time.time()\n"
        f"while sys.argv[1:3] == ['job', 'submit'] and time.time() - t0 < {submit_sleeps} "
        f"and not os.path.exists({str(stopped)!r}):\n    time.sleep(0.1)\n")
    (bin_dir / "ray").chmod(0o755)
    return bin_dir, record


def _calls(record: Path) -> list[list[str]]:
    return [json.loads(x) for x in record.read_text().splitlines()] if record.exists() else []


def _launch_env(bin_dir: Path, **kw: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RPG_")) and k not in (
        "DRY_RUN", "NNODES", "N_GPUS_PER_NODE", "CKPTS_DIR", "OUT_DIR", "LOGGER")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHON=sys.executable, **kw)
    return env


def test_a_cpu_backend_job_is_submitted_with_its_environment_and_resume_command(tmp_path):
    bin_dir, record = _stub_ray(tmp_path)
    env = _launch_env(bin_dir, RPG_BACKEND="cpu", RAY_ADDRESS="http://127.0.0.1:8265", NNODES="2",
                      N_GPUS_PER_NODE="1", CKPTS_DIR=str(tmp_path / "ck"))
    p = subprocess.run(["bash", str(ROOT / "recipe/rpg/7b/run_rpg_7b_ufkl1e-4.sh"), "trainer.save_freq=1"],
                       env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    submit = [c for c in _calls(record) if c[:2] == ["job", "submit"]]
    assert len(submit) == 1, _calls(record)
    args = submit[0]
    sid = args[args.index("--submission-id") + 1]
    job_env = json.loads(args[args.index("--runtime-env-json") + 1])["env_vars"]
    assert job_env["VERL_PLATFORM"] == "cpu" and job_env["DIST_INIT_METHOD"] == f"file://{tmp_path}/ck/.rendezvous/{sid}"
    assert job_env["RPG_RESUME_COMMAND"].endswith(
        "bash recipe/rpg/7b/run_rpg_7b_ufkl1e-4.sh trainer.save_freq=1 trainer.resume_mode=auto")
    assert "RPG_BACKEND=cpu" in job_env["RPG_RESUME_COMMAND"] and "NNODES=2" in job_env["RPG_RESUME_COMMAND"]
    entry = args[args.index("--") + 1:]
    assert "trainer.device=cpu" in entry and "trainer.nnodes=2" in entry and "trainer.n_gpus_per_node=1" in entry
    assert f"trainer.default_local_dir={tmp_path}/ck" in entry
    assert not [o for o in entry if "ray_init.num_gpus" in o or "ray_init.num_cpus" in o or "_temp_dir" in o]
    # Ray refuses a job whose runtime env and the driver's ray.init runtime env share a variable
    init_vars = {o.split("=", 1)[0].rsplit(".", 1)[1] for o in entry if "ray_init.runtime_env.env_vars." in o}
    assert not init_vars & set(job_env)


def test_ctrl_c_while_waiting_for_a_job_stops_the_job(tmp_path):
    bin_dir, record = _stub_ray(tmp_path, submit_sleeps=120)
    env = _launch_env(bin_dir, RAY_ADDRESS="http://127.0.0.1:8265", RAY_JOB_WAIT="1", DATA_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "rpg.cluster", "run_grpo_7b"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    t0 = time.time()
    while not any(c[:2] == ["job", "submit"] for c in _calls(record)):
        assert proc.poll() is None and time.time() - t0 < 120, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    sid = next(c for c in _calls(record) if c[:2] == ["job", "submit"])
    sid = sid[sid.index("--submission-id") + 1]
    assert ["job", "stop", "--address", "http://127.0.0.1:8265", sid] in _calls(record)
    assert f"rpg.launch: stopped by SIGINT: job {sid} stopped" in err and "Traceback" not in err


def test_a_fresh_cpu_job_over_another_runs_checkpoints_is_refused_before_submitting(tmp_path):
    bin_dir, record = _stub_ray(tmp_path)
    (tmp_path / "ck" / "global_step_2").mkdir(parents=True)
    env = _launch_env(bin_dir, RPG_BACKEND="cpu", RAY_ADDRESS="http://127.0.0.1:8265", CKPTS_DIR=str(tmp_path / "ck"))
    p = subprocess.run([sys.executable, "-m", "rpg.cluster", "run_rpg_7b_ufkl1e-4"], env=env, capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 2 and not [c for c in _calls(record) if c[:2] == ["job", "submit"]]
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith(f"rpg.launch: {tmp_path / 'ck'} already holds a run (checkpoints ")
    assert "CKPTS_DIR=... or EXP_NAME=..." in line and "trainer.resume_mode=auto" in line
    p = subprocess.run([sys.executable, "-m", "rpg.cluster", "run_rpg_7b_ufkl1e-4", "trainer.resume_mode=auto"],
                       env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]  # continuing it is submitted


def test_the_driver_removes_its_rendezvous_file_but_never_one_that_was_there_before(tmp_path, monkeypatch):
    """The ``file://`` rendezvous the ranks create is removed when the driver ends; a file a user's
    ``DIST_INIT_METHOD`` names that existed before the run is not the run's and is kept."""
    from rpg.verl.main import _removed

    mine, theirs = tmp_path / "torch_dist_store", tmp_path / "notes.txt"
    theirs.write_text("a user's own file\n")
    monkeypatch.setenv("DIST_INIT_METHOD", f"file://{mine}")
    with _removed(C.rendezvous_file()):
        mine.write_text("the ranks' keys")  # torch's FileStore, made by the ranks
    monkeypatch.setenv("DIST_INIT_METHOD", f"file://{theirs}")
    with _removed(C.rendezvous_file()):
        pass
    assert not mine.exists() and theirs.read_text() == "a user's own file\n"
