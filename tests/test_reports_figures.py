"""Training-dynamics figure from synthetic logs in each input format: PNG and SVG are produced."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from rpg.reports.cli import main_plot
from rpg.reports.figures import plot_curves
from rpg.reports.logs import read_run


def _logs():
    logs = {}
    for s in range(0, 101):
        d = {"critic/score/mean": -1 + s / 100, "actor/entropy": 1 - s / 200, "response_length/mean": 400.0 + 2 * s}
        if s % 10 == 0:
            d.update({"val-core/math_dapo/acc/mean@32": 0.2 + s / 1000, "val-core/aime2025/acc/mean@32": 0.1 + s / 2000})
        logs[s] = d
    return logs


def _jsonl(path: Path) -> Path:
    path.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in _logs().items()))
    return path


def _csv(path: Path) -> Path:
    logs = _logs()
    keys = sorted({k for d in logs.values() for k in d})
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["_step"] + keys)
        for s, d in logs.items():
            w.writerow([s] + [d.get(k, "") for k in keys])
    return path


def _tb(path: Path) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(path)) as w:
        for s, d in _logs().items():
            for k, v in d.items():
                w.add_scalar(k, v, s)
    return path


def test_figure_png_and_svg_from_all_formats(tmp_path):
    runs = [("RPG-UFKL", read_run(_jsonl(tmp_path / "a.jsonl"))), ("DAPO", read_run(_csv(tmp_path / "b.csv"))),
            ("GRPO", read_run(_tb(tmp_path / "tb")))]
    paths, warns = plot_curves(runs, tmp_path / "fig" / "curves")
    png, svg = paths
    assert (png.name, svg.name) == ("curves.png", "curves.svg") and warns == []
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    import matplotlib.image

    h, w = matplotlib.image.imread(str(png)).shape[:2]
    assert w > 3 * h  # five panels side by side
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    # three runs x five panels of lines (plus nothing else drawn as a Line2D group)
    assert text.count('id="line2d_') >= 15
    # deterministic SVG (no date, fixed hash salt)
    plot_curves(runs, tmp_path / "fig" / "curves.svg")
    assert svg.read_text() == text


def test_missing_series_warn_and_draw_no_data(tmp_path):
    only_train = {"actor/entropy": {1: 1.0, 2: 0.9}}
    paths, warns = plot_curves([("x", only_train)], tmp_path / "f")
    assert all(p.exists() for p in paths)
    assert "run 'x': no data for panel 'AIME24 mean@32'" in warns
    assert len(warns) == 4


def test_cli_plot(tmp_path, capsys):
    rc = main_plot([f"RPG-UFKL={_jsonl(tmp_path / 'a.jsonl')}", str(_csv(tmp_path / "b.csv")), "--out", str(tmp_path / "o" / "fig")])
    out = capsys.readouterr().out.split()
    assert rc == 0 and out == [str(tmp_path / "o" / "fig.png"), str(tmp_path / "o" / "fig.svg")]
    assert Path(out[0]).stat().st_size > 0
    assert main_plot([str(tmp_path / "missing.csv"), "--out", str(tmp_path / "z")]) == 2
