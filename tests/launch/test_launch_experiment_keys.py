"""Every key an experiment file sets is a key of the config, checked before anything starts (one line naming the
file, the key and the closest key the config has, exit 2), for shipped files and a user's alike
(``rpg.launch.config_keys.experiment_key_problems``); what a file's YAML expands to is bounded
(``rpg.launch.experiments.expanded_size``). Hydra merges a file of the defaults list without its struct check: a
typo sat beside the default it meant to change, and the run used the default. The 84 shipped files compose
through the same check in tests/launch/test_launch_dryrun.py::test_every_script_composes_and_validates."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from launching import env as _env, launch
from messages import names, one_line

from rpg.launch.config_keys import ConfigKeyError, compose_config
from rpg.launch.experiments import ExperimentError

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "recipe" / "rpg" / "config"
SHIPPED = "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28_7binstruct"
PLUS = "+key=value"  # the form that adds a key the config does not have, named by each refusal of a file's key


def _copy(tmp_path: Path, name: str, edit) -> Path:
    """A copy of the shipped file as ``my_configs/experiment/<name>.yaml``, its text passed through ``edit``."""
    text = (CONFIG_DIR / "experiment" / f"{SHIPPED}.yaml").read_text()
    path = tmp_path / "my_configs" / "experiment" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    new = edit(text)
    assert new != text
    path.write_text(new)
    return path


def _searchpath(tmp_path: Path) -> str:
    return f"hydra.searchpath=[pkg://verl.trainer.config,file://{tmp_path / 'my_configs'}]"


def _compose(tmp_path: Path, name: str, *more: str):
    return compose_config([f"+experiment={name}", _searchpath(tmp_path), *more], CONFIG_DIR)


def test_a_typo_in_a_copied_shipped_file_is_refused_by_dry_run_in_one_line(tmp_path):
    """As docs/launch-scripts.md says to make a new run. Before: exit 0, the header said response 512."""
    path = _copy(tmp_path, "my_typo", lambda t: t.replace("  max_response_length: 2048", "  max_respons_length: 2048"))
    p = subprocess.run([sys.executable, str(ROOT / "recipe" / "rpg" / "main_rpg.py"), "+experiment=my_typo",
                        _searchpath(tmp_path)], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env=_env(DRY_RUN="1", PYTHONPATH=str(ROOT)))
    assert (p.returncode, p.stdout) == (2, ""), p.stdout[-2000:] + p.stderr[-2000:]
    line = one_line(p.stderr)
    assert line.startswith(f"rpg config error: {path} "), line
    names(line, "data.max_respons_length", "data.max_response_length?", PLUS)  # the key, the key meant, the `+` form


@pytest.mark.parametrize("old, new, said", [
    ("    enable: true                                        # DAPO's", "    enabel: true  # DAPO's", [("algorithm.filter_groups.enabel", "algorithm.filter_groups.enable")]),
    ("  project_name: rpg ", "  total_trainig_steps: 50\n  save_frq: 5\n  project_name: rpg ",
     [("trainer.total_trainig_steps", "trainer.total_training_steps"), ("trainer.save_frq", "trainer.save_freq")]),
    ("\nrpg:\n", "\nbomb:\n  x: 1\nrpg:\n", [("bomb", None)]),
], ids=["nested", "two", "block"])
def test_each_key_the_config_lacks_is_named_with_the_closest_one(tmp_path, old, new, said):
    path = _copy(tmp_path, "mine", lambda t: t.replace(old, new, 1))
    with pytest.raises(ConfigKeyError) as e:
        _compose(tmp_path, "mine")
    line = one_line(str(e.value))
    assert line.startswith(f"{path} "), line
    for key, close in said:  # each key, the key meant where one is close, and the `+` form
        names(line, f" {key},", *([f"{close}?"] if close else []))
    assert ("did you mean" in line) == any(close for _, close in said), line
    names(line, PLUS)


def test_a_file_without_its_package_line_is_refused(tmp_path):
    """Without ``# @package _global_`` Hydra puts every key under ``experiment.``, where nothing reads it."""
    path = _copy(tmp_path, "nopkg", lambda t: t.replace("# @package _global_\n", ""))
    with pytest.raises(ConfigKeyError, match=rf"^{path}: its keys land under experiment\. .*# @package _global_"):
        _compose(tmp_path, "nopkg")


def test_keys_whose_mapping_belongs_to_their_reader_are_accepted(tmp_path):
    """A key new to the config is legitimate under an empty mapping (verl's dict fields), a value of the rpg: block,
    ray.init's and the reward function's keyword arguments, and where a ``+``/``++`` override adds it."""
    def edit(t: str) -> str:
        t = t.replace("    path: Qwen/Qwen2.5-7B-Instruct ", "    override_config: {attn_implementation: sdpa}\n"
                      "    path: Qwen/Qwen2.5-7B-Instruct ")
        t = t.replace("\ndata:\n", "\ndata:\n  my_key: 1\n  apply_chat_template_kwargs: {enable_thinking: false}\n")
        t = t.replace("\nreward:\n", "\nreward:\n  custom_reward_function:\n    reward_kwargs: {boxed_fallback: true}\n")
        t = t.replace("\n  reference:\n", "\n  validation:\n    samples_per_problem: {aime: 2}\n  reference:\n")
        return t + "ray_kwargs:\n  ray_init:\n    runtime_env:\n      env_vars:\n        MY_VAR: x\n"

    _copy(tmp_path, "open", edit)
    with pytest.raises(ConfigKeyError) as e:  # without the + override: that key alone
        _compose(tmp_path, "open")
    assert str(e.value).count(" sets ") == 1 and "open.yaml sets data.my_key, which is not a key" in str(e.value)
    cfg = _compose(tmp_path, "open", "++data.my_key=2")
    assert cfg.data.my_key == 2 and cfg.rpg.validation.samples_per_problem.aime == 2
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.MY_VAR == "x"
    assert cfg.reward.custom_reward_function.reward_kwargs.boxed_fallback is True
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"


def _bomb(levels: int, fan: int = 10) -> str:
    lines = ["# @package _global_", "bomb:", "  a0: &a0 x"]
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fan)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_what_a_file_expands_to_is_counted_without_expanding_it():
    from rpg.launch.experiments import expanded_size

    sizes = [1]  # a0, a1 = [a0 x 10], ...: each level 1 + 10 x the one below
    for _ in range(9):
        sizes.append(1 + 10 * sizes[-1])
    assert expanded_size(_bomb(9)) == 3 + sum(1 + s for s in sizes)  # the root, bomb and its mapping; each key
    assert expanded_size("a: &x [1, *x]\n") == math.inf  # an alias inside its own anchor
    assert expanded_size("") == 0


def test_an_alias_bomb_and_a_yaml_error_are_one_line_before_anything_is_composed(tmp_path, capsys):
    """Before: a 6-level bomb hung DRY_RUN over 120 s (OmegaConf expands every alias)."""
    from rpg.launch.experiments import MAX_NODES, expanded_size

    folder = tmp_path / "my_configs" / "experiment"
    folder.mkdir(parents=True)
    (folder / "bomb.yaml").write_text(_bomb(4))  # 12,353 values: over the bound, and quick to build without it
    (folder / "broken.yaml").write_text("# @package _global_\ndata: [\n")
    assert launch(["bomb", _searchpath(tmp_path)], _env(DRY_RUN="1")) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"rpg.launch: {folder / 'bomb.yaml'}: its YAML expands to {expanded_size(_bomb(4)):,} values through "
                   f"its aliases (&name / *name), over {MAX_NODES:,}: an experiment file sets keys, write them out"]
    with pytest.raises(ExperimentError, match=rf"^{folder / 'broken.yaml'}: not valid YAML: while parsing"):
        _compose(tmp_path, "broken")
