"""Hydra override lists (``key=value`` strings): the key an override sets and merging lists.

Used by every launcher (``rpg.launch.cli``, the CPU harness, the GPU smoke run, the study) to put
the user's overrides last so that they win.
"""

from __future__ import annotations

from collections.abc import Iterable


def override_key(override: str) -> str:
    """``'+a.b=1'`` -> ``'a.b'`` (the dotted key an override sets)."""
    key = override.split("=", 1)[0]
    return key.lstrip("+~")


def merge_overrides(*groups: Iterable[str]) -> list[str]:
    """Concatenate override lists; a later value for the same key replaces the earlier one.

    The first occurrence keeps its position and its ``+``/``++`` prefix (so a base that adds a
    new key with ``+k=v`` can be overridden by a caller writing ``k=v2``). ``~k`` deletions are
    kept as given.
    """
    order: list[str] = []
    prefix: dict[str, str] = {}
    value: dict[str, str] = {}
    for group in groups:
        for ov in group:
            if "=" not in ov:
                raise ValueError(f"Hydra override must be key=value, got {ov!r}")
            raw_key, val = ov.split("=", 1)
            key = override_key(ov)
            if key not in value:
                order.append(key)
                prefix[key] = raw_key[: len(raw_key) - len(raw_key.lstrip("+~"))]
            value[key] = val
    return [f"{prefix[k]}{k}={value[k]}" for k in order]
