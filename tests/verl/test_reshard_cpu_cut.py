"""Resharding moves only what a rank keeps, on CPU, in one process: DeviceMeshes of several ranks
are built without a process group (torch's ``DeviceMesh(..., _init_backend=False, _rank=r)``: no collective runs in
the code tested), and a device other than the CPU is stood in for by ``meta`` (the resharding target) or by ``cuda``,
which this CPU-only torch cannot reach (the reference copy): the GPU part is stubbed, the mechanism is tested.

* ``local_piece`` cuts exactly as torch's ``distribute_tensor`` does, for every rank of 1-D and 2-D meshes, even
  and uneven shapes (a rank past the last chunk gets an empty piece);
* with the mesh and the parameters on another device, no tensor larger than the rank's piece leaves the CPU
  (``distribute_tensor`` moved the full tensor to the mesh's device first);
* the reference copy saved at each save (``saved_shard``) stays on the CPU with its mesh and placements, and loads
  back at another world size to the saved values.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from rpg.verl.reshard import local_piece, reference_shards, reshard_like, saved_shard

pytestmark = pytest.mark.gpu_stack  # also in the GPU stack's torch: .ci/run


def _mesh(shape: tuple[int, ...], rank: int, device: str = "cpu") -> DeviceMesh:
    n = 1
    for s in shape:
        n *= s
    return DeviceMesh(device, torch.arange(n).reshape(shape), _init_backend=False, _rank=rank)


CUTS = [((2,), [Shard(0)]), ((3,), [Shard(0)]), ((4,), [Shard(0)]), ((2,), [Shard(1)]), ((2,), [Replicate()]),
        ((2, 2), [Shard(0), Replicate()]), ((2, 2), [Replicate(), Shard(1)]), ((2, 3), [Shard(0), Shard(0)]),
        ((2, 2), [Shard(0), Shard(1)])]


@pytest.mark.parametrize("shape", [(5, 3), (8, 4), (1, 6)])
@pytest.mark.parametrize("mesh_shape, placements", CUTS)
def test_the_cpu_cut_is_distribute_tensors_for_every_rank(shape, mesh_shape, placements):
    full = torch.arange(float(shape[0] * shape[1])).reshape(shape)
    ranks = int(torch.tensor(mesh_shape).prod())
    for rank in range(ranks):
        torchs = distribute_tensor(full, _mesh(mesh_shape, rank), placements, src_data_rank=None)
        got = local_piece(full, torchs)
        assert got.shape == torchs.to_local().shape and torch.equal(got, torchs.to_local()), (rank, mesh_shape)
        assert got.untyped_storage().data_ptr() != full.untyped_storage().data_ptr() or got.numel() == 0  # a copy
        as_dtensor = reshard_like(full, torchs)
        assert as_dtensor.placements == torchs.placements and torch.equal(as_dtensor.to_local(), torchs.to_local())


def test_a_piece_that_does_not_fit_the_parameters_shard_is_refused():
    target = distribute_tensor(torch.zeros(6, 2), _mesh((2,), 1), [Shard(0)], src_data_rank=None)
    with pytest.raises(ValueError, match=r"piece of a \(6, 3\) tensor is \(3, 3\), its parameter's local shard \(3, 2\)"):
        local_piece(torch.zeros(6, 3), target)


@pytest.fixture
def moves(monkeypatch):
    """Every ``Tensor.to`` call that sends a tensor off the CPU: (elements, device)."""
    seen, real = [], torch.Tensor.to

    def to(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if self.device.type == "cpu" and out.device.type != "cpu":
            seen.append((self.numel(), out.device.type))
        return out

    monkeypatch.setattr(torch.Tensor, "to", to)
    return seen


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_resharding_moves_only_the_ranks_piece_off_the_cpu(moves, rank):
    """The mesh and the current parameter on ``meta`` (the GPU stand-in): the full tensor stays on the CPU, the
    piece alone is moved (its elements: a quarter of the tensor's at world size 4)."""
    full = torch.arange(64.0).reshape(16, 4)
    mesh = _mesh((4,), rank)
    target = distribute_tensor(torch.empty(16, 4, device="meta"), mesh, [Shard(0)], src_data_rank=None)
    mesh._device_type = "meta"  # the device mesh of a GPU run: device_type cuda
    out = reshard_like(full, target)
    assert isinstance(out, DTensor) and out.to_local().device.type == "meta" and out.to_local().shape == (4, 4)
    assert moves == [(16, "meta")], moves  # one move, of the 16 elements this rank keeps; never the 64


def test_the_saved_reference_copy_stays_on_the_cpu_and_loads_at_another_world_size(tmp_path, monkeypatch):
    """Each of two ranks saves its reference shard with ``saved_shard`` while the mesh's device is CUDA (absent on
    this machine: any copy sent there raises); the copy is a CPU DTensor with the mesh and placements, and the
    two files load at world size 1 (no process group: rank 0 of 1) to the full tensor."""
    full = torch.arange(30.0).reshape(10, 3)
    for rank in range(2):
        mesh = _mesh((2,), rank)
        param = distribute_tensor(full, mesh, [Shard(0)], src_data_rank=None)
        monkeypatch.setattr(mesh, "_device_type", "cuda")
        copy = saved_shard(param, param.to_local())
        assert isinstance(copy, DTensor) and copy.to_local().device.type == "cpu" and copy.placements == (Shard(0),)
        assert copy.device_mesh.device_type == "cuda" and copy.shape == full.shape
        assert copy.to_local().data_ptr() != param.to_local().data_ptr()  # a copy, not the parameter's storage
        assert torch.equal(copy.to_local(), torch.chunk(full, 2)[rank])
        torch.save({"w": copy}, tmp_path / f"reference_rank_{rank}.pt")
        monkeypatch.undo()
    one = distribute_tensor(torch.zeros(10, 3), _mesh((1,), 0), [Shard(0)], src_data_rank=None)
    assert torch.equal(reference_shards(str(tmp_path), {"w": one}, ["w"])["w"], full)
    plain = reference_shards(str(tmp_path), {"w": torch.zeros(10, 3)}, ["w"])["w"]  # an FSDP1 / plain parameter
    assert torch.equal(plain, full)
