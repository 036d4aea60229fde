"""pi_old snapshots of ``trainer.v1.trainer_mode=separate_async`` (rpg.verl.snapshot): restoring the snapshot taken
before an optimizer step returns exactly the parameters it was taken from.

verl's own FSDP2 save (``fsdp2_sharded_save_to_cpu``: ``_local_tensor.detach().cpu()``) is taken on a real FSDP2
module (``fully_shard``, a one-rank gloo group in this process): on the CPU it shares storage with the live
weights, so after the step its "restore" gives the new weights (asserted: the defect this guards against);
``owned_snapshot`` of the same save restores the old ones bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from verl.utils.fsdp_utils import fsdp2_sharded_load_from_cpu, fsdp2_sharded_save_to_cpu

from rpg.verl.snapshot import owned_snapshot


@pytest.fixture()
def fsdp2_module(tmp_path):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        yield model
    finally:
        dist.destroy_process_group()


def _values(model) -> dict[str, torch.Tensor]:
    return {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}


def _train_step(model) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).pow(2).sum().backward()
    opt.step()


def _restored_after_a_step(model, own: bool) -> dict[str, torch.Tensor]:
    saved = fsdp2_sharded_save_to_cpu(model)
    state, spec = owned_snapshot(saved, model) if own else saved
    _train_step(model)
    fsdp2_sharded_load_from_cpu(model, state, spec)
    return _values(model)


def test_the_owned_snapshot_restores_the_exact_parameters(fsdp2_module):
    before = _values(fsdp2_module)
    restored = _restored_after_a_step(fsdp2_module, own=True)
    assert restored.keys() == before.keys()
    assert all(torch.equal(restored[k], before[k]) for k in before)


def test_verls_snapshot_alone_follows_the_live_weights_on_cpu(fsdp2_module):
    """The defect: without the copy, "restoring" pi_old after a step leaves the stepped weights."""
    before = _values(fsdp2_module)
    restored = _restored_after_a_step(fsdp2_module, own=False)
    assert any(not torch.equal(restored[k], before[k]) for k in before)


def test_only_tensors_sharing_a_live_storage_are_cloned():
    live = torch.nn.Linear(2, 2)
    own_copy = live.weight.detach().clone()
    saved = {"w": (live.weight.detach(), None), "c": (own_copy, None), "b": [live.bias.detach()]}
    snap = owned_snapshot(saved, live)
    assert snap["w"][0].untyped_storage().data_ptr() != live.weight.untyped_storage().data_ptr()
    assert torch.equal(snap["w"][0], live.weight)
    assert snap["c"][0] is own_copy  # not shared: kept as it is
    assert snap["b"][0].untyped_storage().data_ptr() != live.bias.untyped_storage().data_ptr()
