"""What a study runs and reuses, without Ray: a declared study (the lag study, the SmolLM2 comparison) runs the design
its plan declares, or refuses in one line naming the option and the declared value, or runs as exploratory and says
so in every output (the design line, each runs.csv row, results.md: no verdict); runs.csv records each run's steps,
samples, threads and code, and a file written before those columns reads as the plan's design; a finished run made
by other code or threads is named at the start and not reused unless ``--rerun-other-code`` runs it again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from messages import names, one_line
from test_lag_study import LagFakeTrainer
from test_lag_study import _rows as lag_rows
from test_smol_study import _rows as smol_rows
from test_study import SMALL, FakeTrainer

from rpg_lab.study import grid as G
from rpg_lab.study import lag as L
from rpg_lab.study import records as D
from rpg_lab.study import runner as R
from rpg_lab.study import smol as S
from rpg_lab.study.__main__ import main
from rpg_lab.study.plan_and_results import DECLARED, RAN_ON_COLUMNS
from rpg_lab.study.identity import other_code

ROOT = Path(__file__).resolve().parents[3]
ALL_CELLS = ",".join(c.name for c in G.LAG_CELLS)


# ---- the declared design, or --exploratory ----

@pytest.mark.parametrize("flags, error", [
    (["--lag", "--steps", "5"], "--steps 5: the lag study declares 24 (docs/study/lag/PLAN.md); run the declared "
                                "design, or add --exploratory"),
    (["--lag", "--seeds", "3"], "--seeds 3: the lag study declares 12 (docs/study/lag/PLAN.md)"),
    (["--lag", "--val-n", "4"], "--val-n 4: the lag study declares 8 (docs/study/lag/PLAN.md)"),
    (["--lag", "--test-freq", "8"], "--test-freq 8: the lag study declares 4"),
    (["--lag", "--prompts", "8"], "--prompts 8: the lag study declares 16"),
    (["--lag", "--cells", "lag0-noclip-token,lag1-noclip-none"],
     f"--cells lag0-noclip-token,lag1-noclip-none: the lag study declares {ALL_CELLS} (docs/study/lag/PLAN.md)"),
    (["--lag", "--updates", "2"], "--updates sets another grid; the lag study's cells fix its methods and 8 updates"),
    (["--lag", "--methods", "run_grpo_7b"], "--methods sets another grid; the lag study's cells"),
    (["--exploratory"], "--exploratory: only a declared study (--lag, --model smol) has a design to depart from"),
])
def test_a_declared_study_refuses_an_undeclared_design_in_one_line(tmp_path, capsys, flags, error):
    for mode in (["--dry-run"], ["--render-only"], []):
        assert main([*mode, "--out", str(tmp_path / "s"), *flags]) == 2, (mode, flags)
        err = capsys.readouterr().err
        assert err.startswith(f"rpg_lab.study: {error}") and err.count("\n") == 1, err
    assert not (tmp_path / "s").exists()


def test_the_declared_values_named_in_another_order_are_the_declared_design():
    specs = G.lag_grid(12, G.Sizes(steps=24, test_freq=4, prompts=16, n=4, val_n=8), tuple(reversed(G.LAG_CELLS)))
    assert L.DESIGN.label(L.chosen(specs), exploratory=False) == DECLARED
    assert S.PILOT.DESIGN.label(S.PILOT.chosen(S.PILOT.grid(methods=tuple(reversed(S.PILOT.methods)))), False) == DECLARED
    assert L.DESIGN.label(L.chosen(specs), exploratory=True) == "exploratory: the declared values"


HOW = ("--seeds 1 (declared 12); --cells lag0-noclip-token,lag1-noclip-none (declared " + ALL_CELLS + "); --steps 4 "
       "(declared 24); --test-freq 2 (declared 4)")


def test_an_exploratory_study_says_so_in_its_plan_line_csv_rows_and_results(monkeypatch, tiny_assets, tmp_path, capsys):
    from rpg import trainer_process as harness

    monkeypatch.setattr(harness, "run_trainer", LagFakeTrainer())
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    report = tmp_path / "report"
    args = ["--lag", "--exploratory", "--seeds", "1", "--cells", "lag0-noclip-token,lag1-noclip-none", "--steps", "4",
            "--test-freq", "2", "--out", str(tmp_path / "out"), "--report-dir", str(report)]
    assert main(args) == 0
    assert capsys.readouterr().out.startswith(f"design: EXPLORATORY, not a test of docs/study/lag/PLAN.md: {HOW}; "
                                              "runs.csv and results.md say so and give no verdict\n")
    rows = L.read_csv(report / "runs.csv")
    assert [(r["design"], r["steps"], r["test_freq"], r["val_problems"], r["val_n"], r["threads"]) for r in rows] == \
        [(f"exploratory: {HOW}", 4, 2, 30, 8, "1")] * 2
    assert all(r["code"] for r in rows)
    text = (report / "results.md").read_text()
    assert text.startswith("# Lag study: EXPLORATORY results (generated from runs.csv")
    banner = next(ln for ln in text.splitlines() if "**EXPLORATORY" in ln)  # the plan departed from, and how
    names(banner, "docs/study/lag/PLAN.md", HOW)
    h1 = next(ln for ln in text.splitlines() if ln.startswith("| H1 |"))
    assert h1.endswith("| none (exploratory) |") and "supported" not in text
    # a declared study's report is not replaced by an exploratory one, nor the reverse: refused before any run
    L.write_csv(tmp_path / "declared" / "runs.csv", lag_rows({}))
    for flags, report_dir in ((args[:-2], tmp_path / "declared"), (["--lag", "--out", str(tmp_path / "out")], report)):
        assert main([*flags, "--report-dir", str(report_dir)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"rpg_lab.study: {report_dir / 'runs.csv'} holds the runs of another design (") and \
            err.count("\n") == 1, err
    assert not (tmp_path / "out" / "runs" / G.lag_grid()[0].run_id).exists()


def test_rows_called_declared_must_be_the_plans_design():
    rows = lag_rows({})
    assert L.render_tables(rows).startswith("# Lag study: results (")
    with pytest.raises(ValueError, match=r"run lag0-noclip-token-seed1 has steps 5, not the declared 24 \(docs/study/"
                                         r"lag/PLAN.md\), yet its design is declared"):
        L.render_tables([dict(rows[0], steps=5), *rows[1:]])
    with pytest.raises(ValueError, match=r"18 rows called declared, not the 72 runs the plan declares \(12 seeds x 6 "
                                         r"cells"):
        L.render_tables(lag_rows({}, seeds=3))
    with pytest.raises(ValueError, match="rows of 2 designs"):
        L.render_tables([dict(rows[0], design="exploratory: --steps 5 (declared 24)"), *rows[1:]])
    smol = [dict(r, design="exploratory: --steps 8 (declared 3)", steps=8) for r in smol_rows({})]
    text = S.PILOT.render_tables(smol)
    assert text.startswith("# SmolLM2 comparison: EXPLORATORY results")
    names(next(ln for ln in text.splitlines() if "**EXPLORATORY" in ln), "docs/study/smol/PLAN.md",
          "--steps 8 (declared 3)")


@pytest.mark.parametrize("module, folder", [(L, "lag"), (S.PILOT, "smol")])
def test_a_csv_without_the_new_columns_reads_as_the_plans_design(module, folder, tmp_path):
    """runs.csv written before it had the design, sizes, threads, ran-on (and SmolLM2's settings digest and code)
    columns (the committed studies') reads as it is: every row the plan's design, threads and what it ran on not
    recorded; nothing is rewritten."""
    committed = ROOT / "docs" / "study" / folder / "runs.csv"
    declared = dict(module.DESIGN.columns)
    if committed.is_file():
        rows = module.read_csv(committed)
        assert module.DESIGN.check_rows(rows, str(committed)) == DECLARED
        assert all({c: r[c] for c in declared} == declared for r in rows)
    rows = (lag_rows if module is L else smol_rows)({})
    path = module.write_csv(tmp_path / "runs.csv", rows)
    lines = [ln.split(",") for ln in path.read_text().splitlines()]
    # the SmolLM2 comparisons' settings digest, full commit and uncommitted changes
    settings = {} if module is L else {"settings": None, **dict.fromkeys(S.CODE_COLUMNS)}
    added = ("threads", "design", *declared, *RAN_ON_COLUMNS, *settings)
    keep = [i for i, c in enumerate(lines[0]) if c not in added]
    path.write_text("".join(",".join(ln[i] for i in keep) + "\n" for ln in lines))  # the file as written before
    back = module.read_csv(path)
    assert back == [{**{k: None if v == "" else v for k, v in r.items()}, "threads": None,
                     **dict.fromkeys(RAN_ON_COLUMNS), **settings} for r in rows]
    assert {r["design"] for r in back} == {DECLARED}


# ---- a finished run of other code or threads ----

NOW = {"code": "1111111", "commit": "1" * 40, "changes": None}


def _code_now(monkeypatch, state: dict) -> None:
    """What the study sees as the checkout's code (the records' and the runner's ``code_state``)."""
    for module in (D, R):
        monkeypatch.setattr(module, "code_state", lambda outputs=(): dict(state))


def test_a_finished_run_of_other_code_or_threads_is_named_at_the_start_and_not_reused(monkeypatch, tiny_assets,
                                                                                     tmp_path, capsys):
    from rpg import trainer_process as harness

    monkeypatch.setattr(harness, "run_trainer", fake := FakeTrainer())
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    _code_now(monkeypatch, NOW)
    specs = G.grid(seeds=1, updates=4, stress=(), sizes=SMALL, methods=G.METHODS[:2])
    args = ["--out", str(tmp_path), "--seeds", "1", "--stress", "", "--steps", "4", "--test-freq", "2", "--methods",
            ",".join(G.METHODS[:2]), "--dry-run"]
    R.run_grid(specs, tmp_path, G.BUILTIN_COSTS)
    rec = D.read_record(tmp_path, specs[0])
    assert {k: rec[k] for k in ("code", "commit", "changes", "threads")} == {**NOW, "threads": "1"}
    fake.calls.clear()
    R.run_grid(specs, tmp_path, G.BUILTIN_COSTS)  # the same code and threads: reused
    assert fake.calls == []
    other = {"code": "2222222+dirty", "commit": "2" * 40, "changes": "ab" * 32}
    for now, threads, why in ((other, "1", "code 1111111, this checkout 2222222+dirty"),
                              ({**NOW, "changes": "cd" * 32}, "1",
                               "code 1111111, this checkout 1111111 (other uncommitted changes)"),
                              (NOW, "2", "threads 1, now 2")):
        _code_now(monkeypatch, now)
        monkeypatch.setenv("OMP_NUM_THREADS", threads)
        line = (f"2 finished run(s) in --out {tmp_path} were made by other code or threads, not reused: "
                f"{specs[0].run_id}: {why}; ...; --rerun-other-code runs them again (their folders moved to "
                f"{tmp_path / 'stale'}, kept), or start from the code and threads that made them")
        with pytest.raises(R.OtherRunsError) as err:
            R.run_grid(specs, tmp_path, G.BUILTIN_COSTS)
        assert str(err.value) == line and fake.calls == [] and not (tmp_path / "stale").exists()
        assert main(args) == 2  # the dry run stops as the start does, after the grid with each run's state
        out, err = capsys.readouterr()
        assert err == f"rpg_lab.study: {line}\n" and f"other    {specs[0].run_id}" in out
    R.run_grid(specs, tmp_path, G.BUILTIN_COSTS, rerun_other=True)  # threads 2 now: both runs again, old ones kept
    out = capsys.readouterr().out
    assert fake.calls == [s.run_id for s in specs]
    names(next(ln for ln in out.splitlines() if "--rerun-other-code" in ln), "2 finished run(s)")  # counted, the flag
    assert f"moved {D.run_dir(tmp_path, specs[0])} (finished, threads 1, now 2) to " in out
    assert json.loads((tmp_path / "stale" / f"{specs[0].run_id}.1" / D.RUN_RECORD).read_text())["threads"] == "1"
    assert D.read_record(tmp_path, specs[0])["threads"] == "2"
    # a record from before threads were recorded is not reused either
    rec = D.read_record(tmp_path, specs[1])
    G.save_json(D.run_dir(tmp_path, specs[1]) / D.RUN_RECORD, {k: v for k, v in rec.items() if k != "threads"})
    assert main(args) == 2 and f"{specs[1].run_id}: threads not recorded, now 2;" in capsys.readouterr().err


def test_other_code_compares_commits_and_uncommitted_changes():
    assert other_code(dict(NOW), NOW) is None
    assert other_code({**NOW, "changes": "ab"}, {**NOW, "changes": "ab"}) is None  # the same uncommitted changes
    assert other_code({**NOW, "changes": "ab"}, {**NOW, "changes": "cd"}) is not None
    assert other_code({**NOW, "commit": "2" * 40}, NOW) == f"commit {'2' * 40}, this checkout {'1' * 40}"
    assert other_code({**NOW, "code": "2222222", "commit": "2" * 40}, NOW) == "code 2222222, this checkout 1111111"
    # records with the abbreviated `git describe` alone (before the full commit was recorded)
    assert other_code({"code": "1111111"}, NOW) is None and other_code({"code": "v1-3-g1111111"}, NOW) is None
    for code in ("1111111+dirty", "2222222", "unknown", None):
        assert other_code({"code": code}, NOW) is not None, code
    assert other_code({"code": "1111111"}, {**NOW, "changes": "ab"}) is not None  # this checkout has changes
    assert other_code({"code": "unknown"}, {"code": "unknown", "commit": None, "changes": None}) is not None




def test_a_study_refuses_to_render_runs_of_two_model_builds(tmp_path):
    """A finished run records the weights' sha256 it ran on (runs.csv's ``model_sha256``); results of two builds
    are refused in one line naming the file and both builds, as runs of two codes would mix two computations."""
    rows = lag_rows({})
    assert "model weights: 0123456789ab" in L.render_tables(rows)
    rows[5]["model_sha256"] = "ba9876543210"
    with pytest.raises(ValueError) as e:
        L.render_tables(rows, "runs.csv")
    assert "\n" not in str(e.value) and "runs.csv" in str(e.value)
    assert "0123456789ab" in str(e.value) and "ba9876543210" in str(e.value)
    smol = smol_rows({})
    smol[0]["model_sha256"] = None  # a run that did not record it beside runs that did: not one known build
    with pytest.raises(ValueError, match="not recorded"):
        S.PILOT.render_tables(smol, "runs.csv")
    assert "model weights: not recorded" in S.PILOT.render_tables([dict(r, model_sha256=None) for r in smol])


def test_a_run_records_what_it_ran_on(monkeypatch, tiny_assets, tmp_path):
    """The runner's run.json holds ``ran_on`` (the weights' sha256 of the model the run trains, the libraries, the
    kernel path), which runs.csv's columns show."""
    from rpg import trainer_process as harness
    from rpg.run_record import weights_digest
    from rpg_lab.study.plan_and_results import ran_on_columns

    monkeypatch.setattr(harness, "run_trainer", FakeTrainer())
    specs = G.grid(seeds=1, updates=4, stress=(), sizes=SMALL, methods=G.METHODS[:1])
    R.run_grid(specs, tmp_path, G.BUILTIN_COSTS)
    rec = D.read_record(tmp_path, specs[0])
    digest = weights_digest(tiny_assets.model_dir)
    assert rec["ran_on"]["weights_sha256"] == digest and rec["ran_on"]["libraries"]["torch"]
    row = ran_on_columns(rec)
    assert row["model_sha256"] == digest[:12] and row["torch"] and row["kernels"]
