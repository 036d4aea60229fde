"""Overrides are read with Hydra's own override parser (rpg.override_lists), everywhere:

* merging keeps its documented semantics and every value exactly as written;
* README's list form ``data.val_files=[data/aime2024.parquet,data/aime2025.parquet]`` works in the
  launcher's data-file check (it used ``ast.literal_eval`` and crashed with a SyntaxError);
* an override Hydra cannot read is ONE line naming it with Hydra's reason, exit code 2, at every entry
  point (the paper scripts and recipe/rpg/main_rpg.py, a Ray submission, python -m rpg_lab.demo.cpu and the tiny
  script), before anything starts; Hydra's own flags still work;
* the launchers keep the driver's exit code when it refuses a config, and their stderr is the
  driver's one line (the real driver process; it refuses before Ray, in seconds).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from data_files import verl_file
from launching import env as _env, launch
from messages import names

from rpg.override_lists import (OverrideSyntaxError, bad_override_line, merge_overrides, override_key, parse_one,
                                  value_of, values)

ROOT = Path(__file__).resolve().parents[2]
README_VAL = "data.val_files=[data/aime2024.parquet,data/aime2025.parquet]"
BAD = "data.val_files=[a.parquet,b.parquet"  # the closing bracket forgotten
DIVERGENCE_LINE = "rpg config error: rpg.loss.divergence='js' is invalid: expected one of fkl, rkl, ufkl, urkl"


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def _run(cmd: list[str], cwd: Path, timeout: float = 300, **env) -> subprocess.CompletedProcess:
    full_env = {**_env(**env), "PYTHONPATH": str(ROOT), "PYTHON": sys.executable}
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


# ----------------------------------------------------------------------------- the parser module


def test_values_are_read_as_hydra_reads_them():
    assert value_of(README_VAL) == ["data/aime2024.parquet", "data/aime2025.parquet"]
    assert value_of("data.val_files=['a b.parquet', \"c.parquet\"]") == ["a b.parquet", "c.parquet"]
    assert value_of("trainer.default_local_dir='/x/y z'") == "/x/y z"
    assert value_of("+a.b={c:1,d:[2,3]}") == {"c": 1, "d": [2, 3]}
    assert override_key("++a.b=1") == "a.b" and override_key("~a.b") == "a.b" and override_key("db@pkg=x") == "db@pkg"
    assert values(["a=1", "b=[x,y]", "a=2", "~b"]) == {"a": 2}


def test_merge_keeps_values_as_written_and_deletions_in_place():
    merged = merge_overrides(["a=1", "+b.c=2", "~d", "e='x,y'"], ["b.c=${oc.env:HOME}", "a=[p,q]", "e=\"z\""])
    assert merged == ["a=[p,q]", "+b.c=${oc.env:HOME}", "~d", "e=\"z\""]
    # an assignment after a deletion of its key comes after it (merged before it, the deletion would win)
    assert merge_overrides(["+a=1", "~a"], ["++a=3"]) == ["+a=1", "~a", "++a=3"]


@pytest.mark.parametrize("bad, reason", [
    (BAD, "no viable alternative at input '[a.parquet,b.parquet'"),
    ("trainer.device", "missing EQUAL"),
    ("a='x", "LexerNoViableAltException"),
])
def test_a_syntax_error_is_one_line_naming_the_override_and_hydras_reason(bad, reason):
    with pytest.raises(OverrideSyntaxError) as err:
        merge_overrides(["a=1"], [bad])
    msg = str(err.value)
    assert "\n" not in msg and repr(bad) in msg and reason in msg and "key=value" in msg, msg


def test_a_sweep_is_refused_where_a_run_takes_one_value():
    with pytest.raises(OverrideSyntaxError, match=r"'data.val_files=a.parquet,b.parquet' is a sweep.*key=\[a,b\]"):
        parse_one("data.val_files=a.parquet,b.parquet")
    assert bad_override_line(["-m", "a=1,2"]) is None  # Hydra's multirun takes sweeps
    assert "is a sweep" in bad_override_line(["--cfg", "job", "a=1,2"])
    assert bad_override_line(["--config-name", "rpg_trainer", "hydra.run.dir=x", "a=[1,2]"]) is None


# ----------------------------------------------------------------------------- README's list form in the launcher


def test_a_parsed_value_is_the_callers_own_and_a_refusal_is_said_each_time():
    """``parse_one`` is memoised: a caller that edits a list or dict value it got changes no later parse, and an
    override Hydra cannot read is refused on every call (a refusal is not remembered as a parse)."""
    first = parse_one("+a.b={c:1,d:[2,3]}")
    first.value["d"].append(4)
    first.value["e"] = 5
    assert parse_one("+a.b={c:1,d:[2,3]}").value == {"c": 1, "d": [2, 3]}
    listed = parse_one("k=[x,y]")
    listed.value.clear()
    assert value_of("k=[x,y]") == ["x", "y"] and values(["k=[x,y]"]) == {"k": ["x", "y"]}
    for _ in range(2):
        with pytest.raises(OverrideSyntaxError, match="missing EQUAL"):
            parse_one("trainer.device")
    sweep = parse_one("a=1,2", multirun=True)  # the same text, another answer under multirun
    with pytest.raises(OverrideSyntaxError, match="is a sweep"):
        parse_one("a=1,2")
    assert sweep.key == "a" and parse_one("a=1,2", multirun=True).value == sweep.value


def test_readme_list_form_in_the_data_file_check(tmp_path, monkeypatch):
    from rpg.data.checks import override_problems
    from rpg.launch.experiments import recipe_value

    def problems(overrides):
        return override_problems(values(overrides), recipe_value)

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    verl_file(tmp_path / "data" / "aime2024.parquet")
    assert problems([README_VAL]) == ["data.val_files[1]=data/aime2025.parquet: no such file"]  # the other accepted
    verl_file(tmp_path / "data" / "aime2025.parquet")
    assert problems(["data.train_files=data/aime2024.parquet", README_VAL]) == []
    assert problems(["data.train_files='data/none.parquet'", "data.val_files=hdfs://x/y.parquet"]) == [
        "data.train_files=data/none.parquet: no such file"]


def test_launcher_names_the_missing_files_of_readmes_list_form(tmp_path, monkeypatch, capsys):
    """No DRY_RUN: the launcher checks the data files before exec'ing the driver (it crashed with a raw
    SyntaxError traceback on this valid Hydra list); the driver's lines (rpg.data.checks), exit 2."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    verl_file(tmp_path / "data" / "aime2024.parquet")
    verl_file(tmp_path / "train.parquet", "math_dapo")
    rc = launch(["run_grpo_7b", README_VAL], _env(TRAIN_FILE=str(tmp_path / "train.parquet")))
    err = _lines(capsys.readouterr().err)
    assert rc == 2 and len(err) == 1 and err[0].startswith("rpg config error: "), err
    # the key and file missing (the other one found), and the command that prepares the files
    names(err[0], "data.val_files[1]=data/aime2025.parquet", "no such file",
          "python -m rpg.data prepare-all --out-dir data/", "docs/data-and-reports.md")


# ----------------------------------------------------------------------------- every entry point: one line, exit 2


@pytest.mark.parametrize("extra_env", [{}, {"DRY_RUN": "1"}, {"RPG_BACKEND": "cpu"}, {"RPG_BACKEND": "cpu", "DRY_RUN": "1"},
                                       {"RAY_ADDRESS": "http://127.0.0.1:8265"}])
def test_launch_syntax_error_is_one_line(extra_env, capsys):
    assert launch(["run_rpg_7b_ufkl1e-4", "trainer.save_freq=5", BAD], _env(**extra_env)) == 2
    cap = capsys.readouterr()
    err = _lines(cap.err)
    assert len(err) == 1 and err[0].startswith(f"rpg config error: Hydra cannot parse the override {BAD!r}: no viable"), \
        cap.err
    assert "[cpu]" not in cap.out  # nothing was started


def test_paper_script_syntax_error_is_one_line(tmp_path):
    p = _run(["bash", str(ROOT / "recipe" / "rpg" / "4b" / "run_rpg_4b_ctx2k_ufkl1e-4.sh"), BAD], tmp_path, DRY_RUN="1")
    assert p.returncode == 2 and _lines(p.stderr) == [_lines(p.stderr)[0]], p.stderr[-3000:]
    assert _lines(p.stderr)[0].startswith(f"rpg config error: Hydra cannot parse the override {BAD!r}")


def test_tiny_launcher_syntax_error_is_one_line_before_anything_starts(tmp_path, capsys):
    from rpg_lab.demo.cpu import main

    assert main(["--out", str(tmp_path / "out"), "--steps", "1", BAD]) == 2
    cap = capsys.readouterr()
    err = _lines(cap.err)
    assert len(err) == 1 and err[0].startswith(f"[tiny] Hydra cannot parse the override {BAD!r}: no viable"), cap.err
    assert cap.out == "" and not (tmp_path / "out").exists()  # no assets, no output directory, no trainer
    p = _run(["bash", str(ROOT / "recipe" / "rpg" / "tiny" / "run_tiny_cpu.sh"), "trainer.device"], tmp_path,
             OUT=str(tmp_path / "out2"))
    assert p.returncode == 2 and len(_lines(p.stderr)) == 1, p.stderr[-3000:]
    names(_lines(p.stderr)[0], "[tiny] ", "'trainer.device'", "missing EQUAL")  # the override and Hydra's reason


def test_driver_entry_syntax_error_is_one_line_before_verl_is_imported(tmp_path):
    """Hydra's own report was three lines without the override's name, exit code 1."""
    entry = str(ROOT / "recipe" / "rpg" / "main_rpg.py")
    p = _run([sys.executable, entry, "trainer.total_training_steps=2", BAD], tmp_path)
    assert p.returncode == 2 and len(_lines(p.stderr)) == 1, p.stderr[-3000:]
    assert _lines(p.stderr)[0].startswith(f"rpg config error: Hydra cannot parse the override {BAD!r}: no viable")
    p = _run([sys.executable, entry, "data.val_files=a.parquet,b.parquet"], tmp_path)
    assert p.returncode == 2 and len(_lines(p.stderr)) == 1 and "is a sweep" in p.stderr, p.stderr[-3000:]
    # Hydra's flags and hydra.* overrides still reach Hydra: the composed config's package is printed (only it),
    # nothing runs (one process: each imports verl)
    p = _run([sys.executable, entry, "--cfg", "job", "--package", "data", "hydra.run.dir=.", README_VAL,
              "data.max_prompt_length=7"], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "- data/aime2024.parquet" in p.stdout and "max_prompt_length: 7" in p.stdout, p.stdout[-3000:]
    assert not re.search(r"^(trainer|actor_rollout_ref):", p.stdout, re.M), p.stdout[-3000:]


# ----------------------------------------------------------------------------- the driver's exit code


def test_tiny_launcher_keeps_the_drivers_exit_code_and_line(tiny_assets, tmp_path, capsys, monkeypatch):
    """The real driver (recipe/rpg/main_rpg.py on the CPU backend, its own process) refuses before Ray: exit code
    2 and its one line is the launcher's whole stderr (the launcher printed 'FAILED' and the log's last 60 lines).
    The launchers in this process (``python -m rpg_lab.demo.cpu`` exits with what ``main`` returns)."""
    from rpg_lab.demo.cpu import main

    monkeypatch.setenv("RPG_TINY_CACHE", str(tiny_assets.root.parent))
    assert main(["--out", str(tmp_path / "out"), "--steps", "1", "rpg.loss.divergence=js"]) == 2
    assert _lines(capsys.readouterr().err) == [DIVERGENCE_LINE]
    assert DIVERGENCE_LINE in (tmp_path / "out" / "trainer.log").read_text()


def test_cpu_backend_launcher_keeps_the_drivers_exit_code_and_line(tiny_assets, tmp_path, capsys):
    environ = _env(RPG_BACKEND="cpu", OUT_DIR=str(tmp_path / "out"), RPG_TINY_CACHE=str(tiny_assets.root.parent))
    assert launch(["run_rpg_7b_ufkl1e-4", "rpg.loss.divergence=js"], environ) == 2
    assert _lines(capsys.readouterr().err) == [DIVERGENCE_LINE]
    assert DIVERGENCE_LINE in (tmp_path / "out" / "trainer.log").read_text()


@pytest.mark.parametrize("text", ["abc", "a b", "data/x.parquet", "1", "1e-4", "true", "False", "null", "None",
                                  "a,b", "${x}", "a\\b", "[a]", "{k: v}", "é", "~home", "x=y"])
def test_hydra_value_reads_back_as_the_same_string_when_quoted(text):
    """The one quoting function: quoted, Hydra reads back exactly the string (never an int, a bool, null, a list,
    an interpolation); bare only when Hydra reads the bare text as that same string."""
    from rpg.override_lists import hydra_value

    assert values([f"k={hydra_value(text, quote=True)}"])["k"] == text
    bare = values([f"k={hydra_value(text)}"])["k"]
    assert bare == text or (text in ("1", "1e-4") and str(bare) in ("1", "0.0001")), bare


@pytest.mark.parametrize("text", ["it's", "data/o'brien/x y", "a\\", "a\\\\", "a\\'b", "x\\'", "'", "''", "\\\\'"])
def test_hydra_value_escapes_quotes_and_backslashes(text):
    """A single quote, and backslashes before one or at the end, are escaped as Hydra's grammar wants (a folder
    named o'brien was refused; before that, a traceback): Hydra's parser reads back the very string."""
    from rpg.override_lists import hydra_list, hydra_value

    assert values([f"k={hydra_value(text, 'MODEL_PATH')}"])["k"] == text
    assert values([f"k={hydra_list([text, '1'])}"])["k"] == [text, "1"]
    assert values([f"k={hydra_list(['a b', '1', 'true'])}"])["k"] == ["a b", "1", "true"]
