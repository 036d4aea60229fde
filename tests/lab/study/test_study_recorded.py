"""A declared study's runs.csv outlives its ``--out`` (``rpg_lab.study.records``): a finished run whose folder is gone
(the study moved to another machine) is kept as its row, not run again, when its settings, code and threads are this
start's or its code is named by ``--keep-recorded-code``; otherwise the start refuses in one line and touches
nothing. Through ``python -m rpg_lab.study`` with a stand-in trainer (no Ray, no model)."""

from __future__ import annotations

import shutil
import signal

import pytest
from messages import one_line
from test_smol_study import SmolFakeTrainer

from rpg.stop_signals import StopSignal
from rpg_lab.study import attempts as A
from rpg_lab.study import records as D
from rpg_lab.study import runner as R
from rpg_lab.study.__main__ import main
from rpg_lab.study.smol_paper import PAPER

STUDY = ["--model", "smol", "--paper", "--exploratory", "--seeds", "1", "--methods", "run_grpo_7b,run_dapo_7b"]
FIRST = {"code": "1111111", "commit": "1" * 40, "changes": None}
SECOND = {"code": "2222222", "commit": "2" * 40, "changes": None}


@pytest.fixture
def study(monkeypatch, tmp_path):
    """(fake trainer, argv, out, report): the study's first machine ran both runs with code FIRST."""
    from rpg import trainer_process as harness

    monkeypatch.setattr(harness, "run_trainer", trainer := SmolFakeTrainer())
    monkeypatch.setattr("rpg_lab.study.__main__.build_smol", lambda: None)
    out, report = tmp_path / "s", tmp_path / "report"
    argv = [*STUDY, "--out", str(out), "--report-dir", str(report)]
    _code_now(monkeypatch, FIRST)
    assert main(argv) == 0 and len(trainer.calls) == 2
    trainer.calls.clear()
    return trainer, argv, out, report


def _code_now(monkeypatch, state: dict) -> None:
    for module in (D, R):
        monkeypatch.setattr(module, "code_state", lambda outputs=(): dict(state))


def _machine_lost(out) -> None:
    shutil.rmtree(out)


def _rewrite(report, rows: list[dict]) -> None:
    """runs.csv as ``rows`` (the file first removed: writing it never drops a finished run of its own)."""
    (report / "runs.csv").unlink()
    PAPER.write_csv(report / "runs.csv", rows)


def test_a_finished_run_whose_folder_is_gone_is_kept_as_its_row(study, capsys):
    fake, argv, out, report = study
    before = (report / "runs.csv").read_bytes()
    _machine_lost(out)
    capsys.readouterr()
    assert main([*argv, "--dry-run"]) == 0
    assert "2 finished (2 of them recorded in runs.csv only" in capsys.readouterr().out
    assert main(argv) == 0
    assert fake.calls == [] and (report / "runs.csv").read_bytes() == before  # carried over as they were
    assert "2 of 2 runs finished" in (report / "results.md").read_text()
    assert [r["runs_done"] for r in A.read(report / A.ATTEMPTS)[-2:]] == ["2", "2"]


def test_rows_of_other_code_are_kept_only_when_named(study, monkeypatch, capsys):
    fake, argv, out, report = study
    before = (report / "runs.csv").read_bytes()
    _machine_lost(out)
    _code_now(monkeypatch, SECOND)
    capsys.readouterr()
    for mode in (["--dry-run"], []):
        assert main([*argv, *mode]) == 2
        err = one_line(capsys.readouterr().err)
        assert err.startswith("rpg_lab.study: 2 finished run(s) recorded in runs.csv only (their folders not in --out")
        assert "code 1111111, this checkout 2222222" in err and "--keep-recorded-code CODE keeps" in err
    assert fake.calls == [] and (report / "runs.csv").read_bytes() == before
    assert main([*argv, "--keep-recorded-code", "9999999"]) == 2
    assert one_line(capsys.readouterr().err).endswith("--keep-recorded-code 9999999: no finished run of "
                                                      f"{report / 'runs.csv'} was made by it (its codes: 1111111)")
    assert main([*argv, "--keep-recorded-code", "1111111"]) == 0
    assert fake.calls == [] and (report / "runs.csv").read_bytes() == before


def test_the_runs_left_run_with_this_code_beside_the_kept_rows(study, monkeypatch):
    """The second run's row is not finished (its run was under way when the machine went): it runs with the new code,
    the first run's row stays as it was, of the code that made it."""
    fake, argv, out, report = study
    rows = PAPER.read_csv(report / "runs.csv")
    _rewrite(report, [rows[0], {**rows[1], "status": "todo", "primary": None}])
    _machine_lost(out)
    _code_now(monkeypatch, SECOND)
    assert main([*argv, "--keep-recorded-code", "1111111"]) == 0
    assert [kv["data.seed"] for kv in fake.calls] == ["1"] and len(fake.calls) == 1
    now = PAPER.read_csv(report / "runs.csv")
    assert now[0] == rows[0] and (now[1]["status"], now[1]["code"]) == ("done", "2222222")
    assert now[1]["primary"] == rows[1]["primary"]  # the stand-in's accuracy is a function of seed and lr


def test_a_stop_keeps_the_recorded_rows(study, monkeypatch):
    from rpg import trainer_process as harness

    fake, argv, out, report = study
    rows = PAPER.read_csv(report / "runs.csv")
    _rewrite(report, [rows[0], {**rows[1], "status": "todo", "primary": None}])
    _machine_lost(out)

    def stopped(*args, **kwargs):
        raise StopSignal(signal.SIGTERM)

    monkeypatch.setattr(harness, "run_trainer", stopped)
    with pytest.raises(StopSignal):
        main(argv)
    now = PAPER.read_csv(report / "runs.csv")
    assert now[0] == rows[0] and now[1]["status"] == "todo"
    assert [(r["how"], r["runs_done"]) for r in A.read(report / A.ATTEMPTS)[-1:]] == [("stopped by SIGTERM", "1")]


def test_a_row_of_other_settings_stops_the_start_even_when_told_to_rerun(study, capsys):
    fake, argv, out, report = study
    rows = PAPER.read_csv(report / "runs.csv")
    _rewrite(report, [{**rows[0], "settings": "0" * 12}, rows[1]])
    before = (report / "runs.csv").read_bytes()
    _machine_lost(out)
    capsys.readouterr()
    for extra in ([], ["--rerun-other-code"]):
        assert main([*argv, *extra]) == 2
        err = one_line(capsys.readouterr().err)
        assert f"{rows[0]['run_id']}: recorded with settings 000000000000, now {rows[0]['settings']}" in err
        assert "their rows would be replaced" in err
    assert fake.calls == [] and (report / "runs.csv").read_bytes() == before


def test_rows_of_other_code_run_again_when_told(study, monkeypatch, capsys):
    fake, argv, out, report = study
    _machine_lost(out)
    _code_now(monkeypatch, SECOND)
    capsys.readouterr()
    assert main([*argv, "--rerun-other-code"]) == 0
    assert "2 finished run(s) recorded in runs.csv only, of other code or threads, will be redone" in (
        capsys.readouterr().out)
    assert len(fake.calls) == 2 and {r["code"] for r in PAPER.read_csv(report / "runs.csv")} == {"2222222"}


def test_a_folder_wins_over_its_row(study, monkeypatch):
    """With its folder in --out a run is the folder's (the row is what the folder wrote): no row is read for it."""
    fake, argv, out, report = study
    rows = PAPER.read_csv(report / "runs.csv")
    _rewrite(report, [{**rows[0], "settings": "0" * 12}, rows[1]])  # a row the folder disowns
    assert main(argv) == 0 and fake.calls == []
    assert PAPER.read_csv(report / "runs.csv") == rows


def test_a_failed_run_whose_folder_is_gone_stays_failed_until_retried(study):
    fake, argv, out, report = study
    rows = PAPER.read_csv(report / "runs.csv")
    _rewrite(report, [rows[0], {**rows[1], "status": "failed", "primary": None}])
    before = (report / "runs.csv").read_bytes()
    _machine_lost(out)
    assert main(argv) == 1 and fake.calls == []  # not run again: the row carried as it was
    assert (report / "runs.csv").read_bytes() == before
    assert main([*argv, "--retry-failed"]) == 0 and len(fake.calls) == 1
    assert [r["status"] for r in PAPER.read_csv(report / "runs.csv")] == ["done", "done"]


@pytest.mark.parametrize("edit, why", [
    ({"changes": "ab" * 32}, "code 1111111, this checkout 1111111 (other uncommitted changes)"),
    ({"commit": None, "changes": None}, "code 1111111 without its commit and uncommitted changes recorded: kept only "
                                        "when named"),
])
def test_a_row_is_compared_by_its_commit_and_uncommitted_changes(study, capsys, edit, why):
    """A run made with uncommitted changes (``git describe`` does not see untracked files, so its code reads clean) is
    not this checkout's; a row that does not record its commit and changes (written before those columns) is kept only
    when its code is named."""
    fake, argv, out, report = study
    rows = PAPER.read_csv(report / "runs.csv")
    assert (rows[0]["commit"], rows[0]["changes"]) == (FIRST["commit"], None)
    _rewrite(report, [{**r, **edit} for r in rows])
    _machine_lost(out)
    capsys.readouterr()
    assert main(argv) == 2 and fake.calls == []
    assert f"{rows[0]['run_id']}: {why}; ...; --keep-recorded-code CODE keeps" in one_line(capsys.readouterr().err)
    assert main([*argv, "--keep-recorded-code", "1111111"]) == 0 and fake.calls == []


def test_other_threads_are_not_kept_by_naming_the_code(study, capsys):
    fake, argv, out, report = study
    rows = PAPER.read_csv(report / "runs.csv")
    _rewrite(report, [{**r, "threads": "7"} for r in rows])
    _machine_lost(out)
    capsys.readouterr()
    for extra in ([], ["--keep-recorded-code", "1111111"]):
        assert main([*argv, *extra]) == 2
        err = one_line(capsys.readouterr().err)
        assert f"{rows[0]['run_id']}: threads 7, now {rows[0]['threads']}" in err and "OMP_NUM_THREADS" in err
    assert fake.calls == []


def test_render_only_keeps_nothing(study, capsys):
    fake, argv, out, report = study
    capsys.readouterr()
    assert main([*argv, "--render-only", "--keep-recorded-code", "1111111"]) == 2
    assert one_line(capsys.readouterr().err) == ("rpg_lab.study: --keep-recorded-code 1111111: --render-only runs "
                                                 "nothing and keeps nothing: drop one")


def test_a_row_without_a_settings_digest_is_never_kept():
    """The lag study's runs.csv records no settings digest: its rows cannot show they are this start's settings."""
    row = {"run_id": "r", "status": "done", "settings": None, "code": "1111111", "commit": "1" * 40, "changes": None,
           "threads": "1"}
    assert D._recorded_state(row, "abc", FIRST, "1", ("1111111",)) == (
        "recorded-stale", "runs.csv does not record its settings digest, now abc")
    assert D._recorded_state({**row, "settings": "abc"}, "abc", FIRST, "1", ()) == ("recorded", None)
