"""The fingerprint of a weight sync (``rpg.backends.cpu.weight_sync`` sends, the HF rollout server reads back):
a sha256 bound to every tensor's name, shape, dtype and bytes. A float sum of all parameters is blind to two
same-shape tensors swapped (q_proj and o_proj), rows permuted or a square matrix transposed; this is not.
``sync_problems`` reads both sides' lines back from a run's log and compares them.""" 

from __future__ import annotations

import hashlib
import json
import re

import torch

METRIC_HEX_DIGITS = 12  # the float metric's share of the digest: 48 bits, an integer float64 holds exactly
CHECKSUM_METRIC = "rpg/weight_sync_checksum"  # per step: digest_metric of the digest of the weights sent


class WeightDigest:
    """sha256 of named tensors: each tensor's own sha256 over ``[name, shape, dtype]`` (JSON) and its raw bytes
    (row-major), then one sha256 over those in sorted name order, so the order of ``add`` does not matter and
    each name is bound to its tensor. A name added twice is an error (a sync that sends it twice is wrong)."""

    def __init__(self) -> None:
        self._digests: dict[str, bytes] = {}

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self._digests:
            raise ValueError(f"weight digest: {name} added twice")
        t = tensor.detach().to("cpu").contiguous()
        h = hashlib.sha256(json.dumps([name, list(t.shape), str(t.dtype)]).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
        self._digests[name] = h.digest()

    def __len__(self) -> int:
        return len(self._digests)

    def hexdigest(self) -> str:
        h = hashlib.sha256()
        for name in sorted(self._digests):
            h.update(self._digests[name])
        return h.hexdigest()


def digest_metric(hexdigest: str) -> float:
    """The digest as a float metric (verl's metrics are floats): its first ``METRIC_HEX_DIGITS`` hex digits as an
    integer. Checks compare the whole digests of the log lines; this number ties a step's metrics to its sync."""
    return float(int(hexdigest[:METRIC_HEX_DIGITS], 16))


# rpg.backends.cpu.weight_sync's line per sync, and the HF rollout server's per weight load (any pool)
_SENT = re.compile(r"\[rpg-weight-sync\] sent \d+ buckets \(global_steps=(\d+), tensors=\d+, digest=([0-9a-f]{64})\)")
_LOADED = re.compile(r"\[hf-rollout\] weights v\d+ loaded \(global_steps=(\w+), .*?pool=(\w+), replica=(\d+), "
                     r"received_digest=([0-9a-f]{64})\)")


def sent_digests(log: str) -> list[tuple[int, str]]:
    """(global_steps, digest) of every sync the actor sent, in order."""
    return [(int(g), d) for g, d in _SENT.findall(log)]


def loaded_digests(log: str) -> list[tuple[str, str, int, str]]:
    """(global_steps as printed, pool, replica, digest) of every weight load of an HF rollout server, in order."""
    return [(g, pool, int(replica), d) for g, pool, replica, d in _LOADED.findall(log)]


def sync_problems(log: str, metrics: dict, steps: int, replicas: int) -> list[str]:
    """What is wrong with the weight syncs of a ``separate_async`` run of ``steps`` steps whose standalone rollout
    pool has ``replicas`` replicas (one line each): one sync sent at the start and one after each step; the
    standalone replicas' lines name ``replicas`` replicas (verl numbers them after the hybrid ones), and at each
    sync every one of them printed a load of exactly the digest sent (the hybrid servers' loads, at the start and
    at validation steps, do not count for it); each step's ``CHECKSUM_METRIC`` is the sent digest's
    ``digest_metric``. ``metrics``: step -> that step's metrics."""
    sent = sent_digests(log)
    loads: dict[tuple[str, int], list[str]] = {}
    for g, pool, replica, d in loaded_digests(log):
        if pool == "standalone":
            loads.setdefault((g, replica), []).append(d)
    named = sorted({r for _, r in loads})
    out = []
    if [g for g, _ in sent] != list(range(steps + 1)):
        out.append(f"weight syncs sent at global_steps {[g for g, _ in sent]}, expected 0..{steps}")
    if len(named) != replicas:
        out.append(f"weight loads of standalone replica(s) {named} in the log, expected {replicas} replica(s)")
    for g, d in sent:
        for r in named:
            got = loads.get((str(g), r))
            if not got:
                out.append(f"sync at global_steps={g}: no weight load of standalone replica {r} in the log")
            elif any(x != d for x in got):
                out.append(f"sync at global_steps={g}: standalone replica {r} loaded digest "
                           f"{', '.join(x[:12] for x in got)}..., the actor sent {d[:12]}...")
    out += [f"step {g}: {CHECKSUM_METRIC}={metrics.get(g, {}).get(CHECKSUM_METRIC)} != {digest_metric(d)!r}, the "
            "sent digest's" for g, d in sent if g >= 1 and metrics.get(g, {}).get(CHECKSUM_METRIC) != digest_metric(d)]
    return out
