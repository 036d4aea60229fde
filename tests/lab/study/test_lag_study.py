"""The declared lag study (docs/study/lag/PLAN.md) without Ray: its grid and overrides, run order, budget, the plan's
generated numbers, the per-run CSV, the statistics and the tables rebuilt from the CSV.

The statistics are checked on hand-computed cases and on synthetic CSVs with planted effects; the committed tables
are rebuilt from the committed CSV once the plan's runs exist.
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest
from messages import names, one_line

from rpg_lab.study import grid as G
from rpg_lab.study import lag as L
from rpg_lab.study import records as Rec
from rpg_lab.study import runner as R
from rpg_lab.study import stats as S
from rpg_lab.study.__main__ import main

ROOT = Path(__file__).resolve().parents[3]
LAG_DIR = ROOT / "docs" / "study" / "lag"
SMALL = G.Sizes(steps=4, test_freq=2, prompts=16, n=4, val_n=8)


def _kv(overrides: list[str]) -> dict[str, str]:
    from launch_expected import effective

    return effective(overrides)


# ---- statistics ----

def test_sign_flip_p_values_by_hand():
    # d = (0.1, 0.2, -0.05): the subsets with sum <= 0 are {} and {3}: 2 of 8
    assert S.sign_flip_p([0.1, 0.2, -0.05]) == 2 / 8
    assert S.sign_flip_p([1.0, 2.0, 3.0]) == 1 / 8 and S.sign_flip_p([-1.0, -2.0]) == 1.0
    # ties count against H1: (0.1, -0.1): {} (0), {2} (-0.1), {1, 2} (0) -> 3 of 4
    assert S.sign_flip_p([0.1, -0.1]) == 3 / 4
    # {}, {3}, {1, 3}, {2, 3} and {1, 2, 3}, whose float sum 0.1 + 0.2 - 0.3 is 5.6e-17: a tie, not > 0
    assert S.sign_flip_p([0.1, 0.2, 0.3 - 0.6]) == 5 / 8
    assert S.sign_flip_p([0.05] * 12) == 1 / 4096


def test_sign_flip_interval_by_hand_and_its_coverage():
    # n = 3, level 0.75: k = floor(0.125 * 8 - 1) + 1 = 1: [smallest, largest subset mean] = [1, 3]
    assert S.sign_flip_ci([1.0, 2.0, 3.0], 0.75) == (1.0, 3.0)
    assert S.sign_flip_ci([1.0, 2.0, 3.0], 0.95) == (-math.inf, math.inf)  # 2^-3 > 0.025: nothing excluded
    # n = 5, level 0.75: k = floor(0.125 * 32 - 1) + 1 = 4: the 4th smallest / largest of the 31 subset means
    d = [1.0, 2.0, 4.0, 8.0, 16.0]
    means = sorted(sum(x for i, x in enumerate(d) if m >> i & 1) / bin(m).count("1") for m in range(1, 32))
    assert S.sign_flip_ci(d, 0.75) == (means[3], means[-4])
    rng = random.Random(5)
    cover = sum(lo <= 0.3 <= hi for lo, hi in (S.sign_flip_ci([0.3 + rng.gauss(0, 1) for _ in range(8)])
                                               for _ in range(2000)))
    assert cover / 2000 >= 0.94  # n = 8: each side misses with probability 6/256, coverage 0.953 (SD 0.005)


def test_holm_and_fisher_by_hand():
    assert S.holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert S.holm([0.5, 0.001]) == pytest.approx([0.5, 0.002]) and S.holm([0.9, 0.8]) == [1.0, 1.0]
    assert S.fisher_greater(3, 3, 0, 3) == pytest.approx(1 / 20)  # C(3,3) C(3,0) / C(6,3)
    assert S.fisher_greater(0, 3, 3, 3) == 1.0
    assert S.fisher_greater(2, 4, 1, 4) == pytest.approx((6 * 4 + 4 * 1) / 56)  # X >= 2 of K = 3 in N = 8
    with pytest.raises(ValueError):
        S.fisher_greater(5, 4, 0, 4)


def test_the_sign_flip_test_holds_its_level_under_the_null_and_detects_a_planted_shift():
    rng = random.Random(11)
    alpha = 13 / 256  # attainable at n = 8: P(p <= alpha) = alpha exactly for continuous symmetric noise
    ps = [S.sign_flip_p([rng.gauss(0, 1) for _ in range(8)]) for _ in range(2000)]
    assert abs(sum(p <= alpha for p in ps) / 2000 - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / 2000)
    assert abs(sum(p <= 0.5 for p in ps) / 2000 - 0.5) < 0.05  # ~ uniform in the middle too
    planted = [S.sign_flip_p([1.5 + rng.gauss(0, 1) for _ in range(12)]) for _ in range(200)]
    assert sum(p <= 0.0125 for p in planted) / 200 > 0.85  # standardised MDE at 0.0125 is ~1.03 (PLAN.md)


def test_power_and_mde():
    assert S.min_detectable_effect(0.1, 3, 0.05) == math.inf  # 1/8 > 0.05: no effect is detectable with 3 seeds
    sim = S.PowerSim(sims=1000)
    mde = S.min_detectable_effect(1.0, 12, 0.05, 0.8, sim)
    assert 0.7 < mde < 0.9  # t-approximation: (t_0.95,11 + t_0.8,11) / sqrt(12) = 0.77
    assert S.min_detectable_effect(0.2, 12, 0.05, 0.8, sim) == pytest.approx(0.2 * mde)  # scale-free
    assert S.sign_flip_power(mde, 1.0, 12, 0.05, sim) >= 0.8 > S.sign_flip_power(mde - 0.01, 1.0, 12, 0.05, sim)
    assert S.fisher_power(0.5, 0.03, 12, 0.05) == pytest.approx(0.8189, abs=1e-4)


@pytest.mark.parametrize("n, alpha", [(5, 0.0625), (8, 0.0125), (9, 0.05)])
def test_the_mde_is_the_bisection_on_the_simulated_power(n, alpha):
    """The MDE read off the per-data-set critical shifts is exactly the bisection on ``sign_flip_power`` itself."""
    sim = S.PowerSim(sims=300, seed=11)
    lo, hi = 0.0, 10.0
    while hi - lo > 1e-4:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if S.sign_flip_power(mid, 1.0, n, alpha, sim) >= 0.8 else (mid, hi)
    assert S.min_detectable_effect(1.0, n, alpha, 0.8, sim) == hi


# ---- the grid ----

def test_each_cell_composes_its_lag_and_arm_and_nothing_else(tiny_assets, tmp_path):
    """A cell's overrides against its method's lag-1 token cell: only the lag's two keys and its arm's keys differ
    (run-id paths aside); the updates per version, mini-batch, batch, steps, validation and seeds are the same in
    every cell."""
    specs = [s for s in G.lag_grid() if s.seed == 1]
    kv = {G.lag_cell(s).name: _kv(Rec.spec_overrides(s, tmp_path)) for s in specs}
    lag = {0: {"trainer.v1.separate_async.num_warmup_batches": "0", "trainer.v1.sampler.max_off_policy_threshold": "1"},
           1: {"trainer.v1.separate_async.num_warmup_batches": "1", "trainer.v1.sampler.max_off_policy_threshold": "2"}}
    arm = {"token": {}, "none": {"rpg.loss.behavior_weight_level": "none"},
           "bypass": {"algorithm.rollout_correction.bypass_mode": "true"}}
    for spec in specs:
        cell, this = G.lag_cell(spec), kv[G.lag_cell(spec).name]
        same = {"trainer.v1.trainer_mode": "separate_async", "trainer.v1.separate_async.parameter_sync_step": "8",
                "actor_rollout_ref.actor.ppo_mini_batch_size": "2", "data.train_batch_size": "16",
                "actor_rollout_ref.rollout.n": "4", "actor_rollout_ref.rollout.val_kwargs.n": "8",
                "trainer.total_training_steps": "24", "trainer.test_freq": "4",
                "trainer.v1.sampler.max_off_policy_strategy": "drop", "algorithm.filter_groups.enable": "false",
                "data.seed": "1",
                "actor_rollout_ref.rollout.seed": "1", **lag[cell.lag], **arm[cell.arm]}
        assert {k: this.get(k) for k in same} == same, cell.name
        base = kv["lag1-clip-token" if "-clip-" in cell.name or cell.arm == "bypass" else "lag1-noclip-token"]
        changed = {k for k in set(this) | set(base) if this.get(k) != base.get(k)
                   and spec.run_id not in (this.get(k) or "") and "-lag1-token-" not in (base.get(k) or "")}
        assert changed <= set(lag[1]) | set(arm[cell.arm]), (cell.name, changed)


def test_the_new_settings_pass_the_drivers_checks():
    """The cells' settings the staleness study never ran, lag 0 (no prefetch, threshold 1) and bypass mode, on the CPU
    backend's separate-async settings pass the RPG driver's checks before Ray, as
    tests/verl/test_separate_async_driver.py composes them (its tiny sizes: 4 mini-batches per version)."""
    from recipe_config import SEPARATE_ASYNC_OK as OK
    from recipe_config import apply

    for spec in (s for s in G.lag_grid(seeds=1) if s.lag == 0 or s.arm == "bypass"):
        mode = [o for o in spec.mode_overrides() if "parameter_sync_step" not in o]
        cfg, s = apply(*OK, *mode, "trainer.v1.separate_async.parameter_sync_step=4")
        cell = G.lag_cell(spec)
        assert (cfg.trainer.v1.separate_async.num_warmup_batches, cfg.trainer.v1.sampler.max_off_policy_threshold,
                bool(cfg.algorithm.rollout_correction.bypass_mode)) == (cell.lag, cell.lag + 1, cell.arm == "bypass")
        assert s.loss.behavior_weight_level == ("none" if cell.arm == "none" else "token")
        assert cfg.algorithm.filter_groups.enable is False  # no refill at the current version, none without end
        assert cfg.actor_rollout_ref.actor.policy_loss.rpg_stale_sampler is True


def test_seeds_pair_across_cells_and_the_run_order_is_the_declared_seeds():
    specs = G.lag_grid()
    assert len(specs) == 72 and len({s.run_id for s in specs}) == 72
    assert [s.seed for s in specs] == [s for s in range(1, 13) for _ in range(6)]  # seed-major blocks
    for seed in range(1, 13):
        block = [G.lag_cell(s).name for s in specs if s.seed == seed]
        assert sorted(block) == sorted(c.name for c in G.LAG_CELLS)  # every cell once per seed
    assert {(s.sizes, s.updates, s.staleness) for s in specs} == {(G.LAG_SIZES, 8, 8)}
    # the order is the declared seed's (PLAN.md): fixed, seed-dependent, and another order seed gives another order
    assert [G.lag_cell(s).name for s in specs[:6]] == ["lag1-naive-ppo", "lag1-clip-token", "lag1-clip-none",
                                                       "lag1-noclip-none", "lag1-noclip-token", "lag0-noclip-token"]
    assert G.lag_grid() == specs
    orders = {tuple(G.lag_cell(s).name for s in specs if s.seed == seed) for seed in range(1, 13)}
    assert len(orders) > 6
    assert [s.run_id for s in G.lag_grid(order_seed=54)] != [s.run_id for s in specs]
    assert sorted(s.run_id for s in G.lag_grid(order_seed=54)) == sorted(s.run_id for s in specs)
    # the other grids' run ids and labels are unchanged: their finished runs stay finished
    assert G.RunSpec(G.STRESS_METHODS[0], 8, 1, G.STALENESS_SIZES, "token", staleness=8).run_id.startswith(
        f"{G.STRESS_METHODS[0]}-k8-sep8-token-seed1-")
    assert specs[-1].label.startswith("RPG-REINFORCE-UFKL") and "lag " in specs[-1].label


def test_grid_refuses_bad_cells():
    with pytest.raises(ValueError, match="--seeds must be >= 1"):
        G.lag_grid(seeds=0)
    with pytest.raises(ValueError, match="distinct"):
        G.lag_grid(cells=(G.LAG_CELLS[0], G.LAG_CELLS[0]))
    with pytest.raises(ValueError, match="cell x: lag must be >= 0"):
        G.lag_grid(cells=(G.LagCell("x", G.UNCLIPPED, -1, "token"),))
    with pytest.raises(ValueError, match="must divide --prompts 12"):
        G.lag_grid(sizes=G.Sizes(steps=24, test_freq=4, prompts=12, n=4, val_n=8))


def test_the_design_fits_three_hours_with_twelve_seeds_per_cell():
    specs = G.lag_grid()
    per_cell = {c.name: sum(1 for s in specs if G.lag_cell(s) == c) for c in G.LAG_CELLS}
    assert set(per_cell.values()) == {12}
    assert G.LAG_COSTS.grid_s(specs, 2) <= G.LAG_BUDGET_S == 3 * 3600
    # a run: start-up + 24 steps x (step + 7 extra updates) + 7 validations, from the staleness grid's measured costs
    c = G.STALENESS_COSTS
    expected = c.startup_s + 24 * (c.step_s + 7 * c.update_s) + 7 * 2 * c.val_s
    assert G.LAG_COSTS.run_s(specs[0]) == pytest.approx(expected)


# ---- runs ----

class LagFakeTrainer:
    """Stands in for rpg.trainer_process.run_trainer: verl-style records of a lag run with the per-step diagnostics."""

    def __call__(self, overrides, *, output_dir, entry, timeout_s, on_metrics, stop=None, env=None):
        from rpg.trainer_process import TrainerRun

        kv = _kv(overrides)
        steps, seed = int(kv["trainer.total_training_steps"]), int(kv["data.seed"])
        lag = int(kv["trainer.v1.separate_async.num_warmup_batches"])
        out, lines = Path(output_dir), []
        for s in range(steps + 1):
            data = {"timing_s/step": 2.0, "actor/grad_norm": 0.5 + s, "actor/pg_clipfrac": 0.01 * s,
                    "actor/rpg/behavior_ess": 1.0 - 0.1 * lag, "actor/rpg/behavior_log_w_m2": 0.02 * lag,
                    "actor/rpg/behavior_weight_max": 1.0 + lag * s, "actor/rpg/behavior_kl_k3": 0.001 * lag,
                    "actor/rpg/ratio_max": 2.0, "training/rpg/lag_versions": float(lag and s > 1),
                    "training/rpg/lag_updates": 8.0 * lag * (s > 1)} if s else {}
            if s % int(kv["trainer.test_freq"]) == 0 or s == steps:
                data["val-core/math_dapo/acc/mean@8"] = round(0.3 + 0.05 * s + 0.01 * seed - 0.1 * lag, 6)
                data["timing_s/testing"] = 1.0
            lines.append(json.dumps({"step": s, "data": data}))
            on_metrics(s, data)
        (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        return TrainerRun(0, 30.0, out, out / "trainer.log", out / "metrics.jsonl", [],
                          metrics={json.loads(x)["step"]: json.loads(x)["data"] for x in lines})


def test_a_runs_record_holds_the_machines_load(monkeypatch, tiny_assets, tmp_path):
    import os

    from rpg import trainer_process as harness

    monkeypatch.setattr(harness, "run_trainer", LagFakeTrainer())
    spec = G.lag_grid(seeds=1, sizes=SMALL, cells=G.LAG_CELLS[:1])
    R.run_grid(spec, tmp_path, G.LAG_COSTS)
    rec = Rec.read_record(tmp_path, spec[0])
    assert rec["status"] == "done" and rec["cpu_count"] == os.cpu_count()
    for key in ("load_start", "load_end"):  # 1, 5 and 15 minutes
        assert len(rec[key]) == 3 and all(isinstance(x, float) and x >= 0 for x in rec[key]), rec[key]


# ---- the plan, the CSV and the tables ----

def test_the_plans_numbers_are_the_codes():
    """PLAN.md's power and budget block is exactly what ``python -m rpg_lab.study.lag`` prints."""
    from rpg_lab.study.plan_and_results import generated_block

    block = generated_block((LAG_DIR / "PLAN.md").read_text(encoding="utf-8"), "plan_numbers")
    assert block is not None, "PLAN.md has no plan_numbers block"
    assert block == L.plan_numbers()


# what every synthetic run ran on (runs.csv's RAN_ON_COLUMNS)
RAN_ON = {"model_sha256": "0123456789ab", "torch": "2.13.0", "transformers": "5.10.4", "verl": "0.9.1",
          "kernels": "AVX512"}


def _rows(effects: dict[str, float], seeds: int = 12, noise: float = 0.03, rng_seed: int = 3) -> list[dict]:
    """Synthetic runs.csv rows: primary = 0.6 + a seed's block effect (SD 0.1) + the cell's planted effect + noise."""
    rng = random.Random(rng_seed)
    rows = []
    for seed in range(1, seeds + 1):
        block = rng.gauss(0, 0.1)
        for order, c in enumerate(G.LAG_CELLS, 1):
            y = 0.6 + block + effects.get(c.name, 0.0) + rng.gauss(0, noise)
            rows.append({"run_id": f"{c.name}-seed{seed}", "cell": c.name, "lag": c.lag, "weights": c.arm,
                         "clip": int("noclip" not in c.name), "seed": seed, "order": (seed - 1) * 6 + order,
                         "status": "done", "primary": y, "final_acc": y + 0.01, "collapsed": int(y < 0.3),
                         "collapse_reason": "final accuracy below step 0's" if y < 0.3 else "",
                         **{name: 1.0 + 0.1 * order for name, _, _ in L.DIAGNOSTICS},
                         "code": "abc1234", "load_start_1m": 1.5, "load_end_1m": 2.25, "cpu_count": 2,
                         "wall_time_s": 219.5, "started": "2026-12-01 10:00:00", "threads": "1",
                         "design": L.DECLARED, **dict(L.DESIGN.columns), **RAN_ON,
                         **{f"{L.VAL_PREFIX}{t}": y * t / 24 for t in range(0, 25, 4)}})
    return rows


def test_csv_round_trip_is_exact(tmp_path):
    rows = _rows({"lag1-noclip-none": -0.2})
    rows[3].update(status="failed", primary=None, final_acc=None, collapsed=None, collapse_reason=None)
    path = L.write_csv(tmp_path / "runs.csv", rows)
    back = L.read_csv(path)
    assert back == [{k: (None if v == "" else v) for k, v in r.items()} for r in rows]
    assert path.read_text().splitlines()[0].startswith("run_id,cell,lag,weights,clip,seed,order,status,primary")


@pytest.mark.parametrize("edit, why", [
    (lambda t: t.replace("run_id,", "run,", 1), "missing column(s) run_id"),
    (lambda t: t.replace(",started", ",started,extra", 1), "unknown column(s) extra"),
    (lambda t: t.replace(",abc1234,", ",abc1234,x,", 1), ":2: "),
    (lambda t: t.replace(",219.5,", ",fast,", 1), ":2: wall_time_s='fast' is not a number"),
])
def test_a_bad_csv_is_one_line_naming_file_and_line(tmp_path, edit, why):
    path = L.write_csv(tmp_path / "runs.csv", _rows({}, seeds=1))
    path.write_text(edit(path.read_text()))
    with pytest.raises(L.CSVError, match=re.escape(why)) as err:
        L.read_csv(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_primary_that_is_not_finite_is_one_line_naming_file_row_and_column(tmp_path, value):
    """A NaN or inf primary metric (an edited or broken runs.csv): reading, and rendering the report, stop on one line
    naming the file, its line and the column, not on a traceback from the SDs."""
    import csv

    path = L.write_csv(tmp_path / "runs.csv", _rows({}, seeds=2))
    table = list(csv.reader(path.read_text().splitlines()))
    table[3][table[0].index("primary")] = value
    path.write_text("\n".join(",".join(r) for r in table) + "\n")
    for read in (lambda: L.read_csv(path), lambda: L.render(path, tmp_path / "report")):
        with pytest.raises(L.CSVError) as err:
            read()
        assert str(err.value) == f"{path}:4: primary={value!r} is not a finite number"


def test_writing_the_csv_never_drops_a_finished_run(tmp_path):
    path = L.write_csv(tmp_path / "runs.csv", _rows({}, seeds=2))
    fewer = [dict(r, status="todo") if r["seed"] == 2 else r for r in _rows({}, seeds=2)]
    with pytest.raises(ValueError, match="holds 6 finished run"):
        L.write_csv(path, fewer)
    L.write_csv(path, _rows({}, seeds=2, rng_seed=4))  # the same runs finished: rewritten


def _verdicts(text: str) -> dict[str, list[str]]:
    return {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[1:-1]]
            for ln in text.splitlines() if re.match(r"\| [HS]\d ", ln)}


def test_tables_detect_planted_effects_and_not_a_null_one():
    """Planted: the lag costs the arm without weights or clip 0.2 and nothing else (H1, H2 and H3 true, H4 null)."""
    text = L.render_tables(_rows({"lag1-noclip-none": -0.2}))
    v = _verdicts(text)
    for h in ("H1", "H2", "H3"):  # columns: ..., p, Holm p, verdict
        assert v[h][-1] == "supported" and float(v[h][-3]) < 0.01 and float(v[h][-2]) <= 0.05, v[h]
    assert v["H4"][-1] == "not supported" and float(v["H4"][-2]) > 0.05  # no effect planted
    m = re.search(r"\| H1 \|.*?\| 12 \| (\S+) \[", text)
    assert m and float(m[1]) == pytest.approx(0.2, abs=0.03)
    assert "| lag1-noclip-none | 12/12 |" in text and "12 of 12" not in text and "72 of 72 runs finished" in text


def test_tables_are_a_function_of_the_csv_and_report_missing_runs(tmp_path):
    rows = _rows({"lag1-noclip-none": -0.2})
    rows[1].update(status="failed", primary=None)
    path = L.write_csv(tmp_path / "runs.csv", rows)
    text = L.render_tables(L.read_csv(path))
    assert text == L.render_tables(L.read_csv(path)) and "71 of 72 runs finished" in text
    assert "* lag1-noclip-none, seed 1: failed" in text
    assert "| H1 |" in text and re.search(r"\| H1 \|[^\n]*\| 11 \|", text)  # seed 1 left out of H1
    with pytest.raises(ValueError, match="cell\\(s\\) lag2 are not in the plan"):
        L.render_tables([dict(rows[0], cell="lag2")])


def test_the_committed_tables_are_rebuilt_from_the_committed_csv():
    csv_path = LAG_DIR / "runs.csv"
    if not csv_path.is_file():
        pytest.skip("docs/study/lag/runs.csv does not exist yet: the plan's runs (docs/study/lag/PLAN.md) have not run")
    assert (LAG_DIR / "results.md").read_text(encoding="utf-8") == L.render_tables(L.read_csv(csv_path))


def test_runs_to_csv_rows_with_metrics_collapse_and_load(monkeypatch, tiny_assets, tmp_path):
    from rpg import trainer_process as harness

    monkeypatch.setattr(harness, "run_trainer", LagFakeTrainer())
    specs = G.lag_grid(seeds=2, sizes=SMALL, cells=G.LAG_CELLS[:2])
    records = R.run_grid(specs, tmp_path, G.LAG_COSTS)
    rec = Rec.read_record(tmp_path, specs[0])
    rows = L.csv_rows(tmp_path, specs, records)
    assert [r["order"] for r in rows] == [1, 2, 3, 4] and [r["seed"] for r in rows] == [1, 1, 2, 2]
    r0 = next(r for r in rows if r["cell"] == "lag0-noclip-token" and r["seed"] == 1)
    r1 = next(r for r in rows if r["cell"] == "lag1-noclip-none" and r["seed"] == 1)
    # evaluations at 0, 2, 4: the primary metric is the mean of all three; steps >= 2 only for the diagnostics
    assert r0["primary"] == pytest.approx((0.31 + 0.41 + 0.51) / 3) and r0["final_acc"] == pytest.approx(0.51)
    assert r1["lag_versions"] == 1.0 and r1["lag_updates"] == 8.0 and r0["lag_versions"] == 0.0
    assert r1["behavior_weight_max"] == 5.0 and r1["grad_norm"] == pytest.approx(3.5) and r1["grad_norm_max"] == 4.5
    assert r1["lag_versions_max"] is None  # not logged: empty, never 0
    # lag 1 starts at 0.21 and ends at 0.41, above it: not collapsed; the load is the 1-minute average
    assert (r1["collapsed"], r1["collapse_reason"], r1["clip"], r1["weights"]) == (0, None, 0, "none")
    first = next(r for r in rows if r["run_id"] == specs[0].run_id)
    assert first["load_start_1m"] == rec["load_start"][0] and first["cpu_count"] == rec["cpu_count"]
    path = L.write_csv(tmp_path / "report" / "runs.csv", rows)
    assert L.read_csv(path) == rows


# ---- figures: one y-axis ----

def _figures(monkeypatch) -> list:
    from matplotlib.figure import Figure

    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: saved.append(self))
    return saved


def test_the_lag_figure_puts_every_cell_on_one_y_axis(monkeypatch, tmp_path):
    saved = _figures(monkeypatch)
    L.render_figure(_rows({"lag1-noclip-none": -0.2}), tmp_path / "lag.png")
    axes = saved[0].axes
    assert len(axes) == 6 and all(axes[0].get_shared_y_axes().joined(axes[0], ax) for ax in axes)
    assert {ax.get_ylim() for ax in axes} == {(0.0, 1.0)}


# ---- the CLI ----

def test_cli_lag_dry_run_estimate_and_refusals(tmp_path, capsys):
    assert main(["--lag", "--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    size = next(ln for ln in out.splitlines() if "72 runs" in ln)  # the grid and each run's size
    names(size, "(72 to run)", "24 steps", "16 prompts", "4 responses", "8 samples per problem")
    est = re.search(r"estimated time to run: (\d+)m(\d+)s with 2", out)
    assert est and int(est[1]) * 60 + int(est[2]) == pytest.approx(G.LAG_COSTS.grid_s(G.lag_grid(), 2), abs=1)
    assert "lag study budget 180m00s: the estimate fits" in out and not (tmp_path / "runs").exists()
    assert "design: declared (docs/study/lag/PLAN.md)\n" in out
    assert main(["--lag", "--dry-run", "--out", str(tmp_path), "--cells", "lag0-noclip-token", "--seeds", "1",
                 "--exploratory"]) == 0
    out = capsys.readouterr().out
    assert "1 runs (1 to run)" in out and out.startswith("design: EXPLORATORY")
    # the plan it departs from, and each flag that departs with the plan's value
    names(out.splitlines()[0], "docs/study/lag/PLAN.md", "--seeds 1 (declared 12)",
          "--cells lag0-noclip-token (declared lag0-noclip-token,lag1-noclip-none,")
    for flags, error in ((["--lag", "--staleness", "1"], "--lag and --staleness are two different grids"),
                         (["--cells", "lag0-noclip-token"], "--cells selects cells of the lag study: use it with"),
                         (["--lag", "--cells", "lag2"], "--cells lag2: expected some of lag0-noclip-token"),
                         (["--lag", "--seeds", "0"], "--seeds must be >= 1, got 0")):
        assert main(["--dry-run", "--out", str(tmp_path), *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"rpg_lab.study: {error}") and err.count("\n") == 1, err


def test_cli_render_only_from_the_csv_alone(tmp_path, capsys):
    assert main(["--lag", "--render-only", "--report-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rpg_lab.study: --render-only: no {tmp_path / 'runs.csv'}") and err.count("\n") == 1
    L.write_csv(tmp_path / "runs.csv", _rows({}))
    assert main(["--lag", "--render-only", "--report-dir", str(tmp_path), "--out", str(tmp_path / "none")]) == 0
    assert (tmp_path / "results.md").read_text() == L.render_tables(L.read_csv(tmp_path / "runs.csv"))
    assert (tmp_path / "lag.png").stat().st_size > 10_000 and not (tmp_path / "none").exists()


def test_the_pilot_figure_shares_the_y_axis_within_each_row(monkeypatch, tmp_path):
    from rpg_lab.study.render import staleness_figure

    saved = _figures(monkeypatch)
    specs = G.staleness_grid(seeds=1, staleness=(1, 2), sizes=G.Sizes(steps=4, test_freq=2, val_n=4))
    runs = {s.run_id: {"val-core/math_dapo/acc/mean@4": {4: 0.3 + 0.4 * ("clip" in s.variant)},
                       "actor/rpg/behavior_kl": {2: 0.01 * s.staleness * (1 + ("clip" in s.variant))}} for s in specs}
    staleness_figure(tmp_path / "staleness", runs, specs, "acc/mean@4")
    top_left, top_right, bottom_left, bottom_right = saved[0].axes  # rows: accuracy, behaviour KL
    assert top_left.get_shared_y_axes().joined(top_left, top_right)
    assert bottom_left.get_shared_y_axes().joined(bottom_left, bottom_right)
    assert not top_left.get_shared_y_axes().joined(top_left, bottom_left)
