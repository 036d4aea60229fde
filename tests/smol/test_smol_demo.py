"""The demo's ``--model smol`` (recipe/rpg/smol/run_smol_cpu.sh) up to the trainer: its settings, names and lines
(no model built, no trainer started: the smol stage runs it, tests/e2e/test_smol_e2e.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rpg.override_lists import values

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "recipe" / "rpg" / "smol" / "run_smol_cpu.sh"


class Started(Exception):
    pass


@pytest.fixture
def started(monkeypatch, tmp_path):
    """The demo's overrides when it would start the trainer (the asset build replaced by the planned paths)."""
    import rpg_lab.demo.cpu as demo
    import rpg.smol
    import rpg.tiny
    from rpg.smol.build import planned_assets
    from rpg.tiny.build import TinyAssets, builder_key, default_cache_root

    def fake_run(overrides, **kw):
        raise Started(overrides, kw)

    monkeypatch.setattr(demo, "run_trainer", fake_run)
    monkeypatch.setattr(rpg.smol, "build_smol_assets", lambda *a, **k: planned_assets())
    monkeypatch.setattr(rpg.tiny, "build_tiny_assets", lambda *a, **k: TinyAssets.at(default_cache_root() / builder_key()))

    def run(*argv, field=None):
        """The overrides' values, or ``field`` of the trainer call's other arguments (``timeout_s``, ...)."""
        with pytest.raises(Started) as e:
            demo.main(["--out", str(tmp_path / "o"), "--echo", *argv])
        return values(e.value.args[0]) if field is None else e.value.args[1][field]

    return run


def test_the_smol_run_has_its_models_sizes_schedule_and_names(started):
    from rpg.smol import overrides as smol
    from rpg.smol.build import planned_assets

    v = started("--model", "smol")
    planned = planned_assets()
    assert v["actor_rollout_ref.model.path"] == str(planned.model_dir)
    assert (v["data.train_files"], v["data.val_files"]) == (str(planned.train_file), str(planned.val_file))
    assert (v["data.train_batch_size"], v["actor_rollout_ref.rollout.n"]) == (8, 4)
    assert v["actor_rollout_ref.actor.ppo_mini_batch_size"] == 2  # 4 updates per rollout batch: off-policy
    assert (v["data.max_prompt_length"], v["data.max_response_length"]) == (224, 96)
    assert v["actor_rollout_ref.rollout.val_kwargs.n"] == 1
    assert v["actor_rollout_ref.rollout.val_kwargs.temperature"] == 1.0
    for key in ("actor_rollout_ref.actor.use_dynamic_bsz", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz"):
        assert v[key] is True
    # the prefix tree: a whole mini-batch per update micro-batch, a whole rollout batch per log-prob micro-batch
    assert v["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == 2 * 4 * (224 + 96)
    for key in ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"):
        assert v[key] == 8 * 4 * (224 + 96)
    assert (v["trainer.total_training_steps"], v["trainer.test_freq"]) == (smol.STEPS, smol.TEST_FREQ)
    assert v["actor_rollout_ref.actor.optim.lr"] == smol.LR
    assert (v["rpg.loss.form"], v["rpg.loss.divergence"], v["rpg.loss.clip"]) == ("reinforce", "ufkl", True)
    assert (v["trainer.project_name"], v["trainer.experiment_name"]) == ("rpg_smol", "smol_rpg_reinforce_ufkl")


def test_the_users_values_win_and_the_tiny_run_keeps_its_own(started):
    v = started("--model", "smol", "--steps", "2", "--lr", "3e-6", "data.max_response_length=48", "--algo", "grpo")
    assert (v["trainer.total_training_steps"], v["actor_rollout_ref.actor.optim.lr"]) == (2, 3e-6)
    assert v["data.max_response_length"] == 48 and v["trainer.experiment_name"] == "smol_grpo"
    tiny = started()
    assert (tiny["trainer.total_training_steps"], tiny["trainer.test_freq"]) == (30, 10)
    assert (tiny["actor_rollout_ref.actor.optim.lr"], tiny["data.max_response_length"]) == (5e-4, 16)
    assert (tiny["trainer.project_name"], tiny["trainer.experiment_name"]) == ("rpg_tiny", "tiny_rpg_reinforce_ufkl")
    assert "actor_rollout_ref.actor.use_dynamic_bsz" not in tiny


def test_each_model_has_its_own_time_limit_and_the_users_wins(started):
    # the tiny run's 30 minutes stopped the default smol run (about 90 minutes) at step 6
    from rpg.smol import overrides as smol

    assert started("--model", "smol", field="timeout_s") == smol.TIMEOUT_S > 1800.0
    assert started(field="timeout_s") == 1800.0
    assert started("--model", "smol", "--timeout", "60", field="timeout_s") == 60.0


def test_the_smol_script_is_the_demo_with_model_smol(tmp_path):
    """Its lines carry [smol] and name its own command; it refuses OUT as an argument like the tiny script."""
    p = subprocess.run(["bash", str(SCRIPT), "OUT=runs/x"], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)})
    err = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2 and len(err) == 1, p.stderr[-3000:]
    assert err[0].startswith("[smol] OUT is an environment variable")
    assert err[0].endswith("OUT=runs/x bash recipe/rpg/smol/run_smol_cpu.sh ...")


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "x"])
def test_a_time_limit_that_would_end_a_run_at_once_or_never_is_one_line(value, capsys, tmp_path):
    import rpg_lab.demo.cpu as demo
    import rpg_lab.demo.gpu_smoke as gpu_smoke

    for main in (demo.main, gpu_smoke.main):
        assert main(["--out", str(tmp_path / "o"), "--model", "smol", "--timeout", value]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "argument --timeout" in err and "seconds > 0" in err, err
    assert not (tmp_path / "o").exists()


def test_the_smol_run_gives_its_processes_every_core_and_the_tiny_run_one(started, monkeypatch):
    """The demo's trainer environment: SmolLM2's OMP_NUM_THREADS (rpg.smol.overrides.omp_threads), the tiny model
    none of its own (the CPU backend's 1); a user's OMP_NUM_THREADS is left to the backend, which forwards it."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("RPG_CPU_ROLLOUT", raising=False)
    cores = str(len(os.sched_getaffinity(0)))
    assert started("--model", "smol", field="env")["OMP_NUM_THREADS"] == cores
    assert started("--model", "smol", "trainer.v1.trainer_mode=colocate_async", field="env")["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in started(field="env")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert "OMP_NUM_THREADS" not in started("--model", "smol", field="env")
