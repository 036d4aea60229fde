"""What every node of a joined Ray cluster must see as the driver does, checked once Ray is up (one line each).

Besides the checkpoint folder (``rpg.verl.joined_cluster``), a task pinned to each node (``on_each_node``) checks:
the metrics log's folder (verl's ``file`` logger writes it where Ray placed the TaskRunner, the driver and the
reports read it here: probed like the checkpoint folder); the run's local inputs (the model keys of
``rpg.verl.input_paths`` and the data files; each node's ``path_view``, sizes of a file or of a folder's top-level
files, must equal the driver's: ``inputs_problem``; remote values and hub repo ids are not probed); each node's
address as torch's gloo picks it (a hostname resolving to loopback on a node Ray reaches at a routable address would
make ``init_process_group`` wait for its timeout: ``address_problem``); the backend's own checks of a rank's node
(``rank_nodes_problems``).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable
from pathlib import Path

from rpg.metrics_log.history import base_path, logs_to_file
from rpg.backends.run_env import GLOO_IFNAME
from rpg.config import RPGConfigError, config_value
from rpg.verl.input_paths import DATA_KEYS, MODEL_KEYS, is_remote, run_environ

PROBE_TIMEOUT_S = 120.0  # a task per node: a worker process to start on each (seconds on a loaded machine)
METRICS_KEY = "the metrics log's folder (VERL_FILE_LOGGER_ROOT)"
METRICS_WHY = ("verl's trainer process writes the metrics log on whichever node Ray places it, and the stop line, "
               "the resume and the reports read it here; point VERL_FILE_LOGGER_ROOT at shared storage mounted at "
               "the same path on every node")


def path_view(path: str) -> dict | None:
    """This node's view of ``path``: None if missing; a file: ``{"size"}``; a folder: ``{"files": {name: size}}``
    of its top-level files (links followed: a Hugging Face snapshot links its files)."""
    p = Path(path).expanduser()
    try:
        if p.is_dir():
            return {"files": {c.name: c.stat().st_size for c in sorted(p.iterdir()) if c.is_file()}}
        return {"size": p.stat().st_size} if p.is_file() else None
    except OSError:
        return None


def paths_view(paths: list[str]) -> dict:
    """{path: ``path_view``} and the node this ran on (Ray's node id): what a task pinned to a node answers."""
    import ray

    return {"node": ray.get_runtime_context().get_node_id(), "views": {p: path_view(p) for p in paths}}


def group_nodes(nodes: list[dict], gpus: int) -> list[dict]:
    """The nodes that can each hold a rank group (``gpus`` logical GPUs: what ``ray start --num-gpus`` declared)."""
    return [n for n in nodes if n["gpus"] >= gpus]


def on_each_node(fn: Callable, nodes: list[dict], *args, timeout_s: float = PROBE_TIMEOUT_S,
                 gpus: float = 0) -> list | None:
    """``fn(*args)`` run by a task pinned to each node (``NodeAffinitySchedulingStrategy``, soft=False), holding
    ``gpus`` GPUs, results in ``nodes``' order; None when not all answered within ``timeout_s``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, num_gpus=gpus, max_retries=0)(fn)
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["id"], soft=False)).remote(*args)
            for n in nodes]
    try:
        return ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        return None


def local_inputs(cfg) -> dict[str, str]:
    """{key: path} of the run's inputs that are local paths on this node (``rpg.verl.input_paths``'s keys): the model
    keys and each data file; remote values and repo ids (not present here) are left out."""
    found = {}
    for key in (*MODEL_KEYS, *DATA_KEYS):
        value = config_value(cfg, key)
        values = [value] if isinstance(value, str) else list(value or ()) if key in DATA_KEYS else []
        for i, v in enumerate(values):
            if isinstance(v, str) and not is_remote(v) and Path(v).expanduser().exists():
                found[key if len(values) == 1 else f"{key}[{i}]"] = v
    return found


def _difference(here: dict, there: dict | None) -> str | None:
    if there is None:
        return "does not exist there"
    if here == there:
        return None
    if "files" not in here or "files" not in there:
        return f"is {'a folder' if 'files' in there else 'a file'} there, of another size" if "size" in here else \
            "is not a folder there"
    a, b = here["files"], there["files"]
    name = sorted(set(a) ^ set(b) | {n for n in a if n in b and a[n] != b[n]})[0]
    return (f"differs there: {name} is {a[name] if name in a else 'missing'} bytes here, "
            f"{b[name] if name in b else 'missing'} there")


def inputs_problem(inputs: dict[str, str], here: dict, answers: list[dict], nodes: list[dict]) -> str | None:
    """One line naming the first input a node does not see as the driver does (``here``: the driver's
    ``paths_view``; ``answers``: each node's, in ``nodes``' order), or None."""
    for node, answer in zip(nodes, answers):
        for key, path in inputs.items():
            why = _difference(here["views"][path], answer["views"].get(path))
            if why is not None:
                return (f"{key}={path} {why} on node {node['ip']} (id {node['id'][:12]}): every node reads the run's "
                        "inputs (each rank loads the model, the trainer reads the data wherever Ray places it); put "
                        "them on shared storage mounted at the same path on every node, or copy them to that path "
                        "on each")
    return None


def input_paths_problem(cfg, nodes: list[dict], timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """The run's local inputs (``local_inputs``) as every node sees them, against this driver's view."""
    inputs = local_inputs(cfg)
    if not inputs:
        return None
    paths = sorted(set(inputs.values()))
    answers = on_each_node(paths_view, nodes, paths, timeout_s=timeout_s)
    if answers is None:
        return (f"{', '.join(inputs)}: no answer within {timeout_s:.0f} s from a task on every node ({len(nodes)} "
                "nodes) looking at the run's inputs; the cluster is too busy or a node is unhealthy")
    return inputs_problem(inputs, {"views": {p: path_view(p) for p in paths}}, answers, nodes)


def metrics_folder(cfg) -> str | None:
    """The folder of the metrics log as verl's trainer process will write it (the launcher's VERL_FILE_LOGGER_ROOT
    reaches it through ``ray_kwargs.ray_init.runtime_env.env_vars``); None without verl's ``file`` logger."""
    trainer = cfg.trainer
    if not logs_to_file(trainer.logger):
        return None
    return os.path.abspath(base_path(trainer.project_name, trainer.experiment_name, run_environ(cfg)).parent)


def address_view() -> dict:
    """This node's hostname, the address it resolves to (None: it does not resolve) and GLOO_SOCKET_IFNAME in this
    process's environment (the job's): what torch's gloo uses to pick its interface."""
    host = socket.gethostname()
    try:
        resolved = socket.gethostbyname(host)
    except OSError:
        resolved = None
    return {"hostname": host, "resolved": resolved, "gloo_ifname": os.environ.get(GLOO_IFNAME) or None}


def _loopback(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def address_problem(nodes: list[dict], answers: list[dict]) -> str | None:
    """One line for the first node (of several) that Ray reaches at a routable address but whose hostname resolves to
    a loopback address (or not at all) with GLOO_SOCKET_IFNAME unset; None otherwise."""
    if len(nodes) < 2:
        return None
    for node, seen in zip(nodes, answers):
        if _loopback(node["ip"]) or seen["gloo_ifname"] or not (seen["resolved"] is None or _loopback(seen["resolved"])):
            continue
        resolves = "does not resolve" if seen["resolved"] is None else f"resolves to {seen['resolved']}, a loopback address"
        return (f"node {node['ip']} (id {node['id'][:12]}): its hostname {seen['hostname']} {resolves}; torch's gloo "
                f"process groups (verl's cpu:gloo) would bind there and the ranks on other nodes could not connect "
                f"(init_process_group waits until its timeout): export {GLOO_IFNAME} (and NCCL_SOCKET_IFNAME) naming "
                f"the interface of the node's cluster address, e.g. {GLOO_IFNAME}=eth0, before launching (rpg.cluster "
                "passes them to the job), or make the hostname resolve to that address (/etc/hosts)")
    return None


def nodes_address_problem(nodes: list[dict], timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """``address_problem`` of every node's ``address_view``, each from a task pinned to it."""
    if len(nodes) < 2:
        return None
    answers = on_each_node(address_view, nodes, timeout_s=timeout_s)
    if answers is None:
        return (f"no answer within {timeout_s:.0f} s from a task on every node ({len(nodes)} nodes) reading its "
                "address; the cluster is too busy or a node is unhealthy")
    return address_problem(nodes, answers)


class NodeCheckError(RPGConfigError):
    """Problems of the cluster's nodes, one line each (``rpg.verl.input_paths.error_line`` prints each)."""

    def __init__(self, lines: list[str]):
        super().__init__("; ".join(lines))
        self.lines = list(lines)


def rank_nodes_problems(cfg, settings, nodes: list[dict], timeout_s: float = PROBE_TIMEOUT_S) -> tuple[list, list]:
    """The backend's own checks of a node (``rank_node_check``: for the GPU backend the driver, CUDA, the GPUs,
    Triton's compiler and headers, vLLM, flash-attn's CUDA extension), run where the ranks will run: in a task
    on each node that can hold a rank group, holding the group's GPUs (Ray hands it the GPUs it would hand the
    ranks). ``(errors, warnings)``, one line each naming the node."""
    from rpg.backends import backend_of_run
    from rpg.backends.registry import backend

    name = backend_of_run(cfg)
    check = None if name is None or settings is None else backend(name).rank_node_check(cfg, settings)
    gpus = int(cfg.trainer.n_gpus_per_node)
    groups = group_nodes(nodes, gpus)
    if check is None or not groups:
        return [], []
    fn, args = check
    answers = on_each_node(fn, groups, *args, gpus=gpus, timeout_s=timeout_s)
    if answers is None:
        return [f"no answer within {timeout_s:.0f} s from a task holding {gpus} GPU(s) on each of the "
                f"{len(groups)} GPU node(s) (the node checks): a node is unhealthy, or its GPUs are held by "
                "another job (ray status)"], []
    named = [(f"node {n['ip']} (id {n['id'][:12]})", errors, warnings) for n, (errors, warnings) in zip(groups, answers)]
    return ([f"{node}: {line}" for node, errors, _ in named for line in errors],
            [f"{node}: {line}" for node, _, warnings in named for line in warnings])
