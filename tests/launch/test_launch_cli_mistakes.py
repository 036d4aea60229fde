"""A mistyped command line is refused before anything starts, in one line that says what was meant, by the
launch (every paper script: ``recipe/rpg/main_rpg.py +experiment=<run>``) and the tiny demo (``python -m rpg_lab.demo.cpu``,
recipe/rpg/tiny/run_tiny_cpu.sh) alike, exit code 2; no run overwrites another; Ctrl-C at any stage is one line.

* an environment variable given as an argument (``OUT=runs/x`` after the script: ``rpg.launch.args``);
* a run name without an experiment file (a swap of two characters of a shipped one): the closest shipped name
  (``rpg.launch.experiments``);
* a key the composed config does not have, with the closest valid key and the ``+`` hint
  (``rpg.launch.config_keys``; it was Hydra's traceback, after Ray under the demo);
* a logger verl does not know, from ``LOGGER`` or ``trainer.logger``, on every backend (it was verl's
  AssertionError after Ray and the workers; with ``RPG_BACKEND=cpu`` ``LOGGER`` was dropped silently);
* ``--steps``/``STEPS`` below 1 (a ValueError traceback);
* a fresh start in an output folder that holds a run (it replaced its checkpoints and metrics), and the
  checkpoint folder's name follows the variant run (``rpg.trainer_process.run_dir``, ``rpg.tiny.overrides``);
* Ctrl-C before the trainer starts (the tiny model's first build included: a 24-line traceback).

Nothing here starts a trainer; each test is at most a composition of the config (about a second).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from launching import env as _env, launch
from messages import names, one_line

ROOT = Path(__file__).resolve().parents[2]
PAPER = "run_rpg_4b_ctx4k_ufkl1e-4_rf_clip_ppo_0.2_0.28"
TINY = ROOT / "recipe" / "rpg" / "tiny" / "run_tiny_cpu.sh"


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def _demo(argv, capsys):
    from rpg_lab.demo.cpu import main

    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, _lines(cap.err), cap.out


def _launch(argv, capsys, **env):
    rc = launch(argv, _env(**env))
    cap = capsys.readouterr()
    return rc, _lines(cap.err), cap.out


# ----------------------------------------------------------------------------- environment variables as arguments


def test_an_environment_variable_given_as_an_argument_is_one_line_naming_where_it_goes(tmp_path, capsys):
    rc, err, out = _demo(["--out", tmp_path / "o", "OUT=runs/x"], capsys)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("[tiny] OUT is an environment variable") and "--out" in err[0]
    assert err[0].endswith("OUT=runs/x bash recipe/rpg/tiny/run_tiny_cpu.sh ...")
    assert out == "" and not (tmp_path / "o").exists()
    rc, err, _ = _launch([PAPER, "trainer.save_freq=5", "OUT_DIR=runs/x"], capsys, RPG_BACKEND="cpu")
    assert rc == 2 and len(err) == 1, err
    assert err[0].endswith(f"OUT_DIR=runs/x bash recipe/rpg/4b/{PAPER}.sh ...")


def test_the_tiny_scripts_variables_are_the_declared_ones():
    """run_tiny_cpu.sh's variables are the demo's declaration (ENV_VARS), so each is refused as an argument
    and listed in the usage; each sets the flag the declaration names."""
    from rpg_lab.demo.cpu import ENV_VARS, SCRIPT_ENV, _parser

    script = TINY.read_text()
    used = set(re.findall(r"\$\{(\w+):-", script))  # the variables it reads (with a default)
    assert used <= set(ENV_VARS), used - set(ENV_VARS)
    for name, flag in SCRIPT_ENV.items():
        assert re.search(rf'{flag} "\$\{{?{name}', script), (name, flag)
    assert set(SCRIPT_ENV.values()) <= {o for a in _parser()._actions for o in a.option_strings}


def test_the_tiny_script_refuses_out_as_an_argument(tmp_path):
    p = subprocess.run(["bash", str(TINY), "OUT=runs/x"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2 and len(_lines(p.stderr)) == 1, p.stderr[-3000:]
    assert "OUT is an environment variable" in p.stderr and not (tmp_path / "outputs").exists()


# ----------------------------------------------------------------------------- a name next to a shipped one


@pytest.mark.parametrize("extra_env", [{"DRY_RUN": "1"}, {}, {"RPG_BACKEND": "cpu"}])
def test_a_name_next_to_a_shipped_one_is_refused_naming_the_closest_shipped_name(extra_env, capsys):
    """Before: the swapped digits (0.82 for the shipped 0.28) composed eps_high 0.82 after a warning. A run is its
    experiment file: the name without one is refused in one line, in every mode, before anything is read."""
    swapped = "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.82"
    rc, err, out = _launch([swapped, "OUT_DIR=runs/x"], capsys, **extra_env)
    assert rc == 2 and len(err) == 1 and out == "", err
    assert err[0].startswith(f"rpg.launch: no run {swapped}: ") and \
        "closest shipped: run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28;" in err[0]


# ----------------------------------------------------------------------------- unknown keys


@pytest.mark.parametrize("extra_env", [{"DRY_RUN": "1"}, {}, {"RPG_BACKEND": "cpu"}])
def test_an_unknown_key_is_one_line_with_the_closest_key_and_the_plus_hint(extra_env, capsys):
    """Two mistyped keys, in the launcher's three local modes (the local GPU run and the CPU backend never
    composed before starting)."""
    rc, err, out = _launch([PAPER, "rpg.loss.divergance=fkl", "actor_rollout_ref.actor.optim.lrr=1e-6"], capsys,
                           **extra_env)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("rpg config error: "), err
    # each key refused, the key meant and the `+` form that adds it, in the order given
    names(err[0], "rpg.loss.divergance", "rpg.loss.divergence?", "+rpg.loss.divergance=fkl",
          "actor_rollout_ref.actor.optim.lrr", "actor_rollout_ref.actor.optim.lr?",
          "+actor_rollout_ref.actor.optim.lrr=1e-6")
    assert err[0].index("+rpg.loss.divergance=fkl") < err[0].index("actor_rollout_ref.actor.optim.lrr"), err
    assert "[cpu]" not in out


@pytest.mark.parametrize("plus", ["", "+"])
def test_a_key_under_the_loss_configs_reference_names_the_rpg_loss_key_to_set(capsys, plus):
    """verl's policy-loss config holds rpg.loss by reference (rpg_loss: ${rpg.loss}): a loss field set there, with or
    without +, is one line naming the rpg.loss key to write, never a hint to add the key (or to drop the +)."""
    rc, err, _ = _launch([PAPER, f"{plus}actor_rollout_ref.actor.policy_loss.rpg_loss.beta=0.5"], capsys, DRY_RUN="1")
    line = one_line("\n".join(e for e in err if "warning" not in e))
    assert rc == 2, err
    names(line, "actor_rollout_ref.actor.policy_loss.rpg_loss.beta", "rpg.loss.beta=0.5")
    assert "write +" not in line and "++" not in line  # neither Hydra's add nor its force-add


def test_the_demo_checks_keys_before_it_builds_or_starts_anything(tmp_path, capsys, monkeypatch):
    import rpg.tiny

    monkeypatch.setattr(rpg.tiny, "build_tiny_assets", lambda *a, **k: pytest.fail("built before the key check"))
    rc, err, out = _demo(["--out", tmp_path / "o", "--steps", "1", "rpg.loss.divergance=rkl"], capsys)
    assert rc == 2 and len(err) == 1 and "did you mean rpg.loss.divergence?" in err[0], err
    assert out == "" and not (tmp_path / "o").exists()
    from rpg.paths.checkout import RECIPE_CONFIG_DIR
    from rpg.launch.config_keys import ConfigKeyError, compose_config

    with pytest.raises(ConfigKeyError) as e:  # `+` on a key the config has (Hydra's three lines)
        compose_config(["+rpg.loss.divergence=rkl"], ROOT / RECIPE_CONFIG_DIR, "rpg_trainer")
    # the key, the override that changes it and the `++` form that adds or replaces it
    names(one_line(str(e.value)), "rpg.loss.divergence", "write rpg.loss.divergence=rkl", "++rpg.loss.divergence=")


# ----------------------------------------------------------------------------- loggers


def test_loggers_are_verls_own_list():
    from verl.utils.tracking import Tracking

    from rpg.verl.verl_rules import logger_problem, verl_loggers

    assert set(Tracking.supported_backend) <= set(verl_loggers())
    assert logger_problem(["console", "file", "wandb", "tensorboard"]) is None
    problem = one_line(logger_problem(["console", "tensorbord"]))
    assert problem.startswith("trainer.logger: 'tensorbord' "), problem
    names(problem, "'tensorboard'?", ", ".join(verl_loggers()))


@pytest.mark.parametrize("extra_env", [{"DRY_RUN": "1"}, {}, {"RPG_BACKEND": "cpu"}, {"RPG_BACKEND": "cpu", "DRY_RUN": "1"}])
def test_an_unknown_logger_is_one_line_on_every_backend(extra_env, capsys):
    rc, err, _ = _launch([PAPER], capsys, LOGGER="console,tensorbord", **extra_env)
    assert rc == 2 and len(err) == 1 and err[0].startswith("rpg.launch: LOGGER: 'tensorbord' (did you mean "), err
    rc, err, _ = _launch([PAPER, "trainer.logger=[console,file,tensorbord]"], capsys, **extra_env)
    assert rc == 2 and len(err) == 1 and err[0].startswith("rpg config error: trainer.logger: 'tensorbord'"), err


@pytest.mark.parametrize("extra_env", [{"LOGGER": "console,file"}, {"LOGGER": "console,tensorboard"},
                                       {"LOGGER": "console,file", "RAY_ADDRESS": "http://127.0.0.1:9"}])
def test_a_logger_with_the_cpu_backend_under_dry_run_is_checked_after_the_platform_is_chosen(extra_env, tmp_path):
    """Before: exit 1, ``ValueError: Unknown platform 'cpu'``: the LOGGER check imported verl (its list of loggers)
    before the CPU backend's platform variables were set, and verl chose its platform then. A process of its own:
    verl chooses its platform once per process."""
    stub = tmp_path / "ray"  # a job API that does not answer: a warning under DRY_RUN=1
    stub.write_text("#!/bin/sh\nexit 1\n")
    stub.chmod(0o755)
    env = _env(DRY_RUN="1", RPG_BACKEND="cpu", PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **extra_env)
    for key in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES"):
        env.pop(key, None)
    p = subprocess.run(["bash", str(ROOT / "recipe/rpg/7b/run_grpo_7b.sh")], env={**env, "PYTHON": sys.executable},
                       cwd=tmp_path, text=True, capture_output=True, timeout=300)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "composed and validated config" in p.stdout


def test_the_demo_refuses_an_unknown_logger_and_keeps_a_known_one(tmp_path, capsys):
    rc, err, _ = _demo(["--out", tmp_path / "o", "trainer.logger=[console,file,tensorbord]"], capsys)
    assert rc == 2 and len(err) == 1 and "'tensorbord' (did you mean 'tensorboard'?)" in err[0], err
    from rpg.trainer_process import build_command

    argv, _ = build_command(["trainer.logger=[console,wandb]"], base_env={})  # the harness adds its file logger
    assert argv[-1] == "trainer.logger=['console','wandb','file']"


def test_launcher_keeps_the_users_loggers_on_the_cpu_backend(tmp_path, monkeypatch):
    """``LOGGER`` was replaced by console,file with RPG_BACKEND=cpu when it lacked 'file'."""
    from rpg import trainer_process as harness

    main, seen = launch, []
    monkeypatch.setattr(harness, "run_trainer", lambda overrides, **kw: seen.append(list(overrides)) or
                        harness.TrainerRun(0, 0.0, Path(kw["output_dir"]), tmp_path / "l", tmp_path / "m", []))
    assert main([PAPER], _env(RPG_BACKEND="cpu", LOGGER="console,tensorboard", OUT_DIR=str(tmp_path / "o"))) == 0
    argv, _ = harness.build_command(seen[0], base_env={})
    assert [a for a in argv if a.startswith("trainer.logger=")] == ["trainer.logger=['console','tensorboard','file']"]


# ----------------------------------------------------------------------------- counts


@pytest.mark.parametrize("steps", ["0", "-3"])
def test_steps_below_one_is_one_line(steps, tmp_path, capsys):
    rc, err, out = _demo(["--out", tmp_path / "o", "--steps", steps], capsys)
    assert rc == 2 and err == [f"[tiny] argument --steps (STEPS): {steps!r} is invalid: expected an integer >= 1; "
                               "see --help"], err
    p = subprocess.run(["bash", str(TINY)], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "STEPS": steps})
    assert p.returncode == 2 and len(_lines(p.stderr)) == 1 and "(STEPS)" in p.stderr, p.stderr[-3000:]


# ----------------------------------------------------------------------------- run folders


def _holding_a_run(out: Path, experiment: str = "tiny_rpg_reinforce_ufkl") -> Path:
    ckpt = out / "checkpoints" / "rpg_tiny" / experiment / "global_step_2"
    ckpt.mkdir(parents=True)
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": {}}) + "\n" for s in (0, 1, 2)))
    return ckpt


def test_a_fresh_start_in_a_folder_holding_a_run_is_refused_naming_it_and_the_ways_on(tmp_path, capsys, monkeypatch):
    import rpg.tiny

    monkeypatch.setattr(rpg.tiny, "build_tiny_assets", lambda *a, **k: pytest.fail("built before the folder check"))
    out = tmp_path / "D"
    ckpt = _holding_a_run(out)
    before = (out / "metrics.jsonl").read_text()
    rc, err, _ = _demo(["--out", out, "--steps", "2", "trainer.save_freq=1"], capsys)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"[tiny] {out} already holds a run ({out / 'metrics.jsonl'} with steps 0..2 and ")
    assert "another output folder (OUT=" in err[0] and err[0].endswith("trainer.resume_mode=auto to continue that run")
    # a variant with another name is refused too: its metrics.jsonl would replace this run's
    rc, err, _ = _demo(["--out", out, "rpg.loss.divergence=rkl"], capsys)
    assert rc == 2 and "already holds a run" in err[0], err
    # ... and continuing "it" under the other variant's name would restart from step 0 over its metrics
    rc, err, _ = _demo(["--out", out, "rpg.loss.divergence=rkl", "trainer.resume_mode=auto"], capsys)
    assert rc == 2 and len(err) == 1 and f"holds another run ({ckpt.parent})" in err[0], err
    assert (out / "metrics.jsonl").read_text() == before and ckpt.is_dir()


def test_a_launcher_fresh_start_in_its_out_dir_holding_a_run_is_refused(tmp_path, capsys, monkeypatch):
    from rpg import trainer_process as harness

    monkeypatch.setattr(harness, "run_trainer", lambda *a, **k: pytest.fail("started"))
    out = tmp_path / "D"
    (out).mkdir()
    (out / "metrics.jsonl").write_text(json.dumps({"step": 0, "data": {}}) + "\n")
    rc, err, _ = _launch([PAPER, "trainer.resume_mode=disable"], capsys, RPG_BACKEND="cpu", OUT_DIR=str(out))
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"rpg.launch: {out} already holds a run"), err
    assert "OUT_DIR=" in err[0]
    # DRY_RUN=1 is a gate: it refuses what the launch refuses, with the same line
    rc, dry_err, _ = _launch([PAPER, "trainer.resume_mode=disable"], capsys, RPG_BACKEND="cpu", OUT_DIR=str(out),
                             DRY_RUN="1")
    assert rc == 2 and dry_err == err, dry_err


def test_fresh_start_rules(tmp_path):
    from rpg.trainer_process.run_dir import RunDirError, check_fresh_start, run_found

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "trainer.log").write_text("a run that died before logging a step\n")
    assert run_found(empty, empty / "checkpoints") is None
    check_fresh_start(empty, "disable", empty / "checkpoints", "OUT=...")
    out = tmp_path / "D"
    ckpt = _holding_a_run(out)
    for mode in ("auto", "resume_path"):  # a resume is the driver's to check (rpg.verl.checkpoints)
        check_fresh_start(out, mode, ckpt.parent, "OUT=...")
    with pytest.raises(RunDirError, match=rf"checkpoints {re.escape(str(ckpt))}\)"):
        check_fresh_start(out, "disable", ckpt.parent, "OUT=...")
    # auto under another variant's name: nothing of its own to resume, it would replace the other's metrics
    rkl = out / "checkpoints" / "rpg_tiny" / "tiny_rpg_reinforce_rkl"
    with pytest.raises(RunDirError, match=rf"holds another run \({re.escape(str(ckpt.parent))}\), and "):
        check_fresh_start(out, "auto", rkl, "OUT=...")
    (out / "metrics.jsonl").unlink()
    check_fresh_start(out, "auto", rkl, "OUT=...")  # no metrics to replace
    with pytest.raises(RunDirError, match="already holds a run"):  # checkpoints alone are a run too
        check_fresh_start(out, "disable", ckpt.parent, "OUT=...")


@pytest.mark.parametrize("broken, why", [
    ("{not json", r"not a JSON line \(Expecting property name"),
    ('{"step": null, "data": {}}', r"step must be an integer, got None"),
    ("[1, 2]", r"expected an object with a 'step' key, got \[1, 2\]"),
])
def test_a_run_folder_with_a_broken_metrics_line_is_refused_naming_the_file_and_line(broken, why, tmp_path):
    """The folder check reads metrics.jsonl by the one reader's rules (rpg.metrics_log.file): a broken line
    before the last is refused naming the file and line, never skipped (it used to be: steps 0..2 of the
    lines around it were reported, or none, as if the file held nothing)."""
    from rpg.trainer_process.run_dir import RunDirError, check_fresh_start

    out = tmp_path / "D"
    out.mkdir()
    metrics = out / "metrics.jsonl"
    metrics.write_text("\n".join([json.dumps({"step": 0, "data": {}}), broken, json.dumps({"step": 2, "data": {}})]))
    for mode, ckpts in (("disable", out / "checkpoints"), ("auto", out / "checkpoints" / "p" / "other")):
        (out / "checkpoints" / "p" / "mine" / "global_step_2").mkdir(parents=True, exist_ok=True)
        with pytest.raises(RunDirError) as err:
            check_fresh_start(out, mode, ckpts, "OUT=...")
        line = str(err.value)
        assert "\n" not in line and re.match(rf"{re.escape(str(metrics))}:2: {why}", line), line
        names(line, "nothing was started", "OUT=...")  # the outcome and the variable that names another folder
    check_fresh_start(out, "resume_path", out / "checkpoints", "OUT=...")  # the driver's to check: not read


def test_the_folder_check_reads_the_metrics_segments_and_skips_only_a_cut_last_line(tmp_path):
    from rpg.trainer_process.run_dir import RunDirError, check_fresh_start, run_found

    out = tmp_path / "D"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0, "data": {}}\n{"step": 1, "da')  # cut by a kill: skipped
    assert run_found(out, None) == f"{out / 'metrics.jsonl'} with steps 0..0"
    (out / "metrics.jsonl").write_text('{"step": 0, "da')  # nothing but a cut line: no record, no run
    (out / "metrics.backup.jsonl").write_text('{"step": 7, "data": {}}\n')  # not a segment (history.segments)
    assert run_found(out, None) is None
    check_fresh_start(out, "disable", None, "OUT=...")
    (out / "metrics.part2.jsonl").write_text('{"step": 3, "data": {}}\n{"step": 4.0, "data": {}}\n')  # a segment
    assert run_found(out, None) == f"{out / 'metrics.jsonl'} with steps 3..4"
    (out / "metrics.part2.jsonl").write_bytes(b'{"step": 3, "data": {"x": "\xe9"}}\n')  # not UTF-8: named
    with pytest.raises(RunDirError, match=rf"^{re.escape(str(out / 'metrics.part2.jsonl'))}: not UTF-8 text"):
        check_fresh_start(out, "disable", None, "OUT=...")


def test_the_checkpoint_folder_is_named_after_the_variant_run(tmp_path, capsys, monkeypatch):
    """The demo named every RPG run's folder tiny_rpg_reinforce_ufkl, whatever divergence or form it ran."""
    import rpg_lab.demo.cpu as demo
    import rpg.tiny

    class Started(Exception):
        pass

    def fake_run(overrides, **kw):
        raise Started(overrides)

    monkeypatch.setattr(demo, "run_trainer", fake_run)
    monkeypatch.setattr(rpg.tiny, "build_tiny_assets", lambda *a, **k: SimpleNamespace(root=tmp_path))
    from rpg.override_lists import values

    for extra, name in ((["rpg.loss.divergence=rkl"], "tiny_rpg_reinforce_rkl"), ([], "tiny_rpg_reinforce_ufkl"),
                        (["rpg.loss.form=differentiable", "rpg.loss.divergence=urkl"], "tiny_rpg_differentiable_urkl"),
                        (["trainer.experiment_name=mine"], "mine")):
        with pytest.raises(Started) as started:
            demo.main(["--out", str(tmp_path / name), "--echo", *extra])
        assert values(started.value.args[0])["trainer.experiment_name"] == name
    with pytest.raises(Started) as started:
        demo.main(["--out", str(tmp_path / "g"), "--echo", "--algo", "grpo"])
    assert values(started.value.args[0])["trainer.experiment_name"] == "tiny_grpo"


# ----------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_during_the_first_tiny_build_is_one_line(tmp_path, capsys, monkeypatch):
    """Before the harness takes over (the tiny model's first build, here interrupted as it starts): one line,
    exit code 130, nothing published (rpg.tiny.build publishes a build by one rename when complete)."""
    import rpg.tiny
    from rpg.tiny import build

    def interrupted_build(*a, **k):
        tmp = tmp_path / "cache" / ".build-x"
        tmp.mkdir(parents=True)
        os.kill(os.getpid(), signal.SIGINT)
        raise AssertionError("not interrupted")

    monkeypatch.setattr(rpg.tiny, "build_tiny_assets", interrupted_build)
    before = signal.getsignal(signal.SIGINT)  # Python's default_int_handler; SIG_IGN under a background shell's `&`
    try:
        rc, err, _ = _demo(["--out", tmp_path / "o", "--steps", "1"], capsys)
    except KeyboardInterrupt:  # not pytest's own: the demo let it out (a traceback)
        pytest.fail("KeyboardInterrupt escaped the demo: a traceback")
    assert rc == 130 and len(err) == 1 and err[0].startswith("[tiny] "), err
    names(err[0], "SIGINT", "building the tiny model")  # the signal and the stage it stopped
    assert not (tmp_path / "o").exists()
    assert signal.getsignal(signal.SIGINT) is before  # the handler was put back
    del build


def test_ctrl_c_in_the_launcher_before_the_run_is_one_line(capsys, monkeypatch):
    import rpg.launch.plan

    def interrupted(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        raise AssertionError("not interrupted")

    monkeypatch.setattr(rpg.launch.plan, "plan", interrupted)
    try:
        rc, err, _ = _launch([PAPER], capsys, RPG_BACKEND="cpu")
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped the launcher: a traceback")
    assert rc == 130 and len(err) == 1 and err[0].startswith("rpg.launch: "), err
    names(err[0], "SIGINT", "nothing was started")


# ----------------------------------------------------------------------------- W&B as asked


def test_wandb_as_the_user_asked(tmp_path):
    """Every local run had WANDB_MODE=disabled, whatever the user set or trainer.logger asked: a run with
    wandb wrote no W&B run, without a word. (A W&B run folder really written: tests/e2e/test_launch_cpu_e2e.py.)"""
    from rpg.trainer_process import build_command
    from rpg.backends.run_env import wandb_env

    _, env = build_command([], base_env={"WANDB_MODE": "offline"})
    assert env["WANDB_MODE"] == "offline"  # the user's, not 'disabled'
    assert wandb_env({"WANDB_MODE": "offline"}, ["console", "wandb"], tmp_path) == {"WANDB_DIR": str(tmp_path)}
    assert wandb_env({}, ["console", "wandb", "file"], tmp_path) == {"WANDB_DIR": str(tmp_path)}  # W&B's own default mode
    assert wandb_env({"WANDB_DIR": "/mine"}, "wandb", tmp_path) == {}
    assert wandb_env({}, ["console", "file"], tmp_path) == {"WANDB_MODE": "disabled"}  # not asked: quiet, as before
    assert wandb_env({"WANDB_MODE": "offline"}, ["console"], tmp_path) == {}


def test_data_and_model_variables_a_tiny_task_launch_does_not_use_are_named(capsys):
    """RPG_BACKEND=cpu trains the tiny task with its own model and data: TRAIN_FILE or MODEL_PATH given with it
    are named in one warning line, never dropped silently."""
    assert launch([PAPER], _env(RPG_BACKEND="cpu", DRY_RUN="1", TRAIN_FILE="mine.parquet", MODEL_PATH="org/m")) == 0
    warned = [ln for ln in _lines(capsys.readouterr().err) if "not used" in ln]
    assert len(warned) == 1 and warned[0].startswith("rpg.launch: warning: "), warned
    # the variables not used, the setting that drops them, and the keys that train the user's own
    names(warned[0], "MODEL_PATH, TRAIN_FILE", "RPG_BACKEND=cpu", "data.train_files", "actor_rollout_ref.model.path")
