"""An asynchronous run's checkpoints saved by the recipe's real save (``RPGTrainer._save_checkpoint`` over verl's
``trainer_base._save_checkpoint``; stand-ins for the actor worker group and TransferQueue, as in
tests/verl/test_verl_reference.py), step 2 whole, then step 4's save held at a point so that the test kills this
process there with SIGKILL: what is on disk afterwards is what such a kill leaves.

``python killed_save.py ROOT POINT READY``: POINT ``before_book`` (verl's save returned, its tracker written, the lag
book not begun) or ``mid_book`` (half the lag book's bytes written and flushed); READY is written once held.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import torch
import transfer_queue as tq
from test_verl_reference import RetainingWorkerGroup, _saving_trainer

import rpg.verl.sample_order_and_lag as order_and_lag
from rpg.config import parse_rpg_settings
from rpg.verl.sample_order_and_lag import LagBook


class TorchFiles(RetainingWorkerGroup):
    """The actor's shard in torch's format (the resume's check opens it as a zip)."""

    def save_checkpoint(self, local_path, *args, **kwargs):
        super().save_checkpoint(local_path, *args, **kwargs)
        torch.save({"w": torch.zeros(4)}, Path(local_path) / "model_world_size_1_rank_0.pt")


def replay_buffer(path, metadata):
    """TransferQueue's save (``tq.save_checkpoint``): its metadata file, which the resume's check looks for."""
    os.makedirs(path, exist_ok=True)
    Path(path, "metadata.json").write_text(json.dumps(metadata))


def hold(ready: Path) -> None:
    ready.write_text(str(os.getpid()))
    threading.Event().wait()  # until the test's SIGKILL


def main(root: Path, point: str, ready: Path) -> None:
    tq.save_checkpoint = replay_buffer
    t = _saving_trainer(root, keep=None)
    t.rpg = parse_rpg_settings({})  # the default reference (the sampler): no reference state is saved
    t.trainer_mode = "colocate_async"
    t.actor_rollout_wg = TorchFiles()
    t._lag_book = LagBook(0)
    for step in (1, 2):
        t._lag_book.add_updates(1)
        t._lag_book.publish(step)
    t.global_steps = 2
    t._save_checkpoint()
    for step in (3, 4):
        t._lag_book.add_updates(1)
        t._lag_book.publish(step)
    t.global_steps = 4
    if point == "before_book":
        order_and_lag.LagBook.state_dict = lambda self: hold(ready)
    else:
        dump = json.dump

        def half_then_hold(obj, f, *args, **kwargs):
            if isinstance(obj, dict) and "at_version" in obj:  # the lag book's record
                text = json.dumps(obj)
                f.write(text[: len(text) // 2])
                f.flush()
                os.fsync(f.fileno())
                hold(ready)
            return dump(obj, f, *args, **kwargs)

        order_and_lag.json.dump = half_then_hold
    t._save_checkpoint()
    raise SystemExit("the save was not held")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
