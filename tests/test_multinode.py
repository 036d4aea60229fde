"""Multi-node on one machine (issue: two Ray nodes on loopback with token authentication, ranks on both, a job
submitted as users submit it, a node lost without losing a step): two nodes started with
``recipe/rpg/ray_cluster.sh head`` / ``worker`` in a loopback-only network namespace (tests/multinode.py), the
tiny run submitted with ``ray_cluster.sh submit`` and ``RPG_BACKEND=cpu`` (``trainer.nnodes=2`` x 1 rank).

Distributed stage (``pytest -m distributed --distributed``): about five minutes of trainer launches.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from multinode import CLUSTER_SH, LoopbackCluster, namespaces_problem, run_processes

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]
if (_why := namespaces_problem()) is not None:
    pytestmark.append(pytest.mark.skip(reason=_why))

SCRIPT = "recipe/rpg/7b/run_rpg_7b_ufkl1e-4.sh"  # RPG-UFKL, fully differentiable, clipped; the tiny task on CPU
SUBMISSION = re.compile(r"rpg-\d{8}-\d{6}-[0-9a-f]{6}")
RUN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def cluster():
    base = Path(tempfile.mkdtemp(prefix="rpgmn"))  # short: Ray's socket paths are length-limited
    c = LoopbackCluster(base)
    try:
        yield c.start()
    finally:
        c.close()  # the second node's tmpfs goes with its mount namespace
        shutil.rmtree(base, ignore_errors=True)


def _submit(cluster: LoopbackCluster, log: Path, *overrides: str, **env: str) -> subprocess.Popen:
    """``ray_cluster.sh submit`` of the tiny run with RPG_BACKEND=cpu, waiting for the job (its logs tailed into
    ``log``), as a user would run it in a terminal (its own process group: a Ctrl-C reaches all of it)."""
    env = {"RPG_BACKEND": "cpu", "N_GPUS_PER_NODE": "1", "RAY_JOB_WAIT": "1", "RAY_PYTHON": sys.executable,
           "DASHBOARD_PORT": str(cluster.dashboard_port), "CKPTS_DIR": str(cluster.shared / "ck" / log.stem),
           "VERL_FILE_LOGGER_ROOT": str(cluster.shared / "logs"), "EXP_NAME": log.stem, **env}
    return cluster.popen(["bash", str(CLUSTER_SH), "submit", SCRIPT, *overrides], log, **env)


def _wait_for(log: Path, pattern: str, proc: subprocess.Popen, timeout: float = RUN_TIMEOUT_S) -> str:
    t0 = time.time()
    while not re.search(pattern, text := log.read_text(errors="replace")):
        if proc.poll() is not None or time.time() - t0 > timeout:
            raise AssertionError(f"{pattern!r} never appeared (rc {proc.poll()}):\n{text[-4000:]}")
        time.sleep(0.5)
    return text


def _training(cluster: LoopbackCluster, log: Path, steps: int, until_step: int) -> tuple[subprocess.Popen, str]:
    """On two nodes, a run of ``steps`` steps saving each one, submitted and followed until step ``until_step`` is
    logged: the running submission and its id."""
    cluster.ensure_two_nodes()
    proc = _submit(cluster, log, f"trainer.total_training_steps={steps}", "trainer.save_freq=1")
    text = _wait_for(log, rf"step:{until_step} ", proc)
    return proc, SUBMISSION.search(text).group(0)


def _finish(proc: subprocess.Popen, log: Path, timeout: float = RUN_TIMEOUT_S) -> tuple[int, str]:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        raise
    return rc, log.read_text(errors="replace")


def _steps(logs: Path, name: str) -> list[list[int]]:
    """The training steps each segment of the run's metrics history holds, in segment order."""
    from rpg.common.history import segments

    out = []
    for seg in segments(logs / "rpg" / f"{name}.jsonl"):
        steps = [r["step"] for r in map(json.loads, seg.read_text().splitlines())
                 if "training/global_step" in r.get("data", {})]
        out.append(steps)
    return out


def _loopback(ip: str) -> bool:
    ip = ip.split("%")[0]
    addr = ipaddress.ip_address(ip)
    if getattr(addr, "ipv4_mapped", None):
        addr = addr.ipv4_mapped
    return addr.is_loopback or addr.is_unspecified


def test_the_tiny_run_on_two_nodes_submitted_as_users_submit(cluster, tmp_path):
    nodes = cluster.alive_nodes()
    assert len(nodes) == 2 and {n["ip"] for n in nodes} == {"127.0.0.1"}, nodes
    log = tmp_path / "twonodes.log"
    proc = _submit(cluster, log, "trainer.save_freq=2")
    text = _wait_for(log, r"step:1 ", proc)
    # contained while it trains: the namespace has loopback only, every listener of both nodes is on it, and a
    # client without the token is refused (it would run code as the run's user)
    net = cluster.listeners()
    assert net["interfaces"] == ["lo"] and net["listen"], net
    assert [x for x in net["listen"] if not _loopback(x[1])] == []
    probe = cluster.base / "unauthenticated"
    for mode, extra in (("token", {"RAY_AUTH_TOKEN_PATH": str(cluster.base / "no-such-token")}),
                        ("disabled", {})):
        r = cluster.python(f"""
            import ray
            ray.init(address="127.0.0.1:{cluster.port}", log_to_driver=False)
            @ray.remote(num_cpus=0)
            def write(path): open(path, "w").write("ran")
            ray.get(write.remote({str(probe)!r}), timeout=60)
        """, timeout=120, RAY_AUTH_MODE=mode, HOME=str(tmp_path), **extra)
        assert r.returncode != 0 and not probe.exists(), (mode, r.stdout[-2000:], r.stderr[-2000:])
    rc, text = _finish(proc, log)
    assert rc == 0, text[-5000:]
    submission = SUBMISSION.search(text).group(0)
    assert "NNODES=2 (alive nodes with GPUs)" in text  # ray_cluster.sh counted them
    assert "is the same folder on all 2 nodes" in text
    # which node each rank ran on, from Ray's own records: one on each node
    ranks = [a for a in cluster.actors(submission) if a["class"].endswith("WorkerDict")]
    assert sorted(a["name"][-3:] for a in ranks) == ["0:0", "1:0"]
    assert {a["node"] for a in ranks} == {n["id"] for n in nodes}, (ranks, nodes)
    actor = cluster.shared / "ck" / "twonodes" / "global_step_2" / "actor"
    assert {p.name for p in actor.glob("model_world_size_2_rank_*.pt")} == {"model_world_size_2_rank_0.pt",
                                                                          "model_world_size_2_rank_1.pt"}
    assert _steps(cluster.shared / "logs", "twonodes") == [[1, 2]]
    assert run_processes(submission) == []


def test_a_cluster_with_too_few_nodes_is_refused_in_one_line(cluster, tmp_path):
    log = tmp_path / "toofew.log"
    t0 = time.time()
    rc, text = _finish(_submit(cluster, log, NNODES="4"), log)
    lines = sorted({x for x in text.splitlines() if x.startswith("rpg config error:")})  # Ray's client repeats the
    assert rc != 0 and len(lines) == 1, text[-4000:]  # failed job's last lines: one line, maybe shown twice
    assert lines[0].startswith("rpg config error: trainer.nnodes=4 x trainer.n_gpus_per_node=1 = 4 ranks need 4 alive")
    assert "the cluster has 2 alive node(s)" in lines[0] and "2 GPU(s) in all" in lines[0]
    assert "Traceback" not in text and "Total available GPUs" not in text
    submission = SUBMISSION.search(text).group(0)
    assert [a for a in cluster.actors(submission) if a["class"] != "JobSupervisor"] == []  # nothing of verl started
    print(f"refused in {time.time() - t0:.0f} s from submission")


def test_a_checkpoint_folder_one_node_does_not_see_is_refused(cluster, tmp_path):
    log = tmp_path / "local.log"
    folder = cluster.node_local / "ck"  # on the second node: its own empty tmpfs
    rc, text = _finish(_submit(cluster, log, CKPTS_DIR=str(folder)), log)
    lines = sorted({x for x in text.splitlines() if x.startswith("rpg config error:")})  # Ray's client repeats the
    assert rc != 0 and len(lines) == 1, text[-4000:]  # failed job's last lines: one line, maybe shown twice
    assert lines[0].startswith(f"rpg config error: trainer.default_local_dir={folder} is not the same folder on node "
                               "127.0.0.1")
    assert "does not exist on that node" in lines[0] and "Traceback" not in text
    submission = SUBMISSION.search(text).group(0)
    assert [a for a in cluster.actors(submission) if a["class"] != "JobSupervisor"] == []


def test_a_node_lost_mid_run_stops_with_the_stop_line_and_the_resume_loses_no_step(cluster, tmp_path):
    log = tmp_path / "lost.log"
    proc, submission = _training(cluster, log, steps=4, until_step=2)
    raylet = cluster.raylet("worker")
    t_kill = time.time()
    raylet.kill()  # the second node's raylet, a child of the `ray start` PID recorded at its start
    rc, text = _finish(proc, log, timeout=300)
    stop_s = time.time() - t_kill
    stops = sorted({x for x in text.splitlines() if x.startswith("rpg: stopped: node 127.0.0.1")})  # maybe twice:
    assert rc != 0 and len(stops) == 1, text[-5000:]  # the tail, then Ray's client's copy of a failed job's last lines
    line = stops[0]
    assert "lost (" in line and "; Ray shut down;" in line, line
    ckpt = re.search(r"last complete checkpoint (\S+);", line).group(1)
    saved = int(Path(ckpt).name.removeprefix("global_step_"))
    assert saved >= 2, line
    resume = line.split("; resume: ", 1)[1]
    assert "trainer.resume_mode=auto" in resume and SCRIPT in resume and "RPG_BACKEND=cpu" in resume, resume
    assert stop_s < 120, f"stopped {stop_s:.0f} s after the node loss"
    time.sleep(5)
    assert run_processes(submission) == []  # nothing of the run left on the surviving node (nor anywhere)
    # the cluster restarted to two nodes, the printed command resumes from that checkpoint
    cluster.stop_node("worker")
    cluster.start_node("worker")
    assert len(cluster.wait_alive(2)) == 2
    log2 = tmp_path / "lost-resumed.log"
    proc2 = cluster.popen(["bash", "-c", resume], log2, PATH=os.environ["PATH"])
    rc2, text2 = _finish(proc2, log2)
    assert rc2 == 0, text2[-5000:]
    assert f"rpg: resuming from {ckpt}" in text2 or f"resuming from {ckpt}" in text2, text2[-5000:]
    steps = _steps(cluster.shared / "logs", "lost")
    trained = sorted({s for seg in steps for s in seg})
    assert trained == [1, 2, 3, 4], steps  # steps continuous, none lost
    assert steps[-1][0] == saved + 1, steps  # the resumed segment starts right after the checkpoint
    print(f"stopped {stop_s:.1f} s after the raylet was killed; checkpoint at step {saved}; segments {steps}; "
          f"join times {cluster.join_s}")


def test_ctrl_c_on_submit_stops_the_job_with_the_stop_line(cluster, tmp_path):
    log = tmp_path / "ctrlc.log"
    proc, submission = _training(cluster, log, steps=6, until_step=1)
    t0 = time.time()
    os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: the launcher's whole process group
    rc, text = _finish(proc, log, timeout=300)
    assert rc == 130, text[-4000:]
    assert f"rpg.launch: stopped by SIGINT: job {submission} stopped" in text
    assert "Traceback" not in text.split("rpg.launch: SIGINT")[-1] and "KeyboardInterrupt" not in text
    logs = cluster.run(["ray", "job", "logs", "--address", cluster.address, submission])
    assert logs.returncode == 0, logs.stderr[-2000:]
    stops = [x for x in logs.stdout.splitlines() if x.startswith("rpg: stopped by SIGTERM; Ray shut down;")]
    assert len(stops) == 1 and re.search(r"step:1 ", logs.stdout), logs.stdout[-4000:]
    status = cluster.run(["ray", "job", "status", "--address", cluster.address, submission])
    assert f"Job '{submission}' was stopped" in status.stdout + status.stderr  # Ray's word for STOPPED
    time.sleep(5)
    assert run_processes(submission) == []
    print(f"Ctrl-C to the end of the launcher: {time.time() - t0:.1f} s")
