"""What a user's overrides change of the settings a run name says, and the name that says the run they give."""

from __future__ import annotations

from typing import Any

from rpg.launch.variants import Variant, name_settings

# Settings of ``name_settings`` that pack micro-batches or size vLLM's share of a GPU: memory and speed, never the
# math, so an override of one leaves what the name says true.
MEMORY_KEYS = frozenset({"actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                         "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
                         "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                         "actor_rollout_ref.rollout.max_num_batched_tokens",
                         "actor_rollout_ref.rollout.gpu_memory_utilization"})


def name_changes(v: Variant, overrides: list[str]) -> list[tuple[str, str]]:
    """(key, value as written) of each setting the name says (``name_settings`` but ``MEMORY_KEYS``) that
    ``overrides`` (read with Hydra's parser; a later one wins) give another value; a mapping on a parent key
    (``rpg.loss={clip:false}``, merged by Hydra) counts for each key in it."""
    from rpg.common.override_lists import parse_overrides
    from rpg.config.kinds import yaml_value

    named = {p.key: p.value for p in parse_overrides(name_settings(v)) if p.key not in MEMORY_KEYS}
    changed: dict[str, str] = {}
    for p in parse_overrides(overrides):
        if p.kind == "DEL":
            continue
        leaves = [(p.key, p.value, p.value_text)]
        if isinstance(p.value, dict):
            leaves = [(f"{p.key}.{k}", x, None) for k, x in _flat(p.value)]
        for key, value, text in leaves:
            if key in named:
                changed.pop(key, None)  # its place: where it was last set
                if isinstance(value, bool) != isinstance(named[key], bool) or value != named[key]:
                    changed[key] = text if text is not None else str(value) if isinstance(value, list) \
                        else yaml_value(value)
    return list(changed.items())


def _flat(mapping: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, x in mapping.items():
        out += _flat(x, f"{prefix}{k}.") if isinstance(x, dict) else [(f"{prefix}{k}", x)]
    return out


def changed_name(v: Variant, changes: list[tuple[str, str]]) -> str:
    """The run name followed by the settings ``changes`` give it, each key by its shortest dotted tail no other
    setting of the name ends with: ``run_rpg_7b_ufkl1e-4+divergence=urkl,clip=false``."""
    if not changes:
        return v.name
    from rpg.common.override_lists import parse_overrides

    keys = [p.key for p in parse_overrides(name_settings(v))]

    def short(key: str) -> str:
        parts = key.split(".")
        for n in range(1, len(parts)):
            tail = ".".join(parts[-n:])
            if sum(k == tail or k.endswith("." + tail) for k in keys) == 1:
                return tail
        return key

    return f"{v.name}+" + ",".join(f"{short(k)}={text}" for k, text in changes)
