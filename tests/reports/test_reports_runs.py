"""Which logs are runs: a log given twice (one path, or one file read through two arguments) is refused,
identical logs under one label are refused (they are not seeds), and a TensorBoard log folder in
TensorBoard's layout (``LOGDIR/RUN/events.*``) is read as the runs it holds, named."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
from messages import names, one_line
from test_reports_inputs import AIME24, AIME25, AMC, _write
from test_reports_tables import _md_rows

from rpg.reports.cli import main_plot, main_tables
from rpg.reports.logs import read_run

TABLE = ["--table", "5", "--last-step", "20"]


def _log(path: Path, value: float) -> Path:
    return _write(path, [{"step": s, "data": {AIME24: value, AIME25: value / 2, AMC: value + 0.25}}
                         for s in (0, 10, 20)])


def _err(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_the_same_log_twice_is_refused(tmp_path, capsys, monkeypatch):
    """Before: RPG-URKL=good.jsonl RPG-URKL=./good.jsonl counted as two seeds (every cell x ± 0.0000)."""
    monkeypatch.chdir(tmp_path)
    good = _log(tmp_path / "good.jsonl", 0.5)
    assert main_tables(["RPG-URKL=good.jsonl", "RPG-URKL=./good.jsonl", *TABLE]) == 2
    assert _err(capsys) == [f"error: RPG-URKL=./good.jsonl reads {good}, as RPG-URKL=good.jsonl does: "
                            "give each log once"]
    assert main_plot(["good.jsonl", f"other={good}", "--out", "f"]) == 2  # two labels: still one run
    assert _err(capsys) == [f"error: other={good} reads {good}, as good.jsonl does: give each log once"]
    # one file read through two arguments: a resumed run's segment is joined into its base log
    _write(tmp_path / "good.part2.jsonl", [{"step": 20, "data": {AIME24: 0.6}}])
    assert main_tables(["good.jsonl", "good.part2.jsonl", *TABLE]) == 2
    err = _err(capsys)[-1]
    assert err.startswith("error: good.part2.jsonl ")
    names(err, str(tmp_path / "good.part2.jsonl"), "as good.jsonl", "resume segments", "once")


def test_identical_logs_under_one_label_are_refused_and_warned_under_two(tmp_path, capsys):
    a = _log(tmp_path / "seed1.jsonl", 0.5)
    b = Path(shutil.copy(a, tmp_path / "seed2.jsonl"))
    assert main_tables([f"RPG-URKL={a}", f"RPG-URKL={b}", *TABLE]) == 2
    (err,) = _err(capsys)
    assert err.startswith(f"error: RPG-URKL={b} ")
    names(err, f"RPG-URKL={a}", "same metrics", "once")
    assert main_tables([f"RPG-URKL={a}", f"GRPO={b}", *TABLE]) == 0
    assert f"warning: GRPO={b} holds the same metrics as RPG-URKL={a} (every value at every step): " \
           "one run under two labels?" in _err(capsys)
    c = _log(tmp_path / "seed3.jsonl", 0.25)  # real seeds differ: no word
    assert main_tables([f"RPG-URKL={a}", f"RPG-URKL={c}", *TABLE]) == 0
    assert not [e for e in _err(capsys) if "same metrics" in e]


def _tensorboard_run(folder: Path, value: float) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(folder)) as w:
        for s in (0, 10, 20):
            for key, v in ((AIME24, value), (AIME25, value / 2), (AMC, value + 0.25)):
                w.add_scalar(key, v, s)
    return folder


def test_a_tensorboard_log_folder_of_runs_reads_each_run(tmp_path, capsys):
    """Before: "directory holds no TensorBoard event files" for LOGDIR/RUN/events.* (TensorBoard's layout)."""
    logdir = tmp_path / "tensorboard_log"
    _tensorboard_run(logdir / "seed1", 0.5)
    _tensorboard_run(logdir / "seed2", 0.25)
    _tensorboard_run(logdir / "more" / "seed3", 0.75)
    with pytest.raises(ValueError) as err:
        read_run(logdir)
    assert one_line(str(err.value)).startswith(f"{logdir}: ")
    names(str(err.value), "3 runs", "more/seed3, seed1, seed2", str(logdir / "more/seed3"), "python -m rpg.reports")
    assert main_tables([str(logdir), *TABLE]) == 0  # as TensorBoard does: each folder a run, named by its path
    out, err = capsys.readouterr()
    assert set(_md_rows(out)) == {"more/seed3", "seed1", "seed2"}
    (warn,) = [x for x in err.splitlines() if x.startswith(f"warning: {logdir}: ")]
    names(warn, "3 runs", "more/seed3, seed1, seed2", f"LABEL={logdir}")
    assert main_tables([f"GRPO={logdir}", *TABLE]) == 0  # under a label: seeds of one method
    out, err = capsys.readouterr()
    assert _md_rows(out)["GRPO"][0] == "0.5000 ± 0.2500"
    (warn,) = [x for x in err.splitlines() if x.startswith(f"warning: GRPO={logdir}: ")]
    names(warn, "more/seed3, seed1, seed2", "3 seeds of GRPO")
    # a run and its own folder's event file: the same log twice
    event = next((logdir / "seed1").iterdir())
    assert main_tables([str(logdir), f"x={event}", *TABLE]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"error: x={event} reads {event}, as {logdir} (run seed1) does: give each log once"


def test_runs_in_the_sub_folders_of_a_run_are_named(tmp_path):
    run = _tensorboard_run(tmp_path / "exp", 0.5)
    _tensorboard_run(run / "other", 0.25)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = read_run(run)
    assert metrics[AIME24] == {0: 0.5, 10: 0.5, 20: 0.5}
    (warn,) = [str(w.message) for w in caught if str(w.message).startswith(f"{run}: ")]
    names(one_line(warn), "sub-folders", ": other;")


def test_runs_that_share_a_default_label_are_not_seeds(tmp_path, capsys, monkeypatch):
    """Before: a/metrics.jsonl b/metrics.jsonl printed one row 'metrics | 0.4000 ± 0.2828', "mean ± std over
    seeds", and the curves one line with a std band: two unrelated runs averaged as seeds of one method."""
    monkeypatch.chdir(tmp_path)
    for folder, value in (("a", 0.2), ("b", 0.6), ("c/a", 0.4)):
        (tmp_path / folder).mkdir(parents=True)
        _log(tmp_path / folder / "metrics.jsonl", value)
    assert main_tables(["a/metrics.jsonl", "b/metrics.jsonl", *TABLE]) == 0
    out, err = capsys.readouterr()
    assert {k: v[0] for k, v in _md_rows(out).items()} == {"a": "0.2000", "b": "0.6000"}
    assert "over seeds" not in out
    (warn,) = [x for x in err.splitlines() if "'metrics'" in x]
    assert warn.startswith("warning: ")
    names(warn, "a/metrics.jsonl as 'a'", "b/metrics.jsonl as 'b'", "METHOD=PATH")
    # folders that share a name too: as much of the folder's path as tells them apart
    assert main_tables(["a/metrics.jsonl", "b/metrics.jsonl", "c/a/metrics.jsonl", *TABLE]) == 0
    assert set(_md_rows(capsys.readouterr().out)) == {f"{tmp_path.name}/a", "b", "c/a"}
    # a default label that a given label has: the given one keeps it, the other is told apart
    assert main_tables(["metrics=a/metrics.jsonl", "b/metrics.jsonl", *TABLE]) == 0
    assert {k: v[0] for k, v in _md_rows(capsys.readouterr().out).items()} == {"metrics": "0.2000", "b": "0.6000"}
    # METHOD=PATH groups seeds on purpose, and only then does the caption say "over seeds"
    assert main_tables(["GRPO=a/metrics.jsonl", "GRPO=b/metrics.jsonl", *TABLE]) == 0
    out = capsys.readouterr().out
    assert _md_rows(out)["GRPO"][0] == "0.4000 ± 0.2828" and "mean ± std over seeds" in out
    assert main_plot(["a/metrics.jsonl", "b/metrics.jsonl", "--out", "fig"]) == 0
    svg = (tmp_path / "fig.svg").read_text()
    assert "<!-- a -->" in svg and "<!-- b -->" in svg and "seeds" not in svg


def test_two_logs_of_one_folder_are_told_apart_by_their_arguments(tmp_path):
    from rpg.reports.runs import run_args, tell_apart

    (tmp_path / "run").mkdir()
    with pytest.warns(UserWarning, match="default label 'metrics'"):
        runs = tell_apart(run_args([str(tmp_path / "run" / "metrics.jsonl"), str(tmp_path / "run" / "metrics.csv")]))
    assert [r.label for r in runs] == [str(tmp_path / "run" / "metrics.jsonl"), str(tmp_path / "run" / "metrics.csv")]
