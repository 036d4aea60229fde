"""Schedule-free AdamW with verl's parameter/optimizer offload and a checkpoint resume, on CUDA
(nccl, one GPU per rank), for test_gpu_schedulefree_offload.py.

Run as ``python tests/gpu/schedulefree_offload_ranks.py WORLD OUT.json [cpu]`` (``cpu``: a dry run of
the logic with gloo and no offload, not a test). Three trainings of the
same FSDP2 tiny model on the same batches, with ``schedulefree.AdamWScheduleFree`` (what verl's
``build_optimizer`` builds for ``rpg.optimizer=schedulefree``) switched between train (y) and eval
(x) by the worker's own ``RPGActorRolloutRefWorker.sf_set_mode``, as the trainer does around
validation and checkpoints:

* ``resident``: nothing offloaded: 3 steps, eval (probe logits = "validation"), train, 2 steps;
* ``offloaded``: the engine's order with ``param_offload`` and ``optimizer_offload``: parameters
  and optimizer states loaded for each step and offloaded after it (verl's non-blocking copies);
  the mode switches run on the offloaded tensors; a checkpoint (model and optimizer state dicts,
  per rank, as verl's FSDP checkpoint manager writes them) is saved in eval mode after step 3;
* ``resumed``: a fresh model and optimizer load that checkpoint, switch to train and run steps 4-5
  with offload.

Float32 compute (the question is the optimizer's bookkeeping; a bf16 forward would turn an ulp of
difference into a rounding flip). Rank 0 writes per rank: the probe logits (as lists) of each
training after step 3 in eval mode and after step 5 in train mode, the size of each mode switch,
and the checkpoint's ``train_mode`` flags.
"""

from __future__ import annotations

import os
import sys
import tempfile
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(TESTS), os.path.join(TESTS, "support")]

import fsdp_reference_ranks as scenario  # noqa: E402  (the tiny model and FSDP wrapping of the CPU tests)

LR = 1e-2
STEPS_BEFORE, STEPS_AFTER = 3, 2


class Training:
    """One FSDP2 model + AdamWScheduleFree, offloaded between uses or not (verl's helpers)."""

    def __init__(self, offload: bool):
        import schedulefree

        from rpg.verl.worker import RPGActorRolloutRefWorker

        self.model = scenario._wrap(scenario._tiny_model(0), "fsdp2", True, torch.float32, forward_only=False)
        self.opt = schedulefree.AdamWScheduleFree(self.model.parameters(), lr=LR, betas=(0.9, 0.999),
                                                  weight_decay=0.01)
        self.opt.train()  # as RPGActorRolloutRefWorker.init_model
        self.offload = offload and scenario.DEVICE == "cuda"  # a CPU dry run has nothing to offload to
        self._switch = RPGActorRolloutRefWorker.sf_set_mode
        self._worker = SimpleNamespace(_optimizer=lambda: self.opt)
        if offload:
            self._put_away()

    def _bring_in(self):
        from verl.utils.fsdp_utils import load_fsdp_model_to_gpu, load_fsdp_optimizer

        load_fsdp_model_to_gpu(self.model)
        load_fsdp_optimizer(self.opt, torch.cuda.current_device())

    def _put_away(self):
        from verl.utils.fsdp_utils import offload_fsdp_model_to_cpu, offload_fsdp_optimizer

        offload_fsdp_model_to_cpu(self.model)
        offload_fsdp_optimizer(self.opt)

    def on_gpu(self, fn):
        if self.offload:
            self._bring_in()
        try:
            return fn()
        finally:
            if self.offload:
                self._put_away()

    def step(self, ids):
        def once():
            scenario._train_step(self.model, self.opt, ids)

        self.on_gpu(once)

    def switch(self, mode: str) -> float:
        """The worker's switch, on wherever the tensors are (the CPU when offloaded)."""
        return self._switch(self._worker, mode)["max_abs_change"]

    def logits(self, probe) -> list:
        from rpg.verl.reference_copy import probe_logits

        self.model.eval()
        return self.on_gpu(lambda: probe_logits(self.model, probe, scenario.DEVICE).cpu().tolist())

    def save(self, path: str):
        self.on_gpu(lambda: torch.save({"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}, path))

    def load(self, path: str):
        state = torch.load(path, map_location="cpu", weights_only=False)

        def once():
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])

        self.on_gpu(once)
        return [g["train_mode"] for g in state["optimizer"]["param_groups"]]


def _rank(rank: int, world: int, init_file: str, ckpt_dir: str, out: str, device: str) -> None:
    from rpg.verl.reference_copy import probe_token_ids

    scenario.init_rank(rank, world, init_file, device)  # device "cpu": a dry run of the logic, not a test
    gen = torch.Generator().manual_seed(1 + rank)
    batches = [torch.randint(0, 96, (2, 12), generator=gen).to(scenario._device()) for _ in range(STEPS_BEFORE + STEPS_AFTER)]
    probe = probe_token_ids(96)
    ckpt = os.path.join(ckpt_dir, f"rank_{rank}.pt")
    rec: dict = {}
    for name, offload in (("resident", False), ("offloaded", True)):
        t = Training(offload)
        for ids in batches[:STEPS_BEFORE]:
            t.step(ids)
        rec[f"{name}_train_logits_3"] = t.logits(probe)
        rec[f"{name}_to_eval"] = t.switch("eval")
        rec[f"{name}_eval_logits_3"] = t.logits(probe)
        if offload:
            t.save(ckpt)
        rec[f"{name}_to_train"] = t.switch("train")
        for ids in batches[STEPS_BEFORE:]:
            t.step(ids)
        rec[f"{name}_train_logits_5"] = t.logits(probe)
    t = Training(offload=True)
    rec["checkpoint_train_mode"] = t.load(ckpt)
    rec["resumed_eval_logits_3"] = t.logits(probe)
    rec["resumed_to_train"] = t.switch("train")
    for ids in batches[STEPS_BEFORE:]:
        t.step(ids)
    rec["resumed_train_logits_5"] = t.logits(probe)
    scenario.write_gathered(rec, rank, world, out)
    dist.destroy_process_group()


def main(world: int, out: str, device: str = "cuda") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(world, os.path.join(tmp, "init"), tmp, out, device), nprocs=world, join=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], *sys.argv[3:4])
