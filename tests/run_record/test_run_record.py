"""What a run ran on (``rpg.run_record``): the weights' digest, the code, the libraries and the CPU's kernel path."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from rpg.run_record import code_state, describe, file_sha256, ran_on, weights_digest


def test_the_weights_digest_is_the_weight_files_sha256_and_none_without_weights(tmp_path):
    import hashlib

    (tmp_path / "config.json").write_text("{}")
    assert weights_digest(tmp_path) is None  # a folder without weights: nothing to digest, said as such
    (tmp_path / "model.safetensors").write_bytes(b"abc")
    assert weights_digest(tmp_path) == hashlib.sha256(b"abc").hexdigest() == file_sha256(tmp_path / "model.safetensors")
    (tmp_path / "model-00002.safetensors").write_bytes(b"def")
    both = weights_digest(tmp_path)
    (tmp_path / "model-00002.safetensors").write_bytes(b"deg")  # one byte of one shard
    assert weights_digest(tmp_path) not in (both, None)
    (tmp_path / "model-00002.safetensors").rename(tmp_path / "model-00003.safetensors")  # a shard renamed
    assert weights_digest(tmp_path) != both


def test_a_record_names_the_weights_code_libraries_and_kernels(tmp_path):
    import torch

    (tmp_path / "model.safetensors").write_bytes(b"abc")
    record = ran_on(tmp_path, {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"})
    assert record["weights_sha256"] == file_sha256(tmp_path / "model.safetensors")
    assert record["libraries"]["torch"] == torch.__version__ and "verl" in record["libraries"]
    assert record["kernels"]["capability"] == torch.backends.cpu.get_cpu_capability()
    assert (record["kernels"]["ATEN_CPU_CAPABILITY"], record["kernels"]["OMP_NUM_THREADS"]) == ("default", "1")
    line = describe(record)
    assert record["weights_sha256"][:12] in line and "ATEN_CPU_CAPABILITY=default" in line


def test_code_state_tells_commits_and_uncommitted_changes_apart(tmp_path, monkeypatch):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                       capture_output=True)

    (repo / "a.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", "a.py")
    git("commit", "-qm", "a")
    monkeypatch.setattr("rpg.paths.checkout.CHECKOUT", repo)
    clean = code_state()
    assert clean["changes"] is None and len(clean["commit"]) == 40 and clean["code"] == clean["commit"][:7]
    (repo / "a.py").write_text("x = 2\n")
    edited = code_state()
    assert edited["code"] == clean["code"] + "+dirty" and edited["changes"] and code_state() == edited
    (repo / "a.py").write_text("x = 3\n")
    assert code_state()["changes"] not in (None, edited["changes"])  # other changes: other code
    (repo / "a.py").write_text("x = 1\n")
    assert code_state() == clean
    (repo / "new.py").write_text("y = 1\n")  # an untracked file is a change
    assert code_state()["changes"] is not None
    (repo / "new.py").unlink()
    (repo / "report").mkdir()
    (repo / "report" / "runs.csv").write_text("run_id\n")  # the study's own output is not
    assert code_state()["changes"] is not None and code_state((repo / "report",)) == clean
