"""Multi-node on one machine (issue: two Ray nodes on loopback with token authentication, ranks on both, a job
submitted as users submit it, a node lost without losing a step): two nodes started with
``recipe/rpg/ray_cluster.sh head`` / ``worker`` in a loopback-only network namespace (tests/support/multinode.py), the
tiny run submitted with ``ray_cluster.sh submit`` and ``RPG_BACKEND=cpu`` (``trainer.nnodes=2`` x 1 rank).

Distributed stage (``pytest -m distributed --distributed``): about five minutes of trainer launches.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import time
from pathlib import Path

import pytest

from multinode import (SCRIPT, SUBMISSION, assert_run_gone, finish, loopback_cluster, loopback_marks, steps, submit,
                       submissions_ended, training, wait_for)

pytestmark = loopback_marks(pytest.mark)
_ = submissions_ended  # autouse: a test's submissions left running end with it


@pytest.fixture(scope="module")
def cluster():
    with loopback_cluster("rpgmn") as c:
        yield c


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
    proc = submit(cluster, log, "trainer.save_freq=2")
    text = wait_for(log, r"step:1 ", proc)
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
    rc, text = finish(proc, log)
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
    assert steps(cluster.shared / "logs", "twonodes") == [[1, 2]]
    assert_run_gone(submission)


def test_a_cluster_with_too_few_nodes_is_refused_in_one_line(cluster, tmp_path):
    log = tmp_path / "toofew.log"
    t0 = time.time()
    rc, text = finish(submit(cluster, log, NNODES="4"), log)
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
    rc, text = finish(submit(cluster, log, CKPTS_DIR=str(folder)), log)
    lines = sorted({x for x in text.splitlines() if x.startswith("rpg config error:")})  # Ray's client repeats the
    assert rc != 0 and len(lines) == 1, text[-4000:]  # failed job's last lines: one line, maybe shown twice
    assert lines[0].startswith(f"rpg config error: trainer.default_local_dir={folder} is not the same folder on node "
                               "127.0.0.1")
    assert "does not exist on that node" in lines[0] and "Traceback" not in text
    submission = SUBMISSION.search(text).group(0)
    assert [a for a in cluster.actors(submission) if a["class"] != "JobSupervisor"] == []


def test_a_node_lost_mid_run_stops_with_the_stop_line_and_the_resume_loses_no_step(cluster, tmp_path):
    log = tmp_path / "lost.log"
    proc, submission = training(cluster, log, steps=4, until_step=2)
    raylet = cluster.raylet("worker")
    t_kill = time.time()
    raylet.kill()  # the second node's raylet, a child of the `ray start` PID recorded at its start
    rc, text = finish(proc, log, timeout=300)
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
    assert " NNODES=1 " in resume, resume  # was NNODES=2 (ray_cluster.sh counted): the command fits what is alive
    assert stop_s < 120, f"stopped {stop_s:.0f} s after the node loss"
    assert_run_gone(submission)  # nothing of the run left on the surviving node (nor anywhere)
    # the cluster restarted to two nodes, the printed command resumes from that checkpoint
    cluster.stop_node("worker")
    cluster.start_node("worker")
    assert len(cluster.wait_alive(2)) == 2
    log2 = tmp_path / "lost-resumed.log"
    proc2 = cluster.popen(["bash", "-c", resume], log2, PATH=os.environ["PATH"])
    rc2, text2 = finish(proc2, log2)
    assert rc2 == 0, text2[-5000:]
    assert f"rpg: resuming from {ckpt}" in text2 or f"resuming from {ckpt}" in text2, text2[-5000:]
    segs = steps(cluster.shared / "logs", "lost")
    trained = sorted({s for seg in segs for s in seg})
    assert trained == [1, 2, 3, 4], segs  # steps continuous, none lost
    assert segs[-1][0] == saved + 1, segs  # the resumed segment starts right after the checkpoint
    print(f"stopped {stop_s:.1f} s after the raylet was killed; checkpoint at step {saved}; segments {segs}; "
          f"join times {cluster.join_s}")


def test_ctrl_c_on_submit_stops_the_job_with_the_stop_line(cluster, tmp_path):
    log = tmp_path / "ctrlc.log"
    proc, submission = training(cluster, log, steps=6, until_step=1)
    t0 = time.time()
    os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: the launcher's whole process group
    rc, text = finish(proc, log, timeout=300)
    assert rc == 130, text[-4000:]
    assert f"rpg.launch: stopped by SIGINT: job {submission} stopped" in text
    assert "Traceback" not in text.split("rpg.launch: SIGINT")[-1] and "KeyboardInterrupt" not in text
    logs = cluster.run(["ray", "job", "logs", "--address", cluster.address, submission])
    assert logs.returncode == 0, logs.stderr[-2000:]
    stops = [x for x in logs.stdout.splitlines() if x.startswith("rpg: stopped by SIGTERM; Ray shut down;")]
    assert len(stops) == 1 and re.search(r"step:1 ", logs.stdout), logs.stdout[-4000:]
    status = cluster.run(["ray", "job", "status", "--address", cluster.address, submission])
    assert f"Job '{submission}' was stopped" in status.stdout + status.stderr  # Ray's word for STOPPED
    assert_run_gone(submission)
    print(f"Ctrl-C to the end of the launcher: {time.time() - t0:.1f} s")
