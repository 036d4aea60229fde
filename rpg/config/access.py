"""How every layer refuses a config and reads its keys: ``RPGConfigError``, ``config_value``.

The driver's checks (``rpg.verl``), the launch (``rpg.launch``) and the backends' checks before Ray
(``rpg.backends``) refuse a config with the same one-line error and read a composed config's keys the same
way. Torch-free, and omegaconf is imported only when a key is read, so that a launcher pays for neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

NNODES, GPUS = "trainer.nnodes", "trainer.n_gpus_per_node"  # verl's world size: nodes x ranks per node


class RPGConfigError(ValueError):
    """A bad value in the ``rpg:`` block or a conflicting verl key (message: one line)."""


def fail(message: str) -> NoReturn:
    """Refuse the config: ``RPGConfigError(message)`` (one line)."""
    raise RPGConfigError(message)


def config_value(cfg, path: str, default=None):
    """The value at dotted ``path`` of a composed config (containers as plain Python, interpolations
    resolved); ``default`` when absent or null. The one reader of config keys in the driver's checks."""
    from omegaconf import OmegaConf

    value = OmegaConf.select(cfg, path, default=default)
    if value is None:
        return default
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


# Ulysses sequence parallelism sizes of the actor and the reference (verl reads both spellings)
ULYSSES_KEYS = tuple(f"actor_rollout_ref.{side}.{sub}ulysses_sequence_parallel_size"
                     for side in ("actor", "ref") for sub in ("", "fsdp_config."))


def ulysses_sizes(cfg) -> list[str]:
    """``key=size`` for every Ulysses sequence-parallel size > 1 in ``cfg``."""
    return [f"{k}={config_value(cfg, k, 1)}" for k in ULYSSES_KEYS if int(config_value(cfg, k, 1)) > 1]


def world_size_of(values: Mapping[str, Any], default: tuple[int, int] = (1, 1)) -> tuple[int, int]:
    """``(nnodes, n_gpus_per_node)`` from override values (``rpg.override_lists.values``) or a plain
    mapping of dotted keys; a key absent takes ``default``. A value that is not an integer >= 1 raises
    ``ValueError`` naming the key."""
    out = []
    for key, fallback in zip((NNODES, GPUS), default):
        value = values.get(key, fallback)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}={value!r} is invalid: expected an integer >= 1 (the run's world size is "
                             f"{NNODES} x {GPUS} FSDP ranks)")
        out.append(value)
    return out[0], out[1]
