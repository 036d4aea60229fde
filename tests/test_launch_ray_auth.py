"""The Ray cluster of a run is not open to the network: by default Ray 2.60's daemons listen on every
interface, so every run's cluster runs in Ray's single-machine mode, every listener on loopback
(rpg.launch.run_env.RUN_ENV), and uses token authentication with a token of its own (``ray_auth_env``),
which also shuts out the other users of this machine.

``test_a_runs_ray_cluster_refuses_a_client_without_its_token`` starts Ray through the harness, with the
environment every run gets, from a stand-in entry script (a bare ``ray.init``, no verl): during the run,
no process of the run listens on a non-loopback address (before: gcs_server, raylet, workers and the
agents did), the run's GCS port cannot be reached through the machine's network address, a client on
this machine that connects to it on loopback cannot run a task without the token (before: it ran one, as
the run's user), and the same client with the token can. ``run_exposure`` is the check, for any run in
progress (e.g. the tiny main command's e2e run).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from e2e_recipe import is_loopback as _loopback, network_listeners
from rpg.launch.harness import build_command, run_trainer
from rpg.launch.run_env import ray_auth_env

# A task that writes a file: what an attacker's client would run as the run's user.
ATTACK = textwrap.dedent("""
    import sys, ray
    ray.init(address=sys.argv[1], log_to_driver=False)
    @ray.remote
    def write(path):
        open(path, "w").write("ran as the run's user")
    ray.get(write.remote(sys.argv[2]), timeout=60)
""")


def network_address() -> str | None:
    """This machine's first non-loopback IPv4 address (what another node would connect to), or None."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name == "AF_INET" and not _loopback(a.address):
                return a.address
    return None


def run_exposure(procs: list[psutil.Process]) -> list[str]:
    """Each listener of ``procs`` on a non-loopback address whose process does not require Ray's token
    (``RAY_AUTH_MODE=token`` and a token in its environment), as ``name pid address:port``; [] when none.
    (With the run's loopback mode there is no non-loopback listener at all; this is the weaker rule the
    token alone guarantees.)"""
    pids = {p.pid: p for p in procs}
    bad = []
    for c in psutil.net_connections("inet"):
        if c.status != psutil.CONN_LISTEN or c.pid not in pids or _loopback(c.laddr.ip):
            continue
        p = pids[c.pid]
        try:
            env, name = p.environ(), p.name()
        except psutil.NoSuchProcess:
            continue
        except psutil.AccessDenied:  # cannot be verified: counted as exposed
            env, name = {}, "?"
        if env.get("RAY_AUTH_MODE") != "token" or not (env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH")):
            bad.append(f"{name} {c.pid} {c.laddr.ip}:{c.laddr.port}")
    return bad


def test_every_run_uses_ray_token_authentication_with_its_own_token(tmp_path):
    """Before: RAY_AUTH_MODE=disabled was forced on every run, even over a user's exported ``token``."""
    for base in ({}, {"RAY_AUTH_MODE": "token"}, {"RAY_AUTH_MODE": "TOKEN"}, {"RAY_AUTH_MODE": "tokne"}):
        _, env = build_command([], base_env={**base, "HOME": str(tmp_path)})
        env.update(ray_auth_env({**base, "HOME": str(tmp_path)}))
        assert env["RAY_AUTH_MODE"] == "token" and len(env["RAY_AUTH_TOKEN"]) == 64, base
    assert ray_auth_env({})["RAY_AUTH_TOKEN"] != ray_auth_env({})["RAY_AUTH_TOKEN"]  # one token per run
    # the user's own token (value or file) is kept; Ray's documented opt-out, spelled exactly, is honoured
    assert ray_auth_env({"RAY_AUTH_TOKEN": "mine"}) == {"RAY_AUTH_MODE": "token"}
    assert ray_auth_env({"RAY_AUTH_TOKEN_PATH": "/x"}) == {"RAY_AUTH_MODE": "token"}
    assert ray_auth_env({"RAY_AUTH_MODE": "disabled"}) == {"RAY_AUTH_MODE": "disabled"}


STAND_IN = textwrap.dedent("""
    import os, sys, time, ray
    tmp = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("+ray_kwargs.ray_init._temp_dir="))
    ctx = ray.init(num_cpus=1, include_dashboard=False, _temp_dir=tmp)
    ray.get(ray.remote(lambda: 1).remote())  # a worker up, as in a real run
    out = os.path.dirname(os.environ["VERL_FILE_LOGGER_PATH"])
    with open(os.path.join(out, "gcs.tmp"), "w") as f:
        f.write(ctx.address_info["gcs_address"])
    os.replace(os.path.join(out, "gcs.tmp"), os.path.join(out, "gcs"))
    deadline = time.time() + 240
    while not os.path.exists(os.path.join(out, "done")) and time.time() < deadline:
        time.sleep(0.2)
    ray.shutdown()
""")


def _client(tmp_path: Path, address: str, target: Path, token: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # no token file either; a client of a loopback cluster runs in the same single-machine mode (its core
    # worker must find the raylet on loopback), so only the token tells the two clients apart
    env.update(HOME=str(tmp_path / "client-home"), RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    if token is not None:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    try:
        return subprocess.run([sys.executable, "-c", ATTACK, address, str(target)], env=env, capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, -1, "", "timed out")


def _reachable(host: str, port: int) -> bool:
    """Whether a TCP connection to host:port is accepted."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


@pytest.mark.e2e
def test_a_runs_ray_cluster_refuses_a_client_without_its_token(tmp_path):
    ip = network_address()
    if ip is None:
        pytest.skip("this machine has no non-loopback address to connect through")
    entry = tmp_path / "entry.py"
    entry.write_text(STAND_IN)
    out = tmp_path / "out"
    found: dict = {}

    def check() -> None:
        try:
            deadline = time.time() + 240
            while not (out / "gcs").exists() and time.time() < deadline:
                time.sleep(0.2)
            port = (out / "gcs").read_text().rsplit(":", 1)[1]
            procs = psutil.Process().children(recursive=True)  # the run's process tree (Ray's daemons included)
            found["exposed"] = run_exposure(procs)
            found["listeners"] = network_listeners(procs)
            driver = next(p for p in procs if any(str(entry) == a for a in p.cmdline()))
            found["network"] = _reachable(ip, int(port))
            found["without"] = _client(tmp_path, f"127.0.0.1:{port}", tmp_path / "without", None)
            found["with"] = _client(tmp_path, f"127.0.0.1:{port}", tmp_path / "with",
                                    driver.environ()["RAY_AUTH_TOKEN"])
        finally:
            (out / "done").parent.mkdir(parents=True, exist_ok=True)
            (out / "done").touch()

    t = threading.Thread(target=check, daemon=True)
    t.start()
    run = run_trainer([], output_dir=out, entry=str(entry), timeout_s=300, reap_after_s=10)
    t.join(timeout=10)
    assert found["listeners"] == []  # loopback only (before: gcs_server, raylet, workers, agents on * or the node's address)
    assert found["exposed"] == []
    assert found["network"] is False  # the GCS port is not reachable through the machine's network address
    assert not (tmp_path / "without").exists(), found["without"].stderr[-2000:]
    assert found["without"].returncode != 0
    assert (tmp_path / "with").read_text() == "ran as the run's user", found["with"].stderr[-2000:]
    assert run.leftover_pids == []
