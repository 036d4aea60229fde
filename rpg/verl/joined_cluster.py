"""A run on a Ray cluster it joined (``ray job submit``, ``RAY_ADDRESS``): the driver's checks once Ray is up, and
its line when a node of the run is lost.

verl finds a cluster that cannot serve the run late: too few GPUs is a traceback, too few nodes a placement group
that waits forever, a checkpoint folder local to each node a checkpoint the resume cannot find. So, after
``ray.init`` and before verl builds anything (``checks_after_ray_init``): ``capacity_problem`` (``trainer.nnodes``
alive nodes with ``n_gpus_per_node`` GPUs each) and, on several nodes, ``shared_folder_problem`` (a file the driver
writes into ``trainer.default_local_dir``, read back on each node) and ``rpg.verl.node_checks``; a refusal is one
line, exit 2. A node lost mid-run (one of Ray's ``LOST`` errors in the driver): ``ClusterRun.lost_reason`` names the
nodes gone, and the driver prints its stop line instead of a traceback.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
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


def alive_nodes() -> list[dict]:
    """Ray's alive nodes: ``{"id", "ip", "gpus"}`` each (logical GPUs, as ``ray start --num-gpus`` declared)."""
    import ray

    return [{"id": n["NodeID"], "ip": n["NodeManagerAddress"], "gpus": float(n["Resources"].get("GPU", 0))}
            for n in ray.nodes() if n.get("Alive")]


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
        start = {n["id"]: n["ip"] for n in self.start_nodes}
        gone: list[str] = []
        deadline = time.time() + (wait_s if len(start) > 1 else 0.0)
        while start:
            try:
                alive = {n["id"] for n in alive_nodes()}
            except Exception:  # noqa: BLE001 - the GCS itself is gone: say what is known
                break
            gone = [f"{ip} (id {nid[:12]})" for nid, ip in start.items() if nid not in alive]
            if gone or time.time() > deadline:
                break
            time.sleep(2.0)
        if gone:
            return f"node {', '.join(gone)} lost ({kind})"
        return f"a process of the run lost ({kind})" if kind in LOST else None
