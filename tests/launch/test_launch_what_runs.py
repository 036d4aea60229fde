"""The run a launch asks for is the run it shows: the launch's header is the composed config's settings (the
experiment file's and the overrides'); an override that changes what the run's file says gives the run a name that
says it (trainer.experiment_name: checkpoints, logs, report labels), in one line; an edited shipped experiment file
is the run (the check names its edits); a user's experiment file for a run without a script is composed, and said."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from launching import env as _env, launch as main, planned
from messages import names, one_line

from rpg.override_lists import values
from rpg.launch.describe import naming_note
from rpg.launch.environment import Request
from rpg.launch.experiments import EXPERIMENT_DIR, find, shipped_names

ROOT = Path(__file__).resolve().parents[2]
NAME = "run_rpg_7b_ufkl1e-4"  # RPG-UFKL, fully differentiable, clipped, lr 1e-6
LR = "actor_rollout_ref.actor.optim.lr"


def _header(out: str) -> str:
    """The launcher's header of a DRY_RUN (its '# ' lines before the command), without its notes."""
    return "\n".join(ln for ln in _header_lines(out) if not ln.startswith("#   note: "))


def _notes(out: str) -> list[str]:
    """The header's note lines."""
    return [ln.removeprefix("#   note: ") for ln in _header_lines(out) if ln.startswith("#   note: ")]


def _header_lines(out: str) -> list[str]:
    lines = out[:out.index("# command: ")].splitlines()
    return lines[next(i for i, ln in enumerate(lines) if ln.startswith("# run ")):]


def _composed(out: str, key: str):
    """``key``'s value in the composed config a DRY_RUN prints (YAML after its '# ---- composed' line)."""
    cfg = yaml.safe_load(out[out.index("# ---- composed"):])
    for part in key.split("."):
        cfg = cfg[part]
    return cfg


def test_an_override_of_what_the_name_says_is_shown_and_renames_the_run(capsys):
    user = ["rpg.loss.divergence=urkl", "rpg.loss.clip=false"]
    assert main([NAME, *user], _env(DRY_RUN="1")) == 0
    out = capsys.readouterr().out
    new = f"{NAME}+divergence=urkl,clip=false"
    header = _header(out)
    assert header.startswith(f"# run {new} (from {NAME}: RPG-UFKL")
    assert "divergence=urkl" in header and "clip=False" in header  # the composed settings, as the driver's line
    assert "ufkl" not in header.replace(NAME, "") and "clip=True" not in header
    # the overrides, the run they change, its new name, the key that name sets and the variable to name it otherwise
    [note] = _notes(out)
    names(one_line(note), "rpg.loss.divergence=urkl, rpg.loss.clip=false", f" {NAME} ", f" {new} ",
          "trainer.experiment_name", "EXP_NAME=...")
    assert _composed(out, "trainer.experiment_name") == new
    assert _composed(out, "trainer.default_local_dir") == str(ROOT / "ckpts" / "rpg" / new)


def test_a_name_given_by_the_user_is_kept_and_a_restated_or_memory_setting_renames_nothing():
    exp = find(NAME)

    def named(env, user):
        ov = values(planned(NAME, env, user))
        note = naming_note(exp, Request.read(env, ROOT), user)
        return ov["trainer.experiment_name"], ov["trainer.default_local_dir"], note

    lr = ["actor_rollout_ref.actor.optim.lr=3e-6"]
    assert named(_env(), lr)[:2] == (f"{NAME}+lr=3e-6", str(ROOT / "ckpts" / "rpg" / f"{NAME}+lr=3e-6"))
    name, ckpts, note = named(_env(EXP_NAME="mine"), lr)
    assert (name, ckpts) == ("mine", str(ROOT / "ckpts" / "rpg" / "mine"))
    # the override, the run it changes, and where the name kept came from
    names(one_line(note), "actor_rollout_ref.actor.optim.lr=3e-6", f" {NAME} ", "EXP_NAME=mine")
    name, _, note = named(_env(), [*lr, "trainer.experiment_name=mine"])
    assert name == "mine", name
    names(one_line(note), "actor_rollout_ref.actor.optim.lr=3e-6", "trainer.experiment_name=mine")
    # the file's own value, a memory-only setting, a key the file does not set: the name still says it all
    same = ["rpg.loss.divergence=ufkl", "actor_rollout_ref.actor.optim.lr=1e-6",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.5", "trainer.total_training_steps=7"]
    assert named(_env(), same) == (NAME, str(ROOT / "ckpts" / "rpg" / NAME), None)
    # Hydra merges a mapping into its node: each key of it counts (a list in it is no setting of the name)
    mappings = ["rpg.loss={clip:false,beta:1e-4}", "actor_rollout_ref.actor={checkpoint:{save_contents:[model]}}"]
    assert named(_env(), mappings)[0] == f"{NAME}+clip=false"


def test_an_edited_shipped_experiment_file_is_the_run_and_the_check_names_the_edits(tmp_path, capsys):
    """A checkout whose shipped file was edited (lr 3e-6, urkl): the file is the run; the header shows its values,
    and ``scripts/experiments.py --check`` names each setting that no longer says what the name says."""
    for part in ("rpg", "recipe"):  # a copy of the checkout: the shipped files stay as they are
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / EXPERIMENT_DIR / f"{NAME}.yaml"
    text = path.read_text()
    assert "      lr: 1.0e-6 " in text and "    divergence: ufkl " in text
    path.write_text(text.replace("      lr: 1.0e-6 ", "      lr: 3.0e-6 ").replace("divergence: ufkl ", "divergence: urkl "))
    env = {**_env(DRY_RUN="1"), "PYTHONPATH": str(tmp_path)}
    p = subprocess.run([sys.executable, str(tmp_path / "recipe/rpg/main_rpg.py"), f"+experiment={NAME}"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    header = _header(p.stdout)
    assert header.startswith(f"# run {NAME}: RPG-UFKL") and "lr=3e-06" in header and "divergence=urkl" in header
    assert _composed(p.stdout, LR) == 3e-6
    assert _notes(p.stdout) == []
    from launching import generator

    from rpg.launch.experiments import file_note

    assert file_note(find(NAME)) is None  # a paper script's file: no note
    assert generator().main(["--check", str(path)]) == 1
    assert capsys.readouterr().err.splitlines() == [f"scripts/experiments.py: {path}: {k}; its name says {v}" for k, v in (
        ("actor_rollout_ref.actor.optim.lr=3.0e-6", "1.0e-6"), ("rpg.loss.divergence=urkl", "ufkl"))]


def test_a_users_experiment_file_for_a_run_without_a_script_is_composed(tmp_path, capsys):
    """The user's folder on Hydra's search path (``hydra.searchpath``, the recipe's entry kept) holds
    experiment/<name>.yaml for a run without a script: the run composes it, and says so."""
    name = "run_rpg_7b_urkl1e-3"
    assert name not in shipped_names()
    (tmp_path / "experiment").mkdir()
    text = (ROOT / EXPERIMENT_DIR / "run_rpg_7b_urkl1e-4.yaml").read_text()  # the user's file: a shipped one, edited
    (tmp_path / "experiment" / f"{name}.yaml").write_text(
        text.replace("      lr: 1.0e-6 ", "      lr: 3.0e-6 ").replace("beta: 1.0e-4 ", "beta: 1.0e-3 "))
    searchpath = f"hydra.searchpath=[pkg://verl.trainer.config,file://{tmp_path}]"
    assert main([name, searchpath], _env(DRY_RUN="1")) == 0
    out = capsys.readouterr().out
    assert "lr=3e-06" in _header(out) and "beta=0.001" in _header(out) and _composed(out, LR) == 3e-6
    assert "+experiment=run_rpg_7b_urkl1e-3" in out
    assert _notes(out) == [f"the run composes your experiment file {tmp_path / 'experiment' / name}.yaml "
                           f"(+experiment={name})"]
    assert main([name], _env(DRY_RUN="1")) == 2  # without the folder on the search path: no such run
    assert capsys.readouterr().err.startswith(f"rpg.launch: no run {name}: no experiment/{name}.yaml in ")
