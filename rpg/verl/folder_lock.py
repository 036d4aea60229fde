"""One writer per checkpoint folder on a Ray cluster: a named actor holds the folder while a run writes into it.

Two trainers saving into one ``trainer.default_local_dir`` mix their shards and steps (a restart racing the
run it replaces, a job submitted twice). Ray's named actors are registered atomically by the GCS: the first
``acquire`` of a folder's name creates the holder, a second one gets ``ValueError`` ("already taken") and is
refused in one line naming who holds it. The holder is not detached: it ends with the Ray driver that made it
(Ray's ownership), so a driver that exits, is killed, or loses its connection frees the folder by itself. It is
placed on the node of its driver (a holder on a node that dies would free the folder while the driver runs).

The elastic supervisor (``rpg.cluster.elastic``) holds the folder for the whole run, across the trainers it
starts one after another; it hands each of them the holder's token (``TOKEN_ENV``), with which the trainer
recognises its own supervisor's hold instead of refusing.
"""

from __future__ import annotations

import hashlib
import os
import secrets

from rpg.config import RPGConfigError

NAMESPACE = "rpg"
TOKEN_ENV = "RPG_FOLDER_LOCK_TOKEN"  # set by a holder for the processes it starts


def lock_name(folder: str) -> str:
    return "rpg-folder-" + hashlib.sha256(os.path.abspath(folder).encode()).hexdigest()[:20]


class _Holder:
    def __init__(self, folder: str, who: str, token: str):
        self.record = {"folder": folder, "who": who, "token": token}

    def describe(self) -> dict:
        return self.record


def holder(folder: str):
    """The live holder of ``folder``'s name, or None."""
    import ray

    try:
        return ray.get_actor(lock_name(folder), namespace=NAMESPACE)
    except ValueError:
        return None


def holder_record(folder: str, timeout_s: float = 60.0) -> dict | None:
    """What the holder of ``folder`` says of itself (``folder``, ``who``, ``token``), or None when nothing holds it."""
    import ray

    actor = holder(folder)
    if actor is None:
        return None
    try:
        return ray.get(actor.describe.remote(), timeout=timeout_s)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return None  # it died meanwhile, or cannot answer: its driver is gone or going


def acquire(folder: str, who: str, key: str = "trainer.default_local_dir"):
    """Hold ``folder`` for this Ray driver; ``RPGConfigError`` (one line) when another one holds it. Returns the
    holder's handle (keep a reference: the hold lasts while this driver lives) and its token."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    folder = os.path.abspath(folder)
    token = secrets.token_hex(16)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    try:
        actor = (ray.remote(num_cpus=0, max_restarts=0)(_Holder)
                 .options(name=lock_name(folder), namespace=NAMESPACE, scheduling_strategy=here)
                 .remote(folder, who, token))
    except ValueError:  # the name is taken: another driver holds the folder
        other = holder_record(folder)
        raise RPGConfigError(f"{key}={folder} is being written by another run ({other['who'] if other else 'a driver'}"
                             "): one trainer per checkpoint folder; stop that run (ray job stop) or choose "
                             "another folder") from None
    ray.get(actor.describe.remote())  # placed and answering before the run goes on
    return actor, token


def held_by_parent(folder: str, environ=None) -> bool:
    """Whether ``folder`` is held by the process that started this one (its token in ``TOKEN_ENV``)."""
    environ = os.environ if environ is None else environ
    token = environ.get(TOKEN_ENV, "")
    record = holder_record(folder) if token else None
    return record is not None and record["token"] == token
