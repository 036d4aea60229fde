"""A run on a Ray cluster it joined (``ray job submit``, ``RAY_ADDRESS``): the driver's checks once Ray is up, its
watch of the nodes, and its line when a node of the run is lost.

verl finds a cluster that cannot serve the run late: too few GPUs is a traceback, too few nodes a placement group
that waits forever, a checkpoint folder local to each node a checkpoint the resume cannot find. So, after
``ray.init`` and before verl builds anything (``checks_after_ray_init``): ``capacity_problem`` (``trainer.nnodes``
alive nodes with ``n_gpus_per_node`` GPUs each) and, on several nodes, ``shared_folder_problem`` (a file the driver
writes into ``trainer.default_local_dir``, read back on each node) and ``rpg.verl.node_checks``; a refusal is one
line, exit 2. A node lost mid-run: verl's TaskRunner may wait for it forever (its replay buffer polls for groups
that no live worker finishes), so ``NodeWatch`` stops the TaskRunner when a lost node held part of the run; the
driver then sees one of Ray's ``LOST`` errors, ``ClusterRun.lost_reason`` names the nodes gone, and the driver prints
its stop line instead of a traceback. A driver that starts a private cluster instead (``joined_cluster`` False) checks
its Ray folder before Ray (``ray_folder_problem``).
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rpg.config import RPGConfigError
from rpg.verl import node_checks

PROBE_PREFIX = ".rpg_node_probe_"
LOST = ("ActorDiedError", "ActorUnavailableError", "NodeDiedError", "ObjectLostError", "OwnerDiedError",
        "WorkerCrashedError", "ObjectFetchTimedOutError", "ReferenceCountingAssertionError", "RayActorError")


def joined_cluster(config: DictConfig, environ=None) -> bool:
    """Whether this driver connects to a running cluster (``RAY_ADDRESS``, as ``ray job submit`` sets it, or
    ``ray_kwargs.ray_init.address``) rather than starting a private one (one node, its own resources)."""
    environ = os.environ if environ is None else environ
    return bool(environ.get("RAY_ADDRESS", "").strip() or OmegaConf.select(config, "ray_kwargs.ray_init.address"))


def ray_folder_problem(cfg, environ=None) -> str | None:
    """One line when the private Ray this driver starts would name a socket path past its limit under its folder
    (``ray_kwargs.ray_init._temp_dir``, else Ray's default: ``rpg.paths.ray_temp``): Ray stops after its processes
    started, with a traceback. None for a cluster this driver joins (its folder is the cluster's)."""
    from rpg.paths.ray_temp import SOCKET_MAX, RAY_TAIL, default_folder, fits

    environ = os.environ if environ is None else environ
    if joined_cluster(cfg, environ):
        return None
    folder, source = OmegaConf.select(cfg, "ray_kwargs.ray_init._temp_dir"), "ray_kwargs.ray_init._temp_dir"
    if not folder:
        folder, source = default_folder(environ)
    if fits(str(folder)):
        return None
    return (f"{source}: Ray's folder {folder} is {len(os.fsencode(str(folder)))} bytes, and its socket paths under it "
            f"would pass {SOCKET_MAX} bytes; set RAY_TMPDIR to a folder of at most {SOCKET_MAX - RAY_TAIL - len('/ray')} "
            "bytes, or +ray_kwargs.ray_init._temp_dir to one of at most "
            f"{SOCKET_MAX - RAY_TAIL} (the CPU launchers make one themselves)")


def alive_nodes() -> list[dict]:
    """Ray's alive nodes: ``{"id", "ip", "gpus"}`` each (logical GPUs, as ``ray start --num-gpus`` declared)."""
    import ray

    return [{"id": n["NodeID"], "ip": n["NodeManagerAddress"], "gpus": float(n["Resources"].get("GPU", 0))}
            for n in ray.nodes() if n.get("Alive")]


def gone_nodes(start: list[dict], alive: list[dict]) -> list[dict]:
    """The nodes of ``start`` (``alive_nodes`` records) that are not in ``alive``."""
    ids = {n["id"] for n in alive}
    return [n for n in start if n["id"] not in ids]


def node_names(nodes: list[dict]) -> str:
    """``nodes`` as the driver's lines name them: ``10.0.0.2 (id 1a2b...)``, comma-separated."""
    return ", ".join(f"{n['ip']} (id {n['id'][:12]})" for n in nodes)


def job_nodes(job_id: str) -> set[str]:
    """The nodes (ids) that hold or held part of Ray job ``job_id``: its actors in any state (those on a lost node
    are dead by the time this asks) and the bundles of its placement groups. Raises when Ray's state API cannot
    answer."""
    import ray
    from ray.util.state import list_actors, list_placement_groups

    # this driver's cluster by its GCS address: without one the state API looks for Ray instances on this machine
    gcs = ray.get_runtime_context().gcs_address
    actors = list_actors(address=gcs, filters=[("job_id", "=", job_id)], detail=True, limit=10_000,
                         raise_on_missing_output=False)
    groups = list_placement_groups(address=gcs, filters=[("creator_job_id", "=", job_id)], detail=True, limit=1000,
                                   raise_on_missing_output=False)
    held = {a.get("node_id") for a in actors}
    held |= {b.get("node_id") for g in groups for b in g.get("bundles") or []}
    return held - {None, ""}


WATCH_POLL_S = 2.0  # between two readings of the alive nodes (after Ray's health check has marked a node dead)


class NodeWatch:
    """A daemon thread that reads the alive nodes (``alive``, default ``alive_nodes``) every ``WATCH_POLL_S``. A node
    of ``start`` gone that held part of the run (``held()``: node ids; when it raises, taken as held: a hang is worse
    than a stop): one stderr line, then ``on_lost()``, once, and the watch ends. A lost node that held nothing: one
    line, and the watch goes on with the others. It ends quietly on ``stop()`` or when ``alive`` raises (the GCS
    gone: the driver's ``ray.get`` sees that)."""

    def __init__(self, start: list[dict], held: Callable[[], set[str]], on_lost: Callable[[], None],
                 alive: Callable[[], list[dict]] | None = None):
        self.start, self.held, self.on_lost, self.alive = list(start), held, on_lost, alive
        self.seen: set[str] = set()  # lost nodes already judged
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rpg-node-watch", daemon=True)

    def begin(self) -> NodeWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.wait(WATCH_POLL_S) and self.check():
            pass

    def check(self) -> bool:
        """One reading; False once the watch is done (the trainer stopped, the GCS gone, ``stop()``)."""
        try:
            alive = self.alive() if self.alive is not None else alive_nodes()
            lost = [n for n in gone_nodes(self.start, alive) if n["id"] not in self.seen]
        except Exception:  # noqa: BLE001 - the GCS itself is gone: the driver's ray.get raises
            return False
        if not lost:
            return True
        self.seen.update(n["id"] for n in lost)
        try:
            held, unknown = self.held(), None
        except Exception as e:  # noqa: BLE001 - Ray's state API did not answer: stop rather than hang
            held, unknown = set(), f"{type(e).__name__}: {e}".splitlines()[0][:200]
        if self._stop.is_set():
            return False
        part = lost if unknown else [n for n in lost if n["id"] in held]
        if rest := [n for n in lost if n not in part]:
            _say(f"rpg: node {node_names(rest)} lost; it held nothing of this run: the run goes on")
        if not part:
            return True
        what = (f"Ray's state API could not tell what it held ({unknown})" if unknown
                else "it held part of this run")
        _say(f"rpg: node {node_names(part)} lost and {what}: stopping the trainer")
        try:
            self.on_lost()
        except Exception as e:  # noqa: BLE001 - e.g. the trainer already gone with the node: the driver sees that
            _say(f"rpg: could not stop the trainer ({type(e).__name__}: {e})".splitlines()[0])
        return False


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def alive_groups(gpus: int) -> int:
    """How many alive nodes can each hold a rank group (``gpus`` GPUs in all)."""
    return len(node_checks.group_nodes(alive_nodes(), gpus))


def capacity_problem(nodes: list[dict], nnodes: int, gpus_per_node: int) -> str | None:
    """Why ``nodes`` cannot hold ``nnodes`` x ``gpus_per_node`` ranks (one line naming the counts), or None."""
    fitting = node_checks.group_nodes(nodes, gpus_per_node)
    total = sum(n["gpus"] for n in nodes)
    need = nnodes * gpus_per_node
    if len(fitting) >= nnodes and total >= need:
        return None
    per_node = ", ".join(f"{n['ip']}: {n['gpus']:g}" for n in nodes) or "none"
    return (f"trainer.nnodes={nnodes} x trainer.n_gpus_per_node={gpus_per_node} = {need} ranks need {nnodes} alive "
            f"Ray node(s) with >= {gpus_per_node} GPU(s) each, but the cluster has {len(nodes)} alive node(s), "
            f"{len(fitting)} of them with >= {gpus_per_node} GPU(s), {total:g} GPU(s) in all (per node: {per_node}): "
            "start the missing nodes (recipe/rpg/ray_cluster.sh worker HEAD_IP) or lower trainer.nnodes")


def _read_probe(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


CHECKPOINT_WHY = ("every node must see the checkpoint folder (shared storage mounted at the same path, e.g. NFS; "
                  "verl's trainer.default_hdfs_dir does not replace it: its FSDP checkpoint manager ignores it), else a "
                  "resume cannot find the checkpoints the ranks wrote")


def shared_folder_problem(folder: str, nodes: list[dict], timeout_s: float = node_checks.PROBE_TIMEOUT_S,
                          key: str = "trainer.default_local_dir", why: str = CHECKPOINT_WHY) -> str | None:
    """Whether every node in ``nodes`` sees ``folder`` (``key``'s) as this driver does (a file written here, read
    there by a task pinned to the node: ``rpg.verl.node_checks.on_each_node``); one line naming the first node that
    does not, and ``why`` it must, or None."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    probe = Path(folder) / f"{PROBE_PREFIX}{token}"
    probe.write_text(token)
    try:
        seen = node_checks.on_each_node(_read_probe, nodes, str(probe), timeout_s=timeout_s)
    finally:
        probe.unlink(missing_ok=True)
    if seen is None:
        return (f"{key}={folder}: no answer within {timeout_s:.0f} s from a task on every node "
                f"({len(nodes)} nodes) reading a file written there; the cluster is too busy or a node is unhealthy")
    for node, content in zip(nodes, seen):
        if content != token:
            what = "does not exist" if content is None else "holds other bytes"
            return (f"{key}={folder} is not the same folder on node {node['ip']} (id {node['id'][:12]}): the file "
                    f"the driver wrote there {what} on that node; {why}")
    return None


def rendezvous_file(environ=None) -> Path | None:
    """The file of a ``file://`` torch.distributed rendezvous (``DIST_INIT_METHOD``, the CPU backend's), or None."""
    environ = os.environ if environ is None else environ
    method = environ.get("DIST_INIT_METHOD", "")
    return Path(method[len("file://"):]) if method.startswith("file://") else None


class ClusterRun:
    """What the driver learns of the cluster after ``ray.init``: the nodes alive at the start (``start_nodes``)."""

    def __init__(self, config: DictConfig, settings=None):
        self.config = config
        self.settings = settings  # rpg.config.RPGSettings, once the driver's checks have read them
        self.start_nodes: list[dict] = []

    def checks_after_ray_init(self) -> None:
        """Ray's post-init hook: on a joined cluster, ``capacity_problem`` and (several nodes)
        ``shared_folder_problem``; raises ``RPGConfigError``. Records the alive nodes either way, and makes the
        folder of a ``file://`` rendezvous (``DIST_INIT_METHOD``: torch's FileStore does not)."""
        self.start_nodes = alive_nodes()
        if (store := rendezvous_file()) is not None:
            store.parent.mkdir(parents=True, exist_ok=True)
        if not joined_cluster(self.config):
            return
        trainer = self.config.trainer
        problem = capacity_problem(self.start_nodes, int(trainer.nnodes), int(trainer.n_gpus_per_node))
        if problem is None:  # each node checked where the ranks will run (the backend's checks of a node)
            errors, warnings = node_checks.rank_nodes_problems(self.config, self.settings, self.start_nodes)
            for line in warnings:
                print(f"rpg: warning: {line}", file=sys.stderr, flush=True)
            if errors:
                raise node_checks.NodeCheckError(errors)
        if problem is None and len(self.start_nodes) > 1:
            folder = os.path.abspath(str(trainer.default_local_dir))
            t0 = time.time()
            problem = shared_folder_problem(folder, self.start_nodes)
            metrics = node_checks.metrics_folder(self.config)
            if problem is None and metrics is not None:
                problem = shared_folder_problem(metrics, self.start_nodes, key=node_checks.METRICS_KEY,
                                                why=node_checks.METRICS_WHY)
            problem = (problem or node_checks.input_paths_problem(self.config, self.start_nodes)
                       or node_checks.nodes_address_problem(self.start_nodes))
            if problem is None:
                print(f"rpg: trainer.default_local_dir={folder} is the same folder on all {len(self.start_nodes)} nodes, "
                      f"as are {f'the metrics log folder {metrics} and ' if metrics else ''}the run's local inputs; "
                      f"no node's hostname resolves to loopback (checked in {time.time() - t0:.1f} s)", flush=True)
        if problem is not None:
            raise RPGConfigError(problem)

    def alive_groups(self) -> int | None:
        """How many alive nodes can each hold a rank group (``trainer.n_gpus_per_node`` GPUs); None when Ray cannot
        say (its GCS gone)."""
        try:
            return alive_groups(int(self.config.trainer.n_gpus_per_node))
        except Exception:  # noqa: BLE001 - the GCS itself is gone
            return None

    def lost_reason(self, err: BaseException, wait_s: float = 60.0) -> str | None:
        """Why the run ended, when a node or a process of it was lost: the stop line's reason, else None (a bug:
        its traceback stays). A node alive at the start and gone now is a node loss whatever ``err`` is (verl
        may report it as its own error: a rollout replica lost mid-rollout is a replay buffer's "no
        materializable trajectories"); Ray's health check marks a node dead some seconds after its raylet went,
        so with several nodes at the start the driver waits for up to ``wait_s`` for that. Else one of Ray's
        lost-process errors in ``err``'s chain (``LOST``) is a process of the run lost."""
        kinds = []
        seen = err
        while seen is not None and len(kinds) < 10:
            kinds.append(type(seen).__name__)
            seen = getattr(seen, "cause", None) or seen.__cause__
        kind = next((k for k in kinds if k in LOST), kinds[0] if kinds else "?")
        gone: list[dict] = []
        deadline = time.time() + (wait_s if len(self.start_nodes) > 1 else 0.0)
        while self.start_nodes:
            try:
                gone = gone_nodes(self.start_nodes, alive_nodes())
            except Exception:  # noqa: BLE001 - the GCS itself is gone: say what is known
                break
            if gone or time.time() > deadline:
                break
            time.sleep(2.0)
        if gone:
            return f"node {node_names(gone)} lost ({kind})"
        return f"a process of the run lost ({kind})" if kind in LOST else None

    def node_watch(self, job_id: str, on_lost: Callable[[], None]) -> NodeWatch | None:
        """On a cluster the driver joined with several nodes at the start: a started ``NodeWatch`` over them, judging a
        lost node by what Ray job ``job_id`` (this driver's) holds there (``job_nodes``); else None."""
        if not joined_cluster(self.config) or len(self.start_nodes) < 2:
            return None
        return NodeWatch(self.start_nodes, lambda: job_nodes(job_id), on_lost).begin()
