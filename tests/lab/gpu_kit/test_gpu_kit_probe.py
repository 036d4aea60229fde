"""The kit's environment step records what a vLLM start depends on (rpg_lab.gpu_kit.probe.node): nvcc, /dev/shm, the
VLLM_/CUDA_/NCCL_ variables, the driver's version and CUDA, torch's CUDA and NCCL; each "absent" when absent or
unreadable, with why in one line, never a traceback."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from rpg_lab.gpu_kit import probe, source_path

ROOT = Path(__file__).resolve().parents[3]


def test_a_node_without_cuda_tools_or_driver_reads_absent_and_the_variables_are_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvcc, no nvidia-smi
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.setattr("rpg.backends.gpu.preflight.driver_cuda_version", lambda: None)
    found = probe.node()
    assert found["nvcc"] == found["driver"] == found["driver_cuda"] == "absent"
    assert found["env"]["VLLM_LOGGING_LEVEL"] == "INFO" and found["env"]["NCCL_DEBUG"] == "WARN"
    assert all(k.startswith(("VLLM_", "CUDA_", "NCCL_")) for k in found["env"])
    assert found["dev_shm"]["size_gib"] > 0  # this machine has one


def test_nvcc_under_cuda_home_is_found_and_a_read_that_fails_is_one_line(tmp_path, monkeypatch):
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\necho 'Cuda compilation tools, "
                    "release 13.0, V13.0.88'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert probe.node()["nvcc"] == {"path": str(nvcc), "version": "Cuda compilation tools, release 13.0, V13.0.88"}

    def broken():
        raise OSError("no such device\nsecond line")

    monkeypatch.setattr(probe, "_shm", broken)
    assert probe.node()["dev_shm"] == "absent (OSError: no such device)"


def test_the_environment_step_writes_them_in_its_result(tmp_path):
    """The step's own command (no GPU here: it exits 1 for that, its result written all the same)."""
    result = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(source_path(ROOT)), "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    p = subprocess.run([sys.executable, "-m", "rpg_lab.gpu_kit.probe", "--result", str(result)], capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=300)
    node = json.loads(result.read_text())["node"]
    assert "Traceback" not in p.stderr and node["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert set(node) == {"nvcc", "dev_shm", "env", "driver", "driver_cuda", "torch_cuda", "nccl"}
