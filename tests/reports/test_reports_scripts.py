"""Every command-line tool runs as ``python -m rpg.<tool>``; the thin wrappers in scripts/ still run
as plain ``python scripts/<name>.py`` commands and give the same output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROW = "| GRPO | 0.2500 | 0.2563 | -0.0063 | 0.2500 | 0.2708 | -0.0208 | 0.1250 | 0.2323 | -0.1073 |"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def _log(tmp_path: Path) -> Path:
    log = tmp_path / "run.jsonl"
    lines = []
    for s in range(0, 401, 10):
        lines.append({"step": s, "data": {"val-core/aime2024/acc/mean@32": 0.25, "val-core/aime2025/acc/mean@32": 0.125,
                                          "critic/score/mean": 0.0, "actor/entropy": 0.5, "response_length/mean": 900}})
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return log


def test_python_m_rpg_reports_tables_and_curves(tmp_path):
    log = _log(tmp_path)
    r = _run("-m", "rpg.reports", "tables", f"GRPO={log}", "--table", "6")
    assert r.returncode == 0, r.stderr
    assert ROW in r.stdout
    r = _run("-m", "rpg.reports", "curves", f"GRPO={log}", "--out", str(tmp_path / "fig"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(tmp_path / "fig.png"), str(tmp_path / "fig.svg")]
    assert (tmp_path / "fig.png").stat().st_size > 0 and (tmp_path / "fig.svg").stat().st_size > 0
    r = _run("-m", "rpg.reports", "plot", str(log))
    assert r.returncode == 2 and "invalid choice: 'plot' (choose from 'tables', 'curves')" in r.stderr


def test_scripts_wrappers_end_to_end(tmp_path):
    log = _log(tmp_path)
    r = _run("scripts/report_tables.py", f"GRPO={log}", "--table", "6")
    assert r.returncode == 0, r.stderr
    assert ROW in r.stdout
    r = _run("scripts/plot_curves.py", f"GRPO={log}", "--out", str(tmp_path / "fig"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "fig.png").stat().st_size > 0 and (tmp_path / "fig.svg").stat().st_size > 0
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    r = _run("scripts/prepare_data.py", "prepare", "aime2024", "--input", str(src), "--out", str(tmp_path / "a.parquet"))
    assert r.returncode == 0 and "wrote 1 rows" in r.stdout
