"""The GPU kit's ``gpu_kit`` CI stage (docs/testing.md): the real build against the package registry (pip's
resolution for CPython 3.12 on x86_64 Linux with the node's torch 2.11.0, the trimmed carry under what one device
call carries), the carry installed by a Python 3.12, an offline install with the project and pip's check, and the
steps' real outputs on CPU read by the kit (pytest, the loss benchmark, the node probe, the model step).

The resolution needs a Python 3.12 (the node's: pip evaluates markers with its own interpreter):
``$RPG_GPU_KIT_PYTHON``, else ``python3.12`` on PATH (.ci/run finds one)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest
from test_gpu_kit import make_wheel

from rpg.gpu_kit import CARRY_FILE, MANIFEST, build, install, pack, run
from rpg.gpu_kit import steps as kit_steps

pytestmark = pytest.mark.gpu_kit

ROOT = Path(__file__).resolve().parents[2]
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
    p = subprocess.run([sys.executable, "-m", "rpg.gpu_kit.build", "--python", python312(), "--out", str(out)],
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
    assert "command:   PYTHONUNBUFFERED=1 python3 -m rpg.gpu_kit.run" in stdout and "timeout_s:" in stdout


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
    assert install.install_wheels(out / CARRY_FILE, site, python312()) == len(manifest["wheels"])
    for path in ("verl/__init__.py", "ray/_raylet.so", "hydra/__init__.py", "transfer_queue/__init__.py"):
        assert (site / path).is_file(), path
    assert os.access(site / "ray/core/src/ray/gcs/gcs_server", os.X_OK)  # mode bits survive the re-packing
    assert not (site / "ray/jars").exists() and not (site / "wandb").exists()


def fake_project(folder: Path) -> Path:
    """A checkout stand-in the install builds like the project (setuptools, an entry point)."""
    folder.mkdir()
    (folder / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "rpg-verl"
        version = "0.0.1"
        [project.entry-points."verl.plugins"]
        rpg = "fakeproj"
        [tool.setuptools]
        py-modules = ["fakeproj"]
        """))
    (folder / "fakeproj.py").write_text("")
    return folder


def test_a_carry_installs_offline_once_and_a_truncated_one_is_refused(tmp_path):
    wheels = {"kitpkg": make_wheel(tmp_path, "kitpkg", {"kitpkg/__init__.py": b"X = 1\n",
                                                       "kitpkg/jars/big.jar": b"0" * 5000}),
              "kitdep": make_wheel(tmp_path, "kitdep", {"kitdep.py": b"Y = 2\n"})}
    carry = tmp_path / "carry"
    manifest = pack.write_carry(wheels, {"kitpkg": "1.0", "kitdep": "1.0"}, carry,
                                 {"excluded": {"wandb": "why"}, "only_needed_by_excluded": []}, preset=1,
                                 trim={"kitpkg": ["kitpkg/jars/*"]})
    with tarfile.open(carry / CARRY_FILE) as tar:
        assert sorted(tar.getnames()) == sorted(w.name for w in wheels.values())
    assert json.loads((carry / MANIFEST).read_text())["carry"] == manifest["carry"]
    assert manifest["wheels"]["kitpkg"]["removed_members"] == 1

    site, project = tmp_path / "site", fake_project(tmp_path / "project")
    first = install.install(carry, site, checkout=project)
    assert first["problems"] == [] and first["wheels_installed"] == 2, first
    assert (site / "kitpkg" / "__init__.py").is_file() and not (site / "kitpkg" / "jars").exists()
    assert (site / "kitdep.py").is_file() and list(site.glob("rpg_verl-0.0.1.dist-info"))
    again = install.install(carry, site, checkout=project)  # the same carry: its wheels stay
    assert again["problems"] == [] and again["wheels_installed"] == "already there (same carry)"

    archive = carry / CARRY_FILE
    archive.write_bytes(archive.read_bytes()[:-100])
    refused = install.install(carry, site, checkout=project)
    assert len(refused["problems"]) == 1 and "a truncated or stale carry" in refused["problems"][0]
    assert install.install(tmp_path / "nothing", site)["problems"][0].endswith("carry .gpu_kit")


def step_run(name: str, tmp_path: Path, log: Path) -> kit_steps.StepRun:
    step = next(s for s in kit_steps.STEPS if s.name == name)
    return kit_steps.StepRun(step, step.box_s, log, tmp_path, tmp_path / "result.json")


def test_pytest_output_is_read_from_a_real_run(tmp_path):
    (tmp_path / "test_x.py").write_text("import pytest\n\ndef test_ok():\n    pass\n\n"
                                        "def test_bad():\n    assert 1 == 2, 'one is not two'\n\n"
                                        "@pytest.mark.skip(reason='why')\ndef test_skip():\n    pass\n")
    log = tmp_path / "gpu_tests.log"
    with open(log, "w") as f:
        subprocess.run([sys.executable, "-m", "pytest", "-v", "-rfEs", "-p", "no:cacheprovider", "--color=no",
                        "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)], stdout=f,
                       stderr=subprocess.STDOUT, cwd=tmp_path)
    result = kit_steps.parse_pytest(None, step_run("gpu_tests", tmp_path, log))
    assert result["counts"] == {"failed": 1, "passed": 1, "skipped": 1}, log.read_text()[-2000:]
    assert result["failures"] and result["failures"][0].startswith("FAILED test_x.py::test_bad")
    assert result["problems"][0].startswith("1 failed, 0 error(s): FAILED test_x.py::test_bad")


def test_the_loss_benchmark_table_is_read_from_a_real_run(tmp_path):
    log = tmp_path / "bench_losses.log"
    with open(log, "w") as f:
        p = subprocess.run([sys.executable, "benchmarks/bench_losses.py", "--batch", "2", "--length", "64", "--reps",
                            "1"], stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, timeout=900)
    assert p.returncode == 0, log.read_text()[-3000:]
    result = kit_steps.parse_bench(None, step_run("bench_losses", tmp_path, log))
    rows = result["rows"]
    assert result["problems"] == [] and len(rows) == 1 + 4 + 1 + 4, rows
    assert rows["verl vanilla (dual-clip PPO)"]["time_ratio"] == 1.0 and result["setting"].startswith("2 x 64 tokens")
    compiled = [r for n, r in rows.items() if n.endswith("[compiled]")]
    assert len(compiled) == 4 and all(r["ops"] is None and r["time_ms"] > 0 for r in compiled)
    assert result["line"].startswith("eager RPG time ") and "; compiled RPG time " in result["line"]


def test_the_probe_finds_the_rpg_losses_in_verls_registry(tmp_path):
    result_file = tmp_path / "probe.json"
    p = subprocess.run([sys.executable, "-m", "rpg.gpu_kit.probe", "--result", str(result_file)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    result = json.loads(result_file.read_text())
    assert result["packages"]["verl"]["version"] == "0.9.1" and result["packages"]["rpg-verl"]["from"]
    # here: no CUDA (and no Triton with the CPU torch); nothing about the registry
    assert p.returncode == 1 and result["problems"] and all(
        "sees no CUDA device" in line or line.startswith("import triton") for line in result["problems"])


def test_the_model_step_trains_on_cpu(tmp_path):
    result_file = tmp_path / "model.json"
    p = subprocess.run([sys.executable, "-m", "rpg.gpu_kit.model_step", "--device", "cpu", "--layers", "2",
                        "--hidden", "128", "--vocab", "512", "--batch", "2", "--prompt", "16", "--response", "16",
                        "--result", str(result_file)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(result_file.read_text())
    steps = result["steps"]
    assert result["problems"] == [] and [s["step"] for s in steps] == [1, 2, 3]
    assert steps[0]["max_abs_log_ratio"] == 0 and steps[0]["grad_norm"] > 0  # the sampler's own log-probs first
    assert steps[2]["max_abs_log_ratio"] > 0 and result["max_abs_parameter_change"] > 0
    assert result["model"].startswith("Qwen2-shaped, random weights")
