"""Every data file a run reads is checked before Ray: it exists, is readable, is in
verl's layout (``data.prompt_key``, ``reward_model.ground_truth``, ``data_source``), every ``data_source``
has a reward function (rpg.reward's routes, or verl's ``default_compute_score`` list when the recipe's reward
is off), and the lists are not empty. One function (``rpg.verl.input_paths.input_path_problems`` through
``rpg.data.checks``), called by the driver, the launcher (a real launch and DRY_RUN alike: exit 2 before
anything starts; DRY_RUN only warns of a missing file) and the tiny demo (before its assets are built). A user's
``reward.custom_reward_function.name`` is never replaced by the recipe's."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir
from data_files import answers_file, model_folder, verl_file
from hydra.core.global_hydra import GlobalHydra
from messages import names, one_line

from rpg.config import RPGConfigError
from rpg.verl.input_paths import InputPathError, check_input_paths, input_path_problems

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
CONFIG_DIR = ROOT / "recipe" / "rpg" / "config"


def raw_file(path: Path) -> Path:
    pq.write_table(pa.table({"problem": ["What is 1+1?"], "answer": ["2"]}), path)
    return path


def corrupt_file(path: Path) -> Path:
    """Footer and schema read; the snappy data pages (every byte between the magic and the footer) do not."""
    table = pa.table({"data_source": [f"aime{i}" * 20 for i in range(200)], "x": [f"What is {i}?" for i in range(200)]})
    pq.write_table(table, path, compression="snappy", use_dictionary=False)
    raw = bytearray(path.read_bytes())
    footer = int.from_bytes(raw[-8:-4], "little")
    for i in range(4, len(raw) - footer - 8):
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))
    return path


@pytest.fixture
def files(tmp_path):
    model_folder(tmp_path / "model")
    verl_file(tmp_path / "train.parquet", "math_dapo")
    verl_file(tmp_path / "val.parquet", "aime2025")
    return tmp_path


def _cfg(files: Path, *overrides: str):
    base = [f"data.train_files={files / 'train.parquet'}", f"data.val_files=['{files / 'val.parquet'}']",
            f"actor_rollout_ref.model.path={files / 'model'}"]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="rpg_trainer", overrides=[*base, *overrides])


def _applied(files: Path, *overrides: str):
    """The config as the driver checks it: the rpg: block applied (the recipe's reward function set)."""
    from rpg.verl.block_to_verl import validate_and_apply

    cfg = _cfg(files, "trainer.device=cpu", *overrides)
    validate_and_apply(cfg)
    return cfg


# ----------------------------------------------------------------------------- the one function


def test_files_in_verl_layout_with_a_scored_data_source_pass(files):
    assert input_path_problems(_applied(files)) == []


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared eval files not found at {SHARED}")
def test_the_real_evaluation_files_pass_and_the_check_reads_one_column(files, monkeypatch):
    vals = [str(SHARED / n) for n in ("aime-2024.parquet", "aime25.parquet", "amc-23.parquet")]
    cfg = _applied(files, f"data.val_files=[{','.join(vals)}]")
    read = []
    real = pq.ParquetFile.read
    monkeypatch.setattr(pq.ParquetFile, "read", lambda self, **kw: read.append(kw) or real(self, **kw))
    assert input_path_problems(cfg) == []
    # the footer, the data_source column and the answers of each file, never the other columns
    assert read == [{"columns": ["data_source", "reward_model.ground_truth"]}] * (1 + len(vals))
    monkeypatch.undo()
    # amc-23.parquet's data_source is 'amc_23': rpg.reward routes amc*, verl's default_compute_score does not
    cfg = _applied(files, f"data.val_files=[{','.join(vals)}]", "rpg.reward_function=null")
    (line,) = input_path_problems(cfg)
    names(one_line(line), f"data.val_files[2]={vals[2]}", "'amc_23'", "rpg.reward_function=null", _verl_allowed(),
          "rpg.reward_function=rpg.reward:compute_score", "reward.custom_reward_function")


def _verl_allowed() -> str:
    from rpg.reward.scored_sources import verl_allowed

    return verl_allowed()


def test_a_raw_problem_answer_train_file_is_refused_naming_the_columns(files):
    """Item 7: the raw file instead of the prepared one (was KeyError: 'prompt' at the first training batch)."""
    raw = raw_file(files / "raw.parquet")
    (line,) = input_path_problems(_applied(files, f"data.train_files={raw}"))
    names(one_line(line), f"data.train_files={raw}", "'prompt' (data.prompt_key)", "'reward_model'", "'ground_truth'",
          "'data_source'", "['answer', 'problem']", "python -m rpg.data prepare", "docs/data-and-reports.md")


def test_the_prompt_key_is_the_one_verl_reads(files):
    with pytest.raises(InputPathError, match=r"no column 'question' \(data.prompt_key\)"):
        check_input_paths(_applied(files, "data.prompt_key=question"))


def test_a_data_source_no_reward_function_scores_is_refused(files):
    """Item 6: was `ValueError: Received an empty list as keys.` at the first validation."""
    verl_file(files / "mine.parquet", "my_eval_set")
    val = files / "mine.parquet"
    problems = input_path_problems(_applied(files, f"data.val_files=['{files / 'val.parquet'}','{val}']"))
    (line,) = problems
    names(one_line(line), f"data.val_files[1]={val}", "'my_eval_set'", "rpg.reward.compute_score",
          "math_dapo, math, math_dapo_reasoning, aime*, amc*, minerva*, olympiad*", _verl_allowed(),
          "reward.custom_reward_function.path", ".name")
    # a user's own reward function is trusted with any data_source
    own = files / "my_reward.py"
    own.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    cfg = _applied(files, f"data.val_files=['{val}']", f"reward.custom_reward_function.path={own}",
                   "reward.custom_reward_function.name=score")
    assert input_path_problems(cfg) == []


def test_rows_without_a_data_source_are_counted(files):
    path = files / "nulls.parquet"
    pq.write_table(pa.table({"data_source": ["aime2025", None], "prompt": [[{"role": "user", "content": "x"}]] * 2,
                             "reward_model": [{"ground_truth": "1"}] * 2}), path)
    (line,) = input_path_problems(_applied(files, f"data.val_files=['{path}']"))
    names(one_line(line), f"data.val_files={path}", "1 of 2 rows", "data_source")


FIX = "python -m rpg.data prepare"  # the command a refusal of a data file names

NULL_ANSWERS = [None if i % 3 == 0 else str(i) for i in range(30)]  # 10 of 30 rows, as the red team's file


@pytest.mark.parametrize("key", ["data.val_files", "data.train_files"])
@pytest.mark.parametrize("answers, what", [
    (NULL_ANSWERS, "null, empty or blank in 10 of 30 rows (row indices 0, 3, 6, 9, 12, ...)"),
    (list(range(30)), "int64 (not text) in 30 of 30 rows (row indices 0, 1, 2, 3, 4, ...)"),
    (["7", "", " \t", "8"], "null, empty or blank in 2 of 4 rows (row indices 1, 2)"),
], ids=["null", "integer", "blank"])
def test_rows_without_a_text_answer_are_refused_naming_the_rows(files, key, answers, what):
    """Null answers passed (10 of 30 problems dropped from validation, the run exited 0), integer
    answers passed and the run died after Ray (``Received an empty list as keys``)."""
    path = answers_file(files / "answers.parquet", answers, "math_dapo")
    (line,) = input_path_problems(_applied(files, f"{key}=['{path}']"))
    names(one_line(line), f"{key}={path}", "reward_model.ground_truth", what, FIX, "reward.custom_reward_function")


def test_answers_are_checked_in_json_and_map_layouts_and_left_to_a_users_own_function(files):
    jsonl = files / "v.jsonl"
    jsonl.write_text("".join('{"data_source": "aime2025", "prompt": [{"role": "user", "content": "x"}], '
                             f'"reward_model": {{"ground_truth": {a}}}}}\n' for a in ("null", '"3"', "null")))
    (line,) = input_path_problems(_applied(files, f"data.val_files=['{jsonl}']"))
    names(one_line(line), f"data.val_files={jsonl}", "reward_model.ground_truth", "2 of 3 rows", "(row indices 0, 2)",
          FIX)
    mapped = files / "map.parquet"
    pq.write_table(pa.table({"data_source": ["aime2025"] * 2, "prompt": [[{"role": "user", "content": "x"}]] * 2,
                             "reward_model": pa.array([[("ground_truth", "1")], [("style", "rule")]],
                                                      pa.map_(pa.string(), pa.string()))}), mapped)
    problems = input_path_problems(_applied(files, f"data.val_files=['{mapped}']"))
    (line,) = problems
    names(one_line(line), f"data.val_files={mapped}", "reward_model.ground_truth", "1 of 2 rows", "(row indices 1)")
    # verl's default_compute_score compares strings too; a user's own function is given what the row holds
    ints = answers_file(files / "ints.parquet", [1, 2], "aime2025")
    assert "int64 (not text)" in input_path_problems(
        _applied(files, f"data.val_files=['{ints}']", "rpg.reward_function=null"))[0]
    own = files / "my_reward.py"
    own.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    assert input_path_problems(_applied(files, f"data.val_files=['{ints}']", f"reward.custom_reward_function.path={own}",
                                        "reward.custom_reward_function.name=score")) == []


@pytest.mark.parametrize("override", ["data.val_files=[]", "data.train_files=[]"])
def test_an_empty_file_list_is_refused(files, override):
    """Item 8: was `ValueError: Unable to concatenate an empty list of datasets.` after Ray started."""
    (line,) = input_path_problems(_applied(files, override))
    assert one_line(line).startswith(f"{override}: ")
    names(line, "no file", "at least one")


def test_a_corrupt_or_foreign_file_names_itself(files):
    bad = corrupt_file(files / "bad.parquet")
    csv = files / "val.csv"
    csv.write_text("a,b\n")
    problems = input_path_problems(_applied(files, f"data.val_files=['{bad}','{csv}']"))
    assert problems[0].startswith(f"data.val_files[0]={bad}: not a readable parquet file (") and "\n" not in problems[0]
    names(one_line(problems[1]), f"data.val_files[1]={csv}", ".parquet, .json and .jsonl", "'.csv'")


def test_a_jsonl_data_file_is_checked_too(files):
    good, bad = files / "v.jsonl", files / "raw.jsonl"
    good.write_text('{"data_source": "aime2025", "prompt": [{"role": "user", "content": "x"}], '
                    '"reward_model": {"ground_truth": "1"}}\n')
    bad.write_text('{"problem": "x", "answer": "1"}\n')
    assert input_path_problems(_applied(files, f"data.val_files=['{good}']")) == []
    assert input_path_problems(_applied(files, f"data.val_files=['{bad}']"))[0].startswith(
        f"data.val_files={bad}: not in verl's layout: no column 'prompt'")


# ----------------------------------------------------------------------------- the driver, the launcher, the demo


def test_the_driver_refuses_before_ray(files, monkeypatch):
    import rpg.verl.main

    monkeypatch.setattr(rpg.verl.main, "check_verl_config", lambda *a, **k: None)  # verl's batch sizes: not here
    cfg = _cfg(files, "trainer.device=cpu", f"data.train_files={raw_file(files / 'raw.parquet')}")
    with pytest.raises(InputPathError, match=r"not in verl's layout"):
        rpg.verl.main.prepare_config(cfg, check_node=False)


def _env(**kw) -> dict[str, str]:
    from launching import env as launch_env

    return launch_env(**kw)


def test_dry_run_refuses_on_each_problem(files, capsys):
    """Both problems are the launch's refusal, one line each, exit 2 (tests/launch/test_launch_paths.py: the same lines
    as the launch's)."""
    from launching import launch as main

    raw = raw_file(files / "raw.parquet")
    assert main(["run_grpo_7b"], _env(DRY_RUN="1", TRAIN_FILE=str(raw), VAL_FILES=" , ")) == 2
    refused = [line for line in capsys.readouterr().err.splitlines() if "data." in line]
    assert len(refused) == 2
    assert all(line.startswith("rpg config error: ") for line in refused)
    names(refused[0], f"data.train_files={raw}", "'prompt'", FIX)
    names(refused[1], "data.val_files=[]", "no file")


def test_dry_run_refuses_null_and_integer_answers_in_one_line_each(files, capsys):
    """As a user ran it: DRY_RUN=1 passed both files; now exit 2 and one line per file naming
    the file, the column, the first rows and the count (the driver's own check: rpg.data.checks.data_problems)."""
    from launching import launch as main

    nulls = answers_file(files / "nulls.parquet", NULL_ANSWERS)
    ints = answers_file(files / "ints.parquet", list(range(1, 31)), "math_dapo")
    for env, key, path, what in [
        ({"VAL_FILES": str(nulls)}, "data.val_files", nulls, "null, empty or blank in 10 of 30 rows (row indices 0, "
                                                           "3, 6, 9, 12, ...)"),
        ({"TRAIN_FILE": str(ints)}, "data.train_files", ints, "int64 (not text) in 30 of 30 rows (row indices 0, 1, "
                                                            "2, 3, 4, ...)")]:
        base = {"TRAIN_FILE": str(files / "train.parquet"), "VAL_FILES": str(files / "val.parquet")}
        assert main(["run_grpo_7b"], _env(DRY_RUN="1", **{**base, **env})) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("rpg config error:")]
        (line,) = err
        names(line, f"{key}={path}", "reward_model.ground_truth", what, FIX)


def test_a_real_launch_is_refused_before_anything_starts(files, capsys, monkeypatch):
    from launching import launch as main

    started = []
    monkeypatch.setattr(os, "execvpe", lambda *a: started.append(a))
    rc = main(["run_grpo_7b"], _env(TRAIN_FILE=str(files / "train.parquet"), VAL_FILES=" , "))
    err = capsys.readouterr().err.splitlines()
    assert (rc, started) == (2, [])
    (line,) = err
    assert line.startswith("rpg config error: data.val_files=[]: ")
    # a data_source without a reward function, the same
    verl_file(files / "mine.parquet", "my_eval_set")
    rc = main(["run_grpo_7b"], _env(TRAIN_FILE=str(files / "train.parquet"), VAL_FILES=str(files / "mine.parquet")))
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and len(err) == 1 and "data_source 'my_eval_set' has no reward function" in err[0] and not started


def test_the_tiny_demo_is_refused_before_building_anything(files, capsys, monkeypatch):
    import rpg.tiny
    from rpg_lab.demo import cpu as run

    monkeypatch.setattr(rpg.tiny, "build_tiny_assets", lambda *a, **k: pytest.fail("assets built"))
    rc = run.main(["--out", str(files / "out"), f"data.val_files=['{raw_file(files / 'raw.parquet')}']"])
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(
        f"[tiny] data.val_files={files / 'raw.parquet'}: not in verl's layout") and not (files / "out").exists()


# ----------------------------------------------------------------------------- item 5: the user's reward name


def test_a_reward_name_without_a_path_is_refused_not_replaced(files):
    from rpg.verl.block_to_verl import validate_and_apply

    cfg = _cfg(files, "trainer.device=cpu", "reward.custom_reward_function.name=my_score")
    with pytest.raises(RPGConfigError) as err:
        validate_and_apply(cfg)
    names(one_line(str(err.value)), "reward.custom_reward_function.name=my_score", "reward.custom_reward_function.path",
          "rpg.reward:compute_score")  # what would score instead: the recipe's reward
    # the same with the recipe's reward off (verl would score with default_compute_score)
    with pytest.raises(RPGConfigError, match=r"name=my_score without .*default_compute_score"):
        validate_and_apply(_cfg(files, "trainer.device=cpu", "reward.custom_reward_function.name=my_score",
                                "rpg.reward_function=null"))


def test_a_reward_name_with_its_path_is_honoured(files):
    own = files / "my_reward.py"
    own.write_text("def my_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    cfg = _applied(files, f"reward.custom_reward_function.path={own}", "reward.custom_reward_function.name=my_score")
    assert (cfg.reward.custom_reward_function.path, cfg.reward.custom_reward_function.name) == (str(own), "my_score")
    # the recipe's own function name, spelled out, is the recipe's reward
    cfg = _applied(files, "reward.custom_reward_function.name=compute_score")
    assert Path(cfg.reward.custom_reward_function.path).as_posix().endswith("rpg/reward/__init__.py")


def test_a_reward_name_its_file_does_not_define_is_refused(files):
    """verl loads the function in a worker, after Ray: the driver reads the file (never runs it) first."""
    from omegaconf import OmegaConf

    own = files / "my_reward.py"
    own.write_text("import math\n\ndef score(data_source, solution_str, ground_truth, extra_info=None):\n"
                   "    return 0.0\n\nif True:\n    def other(*a):\n        return 1.0\n")
    cfg = _applied(files, f"reward.custom_reward_function.path={own}", "reward.custom_reward_function.name=score")

    def problems(path, name):
        OmegaConf.update(cfg, "reward.custom_reward_function", {"path": str(path), "name": name}, merge=True)
        return input_path_problems(cfg, use_critic=False)

    assert problems(own, "score") == [] and problems(own, "other") == []
    (line,) = problems(own, "my_score")
    names(one_line(line), "reward.custom_reward_function.name=my_score", str(own), "reward.custom_reward_function.path",
          "math, other, score")  # the names it defines, sorted, as the choices
    assert problems("pkg://rpg.reward", "compute_score") == []
    assert problems("pkg://rpg.reward", "my_score")[0].startswith("reward.custom_reward_function.name=my_score: ")
    own.write_text("from math import *\n")  # a star import could define any name: not refused
    assert problems(own, "my_score") == []


def test_the_launcher_refuses_a_reward_name_without_a_path(capsys):
    from launching import launch as main

    assert main(["run_grpo_7b", "reward.custom_reward_function.name=my_score"], _env(DRY_RUN="1")) == 2
    line = one_line(capsys.readouterr().err.strip())
    assert line.startswith("rpg config error: ")
    names(line, "reward.custom_reward_function.name=my_score", "reward.custom_reward_function.path",
          "rpg.reward:compute_score")


@pytest.mark.bench
def test_bench_data_checks_one_step(capsys):
    path = ROOT / "benchmarks" / "bench_data_checks.py"
    spec = importlib.util.spec_from_file_location("bench_data_checks", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--repeats", "1", "--train-rows", "50"]) == 0
    out = capsys.readouterr().out
    assert "train.parquet" in out and "problems:" not in out
