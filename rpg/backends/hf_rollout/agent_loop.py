"""``SampleKeyAgentLoop`` (agent loop ``rpg_sample_key``): verl's single-turn agent loop whose requests to the HF
rollout server carry the sample's identity, so the server seeds the sample by what it is, not by which server
answers it or when (server.py, ``HFRolloutServer.request_seed``).

verl's agent loop sends the server nothing that identifies a sample: a fresh ``uuid4`` request id per turn
(``llm_server.py:90-96``), the prompt's tokens and the sampling parameters. Two replicas answering the same
prompt group (separate_async's hybrid and standalone servers, validation included) each counted their own
draws, seeded ``rollout.seed + replica_rank``, so which server answered, and when, decided the sample. The
identity is what verl hands every agent loop: ``sample_key = (global_steps, index, session_id)``, the step the
prompt was dispatched at, its dataset row (``extra_info.index``) and the sample's number within its group; verl's
client passes extra keyword arguments through to the server (``llm_server.py:150-159``). With another rollout
(``rollout.name`` other than ``hf``) the loop is verl's own, unchanged.

The CPU backend selects it (``actor_rollout_ref.rollout.agent.default_agent_loop``; ``rpg.backends.cpu``);
``register_agent_loop`` adds it to verl's agent-loop registry in every process that imports verl's agent loops.
"""

from __future__ import annotations

from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from rpg.backends.hf_rollout.verl_registries import ROLLOUT_NAME


def sample_key(fields: dict) -> tuple:
    """(dispatch step, dataset row, sample index) of one agent-loop run, from the keyword arguments verl gives it."""
    index = fields.get("index")
    return int(fields["global_steps"]), None if index is None else int(index), int(fields["session_id"])


class _WithSampleKey:
    """verl's LLM client, every ``generate`` call of which carries ``sample_key``."""

    def __init__(self, client, key: tuple):
        self._client, self._key = client, key

    async def generate(self, *args, **kwargs):
        return await self._client.generate(*args, sample_key=self._key, **kwargs)

    def __getattr__(self, name):
        return getattr(self._client, name)


class SampleKeyAgentLoop(SingleTurnAgentLoop):
    """verl's ``single_turn_agent`` with the sample's identity on its requests (module docstring)."""

    async def run(self, sampling_params, **kwargs):
        if self.rollout_config.name == ROLLOUT_NAME:  # verl builds one agent loop per sample
            self.server_manager = _WithSampleKey(self.server_manager, sample_key(kwargs))
        return await super().run(sampling_params, **kwargs)
