"""Values of a launch that passed the checks and failed later, or ran doing nothing, refused (or said) before
anything starts: a run name whose files the file system refuses (``OSError`` 36 at the first log segment or
checkpoint, hours into a run), an auto-name that would be one (shortened with a digest, and said), ``LOGGER`` naming
no logger (no metrics), integer variables ``int`` refuses (``²``: a traceback), a file both trained on and
validated (a warning)."""

from __future__ import annotations

from pathlib import Path

import pytest
from data_files import verl_file
from launching import env as _env, launch
from messages import names, one_line
from omegaconf import OmegaConf

from rpg.config import RPGConfigError
from rpg.launch.describe import naming_note
from rpg.launch.environment import LaunchError, Request
from rpg.launch.experiments import find
from rpg.launch.plan import experiment_name
from rpg.verl.input_paths import check_run_names
from rpg.verl.verl_rules import verl_loggers

ROOT = Path(__file__).resolve().parents[2]
PAPER = "run_rpg_7b_ufkl1e-4"
CJK = "名" * 104  # 312 bytes in UTF-8


def _lines(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


# ----------------------------------------------------------------------------- file names


def test_a_name_past_the_file_systems_limit_is_one_line_before_anything_starts(capsys):
    assert launch([PAPER], _env(DRY_RUN="1", EXP_NAME=CJK)) == 2
    [line] = _lines(capsys)
    assert line.startswith(f"rpg.launch: EXP_NAME={CJK[:40]!r}... "), line
    # its size, the longest file it names, the file system's bound and the bound on the name
    names(line, "312 bytes", "<name>.part9999.jsonl", "255 bytes", "240 bytes")
    with pytest.raises(LaunchError, match=r"^PROJECT_NAME='名{40}'\.\.\. is 312 bytes"):
        Request.read({"PROJECT_NAME": CJK}, ROOT)


def _trainer(**values) -> OmegaConf:
    trainer = {"project_name": "rpg", "experiment_name": "run", "resume_mode": "auto", "default_local_dir": "ckpts/x",
               "logger": ["console", "file"], **values}
    return OmegaConf.create({"trainer": trainer})


def test_the_driver_checks_every_file_name_the_run_writes(tmp_path):
    """The driver's check (before Ray, DRY_RUN too): the experiment name with its log segments' suffix, and every
    folder name of the checkpoint, metrics log and TensorBoard paths."""
    check_run_names(_trainer(experiment_name="a" * 240))  # its 9999th log segment: 255 bytes
    with pytest.raises(RPGConfigError, match=r"^trainer\.experiment_name='a{40}'\.\.\. is 241 bytes"):
        check_run_names(_trainer(experiment_name="a" * 241))
    long = "b" * 256
    with pytest.raises(RPGConfigError, match=rf"^trainer\.default_local_dir={tmp_path}/{long}: its folder name 'b{{40}}'"
                                             r"\.\.\. is 256 bytes \(UTF-8\), over the 255 a file name holds$"):
        check_run_names(_trainer(default_local_dir=str(tmp_path / long)))
    env = {"ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": {"TENSORBOARD_DIR": f"/tb/{long}"}}}}}
    with pytest.raises(RPGConfigError, match=r"^TENSORBOARD_DIR=/tb/b+: its folder name"):
        check_run_names(OmegaConf.merge(_trainer(logger=["tensorboard"]), env))
    check_run_names(OmegaConf.merge(_trainer(logger=["console"]), env))  # not written without the logger


def test_an_auto_name_past_the_limit_is_shortened_with_a_digest_and_said():
    """A paper script with many overrides: the name says each change; past the limit it is cut, a digest of the
    whole name keeps it apart from another cut the same way, and the note line says so."""
    from rpg.verl.input_paths import NAME_MAX, longest_file_name

    exp, req = find(PAPER), Request.read(_env(), ROOT)
    lrs = [f"actor_rollout_ref.actor.optim.lr=0.000000{i}{'0' * 90}1" for i in (2, 3)]
    user = [lrs[0], "rpg.loss.divergence=urkl", "rpg.loss.beta=0.00100000000000000000000000000000000000000000000000001",
            "actor_rollout_ref.actor.clip_ratio_low=0.1000000000000000000000000000000000000000000000000000001"]
    name, other = experiment_name(exp, req, user), experiment_name(exp, req, [lrs[1], *user[1:]])
    assert len(longest_file_name(name).encode()) == NAME_MAX and name.startswith(f"{PAPER}+lr=")
    assert name[-13] == "~" and other[:-13] != name[:-13] and other[-12:] != name[-12:]
    note = naming_note(exp, req, user)
    # the name, the key it sets, that it was cut with a digest of the full name, the bound, the variable to name it
    names(one_line(note), f" {name} ", "trainer.experiment_name", "digest", f"{PAPER}+lr=0.0000002", "255 bytes",
          "EXP_NAME=...")
    assert experiment_name(exp, req, ["rpg.loss.divergence=urkl"]) == f"{PAPER}+divergence=urkl"


# ----------------------------------------------------------------------------- loggers and integer variables


def test_a_logger_list_naming_no_logger_is_refused(capsys):
    """Before: ``LOGGER=,`` ran with ``trainer.logger=[]``: no metrics."""
    assert launch([PAPER], _env(DRY_RUN="1", LOGGER=" , ")) == 2
    [line] = _lines(capsys)
    names(line, "rpg.launch: ", "LOGGER=','", "no logger", "console,file")  # the value, what it lacks, the default
    assert launch([PAPER, "trainer.logger=[]"], _env(DRY_RUN="1")) == 2
    [line] = _lines(capsys)
    assert line.startswith("rpg config error: trainer.logger=[] "), line
    names(line, "no logger", ", ".join(verl_loggers()))  # what it lacks and the loggers allowed


@pytest.mark.parametrize("env, line", [
    ({"N_GPUS_PER_NODE": "²"}, "N_GPUS_PER_NODE='²' is invalid; expected a positive integer"),
    ({"N_GPUS_PER_NODE": "0"}, "N_GPUS_PER_NODE='0' is invalid; expected a positive integer"),
    ({"NNODES": "1:2", "RPG_MAX_RESTARTS": "²"}, "RPG_MAX_RESTARTS='²' is invalid; expected an integer >= 0"),
    ({"NNODES": "1:2", "RPG_MAX_RESTARTS": "-1"}, "RPG_MAX_RESTARTS='-1' is invalid; expected an integer >= 0"),
    ({"NNODES": "٣"}, "NNODES='٣' is invalid; expected a positive integer N"),
])
def test_integer_variables_are_read_by_one_parser(env, line):
    """``str.isdigit`` takes '²', which ``int`` refuses (before: a ValueError traceback)."""
    with pytest.raises(LaunchError) as e:
        Request.read(env, ROOT, cluster=True)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)
    assert Request.read({"NNODES": "1:2", "RPG_MAX_RESTARTS": "0"}, ROOT, cluster=True).max_restarts == 0


def test_a_file_trained_on_and_validated_is_a_warning(tmp_path, capsys, monkeypatch):
    """As ``rpg.data prepare`` warns of an evaluation set's problems in a training set: the run goes on."""
    data = verl_file(tmp_path / "aime.parquet")
    monkeypatch.chdir(tmp_path)
    assert launch([PAPER], _env(DRY_RUN="1", TRAIN_FILE="aime.parquet", VAL_FILES=f"{data},{tmp_path}/x.parquet")) == 0
    warned = [ln for ln in _lines(capsys) if "both name" in ln]
    assert len(warned) == 1 and warned[0].startswith("rpg: warning: "), warned
    names(warned[0], "data.train_files", "data.val_files", str(data))  # the two keys and the file they share
