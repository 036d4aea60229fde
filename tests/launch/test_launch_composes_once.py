"""A paper run's launch composes its config once and checks its inputs once: ``recipe/rpg/main_rpg.py
+experiment=<run>`` (what every paper script runs) hands it to its launcher in the same process
(``rpg.launch.entry.cli``), which composes the overrides it plans with Hydra's compose API, makes the driver's checks
once (``Launch.check``: ``rpg.verl.main.prepare_config``) and hands that config to verl's ``run_ppo``, which starts
Ray with it; Hydra's main does not compose it again."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pandas as pd
import pytest
from launching import CLEAN_ENV_KEYS

ROOT = Path(__file__).resolve().parents[2]
NAME = "run_rpg_7b_ufkl1e-4"


class _RayWouldStart(SystemExit):
    """Raised where verl's run_ppo would start Ray (a SystemExit: Hydra's main reports any Exception itself)."""


def test_a_paper_launch_composes_the_run_once_and_checks_its_inputs_once(tmp_path, monkeypatch, capsys):
    import hydra._internal.hydra as hydra_internal

    import rpg.backends.gpu.backend as gpu
    import rpg.verl.input_paths as input_paths
    import rpg.verl.main as driver
    from rpg.launch.experiments import find

    files = find(NAME).settings
    row = pd.DataFrame({"prompt": [[{"role": "user", "content": "1+1?"}]], "data_source": ["aime2024"],
                        "reward_model": [{"ground_truth": "2"}]})
    for name in (files["data.train_files"], *files["data.val_files"]):
        row.to_parquet(tmp_path / Path(name).name)
    for key in CLEAN_ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CKPTS_DIR", str(tmp_path / "ckpts"))

    from rpg.launch import config_keys

    config_keys.base_keys.cache_clear()  # the config without a run, composed once per process: here, in this test
    composed, checked, ran, argv = [], [], [], []
    compose = hydra_internal.Hydra.compose_config
    monkeypatch.setattr(hydra_internal.Hydra, "compose_config",
                        lambda self, config_name, overrides, *a, **k: composed.append(list(overrides))
                        or compose(self, config_name, overrides, *a, **k))
    problems = input_paths.input_path_problems
    monkeypatch.setattr(input_paths, "input_path_problems", lambda cfg, **k: checked.append(cfg) or problems(cfg, **k))
    monkeypatch.setattr(gpu, "check_driver", lambda *a, **k: None)  # this node's GPUs: tests/backends

    def run_ppo(config, **kw):
        ran.append(config)
        argv.append(list(sys.argv))
        raise _RayWouldStart

    monkeypatch.setattr(driver, "run_ppo", run_ppo)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "recipe/rpg/main_rpg.py"), f"+experiment={NAME}",
                                      "trainer.total_training_steps=3"])
    with pytest.raises(_RayWouldStart):
        runpy.run_path(sys.argv[0], run_name="__main__")
    runs = [o for o in composed if f"+experiment={NAME}" in o]
    assert len(runs) == 1, composed  # the run's config; the other composition is the config without a run (its keys)
    assert len(composed) == 2 and all(f"+experiment={NAME}" not in o for o in composed if o is not runs[0])
    assert len(checked) == 1 and ran == checked  # the inputs of the config Ray starts with, checked once
    assert ran[0].trainer.total_training_steps == 3 and ran[0].rpg.loss.divergence == "ufkl"
    # the driver's command line (its resume command) is recipe/rpg/main_rpg.py with the run's overrides
    assert argv == [[str(ROOT / "recipe/rpg/main_rpg.py"), *runs[0]]]
    assert capsys.readouterr().out.count(f"run {NAME}: RPG-UFKL") == 1  # the launch's header, once
