"""Checkpoints across world sizes on gloo ranks, for tests/verl/test_reshard.py.

Run as ``python tests/support/reshard_ranks.py WORK OUT.json``. Three spawns of ranks sharing ``WORK``:

1. world size 1 saves; 2. world size 2 saves, then loads the world-size-1 saves; 3. world size 1 loads the
world-size-2 saves. A save: a tiny Qwen2 actor wrapped like verl's FSDP2 engine (``fully_shard`` per
decoder layer, then the root), an optimizer (torch AdamW, or schedule-free AdamW), an lr schedule, one
update on a fixed batch, verl 0.9.1's own ``FSDPCheckpointManager.save_checkpoint``, and a reference model
saved by ``rpg.verl.reshard.saved_shard`` as ``RPGActorRolloutRefWorker.save_reference`` does. Rank 0 then
writes what was saved, gathered by torch itself (``DTensor.full_tensor``, ``get_optimizer_state_dict`` with
``full_state_dict``): the expected full model, optimizer state, reference and schedule; and the full
parameters after one more update on the same batch.

A load: other initial weights (so nothing passes by accident), ``ReshardingCheckpointManager`` (what
the worker installs) loads the checkpoint of the other world size, the reference is loaded by
``rpg.verl.reshard.reference_shards``; rank 0 records the largest difference of each loaded full tensor
from the expected one, and of the parameters after one more update on the same batch. The batch is the
same on every rank, so FSDP's mean over ranks gives the world-size-1 gradient.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

OPTIMIZERS = ("adamw", "schedulefree")


def _model(seed: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    # odd sizes: dim 0 of several tensors does not divide by 2 (uneven shards)
    cfg = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    model = Qwen2ForCausalLM(cfg).float()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("fsdp",))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _optimizer(kind: str, model):
    if kind == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    else:
        from schedulefree import AdamWScheduleFree

        opt = AdamWScheduleFree(model.parameters(), lr=1e-2, warmup_steps=2, weight_decay=0.01)
        opt.train()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    return opt, sched


def _update(model, opt, sched) -> None:
    ids = torch.arange(24).reshape(2, 12) % 97  # the same batch on every rank
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)


def _full(model) -> dict:
    return {k: v.full_tensor().clone() if hasattr(v, "full_tensor") else v.clone() for k, v in model.state_dict().items()}


def _full_optim(model, opt) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    sd = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
    return {"state": {k: {n: (t.full_tensor() if hasattr(t, "full_tensor") else t).clone() if torch.is_tensor(t) else t
                          for n, t in v.items()} for k, v in sd["state"].items()},
            "param_groups": sd["param_groups"]}


def _manager(model, opt, sched):
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    from rpg.verl.reshard import ReshardingCheckpointManager

    return ReshardingCheckpointManager.like(FSDPCheckpointManager(model=model, optimizer=opt, lr_scheduler=sched))


def _save(work: str, kind: str) -> None:
    from rpg.verl.reshard import saved_shard

    size, rank = dist.get_world_size(), dist.get_rank()
    folder = os.path.join(work, f"{kind}_saved_at_{size}")
    model, ref = _model(0), _model(1)
    opt, sched = _optimizer(kind, model)
    _update(model, opt, sched)
    _manager(model, opt, sched).save_checkpoint(os.path.join(folder, "actor"))
    os.makedirs(os.path.join(folder, "rpg_reference"), exist_ok=True)
    refp = dict(ref.named_parameters())
    torch.save({n: saved_shard(p, p._local_tensor) for n, p in refp.items()},
               os.path.join(folder, "rpg_reference", f"reference_rank_{rank}.pt"))
    expected = {"model": _full(model), "optim": _full_optim(model, opt), "ref": _full(ref),
                "sched": sched.state_dict()}
    _update(model, opt, sched)
    expected["after_update"] = _full(model)
    if rank == 0:
        torch.save(expected, os.path.join(folder, "expected.pt"))
    dist.barrier()


def _diff(a, b) -> float:
    if torch.is_tensor(a):
        return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0 if a.shape == b.shape else float("inf")
    return 0.0 if a == b else float("inf")


def _load(work: str, kind: str, saved_at: int) -> dict:
    from rpg.verl.reshard import reference_shards

    folder = os.path.join(work, f"{kind}_saved_at_{saved_at}")
    model, ref = _model(100), _model(101)  # other weights than the save's
    opt, sched = _optimizer(kind, model)
    before = _full(model)
    _manager(model, opt, sched).load_checkpoint(os.path.join(folder, "actor"))
    refp = dict(ref.named_parameters())
    with torch.no_grad():
        for n, local in reference_shards(os.path.join(folder, "rpg_reference"), refp, list(refp)).items():
            refp[n]._local_tensor.copy_(local)
    got = {"model": _full(model), "optim": _full_optim(model, opt), "ref": _full(ref), "sched": sched.state_dict()}
    _update(model, opt, sched)
    got["after_update"] = _full(model)
    if dist.get_rank() != 0:
        return {}
    want = torch.load(os.path.join(folder, "expected.pt"), weights_only=False)
    state_diff = max(_diff(want["optim"]["state"][k][n], v) for k, e in got["optim"]["state"].items()
                     for n, v in e.items())
    return {
        "model": max(_diff(want["model"][k], v) for k, v in got["model"].items()),
        "model_keys_equal": sorted(want["model"]) == sorted(got["model"]),
        "moved_by_load": max(_diff(before[k], v) for k, v in got["model"].items()),
        "optim_state": state_diff,
        "optim_state_keys_equal": {k: sorted(v) for k, v in want["optim"]["state"].items()}
        == {k: sorted(v) for k, v in got["optim"]["state"].items()},
        "param_groups_equal": want["optim"]["param_groups"] == got["optim"]["param_groups"],
        "reference": max(_diff(want["ref"][k], v) for k, v in got["ref"].items()),
        "schedule_equal": want["sched"] == got["sched"],
        "after_update": max(_diff(want["after_update"][k], v) for k, v in got["after_update"].items()),
    }


def _rank(rank: int, size: int, init_file: str, work: str, phase: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size)
    results = {}
    try:
        for kind in OPTIMIZERS:
            if phase in ("save", "save_and_load"):
                _save(work, kind)
            if phase in ("load", "save_and_load"):
                results[f"{kind}: {3 - size} -> {size}"] = _load(work, kind, 3 - size)
        if rank == 0 and results:
            with open(out, "w") as f:
                json.dump(results, f)
    finally:
        dist.destroy_process_group()


def _spawn(size: int, work: str, phase: str, out: str) -> None:
    fd, init_file = tempfile.mkstemp(dir=work)
    os.close(fd)
    os.remove(init_file)
    mp.spawn(_rank, args=(size, init_file, work, phase, out), nprocs=size, join=True)


def main(work: str, out: str) -> None:
    torch.set_num_threads(1)
    _spawn(1, work, "save", os.devnull)
    _spawn(2, work, "save_and_load", out + ".2")
    _spawn(1, work, "load", out + ".1")
    results = {}
    for part in (out + ".2", out + ".1"):
        with open(part) as f:
            results.update(json.load(f))
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
