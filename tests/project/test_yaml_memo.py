"""The test processes' memoized YAML parsing (tests/support/yaml_memo.py) gives what a fresh parse gives."""

from __future__ import annotations

import io

import yaml_memo
from omegaconf import OmegaConf

from rpg.paths.checkout import CHECKOUT, RECIPE_CONFIG_DIR
from rpg.launch.experiments import CONFIG_NAME


def test_installed_in_the_test_process():
    assert yaml_memo.installed()


def test_a_load_equals_a_fresh_parse_and_shares_nothing(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("# @package _global_\na:\n  b: [1, 2.5, x]\n  c: ${a.b}\nn: null\n")
    first = OmegaConf.load(path)
    assert first == yaml_memo._ORIGINAL(path) and OmegaConf.to_yaml(first) == OmegaConf.to_yaml(yaml_memo._ORIGINAL(path))
    first.a.b.append(3)  # a caller's edit ...
    second = OmegaConf.load(path)
    assert list(second.a.b) == [1, 2.5, "x"] and second == yaml_memo._ORIGINAL(path)  # ... reaches no later load
    stream = io.StringIO("ignored: header\nk: 1\n")
    stream.readline()
    assert OmegaConf.load(stream) == OmegaConf.create({"k": 1})  # a stream is read from its position
    path.write_text("a: 2\n")  # an edited file is parsed again
    assert OmegaConf.load(path) == OmegaConf.create({"a": 2})


def _compose(overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CHECKOUT / RECIPE_CONFIG_DIR), version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=overrides)


def test_a_composition_is_the_same_with_and_without_the_memo(monkeypatch):
    """The recipe's whole config (the recipe's files and verl's tree), composed twice with the memo (the
    second from copies) and once with OmegaConf's own parsing."""
    overrides = ["rpg.loss.divergence=urkl", "actor_rollout_ref.actor.optim.lr=2e-6"]
    memo = [OmegaConf.to_yaml(_compose(overrides)) for _ in range(2)]
    monkeypatch.setattr(OmegaConf, "load", staticmethod(yaml_memo._ORIGINAL))
    fresh = OmegaConf.to_yaml(_compose(overrides))
    assert memo == [fresh, fresh] and "divergence: urkl" in fresh
