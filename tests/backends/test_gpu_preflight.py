"""The driver's GPU checks before Ray (rpg.backends.gpu.preflight), on a CPU machine: every refusal
line from a simulated node (``GpuProbe`` built by hand), exit code 2 from the driver before Ray is
touched, DRY_RUN=1's warnings with exit code 0, the CPU backend left alone, the real 4B script on
this CUDA-less machine, and the tested versions kept in step with verl's pins and the docs."""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from launching import env as _env, recipe_main
from messages import names, one_line

from rpg.backends.gpu import preflight as P
from rpg.backends.gpu.preflight import GpuCheckError, GpuProbe, GpuRequest, check
from rpg.verl.input_paths import error_line

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "run_rpg_4b_ctx8k_urkl1e-4_rf_clip_ppo_0.2_0.28"
GOOD = GpuProbe(cuda_available=True, visible_gpus=8, torch_cuda="13.0", driver_cuda="13.0",
                versions={"verl": "0.9.1", "torch": "2.11.0", "vllm": "0.24.0", "transformers": "5.9.0"})
NO_CUDA = replace(GOOD, cuda_available=False, visible_gpus=0, torch_cuda=None, driver_cuda=None,
                  importable=frozenset(), versions={**GOOD.versions, "torch": "2.13.0", "vllm": None})
ATTN = "actor_rollout_ref.model.override_config.attn_implementation"


def errors(probe: GpuProbe, **request) -> list[str]:
    return list(check(GpuRequest(**{"gpus_per_node": 8, **request}), probe).errors)


# ----------------------------------------------------------------------------- the rules, one line each


def test_a_good_node_passes_without_a_line():
    assert check(GpuRequest(gpus_per_node=8), GOOD) == P.GpuReport()


def test_cpu_only_torch_is_one_line_naming_cuda():
    (line,) = errors(replace(GOOD, cuda_available=False, visible_gpus=0, torch_cuda=None, versions={"torch": "2.13.0"}))
    names(one_line(line), "trainer.device=cuda", "torch 2.13.0", "CPU-only", "docs/gpu-setup.md#install",
          "RPG_BACKEND=cpu")


def test_no_driver_and_no_visible_gpu_are_one_line_each():
    (line,) = errors(replace(GOOD, cuda_available=False, visible_gpus=0, driver_cuda=None))
    names(one_line(line), "trainer.device=cuda", "no NVIDIA driver", "RPG_BACKEND=cpu")
    (line,) = errors(replace(GOOD, cuda_available=False, visible_gpus=0, cuda_visible_devices=""))
    names(one_line(line), "trainer.device=cuda", "torch 2.11.0", "CUDA 13.0", "CUDA_VISIBLE_DEVICES=''",
          "RPG_BACKEND=cpu")
    assert "no NVIDIA driver" not in line  # a driver is found: not blamed


def test_a_driver_too_old_for_torchs_cuda_is_its_own_line():
    old = replace(GOOD, cuda_available=False, visible_gpus=0, driver_cuda="12.8")
    (line,) = errors(old)  # the driver's line explains the unusable CUDA: no second line about it
    names(one_line(line), "driver", "12.8", "torch 2.11.0", "CUDA 13.0", "13.x", "580", "CUDA 12.x")
    # minor-version compatibility: a CUDA 13.0 driver runs a torch built for 13.2
    assert errors(replace(GOOD, torch_cuda="13.2")) == []


def test_a_single_node_run_asking_more_gpus_than_visible():
    (line,) = errors(replace(GOOD, visible_gpus=4))
    names(one_line(line), "trainer.n_gpus_per_node=8", "4 GPU(s)", "trainer.nnodes=1", "allowed 1..4",
          "N_GPUS_PER_NODE", "CUDA_VISIBLE_DEVICES")
    assert errors(replace(GOOD, visible_gpus=4), nnodes=2) == []  # the other nodes' GPUs are not visible here


def test_a_single_node_separate_async_run_counts_both_pools():
    from omegaconf import OmegaConf

    from rpg.backends.gpu.preflight import request_from_config

    cfg = OmegaConf.create({"trainer": {"nnodes": 1, "n_gpus_per_node": 4, "v1": {"trainer_mode": "separate_async"}},
                            "actor_rollout_ref": {"rollout": {"nnodes": 1, "n_gpus_per_node": 4}}})
    settings = type("S", (), {"uses_rpg_actor_loss": True, "loss_name": "rpg"})()
    request = request_from_config(cfg, settings, environ={})
    assert request.rollout_gpus == 4
    assert list(check(request, GOOD).errors) == []  # 4 + 4 of 8
    (line,) = check(request, replace(GOOD, visible_gpus=6)).errors
    names(one_line(line), "trainer.n_gpus_per_node=4", "actor_rollout_ref.rollout.n_gpus_per_node=4", "6")
    cfg.actor_rollout_ref.rollout.nnodes = 2  # the rollout pool on nodes of its own: not this node's to count
    assert request_from_config(cfg, settings, environ={}).rollout_gpus == 0
    cfg.trainer.v1.trainer_mode = "sync"
    assert request_from_config(cfg, settings, environ={}).rollout_gpus == 0


def test_a_driver_joining_a_cluster_refuses_nothing_of_its_own_node_and_names_what_it_lacks():
    """The driver's node runs no rank: its node rules go, its missing software is a warning (verl's TaskRunner may
    land there); every GPU node is checked in full where the ranks run (``rank_node_problems``)."""
    report = check(GpuRequest(gpus_per_node=8, joins_cluster=True), NO_CUDA)
    assert report.errors == ()
    node_lines = errors(NO_CUDA)[1:]  # the software it lacks; its own GPUs are not the run's
    driver_node = [w for w in report.warnings if "driver's node" in w]
    assert len(driver_node) == len(node_lines) and all(
        one_line(w).endswith(line) for w, line in zip(driver_node, node_lines, strict=True))


def test_a_gpu_node_of_a_cluster_is_checked_in_full_for_its_rank_group(monkeypatch):
    """In the task on a GPU node (it holds the rank group's GPUs: what it sees is what the ranks get), every rule
    holds, the visible GPUs counted against one rank group whatever trainer.nnodes is."""
    request = GpuRequest(nnodes=4, gpus_per_node=8, joins_cluster=True)
    for probe, want in ((GOOD, []), (NO_CUDA, errors(NO_CUDA)), (replace(GOOD, visible_gpus=4), errors(replace(GOOD, visible_gpus=4))),
                        (replace(GOOD, c_compiler=None), errors(replace(GOOD, c_compiler=None)))):
        monkeypatch.setattr(P.GpuProbe, "of_this_node", classmethod(lambda cls, probe=probe: probe))
        found, _ = P.rank_node_problems(request)
        assert found == want and (want == [] or found), (probe, found)


def test_vllm_rollout_without_vllm():
    bare = replace(GOOD, importable=frozenset({"flash_attn"}))
    (line,) = errors(bare)
    names(one_line(line), "actor_rollout_ref.rollout.name=vllm", 'pip install -e ".[gpu]"', "docs/gpu-setup.md#install")
    assert errors(bare, rollout="hf") == []


def test_flash_attention_without_flash_attn_names_both_fixes():
    bare = replace(GOOD, importable=frozenset({"vllm"}))
    (line,) = errors(bare)
    names(one_line(line), f"{ATTN}=flash_attention_2", "flash_attn", "docs/gpu-setup.md#install", f"+{ATTN}=sdpa",
          "docs/memory.md#how-the-estimate-is-computed")
    assert errors(bare, attn_implementation="sdpa") == []


def test_ulysses_with_an_rpg_loss_is_refused():
    sp = ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",)
    (line,) = errors(GOOD, ulysses=sp)
    names(one_line(line), sp[0], "rpg.loss.name=rpg", "allowed: 1", "rpg.loss.name=verl")
    assert errors(GOOD, ulysses=sp, rpg_loss=None) == []  # verl's own losses: verl's business


def test_every_problem_is_one_line_and_the_driver_prints_each():
    lines = errors(NO_CUDA)
    assert len(lines) == 3 and all("\n" not in line for line in lines)
    printed = error_line(GpuCheckError(lines)).splitlines()
    assert printed == [f"rpg gpu check: {line}" for line in lines]


def test_versions_outside_the_tested_set_warn_one_line_each():
    versions = {"verl": "0.9.2", "torch": "2.12.0", "vllm": None, "transformers": "5.9.0"}
    verl, torch = P.version_warnings(versions)
    names(one_line(verl), "verl 0.9.2", "0.9.1")
    names(one_line(torch), "torch 2.12.0", "2.13.0", "2.11.0")
    report = check(GpuRequest(gpus_per_node=8), replace(GOOD, versions=versions))
    assert report.errors == () and len(report.warnings) == 2  # warnings never refuse


def test_the_probe_reads_the_driver_without_initialising_it(monkeypatch):
    class FakeLibcuda:
        def cuDriverGetVersion(self, ref):
            ref._obj.value = 13010  # CUDA 13.1, as the driver API encodes it
            return 0

    monkeypatch.setattr(ctypes, "CDLL", lambda name: FakeLibcuda())
    assert P.driver_cuda_version() == "13.1"
    monkeypatch.undo()
    assert P.driver_cuda_version("libcuda-that-does-not-exist.so") is None


def test_the_probe_of_this_node_imports_neither_vllm_nor_flash_attn():
    probe = GpuProbe.of_this_node()
    assert "vllm" not in sys.modules and "flash_attn" not in sys.modules
    assert probe.versions["verl"] == "0.9.1" and probe.importable <= frozenset(P.OPTIONAL_MODULES)


UNDEFINED = "ImportError: /site-packages/flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEa"


def test_a_flash_attn_built_for_another_torch_is_named_on_this_node(tmp_path, monkeypatch):
    """A stand-in flash-attn whose CUDA extension fails to load as a wheel built for another torch does: the probe
    imports the extension in a subprocess and the rule names the error and both fixes in one line (``find_spec``
    alone found the package: the check passed, then every worker died)."""
    (tmp_path / "flash_attn").mkdir()
    (tmp_path / "flash_attn" / "__init__.py").write_text("")
    (tmp_path / "flash_attn_2_cuda.py").write_text(f"raise ImportError({UNDEFINED.split(': ', 1)[1]!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    probe = GpuProbe.of_this_node()
    assert "flash_attn" in probe.importable and "flash_attn" not in sys.modules
    assert probe.flash_attn_error == UNDEFINED
    node = replace(GOOD, flash_attn_error=probe.flash_attn_error)
    (line,) = errors(node)
    names(one_line(line), f"{ATTN}=flash_attention_2", "torch 2.11.0", UNDEFINED, "docs/gpu-setup.md#install",
          f"+{ATTN}=sdpa", "docs/memory.md#how-the-estimate-is-computed")
    assert errors(node, attn_implementation="sdpa") == []  # not used: not refused


def test_an_extension_that_loads_or_crashes_the_loader(tmp_path, monkeypatch):
    (tmp_path / "good_ext.py").write_text("")
    (tmp_path / "crashing_ext.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert P.extension_import_error("good_ext") is None
    assert P.extension_import_error("crashing_ext") == f"the interpreter ended with exit code {-signal.SIGSEGV}"


# torch's warning on a node whose GPUs are present but whose CUDA cannot initialise (fabric manager down)
ERROR_802 = ("CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
             "calling NumCudaDevices() that might have already set an error? Error 802: system not yet initialized "
             "(Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:109.)")


def test_a_failed_cuda_initialisation_is_reported_with_its_error_not_as_no_gpu():
    (line,) = errors(replace(GOOD, cuda_available=False, visible_gpus=0, cuda_init_error=ERROR_802))
    names(one_line(line), "torch 2.11.0", "CUDA 13.0", "cudaGetDeviceCount()", "Error 802: system not yet initialized",
          "fabric manager")
    assert "sees no GPU" not in line


def test_the_probe_keeps_torchs_cuda_initialisation_error(monkeypatch):
    """Simulated: torch.cuda.is_available() warns (as torch does when cuInit fails) and returns False."""
    import warnings

    import torch

    def failing():
        warnings.warn(ERROR_802, UserWarning)
        return False

    monkeypatch.setattr(torch.cuda, "is_available", failing)
    probe = GpuProbe.of_this_node()
    assert probe.cuda_available is False and probe.cuda_init_error == ERROR_802
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU node: torch says nothing
    assert GpuProbe.of_this_node().cuda_init_error is None


def test_a_node_without_a_c_compiler_or_python_headers_is_one_line_saying_what_to_install():
    """Triton builds a C launcher at its first kernel launch (verl's log-prob and entropy kernels, vLLM)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    (line,) = errors(replace(GOOD, c_compiler=None))
    names(one_line(line), "Triton", "C compiler", "CC", "gcc", f"apt-get install gcc python{version}-dev")
    assert "Python.h" not in line  # the headers are there: not asked for
    (line,) = errors(replace(GOOD, c_compiler=None, python_headers=False))
    names(one_line(line), "C compiler", "Python.h", f"apt-get install gcc python{version}-dev")
    (line,) = errors(replace(GOOD, python_headers=False))
    names(one_line(line), "Python.h", f"apt-get install gcc python{version}-dev")
    assert "no gcc or clang" not in line  # a compiler is found: not asked for
    # on the node that runs the workers: a driver joining a cluster does not judge its own node
    assert errors(replace(GOOD, c_compiler=None), joins_cluster=True) == []


def test_the_probe_finds_the_compiler_triton_would_use(tmp_path):
    empty = {"PATH": str(tmp_path)}
    assert P.triton_c_compiler(empty) is None
    gcc = tmp_path / "gcc"
    gcc.write_text("#!/bin/sh\n")
    gcc.chmod(0o755)
    assert P.triton_c_compiler(empty) == str(gcc)
    assert P.triton_c_compiler({**empty, "CC": "no-such-compiler"}) is None  # CC wins, as in Triton
    assert isinstance(P.python_headers_found(), bool)


# ----------------------------------------------------------------------------- the config, the driver, the launcher


@pytest.fixture
def data_dir(tmp_path) -> Path:
    """Valid data files under the names the launcher expects for the 4B script."""
    from rpg.launch.experiments import find

    files = find(SCRIPT).settings
    row = pd.DataFrame({"prompt": [[{"role": "user", "content": "1+1?"}]], "data_source": ["aime2024"],
                        "reward_model": [{"ground_truth": "2"}]})
    for name in (files["data.train_files"], *files["data.val_files"]):
        row.to_parquet(tmp_path / Path(name).name)
    return tmp_path


def _hydra_config(env: dict, *user: str):
    """The 4B script's config as the driver receives it from Hydra (before prepare_config)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from launching import planned

    overrides = planned(SCRIPT, env, list(user))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "recipe/rpg/config"), version_base=None):
        return compose(config_name="rpg_trainer", overrides=overrides)


def test_the_request_read_from_the_4b_config(data_dir):
    from rpg.verl.block_to_verl import validate_and_apply

    cfg = _hydra_config(_env(DATA_DIR=str(data_dir)))
    settings = validate_and_apply(cfg)
    assert P.request_from_config(cfg, settings, {}) == GpuRequest(
        nnodes=1, gpus_per_node=8, rollout="vllm", attn_implementation="flash_attention_2", ulysses=(),
        rpg_loss="rpg", joins_cluster=False)
    assert P.request_from_config(cfg, settings, {"RAY_ADDRESS": "auto"}).joins_cluster  # as `ray job submit` sets
    sp = _hydra_config(_env(DATA_DIR=str(data_dir)), "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                       f"+{ATTN}=sdpa", "+ray_kwargs.ray_init.address=10.0.0.1:6379")
    request = P.request_from_config(sp, validate_and_apply(sp), {})
    assert request.ulysses[0] == "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"
    assert "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2" in request.ulysses  # verl's ref follows the actor
    assert (request.attn_implementation, request.joins_cluster) == ("sdpa", True)


def test_only_the_gpu_backend_is_checked(data_dir, monkeypatch):
    def no_probe():
        raise AssertionError("the CPU backend must not probe the node")

    monkeypatch.setattr(GpuProbe, "of_this_node", staticmethod(no_probe))
    cfg = _hydra_config(_env(DATA_DIR=str(data_dir)))
    from rpg.backends import backend_of_run

    assert backend_of_run(cfg, {}) == "gpu" and backend_of_run(cfg, {"VERL_PLATFORM": "cpu"}) == "cpu"
    assert P.node_report(cfg, None, {"VERL_PLATFORM": "cpu"}) is None
    P.check_gpu_node(cfg, None, {"VERL_PLATFORM": "cpu"})  # no probe, no line, no error


def test_the_driver_exits_2_before_ray_with_one_line_each(data_dir, monkeypatch, capsys):
    import ray

    import rpg.verl.main as driver

    started = []
    monkeypatch.setattr(GpuProbe, "of_this_node", staticmethod(lambda: NO_CUDA))
    monkeypatch.setattr(driver, "run_ppo", lambda *a, **k: started.append(a))
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(SystemExit) as e:
        recipe_main(_hydra_config(_env(DATA_DIR=str(data_dir))))
    assert e.value.code == 2 and started == [] and not ray.is_initialized()
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("rpg gpu check: ")]
    assert [x.split(": ", 1)[1] for x in lines] == errors(NO_CUDA)
    names(lines[0], "trainer.device=cuda", "CUDA")


def test_dry_run_warns_and_exits_0(data_dir, monkeypatch, capsys):
    from launching import launch as main

    node = replace(NO_CUDA, versions={"torch": "2.12.0"})
    monkeypatch.setattr(GpuProbe, "of_this_node", staticmethod(lambda: node))
    assert main([SCRIPT], _env(DRY_RUN="1", DATA_DIR=str(data_dir))) == 0
    warnings = [x for x in capsys.readouterr().err.splitlines() if x.startswith("rpg.launch: warning: ")]
    assert warnings == [f"rpg.launch: warning: {x}" for x in [*errors(node), *P.version_warnings(node.versions)]]
    names(warnings[-1], "torch 2.12.0")
    assert "CUDA is not available" in warnings[0]


def _script(env: dict) -> tuple[int, float, str]:
    """The 4B shell script in a process group of its own (killed after 90 s: the check failed to fire)."""
    start = time.monotonic()
    p = subprocess.Popen(["bash", str(ROOT / "recipe" / "rpg" / "4b" / f"{SCRIPT}.sh")], env=env, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
    return p.returncode, time.monotonic() - start, out


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA: the launch would train")
def test_the_4b_script_on_this_cuda_less_machine(data_dir, capsys):
    """The launch a user makes on a CPU login node: exit 2 before Ray, one line naming
    CUDA; with DRY_RUN=1 the same line as a warning and exit 0; on the CPU backend no such line. The shell
    script once (what a user runs); its dry runs in this process, with this node's real probe (the shell's
    DRY_RUN=1 path: tests/launch/test_launch_dryrun.py)."""
    from launching import launch

    env = _env(DATA_DIR=str(data_dir), PYTHON=sys.executable)
    env.pop("VERL_PLATFORM", None)
    code, seconds, out = _script(env)
    assert code == 2, out[-3000:]  # a hang is killed after 90 s (rc -9); no bound on the time: CI's load varies
    print(f"the 4B script's refusal: {seconds:.1f} s")
    assert "Started a local Ray instance" not in out and "ray init kwargs" not in out
    assert re.search(r"^rpg gpu check: trainer\.device=cuda\b.*CUDA", out, re.M), out[-3000:]
    capsys.readouterr()
    assert launch([SCRIPT], {**env, "DRY_RUN": "1"}) == 0
    out = capsys.readouterr().err
    assert re.search(r"^rpg\.launch: warning: trainer\.device=cuda\b.*CUDA", out, re.M), out
    assert launch([SCRIPT], {**env, "DRY_RUN": "1", "RPG_BACKEND": "cpu"}) == 0  # the CPU backend: not checked
    cap = capsys.readouterr()
    assert "CUDA is not available" not in cap.err + cap.out and "rpg gpu check" not in cap.err + cap.out, cap.err


# ----------------------------------------------------------------------------- the tested versions, defined once


def test_tested_versions_match_the_gpu_extra_and_the_cpu_set_up():
    """verl 0.9.1's `vllm` extra (what the `gpu` extra installs) pins torch, vLLM and transformers: each
    is in the tested set; so are the CPU torch of README's Quick start and the verl pin of pyproject.toml."""
    pins = {}
    for req in importlib.metadata.requires("verl") or []:
        m = re.fullmatch(r'(torch|vllm|transformers)==([\w.]+); extra == "vllm"', req.strip())
        if m:
            pins[m.group(1)] = m.group(2)
    assert set(pins) == {"torch", "vllm", "transformers"}
    assert all(v in P.TESTED_VERSIONS[k] for k, v in pins.items()), pins
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"verl[verl-core]=={P.TESTED_VERSIONS['verl'][0]}" in project["dependencies"]
    assert project["optional-dependencies"]["gpu"] == [f"verl[vllm]=={P.TESTED_VERSIONS['verl'][0]}"]
    cpu_torch = re.search(r'pip install "torch==([\d.]+)" -e "\.\[test\]"', (ROOT / "README.md").read_text()).group(1)
    assert cpu_torch in P.TESTED_VERSIONS["torch"]


def test_no_extra_needs_a_build():
    """flash-attn has no wheel on PyPI (its source build needs torch, nvcc and about an hour): no extra
    may list it by name; README names its prebuilt wheel instead."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not [r for reqs in extras.values() for r in reqs if re.match(r"flash[-_]attn\b", r)]


@pytest.mark.parametrize("doc", ["docs/gpu-setup.md", "docs/gpu-smoke.md"])
def test_docs_state_the_tested_versions(doc):
    assert P.tested_versions_text() in (ROOT / doc).read_text()
