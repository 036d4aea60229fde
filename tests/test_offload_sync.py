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
    calls = []
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a, **k: calls.append("sync"))
    return calls


def test_reference_copy_and_diff_synchronize_before_host_access(syncs):
    torch.manual_seed(0)
    actor, ref = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    assert copy_actor_to_reference(actor, ref) == 2 and syncs
    assert torch.equal(actor.weight, ref.weight)
    syncs.clear()
    assert max_shard_diff(actor, ref) == 0.0 and syncs


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
    assert out["mode"] == "eval" and out["max_abs_change"] > 0 and syncs
