"""The weight sync's fingerprint (rpg.backends.weight_digest): it sees what a sum of all parameters cannot, and the
check of a separate_async run's log requires the standalone pool's load, with the sent digest, at every sync."""

from __future__ import annotations

import pytest
from messages import names, one_line
import torch

from rpg.backends.weight_digest import CHECKSUM_METRIC, WeightDigest, digest_metric, sync_problems

Q, O = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight"


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {Q: torch.randn(8, 8, generator=g), O: torch.randn(8, 8, generator=g),
            "model.norm.weight": torch.randn(8, generator=g)}


def _digest(weights: dict[str, torch.Tensor]) -> str:
    d = WeightDigest()
    for name, t in weights.items():
        d.add(name, t)
    return d.hexdigest()


def _sum(weights: dict[str, torch.Tensor]) -> float:
    return sum(float(t.double().sum()) for t in weights.values())


@pytest.mark.parametrize("change", ["swap q_proj and o_proj", "permute rows", "transpose"])
def test_the_digest_sees_what_the_sum_of_all_parameters_does_not(change):
    w = _weights()
    if change == "swap q_proj and o_proj":
        changed = {**w, Q: w[O], O: w[Q]}
    elif change == "permute rows":
        changed = {**w, Q: w[Q][torch.tensor([1, 0, *range(2, 8)])]}
    else:
        changed = {**w, Q: w[Q].T}
    assert _sum(changed) == pytest.approx(_sum(w), rel=1e-12)  # the float sum is blind to it
    assert _digest(changed) != _digest(w)


def test_the_digest_binds_names_shapes_and_dtypes_not_the_order_sent():
    w = _weights()
    assert _digest(dict(reversed(list(w.items())))) == _digest(w)
    assert _digest({**w, "model.norm.weight": w["model.norm.weight"].reshape(2, 4)}) != _digest(w)
    assert _digest({**w, "model.norm.weight": w["model.norm.weight"].double()}) != _digest(w)
    assert _digest({("model.norm2.weight" if k == "model.norm.weight" else k): v for k, v in w.items()}) != _digest(w)
    d = WeightDigest()
    d.add(Q, w[Q])
    with pytest.raises(ValueError, match="added twice"):
        d.add(Q, w[O])


def test_the_metric_is_the_digests_first_12_hex_digits_exactly():
    h = _digest(_weights())
    assert digest_metric(h) == int(h[:12], 16) and int(digest_metric(h)) == int(h[:12], 16)


SENT = "(AsyncActorRolloutRefWorker pid=11) [rpg-weight-sync] sent 1 buckets (global_steps={}, tensors=3, digest={})"
LOADED = ("(HFRolloutServer pid=12) [hf-rollout] weights v{} loaded (global_steps={}, checksum=1.000000, batches since "
          "last: [], device=cpu, pool={}, replica={}, received_digest={})")


def _digests(n: int) -> list[str]:
    return [f"{i + 1:x}" * 64 for i in range(n)]


def _log(steps: int, drop: tuple[str, int] | None = None) -> tuple[str, dict]:
    """A separate_async run's lines: a sync at the start and after each step, each loaded by the standalone
    replica (verl numbers it after the hybrid one: 1); the hybrid server loads at the start and at step 2
    (validation) too. ``drop``: (pool, step) left out."""
    lines, version, rank = [], {"hybrid": 0, "standalone": 0}, {"hybrid": 0, "standalone": 1}
    for g, d in enumerate(_digests(steps + 1)):
        lines.append(SENT.format(g, d))
        for pool in ("hybrid", "standalone") if g in (0, 2) else ("standalone",):
            version[pool] += 1
            if drop != (pool, g):
                lines.append(LOADED.format(version[pool], g, pool, rank[pool], d))
    metrics = {g: {CHECKSUM_METRIC: digest_metric(d)} for g, d in enumerate(_digests(steps + 1)) if g}
    return "\n".join(lines), metrics


def test_the_check_passes_a_whole_log_and_needs_the_standalone_load_at_every_sync():
    log, metrics = _log(3)
    assert sync_problems(log, metrics, 3, replicas=1) == []
    for step in (0, 2):  # the hybrid server loaded the same weights then: it does not stand in for the standalone one
        (line,) = sync_problems(*_log(3, drop=("standalone", step)), 3, replicas=1)
        names(one_line(line), f"global_steps={step}", "standalone replica 1")
        assert sync_problems(*_log(3, drop=("hybrid", step)), 3, replicas=1) == []
    (line,) = sync_problems(log, metrics, 3, replicas=2)
    names(one_line(line), "replica(s) [1]", "expected 2")
    two = log + "\n" + "\n".join(LOADED.format(9, g, "standalone", 2, d) for g, d in enumerate(_digests(4)) if g != 3)
    (line,) = sync_problems(two, metrics, 3, replicas=2)
    names(one_line(line), "global_steps=3", "standalone replica 2")
    no_standalone = "\n".join(x for x in log.splitlines() if "pool=standalone" not in x)
    names(one_line(sync_problems(no_standalone, metrics, 3, replicas=1)[0]), "replica(s) []", "expected 1")


def test_the_check_names_a_wrong_digest_a_missing_sync_and_a_wrong_metric():
    log, metrics = _log(2)
    d1, wrong = _digests(3)[1], "f" * 64
    bad = log.replace(f"pool=standalone, replica=1, received_digest={d1}", f"pool=standalone, replica=1, "
                                                                           f"received_digest={wrong}")
    assert sync_problems(bad, metrics, 2, replicas=1) == [
        f"sync at global_steps=1: standalone replica 1 loaded digest {wrong[:12]}..., the actor sent {d1[:12]}..."]
    assert sync_problems(log, metrics, 3, replicas=1) == ["weight syncs sent at global_steps [0, 1, 2], expected 0..3"]
    assert sync_problems(log, {**metrics, 2: {CHECKSUM_METRIC: 2.0}}, 2, replicas=1) == [
        f"step 2: {CHECKSUM_METRIC}=2.0 != {digest_metric(_digests(3)[2])!r}, the sent digest's"]
