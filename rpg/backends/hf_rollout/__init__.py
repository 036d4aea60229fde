"""``rollout.name=hf``: a HuggingFace-generate rollout server for verl's async rollout interface (whose own server
backends need a GPU), for tiny models: the CPU backend's rollout and the GPU smoke run's ``ROLLOUT=hf``.

Names the pieces that code outside the package imports, each loaded on first use (PEP 562), so that importing the
registration costs no torch, transformers or verl worker import.
"""

from __future__ import annotations

import importlib

_HOMES = {"HFServerAdapter": "adapter", "HFReplica": "replica", "RowSampler": "sampling",
          "HFRolloutServer": "server", "rollout_device": "server"}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
