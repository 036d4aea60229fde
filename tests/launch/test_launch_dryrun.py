"""Every shipped script composes and passes the driver-side checks (rpg validation + verl 0.9.1's validate_config)
with the expected settings; the shell path (DRY_RUN=1 bash script.sh), environment handling, Ray submission command
and error messages."""

from __future__ import annotations

import contextlib
import re
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launch_expected import ALL_ROWS
from launching import env as _env, launch as main, planned
from messages import names, one_line

from rpg.cluster.submit import Job, ray_command
from rpg.launch.environment import Request
from rpg.launch.plan import compose

ROOT = Path(__file__).resolve().parents[2]
VAL_SETS = {"main": ["aime2024", "aime2025", "amc2023"], "4k": ["aime2024", "aime2025", "amc2023", "minerva",
                                                                 "olympiadbench"]}


def _val_sets(name: str) -> list[str]:
    return VAL_SETS["4k" if "_ctx4k" in name else "main"]


def _check_composed(cfg, row) -> None:
    from verl.trainer.ppo.utils import need_reference_policy

    a, r, pl = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor.policy_loss
    assert cfg.trainer.total_training_steps == 400 and cfg.trainer.total_epochs >= 100
    assert (cfg.trainer.test_freq, cfg.trainer.val_before_train) == (10, True)
    assert (r.val_kwargs.n, r.val_kwargs.temperature, r.val_kwargs.top_p, r.val_kwargs.do_sample) == (32, 1.0, 1.0, True)
    assert (r.n, r.temperature, cfg.data.train_batch_size, a.ppo_mini_batch_size) == (16, 1.0, 512, 32)
    assert (a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c) == (row["eps_low"], row["eps_high"], row["c"])
    assert a.optim.lr == row["lr"] and a.optim.lr_warmup_steps == 10 and a.optim.weight_decay == 0.1
    assert cfg.rpg.optimizer == row["optimizer"]
    assert (a.optim.optimizer_impl == "schedulefree") == (row["optimizer"] == "schedulefree")
    assert cfg.actor_rollout_ref.model.path == row["model"]
    assert cfg.algorithm.filter_groups.enable == row["filtering"] and cfg.algorithm.filter_groups.metric == "acc"
    assert cfg.algorithm.filter_groups.max_num_gen_batches == 20  # the authors' scripts (rpg.verl.refill_limit)
    ob = cfg.reward.reward_kwargs.overlong_buffer_cfg
    assert ob.enable == row["overlong"] and ob.len == cfg.data.max_response_length // 4 and ob.penalty_factor == 1.0
    assert cfg.reward.reward_kwargs.max_resp_len == cfg.data.max_response_length
    assert cfg.reward.reward_manager.name == "dapo"
    assert Path(cfg.reward.custom_reward_function.path).as_posix().endswith("rpg/reward/__init__.py")  # routing by rpg.reward
    assert cfg.reward.custom_reward_function.name == "compute_score"
    assert cfg.algorithm.use_kl_in_reward is False
    stems = [Path(p).stem for p in cfg.data.val_files]
    assert stems == _val_sets(row["name"]) and Path(cfg.data.train_files).name == "dapo-math-17k-en.parquet"
    assert cfg.trainer.experiment_name == row["name"] and cfg.trainer.default_local_dir.endswith(row["name"])
    if row["name"].startswith("run_rpg_4b") or "_4b_" in row["name"]:
        assert cfg.data.apply_chat_template_kwargs.enable_thinking is False
    # reference: a reference model is built only for a fixed reference
    assert need_reference_policy(cfg) == (row["reference"] == "fixed")
    algo = row["algo"]
    if algo == "rpg":
        assert cfg.rpg.loss.name == "rpg" and pl.loss_mode == "rpg"
        loss = pl.rpg_loss
        assert (loss.form, loss.clip, loss.beta) == (row["form"], row["clip"], row["beta"])
        if row["divergence"]:
            assert loss.divergence == row["divergence"]
        assert pl.rpg_anchor == ("reference" if row["reference"] == "fixed" else "sampler")
        assert cfg.algorithm.adv_estimator == "rpg" and cfg.algorithm.norm_adv_by_std_in_grpo is False
    else:
        assert cfg.rpg.loss.name == "verl" and pl.loss_mode == "vanilla"
        if algo in ("grpo", "dapo"):
            assert cfg.algorithm.adv_estimator == "grpo" and cfg.algorithm.norm_adv_by_std_in_grpo is True
        if algo == "grpo":
            assert (a.use_kl_loss, a.kl_loss_type, a.kl_loss_coef) == (True, "low_var_kl", 1e-3)
            assert cfg.rpg.reference.mode == "fixed"
        if algo == "dapo":
            assert a.use_kl_loss is False and pl.rpg_sampler_kl is False
        if algo in ("rfpp", "rfppb"):
            est = {"rfpp": "reinforce_plus_plus", "rfppb": "reinforce_plus_plus_baseline"}[algo]
            assert cfg.algorithm.adv_estimator == est
            assert (a.kl_loss_type, a.kl_loss_coef) == ("kl", row["beta"])
            # k1 against pi_old: the glue feeds old_log_probs as the KL reference (no reference model)
            assert pl.rpg_sampler_kl is True and a.use_kl_loss is False


def _memory_fits(cfg) -> str | None:
    """rpg.memory's estimate on an 80 GB GPU (79.6 GiB) with the documented 10% headroom, vLLM's KV
    cache holding one max_model_len sequence, and the host RAM of a default node (docs/memory.md); the script's
    shape, token budgets and memory settings are those the GPU kit's memory probe measures."""
    from omegaconf import OmegaConf

    from rpg_lab.gpu_kit.memory_terms import uncovered
    from rpg.memory import (DEFAULT_GPU_MEM_GIB, DEFAULT_HOST_MEM_GIB, architecture_for, estimate, estimate_host,
                                   host_settings_from_config, settings_from_config)

    plain = OmegaConf.to_container(cfg, resolve=True)
    s = settings_from_config(plain)
    arch = architecture_for(s.model_path)
    if (why := uncovered(s, arch)) is not None:  # the GPU kit's memory probe measures each script's shape and budget
        return f"not covered by rpg_lab.gpu_kit.memory_probe: {why}"
    e = estimate(s, arch, DEFAULT_GPU_MEM_GIB)
    if not e.fits:
        return f"does not fit 80 GB: peak {e.peak.gib:.1f} GiB ({e.peak.name}), headroom {e.headroom_gib:.1f}, KV ok {e.kv_fits}"
    host = estimate_host(host_settings_from_config(plain, s), arch, DEFAULT_HOST_MEM_GIB)
    return None if host.fits else f"host RAM does not fit {DEFAULT_HOST_MEM_GIB:g} GiB: {host.total_gib:.1f} GiB per node"


def test_every_script_composes_and_validates():
    """All 84 scripts in one process: Hydra compose + rpg validation + verl's validate_config, and
    the memory estimate fits an 80 GB GPU with the documented headroom (KV check included) and the
    host RAM of a default node."""
    failures = []
    for row in ALL_ROWS:
        with contextlib.redirect_stdout(io.StringIO()):
            cfg, _ = compose(planned(row["name"], _env()))
        try:
            _check_composed(cfg, row)
        except AssertionError as e:  # collect, so one run shows every mismatch
            failures.append(f"{row['name']}: {e}")
        if (problem := _memory_fits(cfg)) is not None:
            failures.append(f"{row['name']}: {problem}")
    assert not failures, "\n".join(failures)


def _run_script(script: str, *args: str, **env) -> subprocess.CompletedProcess:
    full = _env(PYTHON=sys.executable, **env)
    return subprocess.run(["bash", str(ROOT / script), *args], capture_output=True, text=True, env=full,
                          cwd=env.get("_cwd", ROOT), timeout=300)


def test_dry_run_through_the_shell_script(tmp_path):
    p = _run_script("recipe/rpg/7b/run_dapo_7binstruct.sh", "trainer.total_training_steps=7",
                    "actor_rollout_ref.actor.optim.lr=2e-6", DRY_RUN="1", NNODES="2", DATA_DIR=str(tmp_path / "d"),
                    CKPTS_DIR="ck", PROJECT_NAME="proj", LOGGER="console,tensorboard")
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    assert "DAPO [Table 8]" in out and "irregular name" in out
    assert "validate_config] All configuration checks passed" in out
    assert "total_training_steps: 7" in out and "lr: 2.0e-06" in out  # user overrides win
    assert "nnodes: 2" in out and "project_name: proj" in out and "experiment_name: run_dapo_7binstruct" in out
    assert f"{tmp_path / 'd'}/amc2023.parquet" in out and "path: Qwen/Qwen2.5-7B-Instruct" in out
    assert f"default_local_dir: {ROOT / 'ck'}" in out  # relative user paths: to the current directory
    assert "- tensorboard" in out
    assert "# command: " in out and "recipe/rpg/main_rpg.py" in out


def test_cpu_dry_run_uses_cpu_backend_and_tiny_task(tiny_assets):
    p = _run_script("recipe/rpg/4b/run_rpg_4b_ctx4k_ufkl1e-3_rf_clip_ppo_0.2_0.28_noiterref.sh",
                    DRY_RUN="1", RPG_BACKEND="cpu")
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    assert "device: cpu" in out and "name: hf" in out and "n_gpus_per_node: 1" in out
    assert f"path: {tiny_assets.model_dir}" in out and str(tiny_assets.train_file) in out
    assert "mode: fixed" in out and "rpg_anchor: reference" in out and "lr: 1.0e-06" in out  # Qwen3-4B: App. H
    assert re.search(r"rpg_loss:\n(?:\s+\w+: .*\n)*?\s+beta: 0\.001\n", out)  # Fig. 9 noiterref: beta 1e-3
    assert "len: 4" in out  # overlong buffer follows the tiny response length (16 / 4)


def test_ray_submission_shell_path(tmp_path):
    """RAY_ADDRESS set: the script validates locally, then runs `ray job submit` (a stub records it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "ray_args.json"
    (bin_dir / "ray").write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n")
    (bin_dir / "ray").chmod(0o755)
    p = _run_script("recipe/rpg/7b/run_grpo_7b.sh", "data.train_batch_size=256",
                    RAY_ADDRESS="http://127.0.0.1:8265", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                    HF_ENDPOINT="https://example.org", WANDB_API_KEY="secret")
    assert p.returncode == 0, p.stderr[-3000:]
    args = json.loads(record.read_text())
    assert args[:4] == ["job", "submit", "--address", "http://127.0.0.1:8265"]
    assert "--no-wait" in args and "--working-dir" not in args
    runtime_env = json.loads(args[args.index("--runtime-env-json") + 1])
    assert set(runtime_env) == {"env_vars"}  # no working_dir upload, no pip: nodes have the project installed
    assert runtime_env["env_vars"]["HF_ENDPOINT"] == "https://example.org"
    assert "WANDB_API_KEY" not in runtime_env["env_vars"]  # secrets are never forwarded
    entry = args[args.index("--") + 1:]
    assert entry[0] == "python3" and entry[1] == str(ROOT / "recipe/rpg/main_rpg.py")
    assert "data.train_batch_size=256" in entry and entry[2] == "+experiment=run_grpo_7b"  # the run's settings file
    # Ray refuses a job whose runtime env and the driver's ray.init runtime env share a variable
    init_vars = {o.split("=", 1)[0].rsplit(".", 1)[1] for o in entry if o.startswith("+ray_kwargs.ray_init.runtime_env.env_vars.")}
    assert init_vars and not init_vars & set(runtime_env["env_vars"])


def test_ray_command_cluster_root_and_wait():
    env = _env(RAY_ADDRESS="http://127.0.0.1:8265", RPG_CLUSTER_ROOT="/srv/rpg", RAY_JOB_WAIT="1")
    ov = planned("run_rpg_7b_ufkl1e-4", env, cluster=True)
    req = Request.read(env, ROOT, Path("/srv/rpg"), cluster=True)
    cmd = ray_command(ov, req, Job.read(env), {})
    assert "--no-wait" not in cmd and cmd[cmd.index("--") + 2] == "/srv/rpg/recipe/rpg/main_rpg.py"


def test_environment_defaults_and_overlong_rule(tmp_path):
    name = "run_rpg_4b_ctx2k_ufkl1e-4"
    ov = planned(name, _env(VAL_FILES="a.parquet, /abs/b.parquet"), ["data.max_response_length=4096"], cwd=tmp_path)
    d = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in ov}
    assert d["data.val_files"] == f"['{tmp_path / 'a.parquet'}','/abs/b.parquet']"
    assert d["data.train_files"] == str(ROOT / "data" / "dapo-math-17k-en.parquet")
    # the response length is a setting of the run's file (_ctx2k): the run's name says the user's value
    assert d["trainer.default_local_dir"] == f"'{ROOT / 'ckpts' / 'rpg' / name}+max_response_length=4096'"
    assert d["reward.reward_kwargs.overlong_buffer_cfg.len"] == "1024"  # L/4 of the user's 4096
    assert d["trainer.logger"] == "['console','file']" and d["trainer.nnodes"] == "1"
    assert d["+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_ROOT"] == f"'{ROOT / 'logs'}'"
    ov2 = planned(name, _env(), ["reward.reward_kwargs.overlong_buffer_cfg.len=100"])
    assert "reward.reward_kwargs.overlong_buffer_cfg.len=100" in ov2


@pytest.mark.parametrize("argv, env, msg", [
    (["run_rpg_7b_nope"], {}, "no run run_rpg_7b_nope: no experiment/run_rpg_7b_nope.yaml"),
    (["run_grpo_7b", "notanoverride"], {}, "key=value"),
    (["run_grpo_7b"], {"NNODES": "two"}, "NNODES='two' is invalid"),
    (["run_grpo_7b"], {"RPG_BACKEND": "tpu"}, "allowed values: gpu, cpu"),
    (["run_grpo_7b"], {"RPG_CPU_MODEL": "big"}, "RPG_CPU_MODEL='big' is invalid; allowed values: tiny, smol"),
    (["run_grpo_7b"], {"DRY_RUN": "maybe"}, "DRY_RUN='maybe' is invalid"),
    (["--describe"], {}, "--describe describes a run: add +experiment=<run>"),
])
def test_errors_are_one_clear_message(argv, env, msg, capsys):
    assert main(argv, _env(**env)) == 2
    assert msg in capsys.readouterr().err


def test_local_run_refuses_missing_data(tmp_path, capsys):
    assert main(["run_grpo_7b"], _env(DATA_DIR=str(tmp_path))) == 2
    err = capsys.readouterr().err.splitlines()  # the driver's lines (rpg.data.checks), one per missing file
    names = ["dapo-math-17k-en", *_val_sets("run_grpo_7b")]
    assert [line.split("=", 1)[1].split(":")[0] for line in err] == [str(tmp_path / f"{n}.parquet") for n in names]
    assert all(line.startswith("rpg config error: data.") for line in err) and "python -m rpg.data prepare-all" in err[-1]


def test_rpg_validation_errors_surface_in_dry_run():
    from rpg.config import RPGConfigError

    with pytest.raises(RPGConfigError, match="rpg.loss.divergence='js'"):
        ov = planned("run_rpg_7b_ufkl1e-4", _env(), ["rpg.loss.divergence=js"])
        with contextlib.redirect_stdout(io.StringIO()):
            compose(ov)


def test_describe(capsys):
    assert main(["run_rpg_7b_rkl1e-4_rf", "--describe"], _env()) == 0
    out = capsys.readouterr().out
    assert "unclipped RPG-REINFORCE" in out and "lr=5e-07" in out and "memory per GPU" in out


def test_describe_shows_the_files_settings_and_full_config_on_request(capsys):
    name = "run_rpg_4b_ctx8k_urkl1e-4_rf_clip_ppo_0.2_0.28"
    assert main([name, "--describe"], _env()) == 0
    out = capsys.readouterr().out
    assert f"settings of recipe/rpg/config/experiment/{name}.yaml" in out and "rpg.loss.divergence=urkl" in out
    assert "data.train_batch_size" not in out  # a paper constant: in the paper setup, not in the file
    assert main([name, "--describe", "--full", "--gpu-mem-gib", "139.8"], _env()) == 0
    full = capsys.readouterr().out
    assert "# ---- the full resolved config" in full and "train_batch_size: 512" in full and "divergence: urkl" in full
    assert "GPU 139.8 GiB" in full
    assert main([name, "--full"], _env()) == 2
    names(one_line(capsys.readouterr().err), "rpg.launch: ", "--full", "--describe")  # the flag and the one it needs
