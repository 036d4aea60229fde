"""Reports: reading verl file-logger JSONL, W&B CSV and TensorBoard logs; paper tables vs published numbers."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import pytest
from messages import names, one_line

from rpg.reports.benchmarks import benchmark_of, benchmark_series
from rpg.reports.cli import main_tables
from rpg.reports.logs import read_run
from rpg.reports.published import load_published, methods_of
from rpg.reports.tables import build_table, last_and_best, render_latex, render_markdown

EVAL_STEPS = list(range(0, 401, 10))


def synthetic(aime24_source="math_dapo", last=400):
    """{step: {key: value}} with known Last/Best: AIME24 0.5/0.62, AIME25 0.3/0.3, AMC23 0.9/0.95."""
    logs: dict[int, dict[str, float]] = {}
    for s in range(1, last + 1):
        logs[s] = {"critic/score/mean": -1 + s / 400, "actor/entropy": 1 - s / 800, "response_length/mean": 500.0 + s}
    for s in [x for x in EVAL_STEPS if x <= last]:
        logs.setdefault(s, {}).update({
            f"val-core/{aime24_source}/acc/mean@32": 0.62 if s == 350 else 0.3 + s / 2000,
            "val-core/aime2025/acc/mean@32": 0.2 + s / 4000,
            "val-core/amc_23/acc/mean@32": 0.95 if s == 200 else 0.9,
            "val-aux/aime2025/acc/std@32": 0.01,
        })
    return logs


def write_file_logger(path: Path, logs, monkeypatch) -> Path:
    """Through verl's own FileLogger (verl/utils/tracking.py)."""
    from verl.utils.tracking import FileLogger

    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    fl = FileLogger("proj", "exp")
    for step in sorted(logs):
        fl.log(logs[step], step)
    fl.finish()
    return path


def write_tensorboard(path: Path, logs, monkeypatch) -> Path:
    """Through verl's own TensorBoard adapter (torch SummaryWriter.add_scalar)."""
    from verl.utils.tracking import _TensorboardAdapter

    monkeypatch.setenv("TENSORBOARD_DIR", str(path))
    tb = _TensorboardAdapter("proj", "exp")
    for step in sorted(logs):
        tb.log(logs[step], step)
    tb.finish()
    return path


def write_wandb_csv(path: Path, logs, panel_prefix: str | None = None) -> Path:
    """W&B export: history layout (_step) or panel layout ('Step', '<run> - key', __MIN/__MAX)."""
    keys = sorted({k for d in logs.values() for k in d})
    if panel_prefix:
        header = ["Step"] + [c for k in keys for c in (f"{panel_prefix} - {k}", f"{panel_prefix} - {k}__MIN", f"{panel_prefix} - {k}__MAX")]
    else:
        header = ["_step", "_runtime"] + keys
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for step in sorted(logs):
            d = logs[step]
            if panel_prefix:
                w.writerow([step] + [c for k in keys for c in ([d[k]] * 3 if k in d else ["", "", ""])])
            else:
                w.writerow([step, 12.5] + [d.get(k, "") for k in keys])
    return path


def _unmark(cell: str) -> str:
    """A value cell without its best (**x**) / second-best (_x_) mark."""
    if cell.startswith("**") and cell.endswith("**"):
        return cell[2:-2]
    if cell.startswith("_") and cell.endswith("_"):
        return cell[1:-1]
    return cell


def _md_rows(text: str, marks: bool = False) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| Method"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:] if marks else [_unmark(c) for c in cells[1:]]
    return rows


@pytest.fixture
def three_runs(tmp_path, monkeypatch):
    jsonl = write_file_logger(tmp_path / "ufkl.jsonl", synthetic("math_dapo"), monkeypatch)
    wandb = write_wandb_csv(tmp_path / "dapo.csv", synthetic("aime2024"), panel_prefix="dapo-run-7")
    tb = write_tensorboard(tmp_path / "tb" / "urkl", synthetic("aime_2024"), monkeypatch)
    return jsonl, wandb, tb


def test_readers_agree_across_formats(tmp_path, three_runs):
    jsonl, wandb, tb = three_runs
    hist = write_wandb_csv(tmp_path / "hist.csv", synthetic("math_dapo"))
    ref = read_run(jsonl)
    ref_val = benchmark_series(ref)
    assert set(ref_val) == {"AIME24", "AIME25", "AMC23"}
    for other in (read_run(hist), read_run(tb)):
        assert len(other) == len(ref)
        for key in ("critic/score/mean", "actor/entropy", "response_length/mean", "val-aux/aime2025/acc/std@32"):
            assert other[key] == pytest.approx(ref[key], rel=1e-6), key  # TensorBoard stores float32
        for bench, (_, series) in benchmark_series(other).items():
            assert series == pytest.approx(ref_val[bench][1], rel=1e-6), bench
    panel = read_run(wandb)
    assert "val-core/aime2024/acc/mean@32" in panel and not any(k.endswith(("__MIN", "__MAX")) for k in panel)
    assert panel["actor/entropy"][400] == 0.5 and len(panel["critic/score/mean"]) == 400


def test_table3_markdown_numbers(three_runs):
    jsonl, wandb, tb = three_runs
    runs = [("RPG-UFKL", read_run(jsonl)), ("dapo", read_run(wandb)), ("mine", read_run(tb)), ("a|b", read_run(tb))]
    td = build_table(runs, "3")
    md = render_markdown(td)
    assert "| a\\|b | **0.5000** |" in md  # all four rows tie: all are marked best
    rows = _md_rows(md.replace("| a\\|b |", "| ab |"))
    # column order: per benchmark (AIME24, AIME25, AMC23) x (Last, Best) x (ours, paper, delta)
    assert rows["RPG-UFKL"] == [
        "0.5000", "0.5938", "-0.0938", "0.6200", "0.6177", "+0.0023",
        "0.3000", "0.4698", "-0.1698", "0.3000", "0.4865", "-0.1865",
        "0.9000", "0.9492", "-0.0492", "0.9500", "0.9517 ⚠", "-0.0017",
    ]
    assert rows["dapo"][:6] == ["0.5000", "0.5438", "-0.0438", "0.6200", "0.5740", "+0.0460"]
    assert rows["mine"][:3] == ["0.5000", "—", "—"]
    assert any("'mine' is not a method of Table 3" in w for w in td.warnings)
    assert any("RPG-UFKL AMC23 Best = 0.9517 [off_grid]" in n for n in td.notes)


def test_typo_flag_shown_for_rpg_urkl_aime25_last(three_runs):
    runs = [("RPG-URKL", read_run(three_runs[0]))]
    md = render_markdown(build_table(runs, "3"))
    assert _md_rows(md)["RPG-URKL"][6:9] == ["0.3000", "0.5261 ⚠", "-0.2261"]
    assert "RPG-URKL AIME25 Last = 0.5261 [typo_suspected]" in md
    tex = render_latex(build_table(runs, "3"))
    assert r"0.3000 & 0.5261$^\dagger$ & -0.2261" in tex and "typo\\_suspected" in tex


def test_latex_layout(three_runs):
    td = build_table([("RPG_REINFORCE & co", read_run(three_runs[0])), ("RPG-REINFORCE-URKL", read_run(three_runs[0]))], "6")
    tex = render_latex(td)
    assert tex.startswith("\\begin{table}") and tex.rstrip().endswith("\\end{table}")
    assert r"\multicolumn{3}{c}{AIME24 Last}" in tex and r"\multicolumn{3}{c}{AIME25 Best}" in tex
    assert "AMC23" not in tex  # Table 6 is AIME only
    assert r"RPG\_REINFORCE \& co & \textbf{0.5000} & -- & --" in tex
    (row,) = [x for x in tex.splitlines() if x.startswith("RPG-REINFORCE-URKL & ")]
    assert row.split(" & ")[1:10] == [r"\textbf{0.5000}", "0.3188", "+0.1812", r"\textbf{0.6200}", "0.3417", "+0.2783",
                                      r"\textbf{0.3000}", "0.2792", "+0.0208"]  # each metric: ours, the paper's, delta
    assert tex.count(r"\\") == 4  # two header lines + two rows
    assert r"\resizebox{\linewidth}{!}{%" in tex and r"\end{tabular}}" in tex  # fits the page width


def test_table8_column_order_and_table7_benchmarks(tmp_path, monkeypatch):
    logs = synthetic("aime2024")
    for s in EVAL_STEPS:
        # Table 7 is one sample per problem (values on k/272, k/674): the recipe logs acc/mean@1 there
        logs[s]["val-core/minerva_math/acc/mean@1"] = 0.125
        logs[s]["val-core/olympiadbench/acc/mean@1"] = 0.5
        logs[s]["val-core/minerva_math/acc/mean@32"] = 0.75  # a mean@32 series must not be read for Table 7
    run = [("GRPO", read_run(write_file_logger(tmp_path / "g.jsonl", logs, monkeypatch)))]
    row8 = _md_rows(render_markdown(build_table(run, "8")))["GRPO"]
    assert row8[:3] == ["0.9000", "0.6266", "+0.2734"]  # AMC23 first in Table 8
    td7 = build_table(run, "7")
    md7 = render_markdown(td7)
    assert "| Method | Minerva Last |" in md7 and td7.metric == "acc/mean@1" and "acc/mean@1" in md7
    assert _md_rows(md7)["GRPO"] == ["0.1250", "0.1029", "+0.0221", "0.1250", "0.1177", "+0.0073",
                                     "0.5000", "0.4926", "+0.0074", "0.5000", "0.5594", "-0.0594"]
    assert _md_rows(render_markdown(build_table(run, "7", "acc/mean@32")))["GRPO"][0] == "0.7500"  # --metric wins
    assert build_table(run, "5").metric == "acc/mean@32"


def test_last_missing_warns_and_best_stops_at_last_step(tmp_path, monkeypatch):
    logs = synthetic("aime2024", last=390)
    run = [("DAPO", read_run(write_file_logger(tmp_path / "d.jsonl", logs, monkeypatch)))]
    td = build_table(run, "5")
    assert _md_rows(render_markdown(td))["DAPO"][:3] == ["—", "0.4063", "—"]
    assert any("no value at step 400; last evaluated step is 390" in w for w in td.warnings)
    final = build_table(run, "5", last_step=None)
    assert _md_rows(render_markdown(final))["DAPO"][0] == "0.4950"
    series = {0: 0.1, 200: 0.3, 400: 0.2, 410: 0.9}
    assert last_and_best(series, 400) == (0.2, 0.3)
    assert last_and_best(series, None) == (0.9, 0.9)
    assert last_and_best({}, 400) == (None, None)


def test_benchmark_mapping_and_collisions():
    assert [benchmark_of(s) for s in ["math_dapo", "aime2024", "AIME-24", "aime25", "aime2025", "amc_23", "amc2023",
                                      "minerva_math", "olympiadbench", "gsm8k"]] == [
        "AIME24", "AIME24", "AIME24", "AIME25", "AIME25", "AMC23", "AMC23", "Minerva", "OlympiadBench", None]
    metrics = {"val-core/math_dapo/acc/mean@32": {0: 0.1}, "val-core/aime2024/acc/mean@32": {0: 0.2}}
    with pytest.raises(ValueError, match="both map to AIME24"):
        benchmark_series(metrics)
    got = benchmark_series(metrics, source_map={"math_dapo": "ignore"})
    assert got == {"AIME24": ("aime2024", {0: 0.2})}
    with pytest.raises(ValueError, match="benchmark must be one of"):
        benchmark_series(metrics, source_map={"math_dapo": "AIME2024"})


def test_log_reader_errors(tmp_path):
    p = tmp_path / "run.jsonl"
    p.write_text('{"step": 0, "data": {"a": 1}}\n{"step": 10, "data": {"a": 2')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_run(p) == {"a": {0: 1.0}}
    assert "truncated last line" in str(caught[0].message)
    p.write_text('{"step": 0, "data": {"a": 1}}\nnot json\n{"step": 10, "data": {"a": 2}}\n')
    with pytest.raises(ValueError, match="run.jsonl:2: not a JSON line"):
        read_run(p)
    c = tmp_path / "two.csv"
    c.write_text("Step,r1 - a,r2 - a\n0,1,2\n")
    with pytest.raises(ValueError, match="several runs"):
        read_run(c)
    (tmp_path / "nostep.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="no step column"):
        read_run(tmp_path / "nostep.csv")
    with pytest.raises(ValueError, match="unknown log format"):
        read_run(_touch(tmp_path / "x.txt"))
    with pytest.raises(FileNotFoundError):
        read_run(tmp_path / "missing.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no TensorBoard event files"):
        read_run(tmp_path / "empty")


def _touch(p: Path) -> Path:
    p.write_text("x")
    return p


def test_cli_tables(three_runs, tmp_path, capsys):
    jsonl, wandb, _ = three_runs
    out = tmp_path / "t3.tex"
    rc = main_tables([f"RPG-UFKL={jsonl}", f"DAPO={wandb}", "--table", "3", "--format", "latex", "--out", str(out)])
    assert rc == 0 and r"RPG-UFKL & \textbf{0.5000} & 0.5938 & -0.0938" in out.read_text()
    rc = main_tables([str(jsonl), "--table", "5", "--last-step", "final"])
    cap = capsys.readouterr()
    assert rc == 0 and "| ufkl | 0.5000 | — | — |" in cap.out and "not a method of Table 5" in cap.err
    assert main_tables([str(tmp_path / "nope.jsonl"), "--table", "3"]) == 2
    assert main_tables([str(jsonl), "--table", "3", "--last-step", "end"]) == 2


# ---- the published-numbers data file ----

def test_published_file_spot_values_and_flags():
    pub = load_published()
    assert len(pub) == 212  # 6x6 + 8x6 + 6x4 + 8x4 + 12x6
    assert pub[("3", "RPG-REINFORCE-URKL", "AIME25", "best")].value == 0.5208
    assert pub[("5", "RPG-REINFORCE-URKL", "AIME24", "last")].mark == "bold"
    assert pub[("6", "RPG-REINFORCE-UFKL", "AIME24", "best")].value == 0.3625
    assert pub[("7", "REINFORCE++", "OlympiadBench", "best")].value == 0.6202
    assert pub[("8", "RPG-REINFORCE-FKL", "AIME24", "best")].value == 0.1667
    typo = pub[("3", "RPG-URKL", "AIME25", "last")]
    assert (typo.value, typo.flag) == (0.5261, "typo_suspected") and "typo" in typo.note
    flagged = {k for k, v in pub.items() if v.flag}
    assert flagged == {("3", "RPG-URKL", "AIME25", "last"), ("5", "REINFORCE++", "AIME25", "last"),
                       ("3", "RPG-UFKL", "AMC23", "best")}
    assert methods_of("8", pub)[:3] == ["GRPO", "REINFORCE++", "REINFORCE++-Baseline"]
    assert all(0 < v.value < 1 for v in pub.values())


# ---- paper-standard formatting: best / second best, seeds, custom layouts, the metric check ----

def _runs_with_last(values: dict[str, list[float]]) -> list[tuple[str, dict]]:
    """One run per value: AIME24 Last = Best = value at steps 0 and 400 (other benchmarks absent)."""
    return [(label, {"val-core/aime2024/acc/mean@32": {0: 0.0, 400: v}}) for label, vs in values.items() for v in vs]


def test_best_bold_second_underlined_and_ties():
    td = build_table(_runs_with_last({"A": [0.5], "B": [0.7], "C": [0.6], "D": [0.7], "E": [0.1]}), "6")
    rows = _md_rows(render_markdown(td), marks=True)
    # AIME24 Last: B and D tie for best (bold), C is second (italic in Markdown), A and E unmarked
    assert [rows[k][0] for k in "ABCDE"] == ["0.5000", "**0.7000**", "_0.6000_", "**0.7000**", "0.1000"]
    tex = render_latex(td)
    assert r"C & \underline{0.6000}" in tex and r"B & \textbf{0.7000}" in tex and "E & 0.1000 &" in tex
    assert "best of each column in bold, second best underlined" in tex
    assert "second best in italics" in render_markdown(td)
    two = _md_rows(render_markdown(build_table(_runs_with_last({"A": [0.5], "B": [0.7]}), "6")), marks=True)
    assert (two["A"][0], two["B"][0]) == ("0.5000", "**0.7000**")  # two rows: a best, no second
    one = _md_rows(render_markdown(build_table(_runs_with_last({"A": [0.5]}), "6")), marks=True)
    assert one["A"][0] == "0.5000"  # a single row is not ranked


def test_seeds_sharing_a_label_give_mean_and_sample_std():
    td = build_table(_runs_with_last({"GRPO": [0.2, 0.4, 0.6], "DAPO": [0.5]}), "6")
    grpo = dict(td.rows)["GRPO"][("AIME24", "last")]
    assert (grpo.ours, grpo.n) == (pytest.approx(0.4), 3) and grpo.std == pytest.approx(0.2)  # ddof 1
    assert grpo.delta == pytest.approx(0.4 - grpo.paper.value)
    md = render_markdown(td)
    assert "mean ± std over seeds" in md
    rows = _md_rows(md, marks=True)
    assert rows["GRPO"][0] == "0.4000 ± 0.2000" and rows["DAPO"][0] == "**0.5000**"
    assert r"0.4000 $\pm$ 0.2000" in render_latex(td)
    # a seed without the step: the mean is over the runs that have it, with a warning (its Best ends at step 390:
    # allowed, that cell is marked)
    partial = _runs_with_last({"GRPO": [0.2, 0.4]}) + [("GRPO", {"val-core/aime2024/acc/mean@32": {0: 0.0, 390: 0.9}})]
    td = build_table(partial, "6", allow_unequal_steps=True)
    assert dict(td.rows)["GRPO"][("AIME24", "last")].n == 2
    assert any("GRPO #3" in w and "no value at step 400" in w for w in td.warnings)
    assert any("'GRPO' AIME24 Last: mean over 2 of 3 runs" in w for w in td.warnings)


def test_custom_layout_reads_exact_sources_without_paper_columns():
    from rpg.reports.published import TableLayout

    layout = TableLayout("tiny", "tiny task", ("val acc",), sources={"val acc": "math_dapo"})
    runs = [("X", {"val-core/math_dapo/acc/mean@4": {0: 0.3, 5: 0.6, 10: 0.5}}), ("Y", {"other": {1: 0.0}})]
    td = build_table(runs, layout, metric="acc/mean@4", last_step=None)
    assert not td.has_paper and not any("not a method" in w for w in td.warnings)
    assert any("'Y': no val-core/math_dapo/acc/mean@4 for val acc" in w for w in td.warnings)
    md = render_markdown(td)
    assert "| Method | val acc Last | val acc Best |" in md and "paper" not in md.split("\n")[2]
    assert _md_rows(md)["X"] == ["0.5000", "0.6000"] and _md_rows(md)["Y"] == ["—", "—"]
    tex = render_latex(td)
    assert "Method & val acc Last & val acc Best" in tex and r"\cmidrule" not in tex


def test_authors_mean_at_1_layout_is_named_in_the_error(tmp_path, capsys):
    from rpg.reports.logs import check_metric

    authors = {"val-core/aime2024/acc/mean@1": {0: 0.3}, "critic/score/mean": {1: 0.0}}
    with pytest.raises(ValueError, match=r"run 'a' has no val-core/<data_source>/acc/mean@32; .*use --metric acc/mean@1"):
        check_metric([("a", authors)], "acc/mean@32")
    with pytest.raises(ValueError, match=r"use --metric acc/mean@16 \(validation metrics logged: acc/mean@4, acc/mean@16\)"):
        check_metric([("b", {"val-core/x/acc/mean@4": {0: 1.0}, "val-core/x/acc/mean@16": {0: 1.0}})], "acc/mean@32")
    check_metric([("c", {"critic/score/mean": {1: 0.0}})], "acc/mean@32")  # no validation at all: fine
    check_metric([("a", authors)], "acc/mean@1")
    log = tmp_path / "authors.jsonl"
    log.write_text('{"step": 0, "data": {"val-core/aime2024/acc/mean@1": 0.3}}\n')
    assert main_tables([str(log), "--table", "3"]) == 2
    assert "use --metric acc/mean@1" in capsys.readouterr().err
    assert main_tables([str(log), "--table", "3", "--metric", "acc/mean@1"]) == 0


def _stopped_seed() -> list[tuple[str, dict]]:
    """Two seeds of RPG: one of 400 steps (AIME24 0.6 at step 400), one stopped at step 120 (0.32 there)."""
    full = {s: 0.2 + s / 1000 for s in range(0, 401, 10)}
    stopped = {s: 0.2 + s / 1000 for s in range(0, 121, 10)}
    return [("RPG", {"val-core/aime2024/acc/mean@32": full}), ("RPG", {"val-core/aime2024/acc/mean@32": stopped})]


def test_seeds_that_end_at_different_steps_are_refused_unless_allowed_and_then_marked(tmp_path, capsys):
    """--last-step final averaged step 400 of one seed with step 120 of the other (Last = 0.4600 ± 0.1980), and
    Best over 400 steps with Best over 120, without a word: one line naming the runs and their last steps;
    --allow-unequal-steps reports them, each such cell marked ‡ with a note; a step both runs evaluated is fine."""
    runs = _stopped_seed()
    with pytest.raises(ValueError) as err:
        build_table(runs, "6", last_step=None)
    names(one_line(str(err.value)), "'RPG' (AIME24 Last, AIME24 Best)", "RPG #1 at step 400", "RPG #2 at step 120",
          "--allow-unequal-steps")
    with pytest.raises(ValueError, match=r"'RPG' \(AIME24 Best\): RPG #1 at step 400, RPG #2 at step 120;"):
        build_table(runs, "6")  # Last at step 400: only run #1 has it (warned); Best still over unequal spans
    td = build_table(runs, "6", last_step=None, allow_unequal_steps=True)
    last = dict(td.rows)["RPG"][("AIME24", "last")]
    assert (last.ours, last.n) == (pytest.approx(0.46), 2) and last.steps == "RPG #1 at step 400, RPG #2 at step 120"
    md = render_markdown(td)
    assert _md_rows(md)["RPG"][0] == "0.4600 ± 0.1980 ‡"
    note = "mean over runs that end at different steps: 'RPG' (AIME24 Last, AIME24 Best): RPG #1 at step 400, RPG #2 at step 120"
    assert f"‡ {note}" in md.splitlines() and note in td.warnings
    assert r"0.4600 $\pm$ 0.1980$^\ddagger$" in render_latex(td)
    same = build_table(runs, "6", last_step=120)
    assert not same.step_notes and dict(same.rows)["RPG"][("AIME24", "last")].steps is None
    # the command line: exit 2, one error line; the option prints the table and the warning
    logs = []
    for k, (_, metrics) in enumerate(runs):
        path = tmp_path / f"seed{k}.jsonl"
        path.write_text("".join(f'{{"step": {s}, "data": {{"val-core/aime2024/acc/mean@32": {v}}}}}\n'
                                for s, v in metrics["val-core/aime2024/acc/mean@32"].items()))
        logs.append(f"RPG={path}")
    assert main_tables([*logs, "--table", "6", "--last-step", "final"]) == 2
    err_lines = capsys.readouterr().err.splitlines()
    assert len(err_lines) == 1 and err_lines[0].startswith("error: runs of one label end at different steps")
    assert main_tables([*logs, "--table", "6", "--last-step", "final", "--allow-unequal-steps"]) == 0
    cap = capsys.readouterr()
    assert "0.4600 ± 0.1980 ‡" in cap.out and f"warning: {note}" in cap.err.splitlines()
