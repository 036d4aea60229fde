"""A declared study's attempt log (``rpg_lab.study.attempts``, attempts.csv beside its runs.csv): every start and end of
the study's process, through ``python -m rpg_lab.study`` with a stand-in trainer (no Ray, no model)."""

from __future__ import annotations

import signal

import pytest
from test_smol_study import SmolFakeTrainer

from rpg.stop_signals import StopSignal
from rpg_lab.study import attempts as A
from rpg_lab.study.__main__ import main

STUDY = ["--model", "smol", "--paper", "--exploratory", "--seeds", "1", "--methods", "run_grpo_7b,run_dapo_7b"]


@pytest.fixture
def fake(monkeypatch):
    from rpg import trainer_process as harness

    monkeypatch.setattr(harness, "run_trainer", trainer := SmolFakeTrainer())
    monkeypatch.setattr("rpg_lab.study.__main__.build_smol", lambda: None)
    return trainer


def test_each_start_and_end_is_a_row(fake, tmp_path, capsys):
    report = tmp_path / "report"
    argv = [*STUDY, "--out", str(tmp_path / "s"), "--report-dir", str(report)]
    assert main(argv) == 0
    assert main(argv) == 0  # again: nothing left to run, still an attempt on record
    rows = A.read(report / A.ATTEMPTS)
    assert [(r["event"], r["how"], r["runs_done"], r["runs"]) for r in rows] == [
        ("start", "", "0", "2"), ("end", "finished", "2", "2"), ("start", "", "2", "2"), ("end", "finished", "2", "2")]
    assert rows[0]["command"] == A.shown_command("python -m rpg_lab.study " + " ".join(argv)) and rows[0]["code"]
    assert rows[0]["attempt"] == rows[1]["attempt"] != rows[2]["attempt"]
    s = A.summary(rows)
    assert [a["how"] for a in s] == ["finished", "finished"] and s[0]["gap_s"] is None and s[1]["gap_s"] >= 0


def test_a_stop_signal_and_a_kill_are_on_record(fake, tmp_path, monkeypatch):
    """SIGTERM during the second run: the attempt ends "stopped by SIGTERM" and the first run's row reaches runs.csv
    and results.md (the second runs again next time)."""
    from rpg import trainer_process as harness
    from rpg_lab.study.smol_paper import PAPER

    def second_stopped(*args, **kwargs):
        if fake.calls:
            raise StopSignal(signal.SIGTERM)
        return fake(*args, **kwargs)

    monkeypatch.setattr(harness, "run_trainer", second_stopped)
    report = tmp_path / "report"
    with pytest.raises(StopSignal):
        main([*STUDY, "--out", str(tmp_path / "s"), "--report-dir", str(report)])
    rows = A.read(report / A.ATTEMPTS)
    assert [(r["event"], r["how"], r["runs_done"]) for r in rows] == [("start", "", "0"),
                                                                      ("end", "stopped by SIGTERM", "1")]
    runs = PAPER.read_csv(report / "runs.csv")
    assert [r["status"] for r in runs] == ["done", "todo"] and runs[0]["primary"] is not None
    assert "1 of 2 runs finished" in (report / "results.md").read_text()
    # a process killed outright writes its start and nothing more
    A.Attempt(report, "python -m rpg_lab.study ...", "abc1234", 2).begin(0)
    assert [a["how"] for a in A.summary(A.read(report / A.ATTEMPTS))] == ["stopped by SIGTERM", A.NO_END]


def test_a_refused_start_is_on_record_and_the_log_is_checked(fake, tmp_path, capsys):
    from rpg_lab.study.runner import lock_study

    out, report = tmp_path / "s", tmp_path / "report"
    held = lock_study(out)  # another study holds --out
    try:
        assert main([*STUDY, "--out", str(out), "--report-dir", str(report)]) == 2
    finally:
        held.close()
    rows = A.read(report / A.ATTEMPTS)
    assert rows[-1]["event"] == "end" and rows[-1]["how"].startswith("refused: --out ") and "in use" in rows[-1]["how"]
    (report / A.ATTEMPTS).write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=r"attempts.csv: not an attempt log \(columns a, b; expected time, attempt"):
        A.read(report / A.ATTEMPTS)


def test_the_logged_command_holds_no_absolute_path(tmp_path):
    """The committed log names the folders relative to where the study ran, never a machine's absolute path."""
    import shlex

    cmd = f"python -m rpg_lab.study --model smol --out {tmp_path / 'runs'} --report-dir {shlex.quote(str(tmp_path / 'a b'))} --seeds 2"
    assert A.shown_command(cmd, str(tmp_path / "code")) == \
        "python -m rpg_lab.study --model smol --out ../runs --report-dir '../a b' --seeds 2"
    A.Attempt(tmp_path / "r", cmd, "abc1234", 2).begin(0)
    logged = A.read(tmp_path / "r" / A.ATTEMPTS)[0]["command"]
    assert not any(word.startswith("/") for word in shlex.split(logged)), logged
