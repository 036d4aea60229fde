"""Register ``rollout.name=hf`` with verl's registries (called, never at import): the replica that launches
the servers (``RolloutReplicaRegistry``) and the worker-side adapter (verl's adapter registry is the dict
``verl.workers.rollout.base._ROLLOUT_REGISTRY``: it has no register function). The CPU backend's
``rpg.backends.cpu.external_module`` calls it when ``VERL_PLATFORM=cpu``; ``rpg.backends.gpu.external_module`` otherwise
(the server then keeps its model on the GPU).
"""

from __future__ import annotations

ROLLOUT_NAME = "hf"
ADAPTER_FQN = "rpg.backends.hf_rollout.adapter.HFServerAdapter"  # verl imports it in the actor worker


def _load_hf_replica():
    from rpg.backends.hf_rollout.replica import HFReplica

    return HFReplica


def register_hf_rollout() -> None:
    """``rollout.name=hf``: the replica (server launcher) and the worker-side adapter (idempotent)."""
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_hf_replica)
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = ADAPTER_FQN
