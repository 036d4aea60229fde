"""Report inputs are never rewritten silently: ±inf and NaN are shown as such (tables) or named
(figures), a step logged twice in one file is reported (resume segments are still joined), and a
file that is not UTF-8 is named."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
from messages import names, one_line
from test_reports_tables import _md_rows

from rpg.reports.cli import main_plot, main_tables
from rpg.reports.figures import plot_curves
from rpg.reports.logs import read_run
from rpg.reports.tables import build_table, render_latex, render_markdown

AIME24, AIME25, AMC = ("val-core/aime2024/acc/mean@32", "val-core/aime2025/acc/mean@32", "val-core/amc2023/acc/mean@32")


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))  # json writes NaN / Infinity / -Infinity
    return path


def _read(path: Path) -> tuple[dict, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = read_run(path)
    return metrics, [str(w.message) for w in caught]


def _nonfinite_log(tmp_path: Path) -> Path:
    recs = [{"step": s, "data": {AIME24: 0.25, AIME25: 0.125, AMC: 0.5, "critic/score/mean": 0.1}} for s in range(0, 41, 10)]
    recs[4]["data"].update({AIME24: math.inf, AIME25: math.nan, AMC: -math.inf})  # step 40: Last
    recs[2]["data"][AIME24] = math.nan  # step 20: out of Best, with a warning
    recs[3]["data"]["critic/score/mean"] = None  # verl's FileLogger (orjson) writes NaN and ±inf as null
    return _write(tmp_path / "run.jsonl", recs)


def test_nonfinite_values_are_read_as_logged_with_one_warning(tmp_path):
    log = _nonfinite_log(tmp_path)
    metrics, warns = _read(log)
    assert metrics[AIME24][40] == math.inf and metrics[AMC][40] == -math.inf and math.isnan(metrics[AIME25][40])
    assert math.isnan(metrics[AIME24][20]) and math.isnan(metrics["critic/score/mean"][30])
    (warn,) = warns
    assert one_line(warn).startswith(f"{log}: 5 ")
    names(warn, f"{AIME24} at step 20 (nan)", "critic/score/mean at step 30 (null", f"{AIME24} at step 40 (inf)",
          f"{AIME25} at step 40 (nan)", f"{AMC} at step 40 (-inf)")


def test_tables_show_inf_and_nan(tmp_path, capsys):
    log = _nonfinite_log(tmp_path)
    assert main_tables([f"GRPO={log}", "--table", "5", "--last-step", "40"]) == 0
    cap = capsys.readouterr()
    row = _md_rows(cap.out)["GRPO"]
    assert row[0::3] == ["inf", "inf", "nan", "0.1250", "-inf", "0.5000"]  # AIME24/25, AMC23: Last, Best
    assert row[2] == "inf" and row[8] == "nan"  # Δ = ours - paper
    nan_lines = [x for x in cap.err.splitlines() if x.startswith("warning: run 'GRPO': ") and " nan at step " in x]
    assert len(nan_lines) == 2
    names(nan_lines[0], "aime2024", "step 20", "Best")
    names(nan_lines[1], "aime2025", "step 40", "Best")
    runs = [("a", _read(log)[0]), ("b", _read(log)[0]), ("c", {AIME24: {40: 0.5}, AIME25: {40: 0.5}, AMC: {40: 0.5}})]
    td = build_table(runs, "5", last_step=40)
    md, tex = render_markdown(td), render_latex(td)
    assert _md_rows(md, marks=True)["a"][0] == "**inf**"  # +inf ranks first (a and b tie); nan is never marked
    assert _md_rows(md, marks=True)["a"][6] == "nan"
    assert r"a & \textbf{inf} & -- & -- & \textbf{inf}" in tex and " & nan & " in tex and r"\underline{-inf}" in tex


def test_seeds_with_nonfinite_values(tmp_path):
    log = _nonfinite_log(tmp_path)
    runs = [("GRPO", _read(log)[0]), ("GRPO", {AIME24: {40: 0.5}, AIME25: {40: 0.5}, AMC: {40: 0.5}})]
    row = _md_rows(render_markdown(build_table(runs, "5", last_step=40)))["GRPO"]
    assert row[0] == "inf ± nan" and row[6] == "nan ± nan" and row[12] == "-inf ± nan"


def test_figures_name_the_points_they_leave_out(tmp_path):
    metrics, _ = _read(_nonfinite_log(tmp_path))
    _, warns = plot_curves([("GRPO", metrics)], tmp_path / "fig")
    (aime,) = [w for w in warns if "'(a) AIME24 mean@32'" in w]
    names(one_line(aime), "run 'GRPO'", "step 20 (nan)", "step 40 (inf)")
    (reward,) = [w for w in warns if "'(d) Reward (critic score)'" in w]
    names(one_line(reward), "run 'GRPO'", "step 30 (nan)")
    assert (tmp_path / "fig.png").stat().st_size > 0


def test_a_step_twice_in_one_file_is_reported(tmp_path):
    log = _write(tmp_path / "dup.jsonl", [{"step": 0, "data": {AIME24: 0.1}}, {"step": 10, "data": {AIME24: 0.2}},
                                          {"step": 10, "data": {AIME24: 0.3}}, {"step": 20, "data": {"x": 1}},
                                          {"step": 20, "data": {"y": 2}}])
    metrics, warns = _read(log)
    assert metrics[AIME24] == {0: 0.1, 10: 0.3}  # the later record wins, as before, but not silently
    (warn,) = warns
    assert one_line(warn).startswith(f"{log}: ")
    names(warn, "10 (lines 2, 3)", "20 (lines 4, 5)", "later is kept", f"{AIME24} at step 10: 0.2 (line 2), 0.3 (line 3)")
    csv = tmp_path / "dup.csv"  # a blank line: lines are file lines, not row numbers
    csv.write_text(f"_step,{AIME24}\n0,0.1\n\n10,0.2\n10,0.3\n")
    metrics, warns = _read(csv)
    assert metrics[AIME24] == {0: 0.1, 10: 0.3}
    (warn,) = warns
    assert one_line(warn).startswith(f"{csv}: ")
    names(warn, "10 (lines 4, 5)", f"{AIME24} at step 10: 0.2 (line 4), 0.3 (line 5)")


def test_the_same_value_twice_is_reported_as_such(tmp_path, capsys):
    same = _write(tmp_path / "same.jsonl", [{"step": 0, "data": {AIME24: 0.25}}, {"step": 10, "data": {AIME24: 0.25}},
                                            {"step": 10, "data": {AIME24: 0.25, "x": math.nan}},
                                            {"step": 20, "data": {"x": math.nan}}, {"step": 20, "data": {"x": math.nan}}])
    _, warns = _read(same)
    assert one_line(warns[0]).startswith(f"{same}: ")
    names(warns[0], "10 (lines 2, 3)", "20 (lines 4, 5)", "no value differs")
    log = _write(tmp_path / "nan.jsonl", [{"step": 0, "data": {AIME24: 0.25}}, {"step": 20, "data": {AIME24: math.nan}},
                                          {"step": 20, "data": {AIME24: 0.5}}])
    assert main_tables([f"GRPO={log}", "--table", "5", "--last-step", "20"]) == 0
    (warn,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith(f"warning: {log}: ")]
    names(warn, "20 (lines 2, 3)", f"{AIME24} at step 20: nan (line 2), 0.5 (line 3)")


def test_tensorboard_values_logged_twice_are_reported(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(tmp_path / "tb")) as w:
        for step, value in ((0, 0.5), (10, 0.25), (10, 0.75), (20, 0.5)):
            w.add_scalar(AIME24, value, step)
        w.add_scalar("critic/score/mean", 1.0, 10)
        w.add_scalar("critic/score/mean", 1.0, 10)
    metrics, warns = _read(tmp_path / "tb")
    assert metrics[AIME24] == {0: 0.5, 10: 0.75, 20: 0.5}
    (warn,) = warns
    assert one_line(warn).startswith(f"{tmp_path / 'tb'}: ")
    names(warn, ": 10;", "later is kept", f"{AIME24} at step 10: 0.25, 0.75")
    assert "critic/score/mean" not in warn  # logged twice with one value: not a difference


def test_values_that_cannot_be_read_are_named(tmp_path, capsys):
    log = _write(tmp_path / "text.jsonl", [{"step": 0, "data": {AIME24: 0.1, "note": "hello"}},
                                           {"step": 10, "data": {AIME24: "n/a"}}, {"step": 20, "data": {AIME24: True}},
                                           {"step": 30, "data": {AIME24: [0.5]}}])
    metrics, warns = _read(log)
    assert metrics == {AIME24: {0: 0.1}}  # "note" is never a number: not a metric
    assert warns == [f"{log}: 3 values that are not numbers not read: {AIME24} at step 10 (line 2: 'n/a'), "
                     f"{AIME24} at step 20 (line 3: True), {AIME24} at step 30 (line 4: [0.5])"]
    csv = tmp_path / "nostep.csv"
    csv.write_text(f"_step,{AIME24}\n0,0.1\n,0.9\n10,abc\n20,0.3\n,\n")
    metrics, warns = _read(csv)
    assert metrics == {AIME24: {0: 0.1, 20: 0.3}}
    assert warns == [f"{csv}: rows without a step not read: line 3",
                     f"{csv}: 1 values that are not numbers not read: {AIME24} at step 10 (line 4: 'abc')"]
    assert main_tables([str(csv), "--table", "5"]) == 0
    assert f"warning: {csv}: rows without a step not read: line 3" in capsys.readouterr().err


def test_resume_segments_are_joined_without_a_duplicate_warning(tmp_path):
    base = _write(tmp_path / "exp.jsonl", [{"step": s, "data": {AIME24: 0.1}} for s in range(0, 31, 10)])
    _write(tmp_path / "exp.part2.jsonl", [{"step": s, "data": {AIME24: 0.2}} for s in range(20, 41, 10)])
    metrics, warns = _read(base)
    assert metrics[AIME24] == {0: 0.1, 10: 0.1, 20: 0.2, 30: 0.2, 40: 0.2}
    joined, replaced = warns
    assert joined == f"{base}: joined 2 log segments (restarted at steps 20)"
    assert one_line(replaced).startswith(f"{base}: ")
    names(replaced, "restart at step 20", "re-ran steps 30", f"{AIME24} 0.1 -> 0.2")


def test_several_segments_name_every_replaced_value(tmp_path, capsys):
    """Three starts after the first (one crashed before logging: an empty segment changes nothing)."""
    base = _write(tmp_path / "r.jsonl", [{"step": s, "data": {AIME24: 0.1, "x": 1.0}} for s in range(0, 51, 10)])
    (tmp_path / "r.part2.jsonl").write_text("")
    _write(tmp_path / "r.part3.jsonl", [{"step": 20, "data": {AIME24: 0.2}}, {"step": 30, "data": {"x": 2.0}},
                                        {"step": 40, "data": {"x": 2.0}}])
    _write(tmp_path / "r.part4.jsonl", [{"step": 30, "data": {AIME24: 0.1, "x": 2.5}}, {"step": 40, "data": {"x": 3.0}}])
    assert main_tables([f"GRPO={base}", "--table", "5", "--last-step", "40", "--metric", "acc/mean@32"]) == 0
    err = capsys.readouterr().err.splitlines()
    joined, replaced = [x for x in err if x.startswith(f"warning: {base}: ")]
    names(joined, "joined 4 log segments", "restarted at steps 20, 30", "no readable record in r.part2.jsonl")
    names(replaced, "restart at step 20: re-ran steps 30, 40", "dropped (not re-run yet) steps 50",
          f"{AIME24} 0.1 -> 0.2", "restart at step 30: re-ran steps 40", "x 2.0 -> 2.5")


def test_a_restart_step_with_many_values_names_three_and_counts_the_rest(tmp_path):
    """A resumed validation step logs ~50 keys again: the line names the first three by key and counts
    the others, so it stays readable (the earlier values stay in the earlier segment)."""
    keys = [f"val/k{i:02d}" for i in range(7)]
    base = _write(tmp_path / "v.jsonl", [{"step": 0, "data": {k: 0.1 for k in keys}}, {"step": 5, "data": {"x": 1.0}}])
    _write(tmp_path / "v.part2.jsonl", [{"step": 0, "data": {k: 0.2 for k in keys}}])
    _, warns = _read(base)
    assert one_line(warns[1]).startswith(f"{base}: ")
    names(warns[1], "restart at step 0", "steps 5", "val/k00 0.1 -> 0.2, val/k01 0.1 -> 0.2, val/k02 0.1 -> 0.2",
          "4 more values")
    assert "val/k03" not in warns[1]


@pytest.mark.parametrize("name, body, where", [
    ("run.jsonl", b'{"step": 0, "data": {"a": 1}}\n{"step": 1, "data": {"caf\xe9": 1}}\n', "line 2, byte 26"),
    ("run.csv", b"_step,a\n0,1\n1,\xff\n", "line 3, byte 3"),
])
def test_non_utf8_log_is_named(tmp_path, capsys, name, body, where):
    log = tmp_path / name
    log.write_bytes(body)
    with pytest.raises(ValueError) as err:
        _read(log)[0]
    assert str(err.value).startswith(f"{log}: not UTF-8 text ({where}:")
    assert main_tables([str(log), "--table", "5"]) == 2
    assert main_plot([str(log), "--out", str(tmp_path / "f")]) == 2
    errs = capsys.readouterr().err.splitlines()
    assert len(errs) == 2 and all(e == f"error: {err.value}" for e in errs)


def test_a_run_directory_of_jsonl_segments_points_to_the_file(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    _write(run / "exp.jsonl", [{"step": 0, "data": {AIME24: 0.1}}])
    _write(run / "exp.part2.jsonl", [{"step": 0, "data": {AIME24: 0.2}}])
    assert main_tables([str(run), "--table", "5"]) == 2
    err = capsys.readouterr().err
    assert one_line(err).startswith(f"error: {run}: ")
    names(err, "TensorBoard", "exp.jsonl", ".partN.jsonl")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main_plot([str(empty), "--out", str(tmp_path / "f")]) == 2
    assert capsys.readouterr().err == f"error: {empty}: directory holds no TensorBoard event files\n"


def test_an_out_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    log = _nonfinite_log(tmp_path)
    (tmp_path / "afile").write_text("")
    for out in (tmp_path / "afile" / "t", tmp_path / "afile" / "sub" / "t"):
        assert main_tables([str(log), "--table", "5", "--out", f"{out}.md"]) == 2
        assert main_plot([str(log), "--out", str(out)]) == 2
        errs = [e for e in capsys.readouterr().err.splitlines() if not e.startswith("warning: ")]
        assert errs == [f"error: cannot write --out {out}.md: {tmp_path / 'afile'} is a file, not a directory",
                        f"error: cannot write --out {out}: {tmp_path / 'afile'} is a file, not a directory"]
    from matplotlib.figure import Figure

    def denied(self, fname, **kwargs):  # what savefig raises in a directory the user cannot write
        raise PermissionError(13, "Permission denied", str(fname))

    monkeypatch.setattr(Figure, "savefig", denied)
    assert main_plot([str(log), "--out", str(tmp_path / "ro" / "fig")]) == 2
    errs = [e for e in capsys.readouterr().err.splitlines() if not e.startswith("warning: ")]
    assert errs == [f"error: cannot write --out {tmp_path / 'ro' / 'fig'}: Permission denied ({tmp_path / 'ro' / 'fig.png'})"]


def test_an_absurdly_long_step_or_value_is_one_line_naming_file_and_line(tmp_path):
    """A 400-digit step (float() overflows), a 5,000-digit one (int() refuses it while parsing), a 400-digit
    value (read as inf, reported as a non-finite value, not a traceback)."""
    AIME = "val-core/aime2024/acc/mean@32"
    for digits, what in ((400, "step must be an integer below 2**63 in size, got 11111111111111111111... "
                               "(400 characters)"),
                         (5000, "a number too long to read (Exceeds the limit (4300 digits)")):
        log = tmp_path / f"big{digits}.jsonl"
        log.write_text(json.dumps({"step": 0, "data": {AIME: 0.5}}) + "\n"
                       + '{"step": ' + "1" * digits + ', "data": {"x": 1}}\n'
                       + json.dumps({"step": 2, "data": {AIME: 0.5}}) + "\n")
        with pytest.raises(ValueError) as err:
            read_run(log)
        assert str(err.value).startswith(f"{log}:2: {what}") and "\n" not in str(err.value), str(err.value)
    csv = tmp_path / "big.csv"
    csv.write_text(f"_step,{AIME}\n0,0.1\n{'9' * 400},0.2\n")
    with pytest.raises(ValueError, match=rf"^{csv}:3: step must be an integer below 2\*\*63 in size"):
        read_run(csv)
    log = tmp_path / "value.jsonl"
    log.write_text(json.dumps({"step": 0, "data": {AIME: 0.5}}) + "\n" + '{"step": 1, "data": {"x": ' + "9" * 400 + "}}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metrics = read_run(log)
    assert metrics["x"] == {1: math.inf}


def test_identical_column_headers_are_refused_naming_them(tmp_path, capsys):
    """A W&B panel export of two runs with one display name (verl's resumed run keeps its name): before,
    csv.DictReader kept the last of the identical columns, Best dropped from 0.9 to 0.3 and the only
    word was "the log starts at step 20"."""
    col = f"rpg-urkl - {AIME24}"
    log = tmp_path / "urkl.csv"
    log.write_text(f"Step,{col},{col}__MIN,{col},{col}__MIN\n0,0.1,0.1,,\n10,0.9,0.9,,\n20,,,0.3,0.3\n30,,,0.3,0.3\n")
    with pytest.raises(ValueError) as err:
        read_run(log)
    assert one_line(str(err.value)).startswith(f"{log}: ")
    names(str(err.value), f"{col!r} (columns 2, 4)", f"{col + '__MIN'!r} (columns 3, 5)", "W&B", "each run")
    assert main_tables([f"RPG-URKL={log}", "--table", "5", "--metric", "acc/mean@32"]) == 2
    assert capsys.readouterr().err == f"error: {err.value}\n"
    hist = tmp_path / "hist.csv"  # a history export: the step column twice
    hist.write_text(f"_step,{AIME24},_step\n0,0.1,0\n")
    with pytest.raises(ValueError, match=r"identical column headers: '_step' \(columns 1, 3\)"):
        read_run(hist)


def test_an_empty_resume_segment_is_named(tmp_path):
    """Before: "joined 2 log segments (restarted at steps )" for a segment without a readable record."""
    base = _write(tmp_path / "r.jsonl", [{"step": s, "data": {AIME24: 0.1}} for s in range(0, 31, 10)])
    (tmp_path / "r.part2.jsonl").write_text('{"step": 40, "data": {"x"')  # killed while writing its first line
    metrics, warns = _read(base)
    assert metrics[AIME24] == {0: 0.1, 10: 0.1, 20: 0.1, 30: 0.1}
    (warn,) = [w for w in warns if "joined" in w]
    assert one_line(warn).startswith(f"{base}: joined 2 log segments; ")
    names(warn, "no readable record in r.part2.jsonl")
    (tmp_path / "r.part2.jsonl").write_text("")
    _write(tmp_path / "r.part3.jsonl", [{"step": 20, "data": {AIME24: 0.2}}])
    (tmp_path / "r.part4.jsonl").write_text("\n")
    _, warns = _read(base)
    (warn,) = [w for w in warns if "joined" in w]
    assert one_line(warn).startswith(f"{base}: joined 4 log segments (restarted at steps 20); ")
    names(warn, "no readable record in r.part2.jsonl, r.part4.jsonl")


@pytest.mark.parametrize("step_key", ["_step", "Step", "step", "global_step", "trainer/global_step"])
def test_a_wandb_history_exported_as_jsonl_reads_the_step_keys_the_csv_reader_reads(tmp_path, step_key):
    """Before: a W&B history saved as JSONL with ``_step`` was ``expected an object with a 'step' key``; the CSV
    reader accepted _step, Step, global_step and trainer/global_step, the JSONL reader step only."""
    log = _write(tmp_path / "history.jsonl", [{step_key: s, AIME24: s / 100, "_runtime": 1.5 * s, "_timestamp": 1e9 + s}
                                              for s in (0, 10)])
    metrics, warned = _read(log)
    assert metrics == {AIME24: {0: 0.0, 10: 0.1}} and warned == []
    csv = tmp_path / "history.csv"
    csv.write_text(f"{step_key},{AIME24},_runtime\n0,0.0,0\n10,0.1,15\n")
    assert _read(csv)[0] == metrics  # the same history either way
    # with two step keys, both readers take the first of the same list (W&B's _step before verl's metric)
    log = _write(tmp_path / "both.jsonl", [{"_step": 3, "trainer/global_step": 4, AIME24: 0.5}])
    assert _read(log)[0] == {AIME24: {3: 0.5}, "trainer/global_step": {3: 4.0}}
    _write(log, [{"steps": 3, AIME24: 0.5}])
    with pytest.raises(ValueError, match=r"expected an object with a 'step' key, got .* \(a step key is one of _step, "
                                         r"Step, step, global_step, trainer/global_step\)"):
        read_run(log)


def test_an_unknown_log_format_says_which_exports_are_read(tmp_path):
    """Before: a W&B ``.json`` export was ``unknown log format``, with no word of what to export."""
    export = tmp_path / "wandb_export.json"
    export.write_text("[]")
    with pytest.raises(ValueError) as err:
        read_run(export)
    assert one_line(str(err.value)).startswith(f"{export}: ")
    names(str(err.value), "(.json)", ".jsonl", ".csv", "TensorBoard", "CSV or JSONL")
