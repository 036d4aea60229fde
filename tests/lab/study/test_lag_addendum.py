"""The lag study's addendum (``python -m rpg_lab.study --lag --addendum``, docs/study/lag-addendum/PLAN.md) without Ray:
its cells and run order, the new cell's composed config, the SDs and the plan's generated numbers read off the lag
study's committed CSV, the hypotheses on planted data, runs through the CSV with a stand-in trainer, the command
line, and the results rebuilt from the committed runs.csv."""

from __future__ import annotations

import random
import re
import statistics
from pathlib import Path

import pytest
from messages import names, one_line
from test_lag_study import LagFakeTrainer, _kv

from rpg_lab.study import plan_and_results as DC
from rpg_lab.study import grid as G
from rpg_lab.study import lag as L
from rpg_lab.study import lag_addendum as A
from rpg_lab.study import records as D
from rpg_lab.study import runner as R
from rpg_lab.study import stats
from rpg_lab.study.__main__ import main

ROOT = Path(__file__).resolve().parents[3]
ADD_DIR = ROOT / "docs" / "study" / "lag-addendum"
SMALL = G.Sizes(steps=4, test_freq=2, prompts=16, n=4, val_n=8)


def test_the_cells_are_the_new_one_and_the_three_it_is_compared_with():
    cells = {c.name: (c.variant, c.lag, c.arm) for c in G.ADDENDUM_CELLS}
    lag = {c.name: (c.variant, c.lag, c.arm) for c in G.LAG_CELLS}
    assert cells["lag0-clip-token"] == (lag["lag1-clip-token"][0], 0, "token")  # the clipped method at lag 0
    assert {k: v for k, v in cells.items() if k != "lag0-clip-token"} == {
        k: lag[k] for k in ("lag0-noclip-token", "lag1-noclip-token", "lag1-clip-token")}  # the lag study's cells
    specs = A.addendum_grid()
    assert len(specs) == 48 and [s.seed for s in specs] == [s for s in range(1, 13) for _ in range(4)]
    assert [L.lag_cell(s, G.ADDENDUM_CELLS).name for s in specs[:4]] == [
        "lag1-noclip-token", "lag1-clip-token", "lag0-clip-token", "lag0-noclip-token"]  # order seed 68's
    assert {s.sizes for s in specs} == {G.LAG_SIZES} and {s.updates for s in specs} == {8}


def test_the_new_cell_composes_the_clipped_method_at_lag_0(tiny_assets, tmp_path):
    """lag0-clip-token's overrides are lag1-clip-token's but for the lag (num_warmup_batches 0, threshold 1)."""
    by = {L.lag_cell(s, G.ADDENDUM_CELLS).name: _kv(D.spec_overrides(s, tmp_path)) for s in A.addendum_grid(1)}
    new, old = by["lag0-clip-token"], by["lag1-clip-token"]
    changed = {k for k in set(new) | set(old) if new.get(k) != old.get(k)}
    names = {"trainer.experiment_name", "trainer.default_local_dir",  # the run's name and its folders
             "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_ROOT",
             "ray_kwargs.ray_init.runtime_env.env_vars.TENSORBOARD_DIR"}
    assert changed - names == {"trainer.v1.separate_async.num_warmup_batches",
                               "trainer.v1.sampler.max_off_policy_threshold"}
    assert (new["trainer.v1.separate_async.num_warmup_batches"], new["trainer.v1.sampler.max_off_policy_threshold"]) \
        == ("0", "1")


def test_the_sds_and_the_plans_numbers_are_the_codes():
    rows = L.read_csv(A.LAG_CSV)
    y = {(r["cell"], r["seed"]): r["primary"] for r in rows}
    d = [y[("lag0-noclip-token", s)] - y[("lag1-noclip-token", s)] for s in range(1, 13)]
    clipped, h4 = A.measured_sds()
    assert h4 == pytest.approx(statistics.stdev(d), abs=5e-4) and 0.02 < clipped < 0.05
    block = DC.generated_block((ADD_DIR / "PLAN.md").read_text(encoding="utf-8"), "plan_numbers")
    assert block is not None and block == A.plan_numbers()


def _rows(effects: dict[str, float], seeds: int = 12, noise: float = 0.02, rng_seed: int = 7) -> list[dict]:
    rng = random.Random(rng_seed)
    rows = []
    for seed in range(1, seeds + 1):
        block = rng.gauss(0, 0.1)
        for order, c in enumerate(G.ADDENDUM_CELLS, 1):
            y = 0.6 + block + effects.get(c.name, 0.0) + rng.gauss(0, noise)
            rows.append({"run_id": f"{c.name}-seed{seed}", "cell": c.name, "lag": c.lag, "weights": c.arm,
                         "clip": int("noclip" not in c.name), "seed": seed, "order": (seed - 1) * 4 + order,
                         "status": "done", "primary": y, "final_acc": y, "collapsed": 0, "collapse_reason": "",
                         **{name: 1.0 for name, _, _ in L.DIAGNOSTICS}, "code": "abc1234", "load_start_1m": 1.0,
                         "load_end_1m": 1.0, "cpu_count": 2, "wall_time_s": 200.0, "started": "2026-11-28 10:00:00",
                         "threads": "1", "design": DC.DECLARED, **dict(A.DESIGN.columns),
                         **{f"{L.VAL_PREFIX}{t}": y for t in range(0, 25, 4)}})
    return rows


def test_the_hypotheses_on_planted_effects():
    """Planted: the lag costs 0.2 without the clip and nothing with it. A2 (and R1) then hold in every seed; A1 is
    noise. The figures are rpg_lab.study.stats' on the same d_s."""
    rows = _rows({"lag1-noclip-token": -0.2})
    text = A.ADDENDUM.render_tables(rows)
    h = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[1:-1]]
         for ln in text.splitlines() if re.match(r"\| (A|R)\d ", ln)}
    y = {(r["cell"], r["seed"]): r["primary"] for r in rows}
    a2 = [y[("lag0-noclip-token", s)] - y[("lag1-noclip-token", s)] - y[("lag0-clip-token", s)]
          + y[("lag1-clip-token", s)] for s in range(1, 13)]
    a1 = [y[("lag0-clip-token", s)] - y[("lag1-clip-token", s)] for s in range(1, 13)]
    adj = stats.holm([stats.sign_flip_p(a1), stats.sign_flip_p(a2)])
    assert h["A2"][5] == f"{stats.sign_flip_p(a2):.4g}" == f"{1 / 4096:.4g}" and h["A2"][6] == f"{adj[1]:.4g}"
    assert h["A2"][7] == "supported" and h["A1"][7] == "not supported" and h["A1"][6] == f"{adj[0]:.4g}"
    lo, hi = stats.sign_flip_ci(a1, 0.95)
    assert h["A1"][4] == f"{statistics.fmean(a1):.3f} [{lo:.3f}, {hi:.3f}]"
    assert h["R1"][5] == f"{1 / 4096:.4g}" and "Holm over 2 at family-wise alpha 0.05" in text
    # the title, and the command that rebuilds the file from its CSV
    assert text.startswith("# Lag addendum: results")
    names(text.splitlines()[0], "runs.csv", "`python -m rpg_lab.study --lag --addendum --render-only`", "do not edit")
    with pytest.raises(ValueError, match=r"cell\(s\) lag1-naive-ppo are not in the plan's design"):
        A.ADDENDUM.render_tables([*rows[1:], dict(rows[0], cell="lag1-naive-ppo")])


def test_runs_reach_the_csv_and_the_report(monkeypatch, tiny_assets, tmp_path, capsys):
    from rpg import trainer_process as harness

    monkeypatch.setattr(harness, "run_trainer", LagFakeTrainer())
    report = tmp_path / "report"
    assert main(["--lag", "--addendum", "--exploratory", "--seeds", "1", "--steps", "4", "--test-freq", "2",
                 "--out", str(tmp_path / "s"), "--report-dir", str(report)]) == 0
    rows = A.ADDENDUM.read_csv(report / "runs.csv")
    assert sorted(r["cell"] for r in rows) == sorted(c.name for c in G.ADDENDUM_CELLS)
    assert all(r["status"] == "done" and r["primary"] is not None for r in rows)
    lag = {r["cell"]: r["lag"] for r in rows}
    assert lag == {"lag0-noclip-token": 0, "lag1-noclip-token": 1, "lag0-clip-token": 0, "lag1-clip-token": 1}
    assert (report / "lag-addendum.png").stat().st_size > 10_000
    assert [r["event"] for r in __import__("rpg_lab.study.attempts", fromlist=["read"]).read(report / "attempts.csv")] == [
        "start", "end"]


def test_the_command_line(tmp_path, capsys):
    assert main(["--addendum", "--dry-run", "--out", str(tmp_path / "s")]) == 2
    names(one_line(capsys.readouterr().err), "rpg_lab.study: --addendum", "--lag")  # the flag and the one it needs
    assert main(["--lag", "--addendum", "--dry-run", "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("design: declared (docs/study/lag-addendum/PLAN.md)\n") and "48 runs (48 to run)" in out
    assert main(["--lag", "--addendum", "--dry-run", "--cells", "lag1-naive-ppo", "--out", str(tmp_path / "s")]) == 2
    names(one_line(capsys.readouterr().err), "rpg_lab.study: --cells lag1-naive-ppo",
          *(c.name for c in G.ADDENDUM_CELLS))  # the cell refused and the cells allowed
    assert not (tmp_path / "s").exists()


def test_the_committed_results_are_rebuilt_from_the_committed_csv():
    csv_path = ADD_DIR / "runs.csv"
    if not csv_path.is_file():
        pytest.skip("docs/study/lag-addendum/runs.csv does not exist yet: the plan's runs have not started")
    assert (ADD_DIR / "results.md").read_text(encoding="utf-8") == A.ADDENDUM.render_tables(
        A.ADDENDUM.read_csv(csv_path))
