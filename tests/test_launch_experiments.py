"""Each shipped run's experiment config (recipe/rpg/config/experiment/<run name>.yaml) is what the run-name grammar
writes, and a script composes from it exactly the config the grammar's overrides compose (every key, both backends);
``main_rpg.py +experiment=<run name>`` composes the run's settings."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

import rpg.launch.experiments as experiments
import rpg.launch.plan
from rpg.common.override_lists import parse_overrides
from rpg.launch.experiments import EXPERIMENT_DIR, experiment_path, render_experiment, stale_files
from rpg.launch.plan import CONFIG_DIR, CONFIG_NAME, plan_overrides
from rpg.launch.variants import known_names, name_settings, parse, recipe_value, to_overrides

ROOT = Path(__file__).resolve().parents[1]
ENV = {"PATH": "/usr/bin:/bin"}
# one name per family: the model, data and names the file adds to the grammar's settings are checked on these
SAMPLE = ("run_grpo_7b", "run_dapo_7binstruct", "run_rfppb_4b_ctx4k_1e-4", "run_rpg_7b_rkl1e-4_rf",
          "run_rpg_4b_ctx8k_urkl1e-4_rf_clip_ppo_0.2_0.28", "run_rpg_7b_schedulefree")
FILE_ONLY = {"actor_rollout_ref.model.path", "data.train_files", "data.val_files", "trainer.project_name",
             "trainer.experiment_name"}


@contextlib.contextmanager
def _hydra():
    """One Hydra initialisation for many compositions (each composition is what ``hydra.main`` composes)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / CONFIG_DIR), version_base=None):
        yield lambda overrides: compose(config_name=CONFIG_NAME, overrides=list(overrides))


def _grammar_plan(monkeypatch, name: str, backend: str | None = None) -> list[str]:
    """The launch's overrides as the grammar alone gives them (no experiment file)."""
    with monkeypatch.context() as m:
        m.setattr(rpg.launch.plan, "variant_overrides", lambda v, user=(): to_overrides(v))
        return plan_overrides(parse(name), ENV, [], root=ROOT, cwd=ROOT, backend=backend)[0]


def _leaves(cfg) -> dict:
    out = {}

    def walk(node, prefix):
        for k, v in node.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and v:
                walk(v, key + ".")
            else:
                out[key] = v
    walk(OmegaConf.to_container(cfg), "")  # unresolved: keys that interpolate the names are the same text
    return out


def test_every_experiment_file_is_what_the_grammar_writes():
    assert sorted(p.stem for p in (ROOT / EXPERIMENT_DIR).glob("*.yaml")) == known_names()
    assert stale_files() == [], "regenerate with: python -m rpg.launch.experiments --write"
    for name in known_names():  # the file holds every setting the name decides, as its value
        loaded = OmegaConf.load(experiment_path(name))
        for p in parse_overrides(name_settings(parse(name))):
            assert OmegaConf.select(loaded, p.key) == p.value and type(OmegaConf.select(loaded, p.key)) is type(p.value)


def test_a_changed_or_extra_file_is_named(monkeypatch, capsys, tmp_path):
    name = "run_rpg_7b_ufkl1e-4"
    monkeypatch.setattr(experiments, "render_experiment",
                        lambda v: render_experiment(v) + ("# edited\n" if v.name == name else ""))
    assert stale_files() == [f"{EXPERIMENT_DIR / name}.yaml"]
    assert experiments.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert f"differs from the run name's settings: {EXPERIMENT_DIR / name}.yaml" in err and "--write" in err
    monkeypatch.undo()
    monkeypatch.setattr(experiments, "CHECKOUT", tmp_path)  # a file without a script: named too
    (tmp_path / EXPERIMENT_DIR).mkdir(parents=True)
    (tmp_path / EXPERIMENT_DIR / "run_rpg_7b_gone.yaml").write_text("x: 1\n")
    assert f"{EXPERIMENT_DIR / 'run_rpg_7b_gone'}.yaml (no script)" in stale_files()


def test_file_content_is_commented_yaml_on_the_paper_setup():
    text = experiment_path("run_rpg_4b_ctx8k_urkl1e-4_rf_clip_ppo_0.2_0.28").read_text()
    assert text.startswith("# @package _global_\n# run_rpg_4b_ctx8k_urkl1e-4_rf_clip_ppo_0.2_0.28: RPG-REINFORCE-URKL "
                           "[Table 3]\n")
    assert yaml.safe_load(text)["defaults"] == [{"/paper": "default"}, "_self_"]
    assert "      lr: 1.0e-6" in text and "App. H" in text
    assert all(len(line) <= 120 for p in (ROOT / EXPERIMENT_DIR).glob("*.yaml") for line in p.read_text().splitlines())


def _file_settings(name: str) -> dict:
    """The experiment file's settings as dotted keys with their typed values (OmegaConf's YAML reading)."""
    cfg = OmegaConf.to_container(OmegaConf.load(ROOT / experiment_path(name)))
    cfg.pop("defaults")
    out = {}

    def walk(node, prefix):
        for k, v in node.items():
            if isinstance(v, dict) and v:
                walk(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = v
    walk(cfg, "")
    return out


def test_every_script_sets_what_its_name_set(monkeypatch):
    """Before/after the move to files, every shipped script: the experiment file's settings, then the launch's
    overrides (the command line wins), give each key the value and type the grammar's overrides gave it, or the
    recipe's YAML where they set none, and set no other key. (That Hydra composes them so, the file under the command line: the test below, per family.)"""
    failures = []
    for name in known_names():
        new = parse_overrides(plan_overrides(parse(name), ENV, [], root=ROOT, cwd=ROOT)[0])
        assert new[0].text == f"+experiment={name}" and not any(o.key == "paper" for o in new), name
        merged = {**_file_settings(name), **{o.key: o.value for o in new[1:]}}
        old = {o.key: o.value for o in parse_overrides(_grammar_plan(monkeypatch, name))}
        old.pop("paper", None)  # the grammar's `+paper=default`: the file's defaults list
        # a key the grammar left at the recipe's value: the file states that value
        old = {**{k: recipe_value(k) for k in merged if k not in old}, **old}
        if {k: (type(v), v) for k, v in merged.items()} != {k: (type(v), v) for k, v in old.items()}:
            failures.append((name, [(k, merged.get(k), old.get(k)) for k in sorted({*merged, *old})
                                    if (type(merged.get(k)), merged.get(k)) != (type(old.get(k)), old.get(k))][:4]))
    assert not failures, failures


@pytest.mark.parametrize("name", SAMPLE)
def test_a_script_composes_what_its_name_composed(monkeypatch, name):
    """One script per family (the file differs from family to family only by which keys it sets): the launch's
    composed config (GPU backend: the paper's run) from ``+experiment=<name>`` equals, key for key, the one from
    the grammar's overrides."""
    with _hydra() as compose:
        old = OmegaConf.to_yaml(compose(_grammar_plan(monkeypatch, name)), resolve=True)
        new = OmegaConf.to_yaml(compose(plan_overrides(parse(name), ENV, [], root=ROOT, cwd=ROOT)[0]), resolve=True)
    assert new == old


@pytest.mark.parametrize("name", ["run_grpo_7b", "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28",
                                  "run_rpg_4b_ctx4k_ufkl1e-3_rf_clip_ppo_0.2_0.28_noiterref"])
def test_tiny_task_composes_the_same_from_the_file(monkeypatch, name):
    """RPG_BACKEND=cpu (the tiny task with the run's algorithm settings): the command's config is unchanged too."""
    from rpg.launch.harness import build_command

    def tiny(overrides):
        return build_command(overrides, entry=str(ROOT / "recipe/rpg/main_rpg.py"), base_env=ENV, backend="cpu")[0][2:]

    with _hydra() as compose:
        new = compose(tiny(plan_overrides(parse(name), ENV, [], root=ROOT, cwd=ROOT, backend="cpu")[0]))
        old = compose(tiny(_grammar_plan(monkeypatch, name, backend="cpu")))
    assert OmegaConf.to_yaml(new, resolve=True) == OmegaConf.to_yaml(old, resolve=True)


def test_a_name_without_a_script_keeps_the_grammars_overrides():
    v = parse("run_rpg_4b_ctx4k_fkl1e-4_rf_clip_ppo_0.1_0.1")
    assert v.name not in known_names() and experiments.variant_overrides(v) == to_overrides(v)


@pytest.mark.parametrize("name", SAMPLE)
def test_main_rpg_with_the_experiment_composes_the_names_settings(name):
    """``main_rpg.py +experiment=<name>`` alone: the grammar's config, plus the model, data files and names the
    file states (which the launcher sets from its environment; the keys that interpolate them follow)."""
    v = parse(name)
    with _hydra() as compose:
        alone, grammar = _leaves(compose([f"+experiment={name}"])), _leaves(compose(to_overrides(v)))
    assert {k for k in alone.keys() | grammar.keys() if alone.get(k) != grammar.get(k)} == FILE_ONLY
    assert alone["actor_rollout_ref.model.path"] == v.model and alone["trainer.experiment_name"] == name
    assert alone["data.val_files"] == [f"data/{s}.parquet" for s in v.val_sets]


def test_main_rpg_reads_the_experiment_from_its_command_line():
    name = "run_rpg_4b_ctx8k_urkl1e-4_rf_clip_ppo_0.2_0.28"
    out = subprocess.run([sys.executable, str(ROOT / "recipe/rpg/main_rpg.py"), f"+experiment={name}", "--cfg", "job"],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    cfg = yaml.safe_load(out.stdout)
    assert cfg["rpg"]["loss"]["divergence"] == "urkl" and cfg["data"]["max_response_length"] == 8192
    assert cfg["trainer"]["experiment_name"] == name and cfg["data"]["train_batch_size"] == 512  # + the paper setup
