"""Training-dynamics figure (the paper's Fig. 4 layout) from synthetic logs in each input format."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from messages import names, one_line

from rpg.reports.cli import main_plot
from rpg.reports.figures import plot_curves
from rpg.reports.logs import read_run


def _logs():
    logs = {}
    for s in range(0, 101):
        d = {"critic/score/mean": -1 + s / 100, "actor/entropy": 1 - s / 200, "response_length/mean": 400.0 + 2 * s}
        if s % 10 == 0:
            d.update({"val-core/math_dapo/acc/mean@32": 0.2 + s / 1000, "val-core/aime2025/acc/mean@32": 0.1 + s / 2000,
                      "val-core/amc2023/acc/mean@32": 0.8 + s / 1000})
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
    assert 1.2 * h < w < 2.2 * h  # 2 rows x 3 columns, as the paper's Fig. 4
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    # three runs x six panels of lines
    assert text.count('id="line2d_') >= 18
    # deterministic SVG (no date, fixed hash salt)
    plot_curves(runs, tmp_path / "fig" / "curves.svg")
    assert svg.read_text() == text


def test_missing_series_warn_and_draw_no_data(tmp_path):
    only_train = {"actor/entropy": {1: 1.0, 2: 0.9}}
    paths, warns = plot_curves([("x", only_train)], tmp_path / "f")
    assert all(p.exists() for p in paths)
    assert "run 'x': no data for panel '(a) AIME24 mean@32'" in warns
    assert len(warns) == 5


def test_cli_plot(tmp_path, capsys):
    rc = main_plot([f"RPG-UFKL={_jsonl(tmp_path / 'a.jsonl')}", str(_csv(tmp_path / "b.csv")), "--out", str(tmp_path / "o" / "fig")])
    out = capsys.readouterr().out.split()
    assert rc == 0 and out == [str(tmp_path / "o" / "fig.png"), str(tmp_path / "o" / "fig.svg")]
    assert Path(out[0]).stat().st_size > 0
    assert main_plot([str(tmp_path / "missing.csv"), "--out", str(tmp_path / "z")]) == 2


def saved_figures(monkeypatch) -> list:
    """The matplotlib figures saved from here on, in order (each still saved to its file)."""
    from matplotlib.figure import Figure

    figs, save = [], Figure.savefig

    def keep(self, *a, **k):
        figs.append(self)
        return save(self, *a, **k)

    monkeypatch.setattr(Figure, "savefig", keep)
    return figs


def test_fig4_layout_labels_xlim_last_marker_and_seed_band(tmp_path, monkeypatch):
    """2 x 3 panels with y labels, x-axis ending at the Last step, Last marked, seeds as mean ± std."""
    figs = saved_figures(monkeypatch)
    logs = read_run(_jsonl(tmp_path / "a.jsonl"))
    shifted = {k: {s: v + 0.1 for s, v in series.items()} for k, series in logs.items()}
    runs = [("RPG", logs), ("RPG", shifted), ("GRPO", logs)]
    paths, warns = plot_curves(runs, tmp_path / "f", last_step=60)
    assert warns == []
    axes = [ax for ax in figs[0].axes if ax.get_visible()]
    assert len(axes) == 6
    rows = sorted({round(ax.get_position().y0, 3) for ax in axes})
    assert len(rows) == 2  # two rows of three
    assert [ax.get_ylabel() for ax in axes] == [
        "AIME24 mean@32", "AIME25 mean@32", "AMC23 mean@32", "reward (critic/score/mean)",
        "entropy (actor/entropy)", "tokens (response_length/mean)"]
    for ax in axes:
        lo, hi = ax.get_xlim()
        assert lo == 0 and 60 <= hi < 62  # clipped at the Last step (small margin for the marker)
        assert any(list(line.get_xdata()) == [60, 60] for line in ax.get_lines())  # the Last line
    val = axes[0]
    rpg_line = next(line for line in val.get_lines() if line.get_label() == "RPG (mean ± std, 2 seeds)")
    # mean of the two seeds; nothing drawn after the Last step
    assert list(rpg_line.get_xdata()) == [0, 10, 20, 30, 40, 50, 60]
    assert rpg_line.get_ydata()[-1] == pytest.approx(0.2 + 60 / 1000 + 0.05)
    diamonds = [line for line in val.get_lines() if line.get_marker() == "D"]
    assert sorted(round(line.get_ydata()[0], 4) for line in diamonds) == [0.26, 0.31]  # Last of GRPO, RPG
    assert len(val.collections) == 1  # one std band (RPG has two seeds, GRPO one)
    band = val.collections[0].get_paths()[0].vertices
    assert band[:, 1].max() == pytest.approx(0.31 + 0.1 / 2 ** 0.5, abs=1e-6)  # mean + sample std (ddof 1)


def test_a_seed_stopped_early_is_counted_in_the_legend(tmp_path, monkeypatch):
    """Two seeds of RPG, one stopped at step 50: the legend said "mean ± std over 2 seeds" while after step 50 the
    line is one seed's; now its entry says n=1 after step 50, and a warning names each run's last step."""
    figs = saved_figures(monkeypatch)
    logs = read_run(_jsonl(tmp_path / "a.jsonl"))
    stopped = {k: {s: v + 0.1 for s, v in series.items() if s <= 50} for k, series in logs.items()}
    _, warns = plot_curves([("RPG", logs), ("RPG", stopped)], tmp_path / "f")
    (warn,) = warns
    names(one_line(warn), "run 'RPG'", "#1 at step 100", "#2 at step 50", "n=1 after step 50")
    legend = figs[0].legends[0]
    assert legend.get_title().get_text() == "mean ± std over 2 seeds"
    assert [t.get_text() for t in legend.get_texts()][0] == "RPG (n=1 after step 50)"
    _, warns = plot_curves([("RPG", logs), ("RPG", stopped), ("GRPO", logs)], tmp_path / "g")
    assert [t.get_text() for t in figs[-1].legends[0].get_texts()][:2] == [
        "RPG (mean ± std, 2 seeds; n=1 after step 50)", "GRPO"]
    from rpg.reports.figures import fewer_runs

    assert fewer_runs([400, 120, 200]) == "n=2 after step 120, n=1 after step 200" and fewer_runs([9, 9]) is None
