"""Checkpoints across world sizes (docs/verl-integration.md, "Resume at another world size").

* On gloo ranks (tests/support/reshard_ranks.py, ~20 s, the ``distributed`` stage): a checkpoint saved by verl's own
  ``FSDPCheckpointManager`` at world size 2 loads at world size 1 and the reverse, through the manager the
  worker installs (``rpg.verl.reshard.ReshardingCheckpointManager``), for torch AdamW and schedule-free
  AdamW: the loaded model, optimizer state (every state tensor, the param groups), lr schedule and
  reference equal, as full tensors gathered by torch itself, the saved ones *exactly* (the same float32
  values, only their placement changed), and one more update on the same batch gives exactly the
  parameters the saving world size computed (FSDP's mean over ranks of equal gradients is exact). The
  load starts from other weights (``moved_by_load`` > 0), so nothing passes by accident; verl's manager
  alone raises ``FileNotFoundError`` on these checkpoints.
* Before Ray (``rpg.verl.resume_world_size``, milliseconds): the line the driver prints, and the one-line
  refusals naming both world sizes and the way out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from messages import names, one_line
import torch

from rpg.verl.checkpoints import ResumeError, plan_resume, write_marker
from rpg.verl.resume_world_size import holds_dtensors, world_size, world_size_change

pytestmark = pytest.mark.gpu_stack  # also in the GPU stack's torch: .ci/run

SCRIPT = Path(__file__).parents[1] / "support" / "reshard_ranks.py"


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    work = tmp_path_factory.mktemp("reshard")
    out = work / "out.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(work), str(out)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.distributed
@pytest.mark.parametrize("case", ["adamw: 2 -> 1", "adamw: 1 -> 2", "schedulefree: 2 -> 1", "schedulefree: 1 -> 2"])
def test_a_checkpoint_loads_exactly_at_another_world_size(loaded, case):
    r = loaded[case]
    assert r["moved_by_load"] > 0.01, r  # the load replaced other weights
    assert r["model_keys_equal"] and r["optim_state_keys_equal"] and r["param_groups_equal"], r
    assert r["model"] == 0.0 and r["optim_state"] == 0.0 and r["reference"] == 0.0, r
    assert r["schedule_equal"], r
    assert r["after_update"] == 0.0, r  # the optimizer state sits on the right parameters


# ----------------------------------------------------------------------------- before Ray


def _checkpoint(root: Path, saved: int, version: int = 2, reference: str | None = "dtensor") -> Path:
    """A global_step_2 with verl's file names for ``saved`` ranks (tiny contents), a reference, a marker."""
    folder = root / "global_step_2"
    actor = folder / "actor"
    actor.mkdir(parents=True)
    for kind in ("model", "optim", "extra_state"):
        for r in range(saved):
            path = actor / f"{kind}_world_size_{saved}_rank_{r}.pt"
            _save_dtensor(path) if kind == "model" else torch.save({"x": torch.zeros(1)}, path)
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": version, "world_size": saved}))
    if reference:
        (folder / "rpg_reference").mkdir()
        for r in range(saved):
            path = folder / "rpg_reference" / f"reference_rank_{r}.pt"
            _save_dtensor(path) if reference == "dtensor" else torch.save({"w": torch.zeros(1)}, path)
    torch.save({}, folder / "data.pt")
    (root / "latest_checkpointed_iteration.txt").write_text("2")
    write_marker(folder, 2, None)
    return folder


_DTENSOR_FILE: list[bytes] = []


def _save_dtensor(path: Path) -> None:
    """Save {"w": a one-rank DTensor} (what an FSDP2 shard pickles as); made once, on a throwaway gloo group."""
    if not _DTENSOR_FILE:
        import io
        import os
        import tempfile

        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        fd, rendezvous = tempfile.mkstemp()
        os.close(fd)
        os.remove(rendezvous)
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1)
        try:
            buf = io.BytesIO()
            torch.save({"w": distribute_tensor(torch.zeros(2), init_device_mesh("cpu", (1,)), [Shard(0)])}, buf)
            _DTENSOR_FILE.append(buf.getvalue())
        finally:
            dist.destroy_process_group()
    path.write_bytes(_DTENSOR_FILE[0])


def test_the_driver_says_what_is_resharded_and_that_the_rng_is_not_restored(tmp_path):
    folder = _checkpoint(tmp_path, saved=2)
    assert holds_dtensors(folder / "rpg_reference" / "reference_rank_0.pt")
    plan = plan_resume("auto", str(tmp_path), world_size=1)
    assert plan.folder == str(folder)
    names(one_line(plan.note), str(folder), "world size 2", "world size 1",
          "model, optimizer state, lr schedule, reference")
    assert "the per-rank RNG state is not restored" in plan.note
    assert "world size" not in (plan_resume("auto", str(tmp_path), world_size=2).note or "")  # same world size
    assert world_size_change(folder, 2) == (None, None)
    # a world size the driver's rules refuse in their own line is not compared here
    assert world_size(2, 1) == 2 and world_size(0, 1) is None and world_size("2", 1) is None


@pytest.mark.parametrize("case, expected", [
    ("fsdp1_save", "saved by FSDP1: only FSDP2 checkpoints (DTensor shards) load at another world size"),
    ("fsdp1_run", "this run's actor strategy is fsdp: only FSDP2 checkpoints"),
    ("missing_rank", "lacks optim_world_size_2_rank_1.pt: the full tensors cannot be rebuilt"),
    ("plain_reference", "reference shards in"),
    ("plain_model", "its model shards were saved without their placement"),
    ("critic", "its critic/ is not resharded"),
])
def test_what_cannot_be_resharded_is_refused_before_ray_in_one_line(tmp_path, case, expected):
    folder = _checkpoint(tmp_path, saved=2, version=1 if case == "fsdp1_save" else 2,
                         reference="plain" if case == "plain_reference" else "dtensor")
    if case == "missing_rank":
        (folder / "actor" / "optim_world_size_2_rank_1.pt").unlink()
    if case == "plain_model":
        torch.save({"w": torch.zeros(1)}, folder / "actor" / "model_world_size_2_rank_0.pt")
        write_marker(folder, 2, None)
    if case == "critic":
        (folder / "critic").mkdir()
    with pytest.raises(ResumeError) as e:
        if case == "missing_rank":  # the marker would refuse it first: the world-size check alone
            problem, _ = world_size_change(folder, 1)
            raise ResumeError(problem)
        plan_resume("auto", str(tmp_path), world_size=1, strategy="fsdp" if case == "fsdp1_run" else "fsdp2")
    line = str(e.value)
    assert "\n" not in line and expected in line, line
    names(line, str(folder), "world size 2", "world size 1", "trainer.n_gpus_per_node x trainer.nnodes = 2")
    assert "python -m verl.model_merger merge --backend fsdp" in line
