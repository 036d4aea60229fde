"""What the elastic supervisor asks of Ray: node counts and whether a trainer's Ray job is gone (``Cluster`` is
three functions: fakes in the unit tests, or ``counting_cluster`` over records shaped as Ray gives them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


@dataclass
class Cluster:
    alive_groups: Callable[[int], int]  # alive nodes that hold that many GPUs
    run_groups: Callable[[int, str | None], int]  # alive nodes that can hold a rank group of the run now (run_nodes)
    released: Callable[[str | None], bool]  # the Ray job of that id (a trainer's) has no live actor nor group


def held_gpus(groups: Iterable[Mapping]) -> dict[str, float]:
    """GPUs per node that ``groups`` (Ray's placement group records, with their bundles: ``list_placement_groups(
    detail=True)``) hold: the bundles placed on a node (a node id; none while the group is pending), of every
    group not removed."""
    held: dict[str, float] = {}
    for group in groups:
        if group.get("state") == "REMOVED":
            continue
        for bundle in group.get("bundles") or []:
            if node := bundle.get("node_id"):
                held[node] = held.get(node, 0.0) + float((bundle.get("unit_resources") or {}).get("GPU", 0))
    return held


def run_nodes(alive: Iterable[str], available: Mapping[str, Mapping[str, float]], trainer_groups: Iterable[Mapping],
              gpus: int) -> int:
    """How many nodes can hold one rank group of the run (``gpus`` GPUs) now, each node counted once: a node Ray
    marks alive (``alive``: node ids) whose free GPUs (``available``: Ray's available resources per node) plus the
    GPUs the running trainer's own placement groups hold on it (``trainer_groups``: ``held_gpus``) are >= ``gpus``.
    The trainer's node is free before its groups exist and holds them after: one node either way. A node Ray has
    marked dead is not counted, whatever its last resource report says."""
    held = held_gpus(trainer_groups)
    return sum(1 for node in set(alive) if float(available.get(node, {}).get("GPU", 0)) + held.get(node, 0.0) >= gpus)


def counting_cluster(nodes: Callable[[], list[dict]], available: Callable[[], Mapping[str, Mapping[str, float]]],
                     groups_of: Callable[[str], list], released: Callable[[str | None], bool]) -> Cluster:
    """A ``Cluster`` that counts nodes from three readings of Ray's state: the alive nodes (``rpg.verl.
    joined_cluster.alive_nodes``), the available resources per node, and a job's placement groups with their
    bundles."""
    from rpg.verl.node_checks import group_nodes

    def run_groups(gpus: int, job_id: str | None) -> int:
        alive = [n["id"] for n in nodes()]
        # free GPUs read before the trainer's groups: a group created in between is then counted on its node
        # twice (still one node), never on no node
        free = available()
        return run_nodes(alive, free, [] if job_id is None else groups_of(job_id), gpus)

    return Cluster(lambda gpus: len(group_nodes(nodes(), gpus)), run_groups, released)


def ray_cluster() -> Cluster:
    """The cluster this process joined (``ray.init`` done)."""
    import ray
    from ray._private.state import available_resources_per_node
    from ray.util.state import list_actors, list_placement_groups

    from rpg.verl.joined_cluster import alive_nodes

    def groups_of(job_id: str, detail: bool = False, limit: int = 10) -> list:
        return list_placement_groups(filters=[("creator_job_id", "=", job_id), ("state", "!=", "REMOVED")],
                                     detail=detail, limit=limit, raise_on_missing_output=False)

    def released(job_id: str | None) -> bool:
        try:  # verl's TransferQueue controller is named, and reused by the next trainer while it lives
            ray.get_actor("TransferQueueController", namespace="transfer_queue")
            return False
        except ValueError:
            pass
        if job_id is None:  # the trainer ended before it joined Ray: nothing of it to wait for
            return True
        actors = list_actors(filters=[("job_id", "=", job_id), ("state", "!=", "DEAD")], limit=10,
                             raise_on_missing_output=False)
        return not actors and not groups_of(job_id)

    return counting_cluster(alive_nodes, available_resources_per_node,
                            lambda job_id: groups_of(job_id, detail=True, limit=1000), released)
