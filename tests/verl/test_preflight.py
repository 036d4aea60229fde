"""Every local input path is checked in the driver before Ray starts (one line, exit 2);
Hugging Face repo ids stay allowed (rule: rpg/verl/input_paths.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from messages import names, one_line
from data_files import model_folder, verl_file
from hydra import compose, initialize_config_dir

from rpg.verl.input_paths import InputPathError, check_input_paths, input_path_problems, looks_like_hub_id

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "recipe" / "rpg" / "config"


@pytest.fixture
def files(tmp_path):
    verl_file(tmp_path / "train.parquet", "math_dapo")  # the data files' own checks: tests/data/test_data_checks.py
    verl_file(tmp_path / "val.parquet")
    model_folder(tmp_path / "model")
    return tmp_path


def _cfg(files: Path, *overrides: str):
    base = [f"data.train_files={files / 'train.parquet'}", f"data.val_files=['{files / 'val.parquet'}']",
            f"actor_rollout_ref.model.path={files / 'model'}"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="rpg_trainer", overrides=[*base, *overrides])


@pytest.mark.parametrize("value, hub", [
    ("Qwen/Qwen2.5-Math-7B", True), ("gpt2", True), ("org/name_1.v2", True),
    ("/abs/model", False), ("./model", False), ("../model", False), ("~/models/x", False), ("a/b/c", False),
    ("org/", False), ("org/na..me", False), ("-org/name", False), ("org\\name", False), ("my model", False),
])
def test_hub_id_rule(value, hub):
    assert looks_like_hub_id(value) is hub


def test_all_present_and_hub_ids_pass(files):
    assert input_path_problems(_cfg(files)) == []
    assert input_path_problems(_cfg(files, "actor_rollout_ref.model.path=Qwen/Qwen3-4B",
                                    "actor_rollout_ref.model.tokenizer_path=Qwen/Qwen3-4B")) == []
    # remote files are left to verl (copied from hdfs by the workers)
    assert input_path_problems(_cfg(files, "data.train_files=hdfs://nn/data/train.parquet")) == []


def test_existing_relative_path_is_local(files, monkeypatch):
    monkeypatch.chdir(files)
    assert input_path_problems(_cfg(files, "actor_rollout_ref.model.path=model", "data.train_files=train.parquet")) == []


@pytest.mark.parametrize("override, expected", [
    ("data.train_files=/no/such.parquet", "data.train_files=/no/such.parquet: no such file"),
    ("data.val_files=[/no/a.parquet]", "data.val_files=/no/a.parquet: no such file"),
    ("actor_rollout_ref.model.path=/nonexistent", "actor_rollout_ref.model.path=/nonexistent: no such file or directory"),
    ("actor_rollout_ref.model.path=./nomodel", "actor_rollout_ref.model.path=./nomodel: no such file or directory"),
    ("actor_rollout_ref.model.tokenizer_path='~/no/tok'", "actor_rollout_ref.model.tokenizer_path=~/no/tok: no such"),
    ("data.tokenizer=/no/tok", "data.tokenizer=/no/tok: no such"),
    ("reward.custom_reward_function.path=/no/reward.py", "reward.custom_reward_function.path=/no/reward.py: no such file"),
])
def test_each_key_missing_is_one_line(files, override, expected):
    with pytest.raises(InputPathError) as err:
        check_input_paths(_cfg(files, override))
    text = str(err.value)
    assert expected in text and "\n" not in text


def test_val_file_list_names_the_index_and_directories_are_refused(files):
    cfg = _cfg(files, f"data.val_files=['{files / 'val.parquet'}','/no/b.parquet','{files / 'model'}']")
    assert input_path_problems(cfg) == ["data.val_files[1]=/no/b.parquet: no such file",
                                        f"data.val_files[2]={files / 'model'}: is a directory, expected a parquet file"]


def test_resume_path_checked_only_in_resume_path_mode(files):
    missing = str(files / "ckpts" / "global_step_20")
    assert input_path_problems(_cfg(files, f"trainer.resume_from_path={missing}")) == []  # resume_mode=auto
    assert input_path_problems(_cfg(files, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={missing}")) == [
        f"trainer.resume_from_path={missing}: no such directory"]
    (files / "ckpts" / "step20").mkdir(parents=True)
    assert "named global_step_<N>" in input_path_problems(
        _cfg(files, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={files / 'ckpts' / 'step20'}"))[0]
    assert "needs a checkpoint directory" in input_path_problems(_cfg(files, "trainer.resume_mode=resume_path"))[0]
    Path(missing).mkdir()
    assert input_path_problems(_cfg(files, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={missing}")) == []


def test_driver_fails_before_ray_with_one_line(files, tmp_path):
    """main_rpg.py with a missing train file and a missing local model: rc 2, one line each, no Ray, seconds.
    On the CPU backend (this machine has no GPU: the GPU checks before Ray are tests/backends/test_gpu_preflight.py)."""
    from rpg.backends.cpu.env_overrides import cpu_env

    env = {**os.environ, **cpu_env(), "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(ROOT / "recipe" / "rpg" / "main_rpg.py"), "data.train_files=/no/such.parquet",
                        f"data.val_files=['{files / 'val.parquet'}']", "actor_rollout_ref.model.path=/nonexistent"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    elapsed = time.monotonic() - t0
    assert p.returncode == 2, p.stderr[-3000:]
    ours = [line for line in p.stderr.splitlines() if line.startswith("rpg config error")]
    data, model = ours  # one line per problem
    names(data, "data.train_files=/no/such.parquet", "no such file", "python -m rpg.data prepare-all --out-dir data/",
          "docs/data-and-reports.md")
    names(model, "actor_rollout_ref.model.path=/nonexistent", "no such file", "'org/name'")
    # the check runs before the config summary is printed and before run_ppo prints "ray init kwargs"
    assert p.stdout == "" and "ray init" not in p.stderr.lower()
    # only the accelerator-detection warnings of a GPU-less machine may precede the line
    assert all("accelerator" in line or "Platform" in line for line in p.stderr.splitlines() if line not in ours)
    print(f"driver failed in {elapsed:.1f} s")  # ~10 s on an idle 2-core machine (imports); no hard limit: CI load varies


# ----------------------------------------------------------------------------- a local model folder's contents


NO_WEIGHTS = "no model.safetensors or model.safetensors.index.json or pytorch_model.bin or pytorch_model.bin.index.json"
EMPTY = (NO_WEIGHTS, "config.json", "tokenizer.json or tokenizer_config.json")  # what an empty model folder lacks


def test_a_model_folder_without_weights_config_or_tokenizer_is_one_line_naming_what_is_missing(files, tmp_path):
    """Before: accepted; verl read the folder in every worker after Ray (a 60-line InstantiationException)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    (line,) = input_path_problems(_cfg(files, f"actor_rollout_ref.model.path={empty}"))
    assert one_line(line).startswith(f"actor_rollout_ref.model.path={empty}: ")
    names(line, *EMPTY)
    # the tokenizer read where verl reads it: tokenizer_path when set (and data.tokenizer)
    (line,) = input_path_problems(_cfg(files, f"actor_rollout_ref.model.tokenizer_path={empty}"))
    assert one_line(line).startswith(f"actor_rollout_ref.model.tokenizer_path={empty}: ")
    names(line, "tokenizer.json or tokenizer_config.json")
    assert NO_WEIGHTS not in line  # the tokenizer's folder needs no weights
    only_model = model_folder(tmp_path / "weights_and_config")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (only_model / name).unlink()
    assert input_path_problems(_cfg(files, f"actor_rollout_ref.model.path={only_model}",
                                    f"actor_rollout_ref.model.tokenizer_path={files / 'model'}")) == []


def test_a_config_or_tokenizer_that_does_not_load_is_one_line(files, tmp_path):
    bad = model_folder(tmp_path / "bad_config")
    (bad / "config.json").write_text("{not json")
    [line] = input_path_problems(_cfg(files, f"actor_rollout_ref.model.path={bad}"))
    assert line.startswith(f"actor_rollout_ref.model.path={bad}: its config does not load (") and "\n" not in line
    hollow = model_folder(tmp_path / "hollow")  # transformers 5 builds an empty tokenizer from the config alone
    (hollow / "tokenizer.json").unlink()
    (hollow / "tokenizer_config.json").write_text("{}")
    (line,) = input_path_problems(_cfg(files, f"data.tokenizer={hollow}"))
    assert one_line(line).startswith(f"data.tokenizer={hollow}: ")
    names(line, "encodes nothing", "tokenizer.json")


def test_dry_run_and_the_tiny_demo_refuse_an_empty_model_folder_before_anything_starts(tmp_path, capsys, monkeypatch):
    """``DRY_RUN=1 MODEL_PATH=<empty folder>`` on a paper script (before: exit 0), and the tiny demo with the folder
    as its model (before: Ray started, 26 s later a 60-line traceback): one line, before any build."""
    import rpg.tiny
    from launching import env as _env, launch

    from rpg_lab.demo.cpu import main as demo

    empty = tmp_path / "empty"
    empty.mkdir()
    assert launch(["run_grpo_7b"], _env(DRY_RUN="1", MODEL_PATH=str(empty), DATA_DIR=str(tmp_path))) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("rpg config error")]
    (line,) = err
    assert line.startswith(f"rpg config error: actor_rollout_ref.model.path={empty}: ")
    names(line, *EMPTY)
    monkeypatch.setattr(rpg.tiny, "build_tiny_assets", lambda *a, **k: pytest.fail("built before the model check"))
    assert demo(["--steps", "1", "--out", str(tmp_path / "o"), f"actor_rollout_ref.model.path={empty}"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"[tiny] actor_rollout_ref.model.path={empty}: ")
    names(line, *EMPTY)


# ----------------------------------------------------------------------------- Ray's folder of a private cluster


def test_a_private_rays_folder_too_long_for_its_sockets_is_refused_before_ray(files, tmp_path, monkeypatch):
    """main_rpg.py started by hand under a long TMPDIR (no launcher to make Ray's folder): Ray's default folder
    $TMPDIR/ray would stop the run after its processes started, on a socket path past 107 bytes. The driver's
    prepare_config refuses it before Ray in one line naming TMPDIR and the folder; a short RAY_TMPDIR or a joined
    cluster passes."""
    from rpg.config import RPGConfigError
    from rpg.verl.joined_cluster import ray_folder_problem
    from rpg.verl.main import prepare_config

    long = tmp_path / ("t" * max(1, 60 - len(str(tmp_path)) - 1))
    long.mkdir()
    cfg = _cfg(files)
    line = ray_folder_problem(cfg, {"TMPDIR": str(long)})
    assert line.startswith(f"TMPDIR: Ray's folder {long / 'ray'} is ") and "\n" not in line, line
    assert ray_folder_problem(cfg, {"TMPDIR": str(long), "RAY_TMPDIR": "/"}) is None  # Ray's rule: RAY_TMPDIR first
    assert ray_folder_problem(cfg, {"TMPDIR": str(long), "RAY_ADDRESS": "10.0.0.1:6379"}) is None  # the cluster's
    assert ray_folder_problem(_cfg(files, f"+ray_kwargs.ray_init._temp_dir={long}"), {}).startswith(
        "ray_kwargs.ray_init._temp_dir: ")
    for var in ("RAY_TMPDIR", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TMPDIR", str(long))
    with pytest.raises(RPGConfigError) as err:
        prepare_config(_cfg(files, f"trainer.default_local_dir={tmp_path / 'c'}"))
    assert str(err.value) == line
