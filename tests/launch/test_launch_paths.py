"""The launcher's DRY_RUN errors are the driver's one line (exit 2), an input the launch refuses is refused
(exit 2), missing input paths are warned about, and a Ray submission resolves every default path against
RPG_CLUSTER_ROOT."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
from launching import env as _env, launch as main, planned
from messages import names, one_line

from rpg.cluster.submit import Job, ray_command
from rpg.launch.environment import Request

ROOT = Path(__file__).resolve().parents[2]
RAY = "http://127.0.0.1:8265"
DIVERGENCE_LINE = "rpg config error: rpg.loss.divergence='js' is invalid: expected one of fkl, rkl, ufkl, urkl"


def _answering_ray(tmp_path: Path) -> dict[str, str]:
    """PATH with a `ray` whose job API answers (a submission asks `ray job list` first: rpg.cluster.ray_job_api)."""
    (tmp_path / "ray").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "ray").chmod(0o755)
    return {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}


def test_dry_run_bad_rpg_value_is_the_drivers_one_line(tmp_path, capsys):
    """Same line and exit code as `python recipe/rpg/main_rpg.py rpg.loss.divergence=js` (test_verl_config)."""
    assert main(["run_rpg_7b_ufkl1e-4", "rpg.loss.divergence=js"], _env(DRY_RUN="1")) == 2
    assert capsys.readouterr().err.strip() == DIVERGENCE_LINE
    # the same before a Ray submission (validated locally before queueing)
    assert main(["run_rpg_7b_ufkl1e-4", "rpg.loss.divergence=js"], _env(RAY_ADDRESS=RAY, **_answering_ray(tmp_path))) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == DIVERGENCE_LINE


def test_dry_run_warns_about_a_missing_local_model(tmp_path, capsys):
    assert main(["run_grpo_7b"], _env(DRY_RUN="1", MODEL_PATH="/nonexistent", DATA_DIR=str(tmp_path))) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rpg.launch: warning:")]
    # one warning per path: the key and path, that it is missing, and the other form the model's may take
    (model,) = [line for line in warnings if "actor_rollout_ref.model.path=" in line]
    names(model, "actor_rollout_ref.model.path=/nonexistent:", "no such file", "'org/name'")
    (train,) = [line for line in warnings if "data.train_files=" in line]
    names(train, f"data.train_files={tmp_path / 'dapo-math-17k-en.parquet'}:", "no such file")
    # a hub id is not warned about
    assert main(["run_grpo_7b"], _env(DRY_RUN="1", DATA_DIR=str(tmp_path))) == 0
    assert "model.path" not in capsys.readouterr().err


def test_every_default_path_follows_the_cluster_root():
    name = "run_rpg_7b_ufkl1e-4"
    env = _env(RAY_ADDRESS=RAY, RPG_CLUSTER_ROOT="/srv/rpg")
    ov = planned(name, env, cluster=True)
    d = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in ov}
    assert d["data.train_files"] == "/srv/rpg/data/dapo-math-17k-en.parquet"
    assert d["data.val_files"].startswith("['/srv/rpg/data/aime2024.parquet',")
    assert d["trainer.default_local_dir"] == f"/srv/rpg/ckpts/rpg/{name}"
    assert d["+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_ROOT"] == "'/srv/rpg/logs'"
    assert d["+ray_kwargs.ray_init.runtime_env.env_vars.TENSORBOARD_DIR"] == f"'/srv/rpg/tensorboard_log/rpg/{name}'"
    # (the `ray` CLI itself runs here, so cmd[0] may be this checkout's venv; nothing after it may be)
    req = Request.read(env, ROOT, Path("/srv/rpg"), cluster=True)
    assert str(ROOT) not in " ".join(ray_command(ov, req, Job.read(env), {})[1:])
    # without RAY_ADDRESS the cluster root plays no part
    ov_local = planned(name, _env(RPG_CLUSTER_ROOT="/srv/rpg"))
    assert "/srv/rpg" not in " ".join(ov_local)


def test_dry_run_shows_the_cluster_root_everywhere(capsys):
    assert main(["run_rpg_7b_ufkl1e-4"], _env(DRY_RUN="1", RAY_ADDRESS=RAY, RPG_CLUSTER_ROOT="/srv/rpg")) == 0
    cap = capsys.readouterr()
    assert "train_files: /srv/rpg/data/dapo-math-17k-en.parquet" in cap.out
    assert "default_local_dir: /srv/rpg/ckpts/rpg/run_rpg_7b_ufkl1e-4" in cap.out
    assert "VERL_FILE_LOGGER_ROOT: /srv/rpg/logs" in cap.out and "path: /srv/rpg/rpg/reward/__init__.py" in cap.out
    assert "/srv/rpg/recipe/rpg/main_rpg.py" in cap.out
    # nothing from this checkout leaks into the cluster's config (the local `ray` CLI on the
    # "# command:" line may live in a venv inside the checkout)
    config = "\n".join(line for line in cap.out.splitlines() if not line.startswith("# command:"))
    # ... but the resume command the driver's stop line shows: pasted on this machine, it goes back to the folder
    # the run was launched from (relative paths in its variables mean the same)
    where = f"cd {shlex.quote(str(Path.cwd()))} && "
    assert config.count(where) == 1, config
    assert str(ROOT) not in config.replace(where, "")
    (missing,) = [line for line in cap.err.splitlines() if "data.train_files=" in line]  # a warning, exit 0 above
    names(missing, "rpg.launch: warning:", "data.train_files=/srv/rpg/data/dapo-math-17k-en.parquet:", "no such file")


def test_relative_cluster_root_is_one_line(capsys):
    assert main(["run_grpo_7b"], _env(DRY_RUN="1", RAY_ADDRESS=RAY, RPG_CLUSTER_ROOT="srv/rpg")) == 2
    names(one_line(capsys.readouterr().err), "rpg.launch: ", "RPG_CLUSTER_ROOT='srv/rpg'", "absolute path")


def _bad_files(tmp_path: Path) -> dict[str, tuple[dict[str, str], str]]:
    """Per case: the environment of a launch whose only problem is one validation input, and the start of the
    line the launch refuses it with."""
    import pandas as pd

    from data_files import verl_file

    train = verl_file(tmp_path / "train.parquet", "math_dapo")
    raw = tmp_path / "raw.parquet"  # the problems as downloaded: no chat prompt, no reward_model
    pd.DataFrame({"problem": ["1+1?"], "answer": ["2"], "data_source": ["aime2025"]}).to_parquet(raw)
    unscored = verl_file(tmp_path / "gsm8k.parquet", "gsm8k")
    base = {"TRAIN_FILE": str(train)}
    return {
        "layout": ({**base, "VAL_FILES": str(raw)}, f"rpg config error: data.val_files={raw}: not in verl's layout: "
                                                     "no column 'prompt' (data.prompt_key)"),
        "scorer": ({**base, "VAL_FILES": str(unscored)},
                   f"rpg config error: data.val_files={unscored}: data_source 'gsm8k' has no reward function"),
        "empty": ({**base, "VAL_FILES": " , "}, "rpg config error: data.val_files=[]: names no file"),
    }


@pytest.mark.parametrize("case", ["layout", "scorer", "empty"])
def test_dry_run_refuses_what_the_launch_refuses(case, tmp_path, monkeypatch, capsys):
    """DRY_RUN=1 as a gate: an existing data file in the wrong layout, a data_source no reward function scores and
    an empty list are the launch's own refusal (same line, exit 2), not a warning."""
    env, start = _bad_files(tmp_path)[case]
    monkeypatch.setattr(os, "execvpe", lambda *a: pytest.fail(f"the launch started the driver: {a[1]}"))
    assert main(["run_grpo_7b"], _env(**env)) == 2
    refused = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rpg")]
    assert len(refused) == 1 and refused[0].startswith(start), refused
    assert main(["run_grpo_7b"], _env(DRY_RUN="1", **env)) == 2
    cap = capsys.readouterr()
    assert [line for line in cap.err.splitlines() if line.startswith("rpg")] == refused
    assert "composed and validated config" not in cap.out


def test_dry_run_warns_of_a_path_only_the_run_node_may_hold(tmp_path, capsys):
    """A data file that does not exist on this machine: a warning, exit 0 (it may exist only on the cluster); the
    existing files it names besides are checked (here: fine)."""
    from data_files import verl_file

    train, missing = verl_file(tmp_path / "train.parquet", "math_dapo"), tmp_path / "elsewhere" / "aime2025.parquet"
    assert main(["run_grpo_7b"], _env(DRY_RUN="1", TRAIN_FILE=str(train), VAL_FILES=str(missing))) == 0
    cap = capsys.readouterr()
    assert [line for line in cap.err.splitlines() if line.startswith("rpg") and "data." in line] == [
        f"rpg.launch: warning: data.val_files={missing}: no such file"]
    assert "composed and validated config" in cap.out


@pytest.mark.parametrize("override, line", [
    (["actor_rollout_ref.rollout.name=vllm"],
     "rpg config error: actor_rollout_ref.rollout.name=vllm on the CPU backend needs RPG_CPU_ROLLOUT=vllm"),
    (["trainer.n_gpus_per_node=2", "ray_kwargs.ray_init.num_gpus=1"],
     "rpg config error: ray_kwargs.ray_init.num_gpus=1 is below the world size trainer.nnodes=1 x "
     "trainer.n_gpus_per_node=2 = 2"),
])
def test_cpu_dry_run_refuses_what_the_driver_refuses_on_the_config(override, line, tiny_assets, capsys):
    """The CPU backend's driver rules that the config and the environment decide (``config_problems``) are refused
    by DRY_RUN=1 too (they were skipped with the rest of the driver's node checks)."""
    env = {k: v for k, v in _env(RPG_BACKEND="cpu", DRY_RUN="1").items() if k != "RPG_CPU_ROLLOUT"}
    assert main(["run_grpo_7b", *override], env) == 2
    refused = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("rpg")]
    assert len(refused) == 1 and refused[0].startswith(line), refused
