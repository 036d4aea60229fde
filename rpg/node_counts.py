"""Node counts of a run: ``NNODES=N`` (fixed) or ``NNODES=MIN:MAX`` (elastic, torchrun's form), the sizes a run
can take, and the per-GPU micro-batches re-split for another node count.

A run's world is ``trainer.nnodes x trainer.n_gpus_per_node`` data-parallel ranks. verl's batch sizes
(``data.train_batch_size``, ``ppo_mini_batch_size``) are global: at another world size each rank takes another
share of the same mini-batch, and the optimization is the same (gradients accumulate over micro-batches; the
data-parallel equivalence tests). Only the keys counted per GPU may have to change: a
``*_micro_batch_size_per_gpu`` value ``m`` chosen for world ``W`` is kept at a smaller world ``W'`` (each rank's
share grows: more micro-batches of the same size, the same memory per GPU) and becomes ``m * W / W'`` at a larger
one (each rank's share shrinks), which must be an integer. Whether ``m`` divides a rank's share at ``W'`` is one of
the driver's rules (``rpg.verl.verl_rules``). Token budgets per GPU (``use_dynamic_bsz``: every paper run) stay.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

NNODES_KEY, GPUS_KEY = "trainer.nnodes", "trainer.n_gpus_per_node"
MICRO_SUFFIX = "micro_batch_size_per_gpu"


@dataclass(frozen=True)
class NodeCount:
    """``NNODES`` read: ``low == high`` and not ``elastic`` for a fixed count."""

    low: int
    high: int
    elastic: bool

    def __str__(self) -> str:
        return f"{self.low}:{self.high}" if self.elastic else str(self.high)


def parse_nnodes(raw: str, key: str = "NNODES") -> NodeCount:
    """``N`` or ``MIN:MAX`` (integers, 1 <= MIN <= MAX); ``ValueError``, one line naming ``key`` otherwise."""
    text = raw.strip()
    m = re.fullmatch(r"([0-9]+)(?::([0-9]+))?", text)  # ASCII digits (\d takes other scripts' digits)
    if m is None or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
        raise ValueError(f"{key}={raw!r} is invalid; expected a positive integer N, or MIN:MAX with 1 <= MIN <= MAX "
                         "(elastic: the run continues on the nodes that remain, docs/launch-scripts.md)")
    low = int(m.group(1))
    return NodeCount(low, int(m.group(2) or low), m.group(2) is not None)


def resized_values(current: Mapping[str, Any], nnodes: int) -> dict[str, Any]:
    """The values of the run of ``current`` (dotted keys: ``trainer.nnodes``, ``trainer.n_gpus_per_node`` and any
    ``*_micro_batch_size_per_gpu``) on ``nnodes`` nodes: the node count and each integer per-GPU micro-batch, kept or
    re-split (module text). ``ValueError`` (one line) when a micro-batch does not split evenly."""
    old, gpus = int(current.get(NNODES_KEY, 1)), int(current.get(GPUS_KEY, 1))
    out: dict[str, Any] = {NNODES_KEY: nnodes}
    for key, value in current.items():
        if not key.endswith(MICRO_SUFFIX) or isinstance(value, bool) or not isinstance(value, int):
            continue
        total = value * old * gpus  # sequences per micro-batch step over all ranks
        if nnodes <= old:
            out[key] = value
        elif total % (nnodes * gpus):
            raise ValueError(f"{key}={value} at {old} x {gpus} ranks does not re-split evenly over {nnodes} x {gpus} "
                             f"ranks ({total} sequences per micro-batch step)")
        else:
            out[key] = total // (nnodes * gpus)
    return out


def largest_fit(sizes: Iterable[int], alive: int) -> int | None:
    """The largest allowed node count (``sizes``) that ``alive`` nodes can hold, or None."""
    fitting = [k for k in sizes if k <= alive]
    return max(fitting) if fitting else None


def nnodes_for_resume(count: NodeCount, sizes: Iterable[int], alive: int, reserved: int = 0) -> str | None:
    """``NNODES`` for a resume command on a cluster with ``alive`` nodes that can each hold a rank group, ``reserved``
    of them kept for separate_async's standalone rollout pool (``actor_rollout_ref.rollout.nnodes``): an elastic
    count as given while ``MIN`` nodes are left for the trainer, else the largest allowed size that fits them (a
    fixed count); None when no size fits (the command keeps the count it had)."""
    alive -= reserved
    if count.elastic and alive >= count.low:
        return str(count)
    k = largest_fit(sizes, alive)
    return None if k is None else str(k)


_NNODES_IN_COMMAND = re.compile(r"(?<=\s)(NNODES=)\S+(?=\s)")
_NNODES_OVERRIDE = re.compile(r"(?<=\s)(trainer\.nnodes=)\S+(?=\s|$)")


def with_nnodes(command: str, nnodes: str) -> str:
    """``command`` (a launcher's resume command: ``[cd DIR &&] VAR=value ... LAUNCH overrides``) with its
    ``NNODES=`` assignment and any ``trainer.nnodes=`` override set to ``nnodes``; ``NNODES=nnodes`` added
    before the first assignment or the launch when it had neither."""
    padded = f" {command} "
    changed = _NNODES_OVERRIDE.sub(lambda m: m.group(1) + nnodes, padded)
    if _NNODES_IN_COMMAND.search(changed):
        return _NNODES_IN_COMMAND.sub(lambda m: m.group(1) + nnodes, changed).strip()
    if changed != padded:
        return changed.strip()
    head, sep, rest = command.partition(" && ")
    return f"{head} && NNODES={nnodes} {rest}" if sep else f"NNODES={nnodes} {command}"
