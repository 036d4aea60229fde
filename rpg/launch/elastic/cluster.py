"""What the elastic supervisor asks of Ray: node counts and whether a trainer's Ray job is gone (a fake in the
unit tests: ``Cluster`` is three functions)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Cluster:
    alive_groups: Callable[[int], int]  # alive nodes that hold that many GPUs
    free_groups: Callable[[int], int]  # alive nodes with that many GPUs free now
    released: Callable[[str | None], bool]  # the Ray job of that id (a trainer's) has no live actor nor group


def ray_cluster() -> Cluster:
    """The cluster this process joined (``ray.init`` done)."""
    import ray
    from ray.util.state import list_actors, list_placement_groups

    from rpg.verl.joined_cluster import alive_groups, free_groups

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
        groups = list_placement_groups(filters=[("creator_job_id", "=", job_id), ("state", "!=", "REMOVED")], limit=10,
                                       raise_on_missing_output=False)
        return not actors and not groups

    return Cluster(alive_groups, free_groups, released)
