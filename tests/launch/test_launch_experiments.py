"""Each shipped run's experiment file (recipe/rpg/config/experiment/<run>.yaml) says what its name says
(``scripts/experiments.py --check``, which names each disagreement and writes nothing), and composes exactly the
config the name's grammar composes (every key, both backends); ``main_rpg.py +experiment=<run>`` composes the run's
settings."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from launching import generator, planned
from messages import names
from omegaconf import OmegaConf

from rpg.launch.experiments import CONFIG_NAME, EXPERIMENT_DIR

ROOT = Path(__file__).resolve().parents[2]
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
    with initialize_config_dir(config_dir=str(ROOT / "recipe/rpg/config"), version_base=None):
        yield lambda overrides: compose(config_name=CONFIG_NAME, overrides=list(overrides))


def _grammar_plan(name: str, backend: str | None = None) -> list[str]:
    """The launch's overrides with the grammar's in place of the experiment file."""
    ov = planned(name, ENV, backend=backend)
    assert ov[0] == f"+experiment={name}"
    return [*generator().to_overrides(generator().parse(name)), *ov[1:]]


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


def test_every_experiment_file_says_what_its_name_says_and_the_check_writes_nothing(capsys):
    """``scripts/experiments.py --check`` on the shipped files: no disagreement, exit 0, every file as it was."""
    gen = generator()
    names = gen.known_names()
    assert len(names) == 84 and all((ROOT / EXPERIMENT_DIR / f"{n}.yaml").is_file() for n in names)
    before = {p: p.read_bytes() for p in (ROOT / EXPERIMENT_DIR).iterdir()}
    assert gen.main(["--check"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().err == ""
    assert {p: p.read_bytes() for p in (ROOT / EXPERIMENT_DIR).iterdir()} == before
    assert gen.main(["--write"]) == 2 and "usage: python scripts/experiments.py --check" in capsys.readouterr().err


def test_the_check_names_each_disagreement_of_a_wrong_copy(tmp_path, capsys):
    """A copy of a shipped file, edited against its name (another divergence, lr 1 as an integer, a setting
    removed, one the name does not decide added, another paper row): one line each, naming the file and the key,
    exit 1. A file whose name is no run name of the grammar (a user's run) is its own declaration: not checked."""
    gen, name = generator(), "run_rpg_7b_ufkl1e-4"
    text = (ROOT / EXPERIMENT_DIR / f"{name}.yaml").read_text()
    for old in ("    divergence: ufkl ", "      lr: 1.0e-6 ", "    clip: true ", f"# {name}: RPG-UFKL [not in the paper]"):
        assert old in text
    wrong = (text.replace("    divergence: ufkl ", "    divergence: urkl ").replace("      lr: 1.0e-6 ", "      lr: 1 ")
             .replace("    clip: true ", "    # clip: true ").replace("RPG-UFKL [not in the paper]", "RPG-URKL [Table 3]")
             + "  seed: 3\n")  # under trainer:
    (tmp_path / f"{name}.yaml").write_text(wrong)
    (tmp_path / "my_run.yaml").write_text(wrong)
    assert gen.main(["--check", str(tmp_path / f"{name}.yaml"), str(tmp_path / "my_run.yaml")]) == 1
    shown = f"scripts/experiments.py: {tmp_path / name}.yaml: "
    assert capsys.readouterr().err.splitlines() == [
        f"{shown}actor_rollout_ref.actor.optim.lr=1; its name says 1.0e-6",
        f"{shown}rpg.loss.divergence=urkl; its name says ufkl",
        f"{shown}rpg.loss.clip is not set; its name says true",
        f"{shown}trainer.seed is set, which its name does not decide",
        f"{shown}its first comment line is '{name}: RPG-URKL [Table 3]'; its name says '{name}: RPG-UFKL [not in the "
        "paper]'"]
    (tmp_path / f"{name}.yaml").write_text(text)  # the shipped file as it is: nothing to say
    assert gen.main(["--check", str(tmp_path / f"{name}.yaml")]) == 0 and capsys.readouterr().err == ""


def test_file_content_is_commented_yaml_on_the_paper_setup():
    text = generator().experiment_path("run_rpg_4b_ctx8k_urkl1e-4_rf_clip_ppo_0.2_0.28").read_text()
    package, first = text.splitlines()[:2]
    assert package == "# @package _global_"  # Hydra's directive: the keys land at the top of the config
    assert first.startswith("# run_rpg_4b_ctx8k_urkl1e-4_rf_clip_ppo_0.2_0.28: "), first  # the run, its variant, table
    names(first, "RPG-REINFORCE-URKL", "[Table 3]")
    assert yaml.safe_load(text)["defaults"] == [{"/paper": "default"}, "_self_"]
    assert "      lr: 1.0e-6" in text and "App. H" in text
    files = list((ROOT / EXPERIMENT_DIR).glob("*.yaml"))
    assert all(len(line) <= 120 for p in files for line in p.read_text().splitlines())
    assert not [p.name for p in files if "sha256" in p.read_text() or "written by" in p.read_text()]  # no digest line


@pytest.mark.parametrize("name", SAMPLE)
def test_a_script_composes_what_its_name_composes(name):
    """One script per family (the file differs from family to family only by which keys it sets): the launch's
    composed config (GPU backend: the paper's run) from ``+experiment=<name>`` equals, key for key, the one from
    the grammar's overrides."""
    with _hydra() as compose:
        old = OmegaConf.to_yaml(compose(_grammar_plan(name)), resolve=True)
        new = OmegaConf.to_yaml(compose(planned(name, ENV)), resolve=True)
    assert new == old


@pytest.mark.parametrize("name", ["run_grpo_7b", "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28",
                                  "run_rpg_4b_ctx4k_ufkl1e-3_rf_clip_ppo_0.2_0.28_noiterref"])
def test_tiny_task_composes_the_same_from_the_file(name):
    """RPG_BACKEND=cpu (the tiny task with the run's algorithm settings): the command's config is unchanged too."""
    from rpg.trainer_process import build_command

    def tiny(overrides):
        return build_command(overrides, entry=str(ROOT / "recipe/rpg/main_rpg.py"), base_env=ENV, backend="cpu")[0][2:]

    with _hydra() as compose:
        new = compose(tiny(planned(name, ENV, backend="cpu")))
        old = compose(tiny(_grammar_plan(name, backend="cpu")))
    assert OmegaConf.to_yaml(new, resolve=True) == OmegaConf.to_yaml(old, resolve=True)


@pytest.mark.parametrize("name", SAMPLE)
def test_main_rpg_with_the_experiment_composes_the_names_settings(name):
    """``main_rpg.py +experiment=<name>`` alone: the grammar's config, plus the model, data files and names the
    file states (which the launch sets from its environment; the keys that interpolate them follow)."""
    gen = generator()
    v = gen.parse(name)
    with _hydra() as compose:
        alone, grammar = _leaves(compose([f"+experiment={name}"])), _leaves(compose(gen.to_overrides(v)))
    assert {k for k in alone.keys() | grammar.keys() if alone.get(k) != grammar.get(k)} == FILE_ONLY
    assert alone["actor_rollout_ref.model.path"] == v.model and alone["trainer.experiment_name"] == name
    assert alone["data.val_files"] == [f"data/{s}.parquet" for s in v.val_sets]


def test_main_rpg_reads_the_experiment_from_its_command_line():
    """Hydra's own flags: the command line goes to Hydra as it is (the launch adds nothing)."""
    name = "run_rpg_4b_ctx8k_urkl1e-4_rf_clip_ppo_0.2_0.28"
    out = subprocess.run([sys.executable, str(ROOT / "recipe/rpg/main_rpg.py"), f"+experiment={name}", "--cfg", "job"],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    cfg = yaml.safe_load(out.stdout)
    assert cfg["rpg"]["loss"]["divergence"] == "urkl" and cfg["data"]["max_response_length"] == 8192
    assert cfg["trainer"]["experiment_name"] == name and cfg["data"]["train_batch_size"] == 512  # + the paper setup


def test_the_docs_table_of_every_script_is_the_generators():
    doc = (ROOT / "docs" / "launch-scripts.md").read_text()
    assert generator().list_table() in doc, "paste `python scripts/experiments.py --table` into section 8"


def test_the_docs_table_of_the_variables_is_their_declaration():
    """Each launch variable, and the Hydra key it sets when it only sets one, is declared once: the docs' table is
    written from it."""
    from rpg.launch.environment import VARIABLES, variables_table

    doc = (ROOT / "docs" / "launch-scripts.md").read_text()
    assert variables_table() in doc, "paste rpg.launch.environment.variables_table() into section 4"
    assert VARIABLES["MODEL_PATH"][0] == "actor_rollout_ref.model.path" and VARIABLES["DRY_RUN"][0] is None
