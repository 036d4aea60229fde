"""The run a launch asks for is the run it shows: the launcher's header is the composed config's settings (the
name's and the overrides'); an override that changes what the run name says gives the run a name that says it
(trainer.experiment_name: checkpoints, logs, report labels), in one line."""

from __future__ import annotations

from pathlib import Path

import yaml
from test_launch_dryrun import _env

from rpg.common.override_lists import values
from rpg.launch.cli import main
from rpg.launch.describe import naming_note
from rpg.launch.plan import plan_overrides
from rpg.launch.request import LaunchRequest
from rpg.launch.variants import parse

ROOT = Path(__file__).resolve().parents[1]
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
    assert _notes(out) == [f"rpg.loss.divergence=urkl, rpg.loss.clip=false change what the run name {NAME} says: "
                           f"the run is named {new} (trainer.experiment_name: its checkpoint folder, logs and report "
                           "labels; EXP_NAME=... names it otherwise)"]
    assert _composed(out, "trainer.experiment_name") == new
    assert _composed(out, "trainer.default_local_dir") == str(ROOT / "ckpts" / "rpg" / new)


def test_a_name_given_by_the_user_is_kept_and_a_restated_or_memory_setting_renames_nothing():
    v = parse(NAME)

    def planned(env, user):
        ov = values(plan_overrides(v, env, user, root=ROOT, cwd=ROOT)[0])
        note = naming_note(v, LaunchRequest.read(env, ROOT, ROOT), user)
        return ov["trainer.experiment_name"], ov["trainer.default_local_dir"], note

    lr = ["actor_rollout_ref.actor.optim.lr=3e-6"]
    assert planned(_env(), lr)[:2] == (f"{NAME}+lr=3e-6", str(ROOT / "ckpts" / "rpg" / f"{NAME}+lr=3e-6"))
    name, ckpts, note = planned(_env(EXP_NAME="mine"), lr)
    assert (name, ckpts) == ("mine", str(ROOT / "ckpts" / "rpg" / "mine"))
    assert note == (f"actor_rollout_ref.actor.optim.lr=3e-6 changes what the run name {NAME} says; the run keeps the "
                    "name you gave it (EXP_NAME=mine)")
    name, _, note = planned(_env(), [*lr, "trainer.experiment_name=mine"])
    assert name == "mine" and note.endswith("the run keeps the name you gave it (trainer.experiment_name=mine)")
    # the name's own value, a memory-only setting, a key the name does not decide: the name still says it all
    same = ["rpg.loss.divergence=ufkl", "actor_rollout_ref.actor.optim.lr=1e-6",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.5", "trainer.total_training_steps=7"]
    assert planned(_env(), same) == (NAME, str(ROOT / "ckpts" / "rpg" / NAME), None)
    # Hydra merges a mapping into its node: each key of it counts
    assert planned(_env(), ["rpg.loss={clip:false,beta:1e-4}"])[0] == f"{NAME}+clip=false"
