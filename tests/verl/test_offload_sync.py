"""Host access to offloaded shards waits for the accelerator first.

verl offloads parameters and optimizer state with non-blocking device-to-host copies
(``verl.utils.fsdp_utils.offload_fsdp2_model_to_cpu``: "not safe for host access until the D2H copy
finishes; a caller that reads the tensors on the host must synchronize first"). The reference copy
(and its diagnostics, save and load) and the schedule-free train/eval switch read and write such
tensors on the host, so they synchronize the accelerator before touching them. On CPU there is
no accelerator; here ``torch.accelerator`` is replaced by a recorder.
"""

from types import SimpleNamespace

import pytest
import torch

from rpg.verl.reference_copy import copy_actor_to_reference, max_shard_diff


@pytest.fixture
def syncs(monkeypatch):
    """The order of events: "sync" (the accelerator synchronized), "host" (a shard read for host access,
    through ``local_shard``, where every such access in these functions goes)."""
    import rpg.verl.reference_copy as rc
    import rpg.verl.worker as worker

    calls = []
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a, **k: calls.append("sync"))
    real = rc.local_shard

    def recorded(t):
        calls.append("host")
        return real(t)

    monkeypatch.setattr(rc, "local_shard", recorded)
    monkeypatch.setattr(worker, "local_shard", recorded)
    return calls


def synced_first(calls) -> bool:
    """Some host access happened, and the accelerator was synchronized before the first one."""
    return "host" in calls and "sync" in calls and calls.index("sync") < calls.index("host")


def test_reference_copy_and_diff_synchronize_before_host_access(syncs):
    torch.manual_seed(0)
    actor, ref = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    assert copy_actor_to_reference(actor, ref) == 2 and synced_first(syncs), syncs
    assert torch.equal(actor.weight, ref.weight)
    syncs.clear()
    assert max_shard_diff(actor, ref) == 0.0 and synced_first(syncs), syncs


def test_schedule_free_mode_switch_synchronizes_before_host_access(syncs):
    import schedulefree

    from rpg.verl.worker import RPGActorRolloutRefWorker

    model = torch.nn.Linear(3, 2)
    opt = schedulefree.AdamWScheduleFree(model.parameters(), lr=0.1)
    opt.train()
    for _ in range(3):
        opt.zero_grad()
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    worker = SimpleNamespace(_optimizer=lambda: opt)
    out = RPGActorRolloutRefWorker.sf_set_mode(worker, "eval")
    assert out["mode"] == "eval" and out["max_abs_change"] > 0 and synced_first(syncs), syncs
