"""Register ``rollout.name=hf`` with verl's registries (called, never at import): the replica that launches
the servers (``RolloutReplicaRegistry``), the worker-side adapter (verl's adapter registry is the dict
``verl.workers.rollout.base._ROLLOUT_REGISTRY``: it has no register function) and the agent loop that tells the
server each sample's identity (agent_loop.py; verl's ``register`` decorator writes the same entry, by dotted path,
into ``_agent_loop_registry``, once verl's agent-loop module is imported). The CPU backend's
``rpg.backends.cpu.external_module`` calls it when ``VERL_PLATFORM=cpu``; ``rpg.backends.gpu.external_module`` otherwise
(the server then keeps its model on the GPU).
"""

from __future__ import annotations

from rpg.backends.import_hooks import when_imported

ROLLOUT_NAME = "hf"
ADAPTER_FQN = "rpg.backends.hf_rollout.adapter.HFServerAdapter"  # verl imports it in the actor worker
AGENT_LOOP = "rpg_sample_key"  # actor_rollout_ref.rollout.agent.default_agent_loop of the CPU backend
AGENT_LOOP_FQN = "rpg.backends.hf_rollout.agent_loop.SampleKeyAgentLoop"  # Hydra builds it in the agent-loop worker


def _load_hf_replica():
    from rpg.backends.hf_rollout.replica import HFReplica

    return HFReplica


def register_hf_rollout() -> None:
    """``rollout.name=hf``: the replica (server launcher), the worker-side adapter and the agent loop ``AGENT_LOOP``
    (idempotent)."""
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_hf_replica)
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = ADAPTER_FQN
    when_imported("verl.experimental.agent_loop.agent_loop", _register_agent_loop)


def _register_agent_loop(agent_loop_module) -> None:
    agent_loop_module._agent_loop_registry[AGENT_LOOP] = {"_target_": AGENT_LOOP_FQN}
