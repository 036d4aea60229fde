"""The GPU kit's ``gpu_kit`` CI stage (docs/testing.md): the real build against the package registry (pip's
resolution for CPython 3.12 on x86_64 Linux with the node's torch 2.11.0, the trimmed carry under what one device
call carries), the carry installed by a Python 3.12, an offline install with the project and pip's check, and the
steps' real outputs on CPU read by the kit (pytest, the loss benchmark, the node probe, the model step): this file
holds the build and its carry installed by a Python 3.12, tests/lab/gpu_kit/test_gpu_kit_steps_stage.py the rest (two
files, so that the stage's two workers run them side by side).

The resolution needs a Python 3.12 (the node's: pip evaluates markers with its own interpreter):
``$RPG_GPU_KIT_PYTHON``, else ``python3.12`` on PATH (.ci/run finds one)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from rpg_lab.gpu_kit import CARRY_FILE, MANIFEST, build, install

pytestmark = pytest.mark.gpu_kit

ROOT = Path(__file__).resolve().parents[3]
MIB = 2**20


def python312() -> str:
    python = os.environ.get("RPG_GPU_KIT_PYTHON") or shutil.which("python3.12") or "python3.12"
    try:
        build.check_resolver(python)
    except build.BuildError as e:
        pytest.fail(f"the gpu_kit stage needs a Python 3.12 (RPG_GPU_KIT_PYTHON or python3.12 on PATH): {e}")
    return python


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The real build (a few minutes: the resolution, about 110 MiB of downloads, xz over about 250 MiB)."""
    out = tmp_path_factory.mktemp("kit") / "carry"
    p = subprocess.run([sys.executable, "-m", "rpg_lab.gpu_kit.build", "--python", python312(), "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    return out, json.loads((out / MANIFEST).read_text()), p.stdout


def test_the_build_resolves_for_python_312_with_torch_2_11_and_fits_one_device_call(built):
    out, manifest, stdout = built
    resolved, wheels = manifest["resolved"], manifest["wheels"]
    assert resolved["torch"] == "2.11.0" and "torch==2.11.0" in manifest["pins"]
    assert wheels["verl"]["version"] == "0.9.1"
    for name in ("ray", "transferqueue", "hydra-core", "omegaconf", "antlr4-python3-runtime", "schedulefree",
                 "math-verify", "latex2sympy2-extended", "tensordict", "transformers", "tokenizers"):
        assert name in wheels, name
    # the node's packages are not carried (torch, its CUDA libraries, numpy...) except those outside a range
    assert not [n for n in wheels if n in ("torch", "triton", "numpy") or n.startswith(("nvidia-", "cuda-"))]
    major, minor = map(int, wheels["transformers"]["version"].split(".")[:2])
    assert (5, 5) <= (major, minor) < (5, 11)  # verl 0.9.1's range
    assert set(manifest["excluded"]) <= set(build.EXCLUDE) and "wandb" not in wheels
    for entry in wheels.values():  # wheels for the node: CPython 3.12 or pure, x86_64 manylinux or any
        interpreter, abi, platform = entry["wheel"][:-4].split("-")[-3:]
        assert any(t.startswith(("py3", "cp3")) for t in interpreter.split(".")) and abi in ("none", "abi3", "cp312")
        assert platform == "any" or all(p.startswith("manylinux") and p.endswith("_x86_64")
                                        for p in platform.split(".")), entry
    size, tree = manifest["carry"]["bytes"], manifest["working_tree_bytes"]
    assert size == (out / CARRY_FILE).stat().st_size and size <= build.MAX_MIB * MIB
    assert tree is not None and size + tree <= build.CALL_MIB * MIB
    assert "command:   PYTHONPATH=lab PYTHONUNBUFFERED=1 python3 -m rpg_lab.gpu_kit.run" in stdout and "timeout_s:" in stdout


def test_the_carry_is_trimmed_and_installs_with_python_312(built, tmp_path):
    out, manifest, _ = built
    with tarfile.open(out / CARRY_FILE) as tar:
        assert sorted(tar.getnames()) == sorted(e["wheel"] for e in manifest["wheels"].values())
        ray = tar.extractfile(manifest["wheels"]["ray"]["wheel"])
        with zipfile.ZipFile(ray) as z:
            names = z.namelist()
    assert names and not [n for n in names if n.startswith(("ray/jars/", "ray/rllib/", "ray/dashboard/client/"))]
    assert manifest["wheels"]["ray"]["removed_members"] > 0
    site = tmp_path / "site"
    assert install.install_carry(out / CARRY_FILE, site, python312()) == len(manifest["wheels"])
    for path in ("verl/__init__.py", "ray/_raylet.so", "hydra/__init__.py", "transfer_queue/__init__.py"):
        assert (site / path).is_file(), path
    assert os.access(site / "ray/core/src/ray/gcs/gcs_server", os.X_OK)  # mode bits survive the re-packing
    assert not (site / "ray/jars").exists() and not (site / "wandb").exists()
