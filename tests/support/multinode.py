"""Two Ray nodes on this machine, started as users start a cluster (``recipe/rpg/ray_cluster.sh head`` and
``worker``, token authentication on), for the multi-node tests (tests/e2e/test_multinode.py; docs/launch-scripts.md,
"Rehearsing a multi-node launch on one machine").

Why a network namespace: ``ray start --node-ip-address=127.0.0.1`` takes the machine's routable address instead
(``ray._private.services.resolve_ip_for_localhost``), and Ray's single-machine guard, which keeps a local run on
loopback (``rpg.backends.run_env``), makes ``ray start`` refuse a second node. In a network namespace whose only
interface is loopback (``unshare -n``) Ray finds no other address: both nodes, every process they start and every
client of the tests live there, and nothing outside the namespace can reach them.

Why a mount namespace for the second node: it sees ``<base>/node-local`` as an empty folder of its own (a tmpfs),
as a node sees a folder on its local disk: a checkpoint folder there is not the same folder on both nodes.

Every process is started here and signalled by the PID recorded at its start: the namespace holder, and each
node's ``ray start --block`` (``ray_cluster.sh`` execs it), whose SIGTERM stops that node's processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SH = ROOT / "recipe" / "rpg" / "ray_cluster.sh"
SCRIPT = "recipe/rpg/7b/run_rpg_7b_ufkl1e-4.sh"  # RPG-UFKL, fully differentiable, clipped; the tiny task on CPU
SUBMISSION = re.compile(r"rpg-\d{8}-\d{6}-[0-9a-f]{6}")
RUN_TIMEOUT_S = 600
NODE_CPUS = 8  # logical: a rank's placement bundle is {CPU: 3, GPU: 1}, the head also holds 5 single-CPU actors


def namespaces_problem() -> str | None:
    """Why this machine cannot make the namespaces (a visible skip reason), or None."""
    if os.geteuid() != 0:
        return "needs root to make network and mount namespaces (unshare -n, unshare -m); CI runs as root"
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "needs util-linux's unshare and nsenter"
    r = subprocess.run(["unshare", "-n", "-m", "true"], capture_output=True, text=True)
    return None if r.returncode == 0 else f"unshare -n -m is refused here: {r.stderr.strip()}"


class LoopbackCluster:
    """Head + worker node in a loopback-only network namespace (see the module's text)."""

    def __init__(self, base: Path, port: int = 46379, dashboard_port: int = 48265):
        self.base = base
        self.port, self.dashboard_port = port, dashboard_port
        self.address = f"http://127.0.0.1:{dashboard_port}"
        self.token = base / "auth_token"
        self.node_local = base / "node-local"  # the worker node's own tmpfs here
        self.shared = base / "shared"
        self.holder: subprocess.Popen | None = None
        self.nodes: dict[str, subprocess.Popen] = {}
        self.join_s: dict[str, float] = {}
        self.starts = 0
        self.submissions: list[subprocess.Popen] = []  # what popen started besides the nodes: end_submissions

    # ------------------------------------------------------------------ environment and commands
    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RPG_", "PYTEST_"))
               and k not in ("DRY_RUN", "NNODES", "N_GPUS_PER_NODE", "CKPTS_DIR", "OUT_DIR")}
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token), PYTHON=sys.executable,
                   PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", RAY_USAGE_STATS_ENABLED="0")
        # as a local run's Ray: no idle workers started ahead of the first driver (NODE_CPUS of them per node)
        from rpg.backends.run_env import NO_PRESTART_ENV, QUIET_RAY_ENV  # no test reads Ray's metrics

        env.update(NO_PRESTART_ENV)
        env.update(QUIET_RAY_ENV)
        env.update(extra)
        return env

    def inside(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the cluster's network namespace."""
        return ["nsenter", "-t", str(self.holder.pid), "-n", *argv]

    def run(self, argv: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.inside(argv), env=self.env(**env), capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)

    def popen(self, argv: list[str], log: Path, **env: str) -> subprocess.Popen:
        """``argv`` started inside the namespace, its own session, its output in ``log``: a submission, ended by
        ``end_submissions`` after its test if it has not ended by then."""
        proc = self._start(argv, log, **env)
        self.submissions.append(proc)
        return proc

    def _start(self, argv: list[str], log: Path, **env: str) -> subprocess.Popen:
        out = open(log, "ab")
        try:
            return subprocess.Popen(self.inside(argv), env=self.env(**env), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=ROOT, start_new_session=True)
        finally:
            out.close()

    def end_submissions(self, timeout: float = 120) -> list[int]:
        """Each submission still running (a test that failed before it waited for its job) stopped as a terminal's
        Ctrl-C stops it (SIGINT to its process group: the launcher stops the job), killed with its group after
        ``timeout``; every one reaped. A job left running would run beside the module's later tests, and its
        unreaped launcher stay a zombie of this process. Returns the PIDs that had to be stopped."""
        stopped = []
        for proc in self.submissions:
            if proc.poll() is None:
                stopped.append(proc.pid)
                os.killpg(proc.pid, signal.SIGINT)  # its own session (start_new_session): this submission only
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self.submissions.clear()
        return stopped

    def python(self, code: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
        return self.run([sys.executable, "-c", textwrap.dedent(code)], timeout=timeout, **env)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "LoopbackCluster":
        for d in (self.node_local, self.shared):
            d.mkdir(parents=True, exist_ok=True)
        self.token.write_text(secrets.token_hex(32))
        self.token.chmod(0o600)
        self.holder = subprocess.Popen(["unshare", "-n", "sleep", "infinity"], start_new_session=True)
        time.sleep(0.2)
        subprocess.run(self.inside(["ip", "link", "set", "lo", "up"]), check=True)
        self.start_node("head")
        self.start_node("worker")
        return self

    def start_node(self, name: str) -> None:
        self.starts += 1
        temp = self.base / f"ray-{name}-{self.starts}"  # a node's own temp dir, each start a new one
        temp.mkdir()
        common = [f"--num-cpus={NODE_CPUS}", f"--temp-dir={temp}", "--block"]
        log = self.base / f"{name}-{self.starts}.log"  # each start its own: "Ray runtime started" is this start's
        env = {"NUM_GPUS": "1", "RAY_PORT": str(self.port), "DASHBOARD_PORT": str(self.dashboard_port)}
        if name == "head":
            argv = ["bash", str(CLUSTER_SH), "head", *common]
        else:  # its own mount namespace: node-local is a tmpfs only this node sees
            script = (f'mount -t tmpfs rpg-node-local {self.node_local} && exec bash {CLUSTER_SH} worker '
                      f'127.0.0.1:{self.port} {" ".join(common)}')
            argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script]
        t0 = time.time()
        self.nodes[name] = self._start(argv, log, **env)
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if self.nodes[name].poll() is not None or time.time() - t0 > 120:
                raise RuntimeError(f"the {name} node did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        self.join_s[name] = round(time.time() - t0, 1)
        self.wait_alive(len(self.nodes))

    def ensure_two_nodes(self) -> None:
        """Both nodes running (a test that failed midway may have left the second one down)."""
        if self.nodes.get("worker") is None or self.nodes["worker"].poll() is not None:
            self.stop_node("worker")
            self.start_node("worker")
        if len(self.wait_alive(2)) != 2:
            raise RuntimeError(f"the cluster did not get back to two alive nodes: {self.alive_nodes()}")

    def alive_nodes(self) -> list[dict]:
        r = self.python(f"""
            import json, ray
            ray.init(address="127.0.0.1:{self.port}", log_to_driver=False, logging_level="ERROR")
            print("NODES=" + json.dumps([{{"id": n["NodeID"], "ip": n["NodeManagerAddress"],
                                           "head": "node:__internal_head__" in n["Resources"]}}
                                          for n in ray.nodes() if n["Alive"]]))
        """)
        line = [x for x in r.stdout.splitlines() if x.startswith("NODES=")]
        if not line:
            raise RuntimeError(f"cannot list the nodes: {r.stderr[-2000:]}")
        return json.loads(line[0][len("NODES="):])

    def wait_alive(self, count: int, timeout: float = 90) -> list[dict]:
        t0 = time.time()
        while True:
            nodes = self.alive_nodes()
            if len(nodes) == count or time.time() - t0 > timeout:
                return nodes
            time.sleep(1)

    def stop_node(self, name: str, timeout: float = 60) -> None:
        proc = self.nodes.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)  # `ray start --block`: stops the node's processes
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session (start_new_session): this node only
            proc.wait()

    def raylet(self, name: str) -> psutil.Process:
        """The raylet of node ``name`` (a child of the ``ray start`` process recorded at the start)."""
        kids = psutil.Process(self.nodes[name].pid).children(recursive=True)
        return next(p for p in kids if p.name() == "raylet")

    def node_processes(self, name: str) -> list[psutil.Process]:
        proc = psutil.Process(self.nodes[name].pid)
        return [proc, *proc.children(recursive=True)]

    def close(self) -> None:
        self.end_submissions()
        for name in [n for n in self.nodes if n != "head"] + ["head"]:  # a third node a test started too
            self.stop_node(name)
        if self.holder is not None and self.holder.poll() is None:
            self.holder.send_signal(signal.SIGTERM)
            self.holder.wait(timeout=30)

    # ------------------------------------------------------------------ what Ray recorded
    def actors(self, submission: str | None = None) -> list[dict]:
        """Every actor Ray recorded (alive or dead): class, name, node id, state, job id; ``submission``: only
        the actors of that job."""
        r = self.python(f"""
            import json, ray
            from ray.util.state import list_actors, list_jobs
            ray.init(address="127.0.0.1:{self.port}", log_to_driver=False, logging_level="ERROR")
            job = None
            if {submission!r} is not None:
                job = next(j.job_id for j in list_jobs(address="{self.address}") if j.submission_id == {submission!r})
            out = [{{"class": a.class_name, "name": a.name, "node": a.node_id, "state": a.state, "job": a.job_id}}
                   for a in list_actors(address="{self.address}", limit=10000, detail=True)
                   if job is None or a.job_id == job]
            print("ACTORS=" + json.dumps(out))
        """)
        line = [x for x in r.stdout.splitlines() if x.startswith("ACTORS=")]
        if not line:
            raise RuntimeError(f"cannot list the actors: {r.stderr[-2000:]}")
        return json.loads(line[0][len("ACTORS="):])

    def listeners(self) -> dict:
        """The namespace's network interfaces and every listening socket of both nodes' processes."""
        pids = [p.pid for name in self.nodes for p in self.node_processes(name)]
        r = self.python(f"""
            import json, socket, psutil
            pids = set({pids!r})
            found = [[c.pid, c.laddr.ip, c.laddr.port] for c in psutil.net_connections("inet")
                     if c.status == psutil.CONN_LISTEN and c.pid in pids]
            print("NET=" + json.dumps({{"interfaces": [n for _, n in socket.if_nameindex()], "listen": found}}))
        """)
        line = [x for x in r.stdout.splitlines() if x.startswith("NET=")]
        if not line:
            raise RuntimeError(f"cannot list the listeners: {r.stderr[-2000:]}")
        return json.loads(line[0][len("NET="):])


def run_processes(submission: str) -> list[psutil.Process]:
    """Processes of a job still running anywhere on this machine: those whose environment carries the job's
    rendezvous file, named by its submission id (every process of a CPU-backend job gets the job's variables)."""
    found = []
    for p in psutil.process_iter():
        try:
            if submission in p.environ().get("DIST_INIT_METHOD", ""):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def assert_run_gone(submission: str, timeout_s: float = 60.0) -> None:
    """Every process of the job ends within ``timeout_s`` once its submission returned: Ray tears a finished job's
    actors down after the job's status is final, so a check at one instant could see one still exiting."""
    deadline = time.time() + timeout_s
    while (left := run_processes(submission)) and time.time() < deadline:
        time.sleep(0.5)
    assert not left, [(p.pid, _command_line(p)) for p in left]


def _command_line(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess) as e:
        return f"({type(e).__name__})"


# the node-loss, restart and Ctrl-C runs check steps, checkpoints, world sizes and stop lines, none a validation: each
# validation of the tiny run is 3-9 s of both cores (benchmarks/cpu_speed.md), before training and after every step
NO_VALIDATION = ("trainer.val_before_train=False", "trainer.test_freq=-1")


def submit(cluster: LoopbackCluster, log: Path, *overrides: str, **env: str) -> subprocess.Popen:
    """``ray_cluster.sh submit`` of the tiny run with RPG_BACKEND=cpu, waiting for the job (its logs tailed into
    ``log``), as a user would run it in a terminal (its own process group: a Ctrl-C reaches all of it)."""
    env = {"RPG_BACKEND": "cpu", "N_GPUS_PER_NODE": "1", "RAY_JOB_WAIT": "1", "RAY_PYTHON": sys.executable,
           "DASHBOARD_PORT": str(cluster.dashboard_port), "CKPTS_DIR": str(cluster.shared / "ck" / log.stem),
           "VERL_FILE_LOGGER_ROOT": str(cluster.shared / "logs"), "EXP_NAME": log.stem, **env}
    return cluster.popen(["bash", str(CLUSTER_SH), "submit", SCRIPT, *overrides], log, **env)


def wait_for(log: Path, pattern: str, proc: subprocess.Popen, timeout: float = RUN_TIMEOUT_S) -> str:
    """``log``'s text once ``pattern`` is in it (a log not written yet is empty); AssertionError with its tail when
    ``proc`` ended or ``timeout`` passed first."""
    t0 = time.time()
    while not re.search(pattern, text := log.read_text(errors="replace") if log.is_file() else ""):
        if proc.poll() is not None or time.time() - t0 > timeout:
            raise AssertionError(f"{pattern!r} never appeared (rc {proc.poll()}):\n{text[-4000:]}")
        time.sleep(0.5)
    return text


def training(cluster: LoopbackCluster, log: Path, steps: int, until_step: int) -> tuple[subprocess.Popen, str]:
    """On two nodes, a run of ``steps`` steps saving each one (no validation), submitted and followed until step
    ``until_step`` is logged: the running submission and its id."""
    cluster.ensure_two_nodes()
    proc = submit(cluster, log, f"trainer.total_training_steps={steps}", "trainer.save_freq=1", *NO_VALIDATION)
    text = wait_for(log, rf"step:{until_step} ", proc)
    return proc, SUBMISSION.search(text).group(0)


def finish(proc: subprocess.Popen, log: Path, timeout: float = RUN_TIMEOUT_S) -> tuple[int, str]:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        raise
    return rc, log.read_text(errors="replace")


def steps(logs: Path, name: str) -> list[list[int]]:
    """The training steps each segment of the run's metrics history holds, in segment order."""
    from rpg.metrics_log.history import segments

    out = []
    for seg in segments(logs / "rpg" / f"{name}.jsonl"):
        steps = [r["step"] for r in map(json.loads, seg.read_text().splitlines())
                 if "training/global_step" in r.get("data", {})]
        out.append(steps)
    return out


@pytest.fixture(autouse=True)
def submissions_ended(cluster):
    """Autouse in a test module that imports it (with its module-scoped ``cluster``): after each test, the
    submissions it left running stopped and reaped (``LoopbackCluster.end_submissions``), so that a failed test's
    job does not run beside the module's next tests."""
    yield
    if stopped := cluster.end_submissions():
        print(f"stopped the submission(s) the test left running: PIDs {stopped}")


def loopback_marks(markers) -> list:
    """A test module's marks: distributed, e2e, and a visible skip where the namespaces cannot be made."""
    marks = [markers.distributed, markers.e2e]
    if (why := namespaces_problem()) is not None:
        marks.append(markers.skip(reason=why))
    return marks


@contextlib.contextmanager
def loopback_cluster(prefix: str, **ports: int):
    """A started ``LoopbackCluster`` in a new short temporary folder (Ray's socket paths are length-limited), stopped
    and removed on the way out (the second node's tmpfs goes with its mount namespace)."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix=prefix))
    c = LoopbackCluster(base, **ports)
    try:
        yield c.start()
    finally:
        c.close()
        shutil.rmtree(base, ignore_errors=True)
