"""The GPU kit's ``gpu_kit`` CI stage (docs/testing.md), the half without the build: an offline install of a carry
with the project and pip's check, and the steps' real outputs on CPU read by the kit (pytest, the loss benchmark, the
node probe, the model step). The build and its carry installed by a Python 3.12 are
tests/lab/gpu_kit/test_gpu_kit_stage.py's; two files so that the stage's two workers run them side by side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from test_gpu_kit import make_wheel

from rpg_lab.gpu_kit import CARRY_FILE, MANIFEST, install, pack
from rpg_lab.gpu_kit import steps as kit_steps

pytestmark = pytest.mark.gpu_kit

ROOT = Path(__file__).resolve().parents[3]


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
    p = subprocess.run([sys.executable, "-m", "rpg_lab.gpu_kit.probe", "--result", str(result_file)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    result = json.loads(result_file.read_text())
    assert result["packages"]["verl"]["version"] == "0.9.1" and result["packages"]["rpg-verl"]["from"]
    # here: no CUDA (and no Triton with the CPU torch); nothing about the registry
    assert p.returncode == 1 and result["problems"] and all(
        "sees no CUDA device" in line or line.startswith("import triton") for line in result["problems"])


def test_the_model_step_trains_each_shape_on_cpu(tmp_path):
    """Both shapes (the 0.1 B Qwen2 and SmolLM2's Llama layout), made small by the size options (hidden 576: nine
    heads of 64 in both)."""
    result_file = tmp_path / "model.json"
    p = subprocess.run([sys.executable, "-m", "rpg_lab.gpu_kit.model_step", "--device", "cpu", "--layers", "1",
                        "--hidden", "576", "--vocab", "512", "--batch", "2", "--prompt", "16", "--response", "16",
                        "--result", str(result_file)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    both = json.loads(result_file.read_text())
    assert both["problems"] == [] and list(both["shapes"]) == ["qwen2", "smollm2"]
    for shape, result in both["shapes"].items():
        steps = result["steps"]
        assert result["problems"] == [] and [s["step"] for s in steps] == [1, 2, 3]
        assert steps[0]["max_abs_log_ratio"] == 0 and steps[0]["grad_norm"] > 0  # the sampler's own log-probs first
        assert steps[2]["max_abs_log_ratio"] > 0 and result["max_abs_parameter_change"] > 0
        assert result["batch"] == "2 x (16 prompt + 16 response) tokens" and shape in both["line"]
    assert both["shapes"]["qwen2"]["model"].startswith("Qwen2-shaped, random weights")
    assert both["shapes"]["smollm2"]["model"].startswith("SmolLM2-135M-shaped (Llama), random weights")


def test_the_smollm2_shape_is_the_built_models_and_its_batch_the_gpu_runs():
    """SmolLM2's shape against the config transformers builds from its GGUF (the asset, built here if the stage has
    not yet), and
    its default batch: the most sequences of the task's longest prompt + response within the GPU run's budget."""
    from transformers import AutoConfig

    from rpg_lab.gpu_kit.model_step import SHAPES, smollm2_config
    from rpg.smol.overrides import GPU_SIZES, MAX_PROMPT_LENGTH, MAX_RESPONSE_LENGTH

    own = SHAPES["smollm2"][2]
    ours = smollm2_config(own["layers"], own["hidden"], own["vocab"])
    assert own["batch"] * (own["prompt"] + own["response"]) <= GPU_SIZES["token_budget"] < (
        (own["batch"] + 1) * (MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))
    from rpg.smol import build_smol_assets

    theirs = AutoConfig.from_pretrained(build_smol_assets(quiet=True).model_dir)  # built once per machine (smol extra)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "tie_word_embeddings", "max_position_embeddings"):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert ours.rope_parameters["rope_theta"] == theirs.rope_parameters["rope_theta"]
    assert abs(ours.rms_norm_eps - theirs.rms_norm_eps) < 1e-9


def test_the_memory_probe_runs_verls_fsdp2_actor_on_cpu_at_stand_in_widths(tmp_path):
    """The probe's whole path (verl's apply_fsdp2 on a one-process gloo mesh, gradient checkpointing, verl's log-probs
    and entropy, the registered RPG loss, AdamW) at each layout's stand-in widths; no peak off CUDA, so nothing is
    restated, and each truncated model has the parameters rpg.memory counts."""
    result_file = tmp_path / "probe.json"
    p = subprocess.run([sys.executable, "-m", "rpg_lab.gpu_kit.memory_probe", "--device", "cpu", "--stand-in",
                        "--eager-entropy", "--result", str(result_file)], capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(result_file.read_text())
    assert result["problems"] == [] and list(result["shapes"]) == ["Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen3-4B"]
    for entry in result["shapes"].values():
        assert [(r["layers"], r["tokens"]) for r in entry["runs"]] == [(1, 32), (1, 64), (2, 32), (2, 64)]
        for r in entry["runs"]:
            assert r["log-prob"]["peak_gib"] is None and r["forward+backward"]["seconds"] > 0
            assert 0 < r["planned_gib"]["log-prob"] < r["planned_gib"]["update"]
        assert entry["restated"] == []
    assert result["line"].startswith("8 measurements in ")


def test_the_probed_models_have_the_parameters_the_memory_plan_counts():
    """transformers' Qwen2 and Qwen3 models at the real widths, 1 and 2 layers, built on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    from rpg_lab.gpu_kit.memory_probe import hf_config, shapes
    from rpg_lab.gpu_kit.memory_terms import truncated

    for _, arch in shapes(stand_in=False):
        for layers in (1, 2):
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(hf_config(arch, layers))
            assert sum(p.numel() for p in model.parameters()) == truncated(arch, layers).params, (arch.name, layers)
