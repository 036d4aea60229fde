"""Reference-reset scenarios on CUDA (nccl, one GPU per rank) for test_gpu_reference_offload.py.

Run as ``python tests/gpu/reference_offload_ranks.py WORLD OUT.json [cpu]`` (``cpu``: a dry run of the
logic with gloo and no offload, not a test). Each rank runs:

1. the CPU scenario's cases (tests/support/fsdp_reference_ranks.py, imported, not copied) on its GPU:
   there the forward-only reference keeps its parameters on the CPU as verl 0.9.1's does
   (FSDP1: ``CPUOffload(offload_params=True)``; FSDP2: ``CPUOffloadPolicy(pin_memory=True)``,
   verl/workers/engine/fsdp/transformer_impl.py:432-433 and :459-463);
2. FSDP2 (the recipe's strategy) placed as verl places it: the reference under the pinned
   ``CPUOffloadPolicy`` (verl builds it forward-only and ignores ``ref.fsdp_config.param_offload``;
   its engine's ``to()`` is a no-op for it, transformer_impl.py:851-853), and with
   ``actor_offloaded`` the actor moved by verl's own functions after its update
   (``verl.utils.fsdp_utils.offload_fsdp_model_to_cpu`` / ``load_fsdp_model_to_gpu``, non-blocking
   copies: ``param_offload=True``). The copy reference <- actor runs between two engine calls, as the
   worker's ``sync_ref_from_actor`` does: the reference's shards on the CPU, the actor's on the CPU
   (offloaded) or the GPU.

Every case checks what the reference *computes*: the logits of a fixed probe sequence, each
module loaded onto the GPU for the forward and offloaded again, before the copy (> 0: the test can
fail) and after it. Rank 0 writes every rank's records as JSON.
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(TESTS), os.path.join(TESTS, "support")]

import fsdp_reference_ranks as cpu_scenario  # noqa: E402

OFFLOAD_CASES = [("fsdp2_ref_offloaded", False), ("fsdp2_ref_and_actor_offloaded", True)]


def _offload_case(name: str, actor_offloaded: bool, rank: int) -> dict:
    from verl.utils.fsdp_utils import load_fsdp_model_to_gpu, offload_fsdp_model_to_cpu

    if cpu_scenario.DEVICE == "cpu":  # dry run: nothing to offload to
        load_fsdp_model_to_gpu = offload_fsdp_model_to_cpu = lambda module: None  # noqa: E731
    from rpg.verl.reference_copy import copy_actor_to_reference, max_shard_diff, probe_logits, probe_token_ids

    dtype = torch.bfloat16  # verl's default FSDP compute dtype
    actor = cpu_scenario._wrap(cpu_scenario._tiny_model(0), "fsdp2", True, dtype, forward_only=False)
    # forward_only: the pinned CPUOffloadPolicy of verl's reference (fsdp_reference_ranks._wrap), which moves
    # the shards for each forward itself; verl never moves this module by hand
    ref = cpu_scenario._wrap(cpu_scenario._tiny_model(0), "fsdp2", True, dtype, forward_only=True)
    ref.eval()
    if actor_offloaded:
        offload_fsdp_model_to_cpu(actor)
    offloaded = {id(ref): False, id(actor): actor_offloaded}  # moved by verl's offload functions
    opt = torch.optim.SGD(actor.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(1 + rank)
    batch = lambda: torch.randint(0, 96, (2, 12), generator=gen).to(cpu_scenario._device())  # noqa: E731
    probe = probe_token_ids(96)

    def run(module, fn):
        """``fn(module)`` with the module on the GPU, offloaded again afterwards if it lives offloaded."""
        if offloaded[id(module)]:
            load_fsdp_model_to_gpu(module)
        try:
            return fn(module)
        finally:
            if offloaded[id(module)]:
                offload_fsdp_model_to_cpu(module)

    def logit_diff() -> float:
        actor.eval()
        a = run(actor, lambda m: probe_logits(m, probe, cpu_scenario.DEVICE, autocast_dtype=dtype))
        r = run(ref, lambda m: probe_logits(m, probe, cpu_scenario.DEVICE, autocast_dtype=dtype))
        return float((a - r).abs().max())

    rec = {"case": name, "ref_on_cpu_at_copy": [], "actor_on_cpu_at_copy": []}
    try:
        for round_ in (1, 2):
            run(actor, lambda m: cpu_scenario._train_step(m, opt, batch()))
            with torch.no_grad():
                run(ref, lambda m: m(input_ids=batch(), use_cache=False))  # the step's ref_log_prob pass
            rec[f"logit_diff_before_copy_{round_}"] = logit_diff()
            with torch.no_grad():
                run(ref, lambda m: m(input_ids=batch(), use_cache=False))  # a forward just before the copy
            rec["ref_on_cpu_at_copy"].append(next(ref.parameters()).device.type == "cpu")
            rec["actor_on_cpu_at_copy"].append(next(actor.parameters()).device.type == "cpu")
            copy_actor_to_reference(actor, ref)
            rec[f"shard_diff_after_copy_{round_}"] = max_shard_diff(actor, ref)
            rec[f"logit_diff_after_copy_{round_}"] = logit_diff()
    except Exception as e:  # noqa: BLE001 - reported to the test
        rec["error"] = f"{type(e).__name__}: {e}"
    return rec


def _rank(rank: int, world: int, init_file: str, out: str, device: str) -> None:
    cpu_scenario.init_rank(rank, world, init_file, device)  # device "cpu": a dry run of the logic, not a test
    records = [cpu_scenario._case(name, s, rr, dt, rank) for name, s, rr, dt in cpu_scenario.CASES]
    records += [_offload_case(name, actor_offloaded, rank) for name, actor_offloaded in OFFLOAD_CASES]
    cpu_scenario.write_gathered(records, rank, world, out)
    dist.destroy_process_group()


def main(world: int, out: str, device: str = "cuda") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(world, os.path.join(tmp, "init"), out, device), nprocs=world, join=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], *sys.argv[3:4])
