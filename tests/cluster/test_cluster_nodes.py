"""A run on a real cluster, what a loopback test cannot show: the job's stop time, the folders and files
every node must see. Mechanisms are tested on this machine; Ray's own code is called where it
decides (the supervisor's runtime env), its installed source read where only its process does (the stop wait)."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import pytest
from messages import names, one_line

from launching import planned

from rpg.cluster.submit import STOP_WAIT_S, STOP_WAIT_VAR, Job, ray_command
from rpg.launch.environment import LaunchError, Request

ROOT = Path(__file__).resolve().parents[2]


def _job_env_vars(**env) -> dict:
    env = {"PATH": os.environ.get("PATH", ""), "RAY_ADDRESS": "http://127.0.0.1:8265", **env}
    ov = planned("run_grpo_7b", env, cluster=True)
    cmd = ray_command(ov, Request.read(env, ROOT, ROOT, cluster=True), Job.read(env), {})
    return json.loads(cmd[cmd.index("--runtime-env-json") + 1])["env_vars"]


def test_a_job_gives_its_driver_time_to_print_its_stop_line():
    """``ray job stop``: SIGTERM, then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S (Ray's default 3 s); the job's runtime
    env sets it, Ray's job manager hands the job's variables to the supervisor, whose stop reads it from its env."""
    from ray.dashboard.modules.job.job_manager import JobManager
    from ray.dashboard.modules.job.job_supervisor import JobSupervisor

    env_vars = _job_env_vars()
    assert env_vars[STOP_WAIT_VAR] == str(STOP_WAIT_S) and STOP_WAIT_S > JobSupervisor.DEFAULT_RAY_JOB_STOP_WAIT_TIME_S
    supervisor_env = JobManager._get_supervisor_runtime_env(JobManager.__new__(JobManager), {"env_vars": env_vars},
                                                            "raysubmit_test", False)
    assert supervisor_env["env_vars"][STOP_WAIT_VAR] == str(STOP_WAIT_S)
    stop = inspect.getsource(JobSupervisor.run)
    assert 'os.environ.get(\n                                "RAY_JOB_STOP_WAIT_TIME_S"' in stop  # Ray 2.60's read


def test_a_stop_wait_the_user_exported_is_passed_on_and_a_bad_one_refused():
    assert _job_env_vars(RAY_JOB_STOP_WAIT_TIME_S="300")[STOP_WAIT_VAR] == "300"
    with pytest.raises(LaunchError, match=r"^RAY_JOB_STOP_WAIT_TIME_S='soon' is invalid; expected a positive integer$"):
        _job_env_vars(RAY_JOB_STOP_WAIT_TIME_S="soon")


# ----------------------------------------------------------------------------- what every node must see

from omegaconf import OmegaConf  # noqa: E402

from rpg.verl import joined_cluster as C  # noqa: E402
from rpg.verl import node_checks as N  # noqa: E402
from rpg.config import RPGConfigError  # noqa: E402


def _node(i: int) -> dict:
    return {"id": f"{i:02d}" + "ab" * 27, "ip": f"10.0.0.{i}", "gpus": 1.0}


def _model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"w" * 64)
    return folder


def _cfg(tmp_path: Path, **extra) -> OmegaConf:
    model = _model(tmp_path / "model")
    train = tmp_path / "train.parquet"
    train.write_bytes(b"rows")
    cfg = {"trainer": {"nnodes": 2, "n_gpus_per_node": 1, "default_local_dir": str(tmp_path / "ckpts"),
                       "logger": ["console", "file"], "project_name": "p", "experiment_name": "e"},
           "actor_rollout_ref": {"model": {"path": str(model)}},
           "data": {"train_files": str(train), "val_files": [str(train), "org/remote-dataset"], "tokenizer": None},
           "ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": {"VERL_FILE_LOGGER_ROOT": str(tmp_path / "logs")}}}}}
    return OmegaConf.merge(cfg, extra)


def test_the_local_inputs_and_the_metrics_folder_are_the_ones_the_workers_use(tmp_path):
    cfg = _cfg(tmp_path, actor_rollout_ref={"model": {"tokenizer_path": "Qwen/Qwen3-4B"}})  # a repo id: not a path
    assert N.local_inputs(cfg) == {"actor_rollout_ref.model.path": str(tmp_path / "model"),
                                   "data.train_files": str(tmp_path / "train.parquet"),
                                   "data.val_files[0]": str(tmp_path / "train.parquet")}
    assert N.metrics_folder(cfg) == str(tmp_path / "logs" / "p")  # verl's FileLogger: <root>/<project>/<exp>.jsonl
    assert N.metrics_folder(OmegaConf.merge(cfg, {"trainer": {"logger": ["console"]}})) is None


def test_a_node_that_sees_an_input_otherwise_is_named_with_the_key_and_the_difference(tmp_path):
    model = str(_model(tmp_path / "model"))
    here = {"views": {model: N.path_view(model)}}
    inputs = {"actor_rollout_ref.model.path": model}
    same = {"node": "x", "views": {model: N.path_view(model)}}
    assert here["views"][model] == {"files": {"config.json": 2, "model.safetensors": 64}}
    assert N.inputs_problem(inputs, here, [same, same], [_node(1), _node(2)]) is None
    missing = {"node": "x", "views": {model: None}}
    line = N.inputs_problem(inputs, here, [same, missing], [_node(1), _node(2)])
    assert line.startswith(f"actor_rollout_ref.model.path={model} does not exist there on node 10.0.0.2 (id 02abab")
    assert "\n" not in line and "shared storage mounted at the same path on every node" in line
    short = {"node": "x", "views": {model: {"files": {"config.json": 2, "model.safetensors": 10}}}}
    line = N.inputs_problem(inputs, here, [short, same], [_node(1), _node(2)])
    names(one_line(line), str(model), "model.safetensors", "64 bytes here, 10 there", "node 10.0.0.1")


def _joined(monkeypatch, node_views):
    """A joined cluster of two nodes; the pinned tasks run here, ``node_views(i, fn, args)`` answering for node i."""
    monkeypatch.setenv("RAY_ADDRESS", "http://10.0.0.1:8265")
    monkeypatch.setattr(C, "alive_nodes", lambda: [_node(1), _node(2)])
    monkeypatch.setattr(N, "on_each_node", lambda fn, nodes, *args, timeout_s=0: [node_views(i, fn, args)
                                                                                  for i, _ in enumerate(nodes, 1)])


GOOD_ADDRESS = {"hostname": "gpu-node", "resolved": "10.0.0.9", "gloo_ifname": None}


def _local(i, fn, args):
    if fn is N.address_view:  # not this machine's own answer: the nodes are simulated
        return dict(GOOD_ADDRESS)
    if fn is N.paths_view:
        return {"node": _node(i)["id"], "views": {p: N.path_view(p) for p in args[0]}}
    return fn(*args)


def test_the_driver_refuses_a_metrics_folder_a_node_does_not_see(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)

    def node_2_has_its_own_logs(i, fn, args):
        if i == 2 and fn is C._read_probe and str(tmp_path / "logs") in args[0]:
            return None
        return _local(i, fn, args)

    _joined(monkeypatch, node_2_has_its_own_logs)
    with pytest.raises(RPGConfigError) as err:
        C.ClusterRun(cfg).checks_after_ray_init()
    names(one_line(str(err.value)), f"(VERL_FILE_LOGGER_ROOT)={tmp_path / 'logs' / 'p'}", "node 10.0.0.2 (id 02abab")


def test_the_driver_refuses_a_model_path_a_node_does_not_have(tmp_path, monkeypatch, capsys):
    cfg = _cfg(tmp_path)
    _joined(monkeypatch, _local)
    C.ClusterRun(cfg).checks_after_ray_init()  # every node sees everything: one line says what was checked
    out = capsys.readouterr().out
    (checked,) = [x for x in out.splitlines() if x.startswith("rpg: trainer.default_local_dir=")]
    names(checked, str(tmp_path / "ckpts"), "all 2 nodes", str(tmp_path / "logs" / "p"), "inputs", "loopback")

    def node_2_lacks_the_model(i, fn, args):
        answer = _local(i, fn, args)
        if i == 2 and fn is N.paths_view:
            answer["views"][str(tmp_path / "model")] = None
        return answer

    _joined(monkeypatch, node_2_lacks_the_model)
    with pytest.raises(RPGConfigError, match=rf"^actor_rollout_ref.model.path={tmp_path / 'model'} does not exist there "
                                             r"on node 10.0.0.2 \(id 02abab"):
        C.ClusterRun(cfg).checks_after_ray_init()


def test_the_checkpoint_folders_refusal_no_longer_suggests_default_hdfs_dir(tmp_path, monkeypatch):
    """verl's FSDP checkpoint manager ignores hdfs_path ("Unused (for API compatibility)", its save_checkpoint)."""
    import verl.utils.checkpoint.fsdp_checkpoint_manager as fsdp

    assert "hdfs_path: Unused" in inspect.getsource(fsdp.FSDPCheckpointManager.save_checkpoint)
    cfg = _cfg(tmp_path)
    _joined(monkeypatch, lambda i, fn, args: None if i == 2 and fn is C._read_probe else _local(i, fn, args))
    with pytest.raises(RPGConfigError) as err:
        C.ClusterRun(cfg).checks_after_ray_init()
    line = one_line(str(err.value))
    assert line.startswith(f"trainer.default_local_dir={tmp_path / 'ckpts'} ")
    names(line, "node 10.0.0.2", "trainer.default_hdfs_dir", "ignores")  # named as no way out (verl ignores it)




# ----------------------------------------------------------------------------- the nodes' addresses


def test_the_network_variables_are_passed_to_the_job():
    env_vars = _job_env_vars(GLOO_SOCKET_IFNAME="eth0", NCCL_SOCKET_IFNAME="eth0", NCCL_IB_HCA="mlx5_0")
    assert (env_vars["GLOO_SOCKET_IFNAME"], env_vars["NCCL_SOCKET_IFNAME"], env_vars["NCCL_IB_HCA"]) == ("eth0", "eth0",
                                                                                                       "mlx5_0")
    assert "GLOO_SOCKET_IFNAME" not in _job_env_vars()  # unset: not invented


def test_a_node_whose_hostname_resolves_to_loopback_is_refused_with_the_fix():
    nodes = [_node(1), _node(2)]
    loopback = {"hostname": "gpu-node-2", "resolved": "127.0.1.1", "gloo_ifname": None}
    line = N.address_problem(nodes, [GOOD_ADDRESS, loopback])
    assert one_line(line).startswith("node 10.0.0.2 (id 02abab")
    names(line, "gpu-node-2", "127.0.1.1", "loopback", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
    unresolved = {**loopback, "resolved": None}
    assert "its hostname gpu-node-2 does not resolve;" in N.address_problem(nodes, [GOOD_ADDRESS, unresolved])
    assert N.address_problem(nodes, [GOOD_ADDRESS, {**loopback, "gloo_ifname": "eth0"}]) is None  # the fix
    assert N.address_problem(nodes, [GOOD_ADDRESS, GOOD_ADDRESS]) is None
    one_machine = [{**n, "ip": "127.0.0.1"} for n in nodes]  # Ray itself on loopback: the rehearsal on one machine
    assert N.address_problem(one_machine, [loopback, loopback]) is None
    assert N.address_problem(nodes[:1], [loopback]) is None  # one node: gloo's ranks all meet on it


def test_this_machines_address_view_is_what_gloo_reads(monkeypatch):
    import socket

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    view = N.address_view()
    assert view == {"hostname": socket.gethostname(), "resolved": socket.gethostbyname(socket.gethostname()),
                    "gloo_ifname": "lo"}


def test_the_driver_refuses_a_cluster_with_a_loopback_hostname(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)

    def node_2_resolves_to_loopback(i, fn, args):
        if i == 2 and fn is N.address_view:
            return {"hostname": "gpu-node-2", "resolved": "127.0.1.1", "gloo_ifname": None}
        return _local(i, fn, args)

    _joined(monkeypatch, node_2_resolves_to_loopback)
    with pytest.raises(RPGConfigError, match=r"^node 10.0.0.2 \(id 02abab\w+\): its hostname gpu-node-2 resolves to "
                                             r"127.0.1.1, a loopback address"):
        C.ClusterRun(cfg).checks_after_ray_init()
