"""``RPG_CPU_MODEL=smol``: a paper script's CPU rehearsal (``RPG_BACKEND=cpu``) runs on SmolLM2-135M-Instruct and its
arithmetic task in place of the tiny model and task, the run's algorithm settings kept, so they meet a real
tokenizer, chat template and response lengths (docs/launch-scripts.md, section 5; docs/smol.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from launching import env as _env, launch, planned
from messages import names, one_line

from rpg.override_lists import values

ROOT = Path(__file__).resolve().parents[2]
NAME = "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28"  # RPG-REINFORCE-UFKL with RPG-Style Clip, lr 5e-7


def _composed(overrides: list[str]):
    """The trainer's config as the harness starts it (the CPU backend's overrides first)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from rpg.trainer_process import build_command

    argv, _ = build_command(overrides, entry=str(ROOT / "recipe/rpg/main_rpg.py"), base_env={}, backend="cpu")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "recipe/rpg/config"), version_base=None):
        return compose(config_name="rpg_trainer", overrides=argv[2:])


def test_the_switch_puts_smollm2_and_its_task_in_place_of_the_tiny_ones():
    from rpg.smol import overrides as smol
    from rpg.smol.build import planned_assets

    env = {"PATH": "/usr/bin:/bin"}
    on_smol, on_tiny = planned(NAME, {**env, "RPG_CPU_MODEL": "smol"}, backend="cpu"), planned(NAME, env, backend="cpu")
    got, assets = values(on_smol), planned_assets()
    assert on_smol[0] == on_tiny[0] == f"+experiment={NAME}"  # the run's settings: its experiment file
    model = "actor_rollout_ref.model.path"
    assert got[model] == str(assets.model_dir) != values(on_tiny)[model]
    assert (got["data.train_files"], got["data.val_files"]) == (str(assets.train_file), str(assets.val_file))
    assert (got["data.max_prompt_length"], got["data.max_response_length"]) == (smol.MAX_PROMPT_LENGTH,
                                                                                smol.MAX_RESPONSE_LENGTH)
    assert (got["trainer.total_training_steps"], got["trainer.test_freq"]) == (2, 2)
    assert got["reward.reward_kwargs.overlong_buffer_cfg.len"] == smol.MAX_RESPONSE_LENGTH // 4
    cfg = _composed(on_smol)  # what the trainer gets: the run's algorithm on SmolLM2, on the CPU backend
    loss = cfg.rpg.loss
    assert (loss.name, loss.form, loss.divergence, loss.beta, loss.clip) == ("rpg", "reinforce", "ufkl", 1e-4, True)
    actor = cfg.actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.optim.lr) == (0.2, 0.28, 5e-7)
    assert cfg.actor_rollout_ref.model.path == str(assets.model_dir) and cfg.trainer.device == "cpu"
    assert (cfg.data.train_batch_size, actor.ppo_mini_batch_size) == (smol.TRAIN_BATCH_SIZE, smol.MINI_BATCH_SIZE)


def test_a_bad_model_is_one_line_and_the_switch_without_the_cpu_backend_is_named(capsys):
    assert launch([NAME], _env(RPG_BACKEND="cpu", RPG_CPU_MODEL="qwen", DRY_RUN="1")) == 2
    names(one_line(capsys.readouterr().err), "rpg.launch: ", "RPG_CPU_MODEL='qwen'", "tiny, smol")  # value, allowed
    with pytest.raises(ValueError, match="world size 3"):  # SmolLM2's mini-batch: 2 prompts x 4 responses
        from rpg.smol.overrides import check_world_size

        check_world_size(3)
    assert launch([NAME], _env(RPG_CPU_MODEL="smol", DRY_RUN="1", DATA_DIR="/nowhere")) == 0
    (ignored,) = [line for line in capsys.readouterr().err.splitlines() if "RPG_CPU_MODEL" in line]
    names(ignored, "rpg.launch: warning:", "RPG_CPU_MODEL", "ignored", "RPG_BACKEND=cpu")  # the variable, the one it needs


@pytest.mark.smol
def test_a_dry_run_of_a_paper_script_on_smollm2(tmp_path):
    """The script's DRY_RUN=1 on SmolLM2 (the model built, or reused from the cache): the driver's checks pass on
    the run's settings with this model's files, and its tokenizer's chat template holds the task's prompts within
    the rehearsal's prompt length."""
    from transformers import AutoTokenizer

    from rpg.smol import overrides as smol
    from rpg.smol.build import planned_assets

    env = _env(DRY_RUN="1", RPG_BACKEND="cpu", RPG_CPU_MODEL="smol", PYTHON=sys.executable,
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    for key in ("OMP_NUM_THREADS", "RPG_CPU_ROLLOUT"):  # the threads' default: the HF rollout, no user's value
        env.pop(key, None)
    p = subprocess.run(["bash", str(ROOT / "recipe/rpg/7b" / f"{NAME}.sh")], env=env, cwd=tmp_path, text=True,
                       capture_output=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assets = planned_assets()
    assert f"# run {NAME}: RPG-REINFORCE-UFKL" in p.stdout
    assert f"model {assets.model_dir} (prompt {smol.MAX_PROMPT_LENGTH}" in p.stdout
    assert "composed and validated config" in p.stdout and "no such file" not in p.stderr
    # the dry run shows the threads the run gets (rpg.smol.overrides.omp_threads: every core, the sync trainer)
    assert f"env_vars.OMP_NUM_THREADS='{len(os.sched_getaffinity(0))}'" in p.stdout, p.stdout[-3000:]
    import pandas as pd

    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    assert tokenizer.chat_template
    prompts = pd.read_parquet(assets.train_file)["prompt"]
    longest = max(len(tokenizer.apply_chat_template(list(m), add_generation_prompt=True, tokenize=True))
                  for m in prompts)
    assert 0 < longest <= smol.MAX_PROMPT_LENGTH, longest
