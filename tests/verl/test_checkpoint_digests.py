"""Checkpoint digests computed where the bytes were written (``rpg.verl.checkpoint_digests``): each
rank hashes the files it wrote, the trainer joins the reports and hashes only its own files; the marker is the one a
single process hashing everything writes, and the resume's checks catch what they caught before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rpg.verl import checkpoint_marker, checkpoints
from rpg.verl.checkpoint_digests import join_reports, rank_entries, rank_files
from rpg.verl.checkpoints import MARKER, checkpoint_problem, manifest, plan_resume, write_marker

SHARDS = ("model", "optim", "extra_state")


def _two_rank_checkpoint(root: Path) -> Path:
    """A world-size-2 global_step_3 laid out as verl's FSDP manager, RPG's reference save and the trainer write it."""
    d = root / "global_step_3"
    (d / "actor" / "huggingface").mkdir(parents=True)
    (d / "rpg_reference").mkdir()
    for r in range(2):
        for kind in SHARDS:
            torch.save({"w": torch.arange(64.0) + r}, d / "actor" / f"{kind}_world_size_2_rank_{r}.pt")
        torch.save({"w": torch.ones(8) * r}, d / "rpg_reference" / f"reference_rank_{r}.pt")
    (d / "actor" / "huggingface" / "config.json").write_text("{}")
    (d / "actor" / "fsdp_config.json").write_text('{"FSDP_version": 2, "world_size": 2}')
    torch.save({"epoch": 0}, d / "data.pt")
    (d / "rpg_reference.json").write_text("{}")
    return d


def test_each_rank_claims_the_files_it_wrote_and_the_joined_marker_equals_one_process_hashing_all(tmp_path):
    d = _two_rank_checkpoint(tmp_path)
    rank0, rank1 = rank_files(d, 0, 2), rank_files(d, 1, 2)
    assert rank1 == [f"actor/{k}_world_size_2_rank_1.pt" for k in SHARDS] + ["rpg_reference/reference_rank_1.pt"]
    assert sorted(rank0) == sorted([f"actor/{k}_world_size_2_rank_0.pt" for k in SHARDS] + [
        "rpg_reference/reference_rank_0.pt", "actor/huggingface/config.json", "actor/fsdp_config.json"])
    everything = manifest(d)  # one process hashing every file: the marker as it was before
    assert set(everything) - set(rank0) - set(rank1) == {"data.pt", "rpg_reference.json"}  # the trainer's own
    known = join_reports([rank_entries(d, 0, 2), rank_entries(d, 1, 2)])
    assert manifest(d, known) == everything
    write_marker(d, 3, None, known=known)
    assert json.loads((d / MARKER).read_text())["files"] == everything
    assert checkpoint_problem(d) is None


def test_with_the_ranks_reports_the_trainer_reads_only_the_files_it_wrote(tmp_path, monkeypatch):
    d = _two_rank_checkpoint(tmp_path)
    known = join_reports([rank_entries(d, 0, 2), rank_entries(d, 1, 2)])
    hashed = []
    real = checkpoint_marker.file_digest
    monkeypatch.setattr(checkpoint_marker, "file_digest", lambda p: hashed.append(Path(p).relative_to(d).as_posix()) or real(p))
    write_marker(d, 3, None, known=known)
    assert sorted(hashed) == ["data.pt", "rpg_reference.json"]


def test_the_trainers_save_asks_the_ranks_and_hashes_no_shard_itself(tmp_path, monkeypatch):
    """RPGTrainer._save_checkpoint (verl's real save underneath, a stand-in worker group reporting as the real
    worker method does): the actor and reference shards are hashed inside the ranks' call only."""
    from test_verl_reference import RetainingWorkerGroup, _saving_trainer

    hashed, where = [], ["trainer"]

    class Ranks(RetainingWorkerGroup):
        def save_checkpoint(self, local_path, *args, **kwargs):
            super().save_checkpoint(local_path, *args, **kwargs)
            torch.save({"w": torch.zeros(4)}, Path(local_path) / "model_world_size_1_rank_0.pt")

        def rpg_checkpoint_digests(self, folder):
            where[0] = "rank"
            try:
                return super().rpg_checkpoint_digests(folder)
            finally:
                where[0] = "trainer"

    real = checkpoint_marker.file_digest
    monkeypatch.setattr(checkpoint_marker, "file_digest", lambda p: hashed.append((where[0], Path(p).name)) or real(p))
    t = _saving_trainer(tmp_path, keep=None)
    t.actor_rollout_wg = Ranks()
    t.global_steps = 3  # periodic K=3 resets at 3: no reference shards; at 2 they are saved
    t._save_checkpoint()
    t.global_steps = 2
    t._save_checkpoint()
    by_trainer = {name for w, name in hashed if w == "trainer"}
    by_rank = {name for w, name in hashed if w == "rank"}
    assert by_trainer == {"data.pt", "rpg_reference.json", "rpg_step_metrics.json", "rpg_lag_book.json"}, hashed
    assert by_rank == {"model_world_size_1_rank_0.pt", "reference_rank_0.pt"}, hashed
    for step in (2, 3):
        d = tmp_path / f"global_step_{step}"
        record = json.loads((d / MARKER).read_text())
        assert record["files"] == manifest(d)  # same record as one process hashing all
        assert record["last_step"] == 4  # the run's last step: 2 epochs of 2 steps before total_training_steps=5


def test_a_file_changed_after_its_rank_hashed_it_is_caught_at_the_resume(tmp_path):
    """The rank's digest is of the bytes it wrote; storage that returns other bytes (a write lost in transit, a
    flipped byte) is named at the resume and the checkpoint is not loaded, as before."""
    d = _two_rank_checkpoint(tmp_path)
    known = join_reports([rank_entries(d, 0, 2), rank_entries(d, 1, 2)])
    shard = d / "actor" / "optim_world_size_2_rank_1.pt"
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    shard.write_bytes(bytes(blob))  # same size, other bytes: before the marker, as storage could deliver it
    write_marker(d, 3, None, known=known)
    assert "optim_world_size_2_rank_1.pt: corrupted or replaced" in checkpoint_problem(d)
    with pytest.raises(checkpoints.ResumeError, match="optim_world_size_2_rank_1.pt: corrupted or replaced"):
        plan_resume("resume_path", str(tmp_path), str(d))


def test_a_file_a_rank_reported_but_the_listing_missed_is_recorded(tmp_path):
    """A stale directory cache on shared storage may hide a just-written file from the trainer: the rank's entry
    is kept, so the resume checks the file (missing there: the checkpoint is named incomplete, not accepted)."""
    d = _two_rank_checkpoint(tmp_path)
    entry = {"size": 5, "sha256": "0" * 64}
    files = manifest(d, {"actor/optim_world_size_2_rank_9.pt": entry})
    assert files["actor/optim_world_size_2_rank_9.pt"] == entry
    write_marker(d, 3, None, known={"actor/optim_world_size_2_rank_9.pt": entry})
    assert checkpoint_problem(d) == f"{d}: actor/optim_world_size_2_rank_9.pt is missing (listed in {MARKER})"


def test_two_ranks_reporting_one_file_differently_is_an_error_naming_it():
    a, b = {"x.pt": {"size": 1, "sha256": "a"}}, {"x.pt": {"size": 1, "sha256": "b"}}
    assert join_reports([a, dict(a)]) == a  # the same entry twice is one file
    with pytest.raises(ValueError, match=r"^x\.pt: two ranks reported different digests"):
        join_reports([a, b])
