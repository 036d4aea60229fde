"""A resumed run keeps its whole metrics history (one file-logger segment per
trainer start, joined by the report tools), the report tools warn on a history that does not start
at step 0 or has gaps in its validation steps, and ``--out`` into a missing directory works."""

from __future__ import annotations

from pathlib import Path

import pytest
from messages import names, one_line
from omegaconf import OmegaConf
from test_reports_tables import _md_rows, write_wandb_csv

from rpg.reports.cli import main_tables
from rpg.metrics_log.history import claim_segment, history_warnings, join, segment_path, segments
from rpg.reports.logs import read_run

AIME = "val-core/aime2024/acc/mean@32"


def _val(step: int, before_resume: bool) -> float:
    """AIME24 accuracy: true best 0.60 at step 100 (first segment); <= 0.40 after the resume."""
    if before_resume:
        return 0.60 if step == 100 else 0.30
    return 0.40 if step == 300 else 0.35


def _train_segment(cfg, steps: range, val_steps: range, before_resume: bool) -> Path:
    """One trainer start as RPGTaskRunner runs it: verl's own Tracking (file logger) inside log_segment."""
    from verl.utils.tracking import Tracking

    from rpg.verl.main import log_segment

    with log_segment(cfg) as path:
        tracking = Tracking(cfg.trainer.project_name, cfg.trainer.experiment_name, default_backend=list(cfg.trainer.logger))
        if val_steps.start == steps.start - 1:  # val_before_train at the start (or resume) step
            tracking.log({AIME: _val(val_steps.start, before_resume)}, step=val_steps.start)
        for s in steps:
            data = {"critic/score/mean": s / 1000 + (0 if before_resume else 0.5)}
            if s in val_steps:
                data[AIME] = _val(s, before_resume)
            tracking.log(data, step=s)
        tracking.finish()
    return path


def test_resumed_run_keeps_the_whole_history(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path / "logs"))
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    cfg = OmegaConf.create({"trainer": {"logger": ["file"], "project_name": "rpg", "experiment_name": "run"}})
    # first start: steps 1..127, checkpoints every 20, killed after step 127 (validated every 10 from step 0)
    first = _train_segment(cfg, range(1, 128), range(0, 128, 10), before_resume=True)
    # resume_mode=auto from global_step_120: validates at 120, redoes 121..127, goes on to 400
    second = _train_segment(cfg, range(121, 401), range(120, 401, 10), before_resume=False)
    base = tmp_path / "logs" / "rpg" / "run.jsonl"
    assert (first, second) == (base, segment_path(base, 2)) and segments(base) == [base, second]

    m = read_run(base)
    assert sorted(m[AIME]) == list(range(0, 401, 10)) and m[AIME][100] == 0.60
    assert m[AIME][120] == 0.35  # the resume's re-validation of the step-120 weights: the later value wins
    assert m["critic/score/mean"][120] == pytest.approx(0.12)  # training metrics of step 120 kept
    assert m["critic/score/mean"][121] == pytest.approx(0.621)  # redone steps: the resumed values
    assert sorted(m["critic/score/mean"]) == list(range(1, 401))

    assert main_tables([f"RPG={base}", "--table", "3", "--metric", "acc/mean@32"]) == 0
    cap = capsys.readouterr()
    aime_best = _md_rows(cap.out)["RPG"][3]
    assert aime_best == "0.6000"  # not 0.4000, the Best of the resumed part alone
    assert "joined 2 log segments (restarted at steps 120)" in cap.err
    assert "not 0" not in cap.err and "gaps" not in cap.err


def test_claim_segment_reuses_empty_files(tmp_path):
    base = tmp_path / "p" / "e.jsonl"
    assert claim_segment(base) == base and base.parent.is_dir()
    base.write_text("")  # a start that crashed before logging anything
    assert claim_segment(base) == base
    base.write_text('{"step": 0, "data": {}}\n')
    assert claim_segment(base) == tmp_path / "p" / "e.part2.jsonl"
    (tmp_path / "p" / "e.part2.jsonl").write_text("x\n")
    (tmp_path / "p" / "e.part10.jsonl").write_text("x\n")
    (tmp_path / "p" / "e.partX.jsonl").write_text("x\n")
    (tmp_path / "p" / "other.part3.jsonl").write_text("x\n")
    assert claim_segment(base) == tmp_path / "p" / "e.part3.jsonl"
    assert [p.name for p in segments(base)] == ["e.jsonl", "e.part2.jsonl", "e.part10.jsonl"]


def test_join_replaces_redone_steps_and_merges_the_restart_step():
    a = {"x": {0: 1.0, 5: 1.0, 6: 1.0, 7: 1.0}, "v": {0: 0.1, 5: 0.1}}
    b = {"v": {5: 0.2, 10: 0.3}, "x": {6: 2.0}}
    assert join([a, b]) == {"x": {0: 1.0, 5: 1.0, 6: 2.0}, "v": {0: 0.1, 5: 0.2, 10: 0.3}}
    assert join([a, {}]) == a  # an empty segment changes nothing


def _logs(val_steps, last=60):
    logs = {s: {"critic/score/mean": 0.1} for s in range(1, last + 1)}
    for s in val_steps:
        logs.setdefault(s, {})[AIME] = 0.5
    return logs


def test_history_warnings_start_and_gaps():
    def metrics(logs):
        return {k: {s: d[k] for s, d in logs.items() if k in d} for k in {k for d in logs.values() for k in d}}

    assert history_warnings("r", metrics(_logs(range(0, 61, 10)))) == []
    assert history_warnings("r", metrics(_logs([*range(0, 61, 10), 63], last=63))) == []  # final-step validation
    late = {s: d for s, d in _logs(range(0, 61, 10)).items() if s >= 30}
    (warn,) = history_warnings("r", metrics(late))
    assert one_line(warn).startswith("r: ")
    names(warn, "step 30, not 0", "before 30", "steps >= 30")
    gappy = _logs([0, 10, 20, 50, 60, 90, 100, 110])
    (warn,) = history_warnings("r", metrics(gappy))
    assert one_line(warn).startswith("r: ")
    names(warn, "every 10 steps", "20 -> 50, 60 -> 90")


def test_a_fresh_run_without_validation_before_training_is_not_taken_for_a_resumed_one():
    """trainer.val_before_train=False: the history starts at training step 1, whole; no line says that a resumed run
    overwrote it. A history from step 2 on lacks step 1: that line still speaks."""
    from rpg.metrics_log.history import TRAINING_STEP_KEY

    def metrics(logs):
        return {k: {s: d[k] for s, d in logs.items() if k in d} for k in {k for d in logs.values() for k in d}}

    fresh = {s: {TRAINING_STEP_KEY: float(s), **({AIME: 0.5} if s % 10 == 0 else {})} for s in range(1, 31)}
    assert history_warnings("r", metrics(fresh), interval=10) == []
    assert history_warnings("r", metrics(fresh)) == []
    late = {s: d for s, d in fresh.items() if s >= 2}
    assert [w for w in history_warnings("r", metrics(late), interval=10) if "starts at step 2" in w and
            "resumed run" in w] != []


def test_report_tables_warns_on_a_truncated_wandb_history(tmp_path, capsys):
    """The checks apply to every log format (here a W&B export of the resumed part only)."""
    csv = write_wandb_csv(tmp_path / "r.csv", {s: d for s, d in _logs(range(0, 401, 10), last=400).items() if s >= 100})
    assert main_tables([str(csv), "--table", "3"]) == 0
    err = capsys.readouterr().err
    assert f"warning: {csv}: the log starts at step 100, not 0" in err


def test_out_into_a_missing_directory(tmp_path, capsys):
    csv = write_wandb_csv(tmp_path / "r.csv", _logs(range(0, 401, 10), last=400))
    out = tmp_path / "new" / "dir" / "t3.md"
    assert main_tables([str(csv), "--table", "3", "--out", str(out)]) == 0
    assert out.read_text().startswith("**Table 3")
    (tmp_path / "afile").write_text("")
    capsys.readouterr()
    assert main_tables([str(csv), "--table", "3", "--out", str(tmp_path / "afile" / "t3.md")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: cannot write --out {tmp_path / 'afile' / 't3.md'}: ") and "Traceback" not in err


def test_a_resumes_own_validation_is_not_read_as_the_interval():
    """The tiny demo (test_freq 5, 8 steps) killed after step 4 and resumed: validations at 0, 4 (the
    resume's), 5 and 8 (the last). Inferred from the spacings, the interval came out as 1 and steps
    0 -> 4, 5 -> 8 were reported as gaps; with the run's trainer.test_freq there is none, and a real
    one is still named."""
    def metrics(logs):
        return {k: {s: d[k] for s, d in logs.items() if k in d} for k in {k for d in logs.values() for k in d}}

    resumed = metrics(_logs([0, 4, 5, 8], last=8))
    assert any("gaps in the validation steps" in w for w in history_warnings("r", resumed))  # the inference
    assert history_warnings("r", resumed, interval=5) == []
    lost = metrics(_logs([0, 5, 15, 20], last=20))
    (warn,) = history_warnings("r", lost, interval=5)
    assert one_line(warn).startswith("r: ")
    names(warn, "step 10", "trainer.test_freq=5")
