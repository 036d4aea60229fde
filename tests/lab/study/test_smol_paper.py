"""The paper's comparison on SmolLM2 (``python -m rpg_lab.study --model smol --paper``, docs/study/smol-paper/PLAN.md)
without Ray and without the model: its grid and run order, the new methods' composed configs through the driver's
checks, the costs and the power read off committed data, the plan's generated numbers, the hypotheses' tests on
planted data, the command line, and the results rebuilt from the committed runs.csv."""

from __future__ import annotations

import csv
import json
import math
import random
import re
import statistics
from pathlib import Path

import pytest
from messages import names, one_line

from rpg_lab.study import plan_and_results as DC
from rpg_lab.study import stats
from rpg_lab.study import smol as S
from rpg_lab.study import smol_paper as P
from rpg_lab.study.__main__ import main

ROOT = Path(__file__).resolve().parents[3]
PAPER_DIR = ROOT / "docs" / "study" / "smol-paper"
# the paper scripts' learning rates (their experiment files, rpg_lab.study.methods.setting)
PAPER_LR = {"run_grpo_7b": 1e-6, "run_dapo_7b": 1e-6, "run_rpg_7b_ufkl1e-4": 1e-6,
            "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28": 5e-7, "run_rpg_7b_urkl1e-4_rf_clip_ppo_0.2_0.28": 5e-7}


def test_the_grid_is_five_methods_by_twelve_seeds_in_the_declared_order():
    specs = P.PAPER.grid()
    assert len(specs) == 60 and len({s.run_id for s in specs}) == 60
    assert [s.seed for s in specs] == [seed for seed in range(1, 13) for _ in range(5)]
    for seed in range(1, 13):
        assert sorted(s.variant for s in specs if s.seed == seed) == sorted(PAPER_LR)
    assert {(s.sizes, s.updates, s.model) for s in specs} == {(S.PILOT.sizes, 4, "smol")}  # the pilot's sizes
    # the order within a seed: SHA-256 of "67:<seed>:<cell>" (PLAN.md), not the pilot's seed 60
    assert [P.PAPER.cell_of[s.variant] for s in specs[:5]] == ["rpg-rf-ufkl", "dapo", "grpo", "rpg-ufkl",
                                                              "rpg-rf-urkl"]
    assert [s.run_id for s in P.PAPER.grid(order_seed=60)] != [s.run_id for s in specs]
    for m, lr in PAPER_LR.items():
        assert S.setting(m, S.LR_KEY) == lr


def test_the_new_methods_compose_and_pass_the_drivers_checks(tmp_path):
    """DAPO and RPG-REINFORCE-URKL (the methods the pilot did not run), as the harness starts them on the CPU backend
    with SmolLM2, compose and pass the driver's checks before Ray (in a subprocess, as tests/lab/study/test_study.py's)."""
    from test_study import _composed

    specs = [s for s in P.PAPER.grid(seeds=1) if s.variant in ("run_dapo_7b", "run_rpg_7b_urkl1e-4_rf_clip_ppo_0.2_0.28")]
    got = _composed(specs, tmp_path, "s.loss_name, s.loss.form, s.loss.clip, s.reference.mode, "
                    "cfg.algorithm.filter_groups.enable, cfg.actor_rollout_ref.actor.optim.lr, cfg.trainer.device",
                    timeout=300)
    by = {s.variant: g for s, g in zip(specs, got)}
    assert by["run_dapo_7b"] == ["verl", "reinforce", "True", "sampler", "True", "2e-05", "cpu"]
    assert by["run_rpg_7b_urkl1e-4_rf_clip_ppo_0.2_0.28"] == ["rpg", "reinforce", "True", "sampler", "True", "1e-05",
                                                              "cpu"]


def test_the_costs_and_the_paired_sd_are_the_committed_datas():
    """Recomputed here from the committed files: the SmolLM2 run's medians (docs/smol/default-run-metrics.jsonl), the
    pilot's refills and its paired SD (docs/study/smol/runs.csv; pooled as the root of the mean variance)."""
    records = [json.loads(line) for line in (ROOT / "docs/smol/default-run-metrics.jsonl").read_text().splitlines()]

    def median(key):
        return statistics.median(r["data"][key] for r in records if r["step"] >= 1 and key in r["data"])

    c = P.PAPER.costs
    assert (c.step_s, c.gen_s, c.log_prob_s) == pytest.approx(
        (median("timing_s/step"), median("timing_s/gen"), median("timing_s/old_log_prob")), abs=0.005)
    assert c.val_s_per_problem * 200 == pytest.approx(median("timing_s/testing"), abs=0.005)
    with open(ROOT / "docs/study/smol/runs.csv", newline="") as fh:
        pilot = list(csv.DictReader(fh))
    refills = [float(r["refill_gen_batches"]) for r in pilot if r["refill_gen_batches"]]
    assert len(refills) == 6 and c.refill_batches == pytest.approx(sum(refills) / 6, abs=0.005)
    y = {(r["cell"], int(r["seed"])): float(r["primary"]) for r in pilot}
    pairs = (("rpg-rf-clip", "grpo"), ("rpg-ufkl", "grpo"), ("rpg-rf-clip", "rpg-ufkl"))
    var = [statistics.variance([y[(a, s)] - y[(b, s)] for s in (1, 2, 3)]) for a, b in pairs]
    assert P.pilot_paired_sd() == pytest.approx(math.sqrt(sum(var) / 3), abs=5e-4) == pytest.approx(0.053, abs=5e-4)
    # a run's estimate: start-up and shutdown, 3 steps with the method's extra passes, one validation
    cost = P.PAPER.cost_model()
    by = {s.variant: s for s in P.PAPER.grid(seeds=1)}
    assert cost.run_s(by["run_grpo_7b"]) == pytest.approx(74 + 3 * (c.step_s + c.log_prob_s) + 200 * c.val_s_per_problem)
    assert cost.run_s(by["run_dapo_7b"]) == pytest.approx(
        74 + 3 * (c.step_s + c.refill_batches * c.gen_s) + 200 * c.val_s_per_problem)
    assert cost.grid_s(P.PAPER.grid(), 1) <= P.PAPER.budget_s


def test_the_plans_numbers_are_the_codes():
    """PLAN.md's generated block is exactly what ``python -m rpg_lab.study.smol_paper`` prints."""
    block = DC.generated_block((PAPER_DIR / "PLAN.md").read_text(encoding="utf-8"), "plan_numbers")
    assert block is not None, "PLAN.md has no plan_numbers block"
    assert block == P.plan_numbers()


def _rows(effects: dict[str, float], seeds: int = 12, noise: float = 0.01, rng_seed: int = 5) -> list[dict]:
    """Synthetic runs.csv rows: primary = 0.3 + a seed's block effect (SD 0.05) + the cell's effect + noise."""
    rng = random.Random(rng_seed)
    rows, order = [], 0
    for seed in range(1, seeds + 1):
        block = rng.gauss(0, 0.05)
        for m in P.PAPER.methods:
            order += 1
            y = 0.3 + block + effects.get(P.PAPER.cell_of[m], 0.0) + rng.gauss(0, noise)
            rows.append({"run_id": f"{m}-seed{seed}", "cell": P.PAPER.cell_of[m], "method": m, "lr": PAPER_LR[m] * 20,
                         "seed": seed, "order": order, "status": "done", "primary": y,
                         **{name: 1.0 for name, _ in S.DIAGNOSTICS}, "code": "abc1234", "load_start_1m": 1.5,
                         "load_end_1m": 2.0, "cpu_count": 2, "wall_time_s": 240.0, "started": "2026-11-27 14:00:00",
                         "threads": "2", "design": DC.DECLARED, **dict(P.PAPER.DESIGN.columns), f"{DC.VAL_PREFIX}3": y})
    return rows


def _hypotheses(text: str) -> dict[str, list[str]]:
    return {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[1:-1]]
            for ln in text.splitlines() if re.match(r"\| H\d ", ln)}


def test_each_hypothesis_gets_its_exact_p_95_interval_and_holm():
    """Planted: RPG-REINFORCE-URKL 0.1 above every other method in every seed, the rest equal. H1 and H4 then have all
    12 d_s positive (p = 1/4096, Holm 4/4096 and 3/4096... as rpg_lab.study.stats computes), H2 and H3 are noise."""
    rows = _rows({"rpg-rf-urkl": 0.1})
    text = P.PAPER.render_tables(rows)
    h = _hypotheses(text)  # columns: name, claim, d_s, seeds, per seed, mean [interval], p, Holm p
    assert sorted(h) == ["H1", "H2", "H3", "H4"] and all(v[3] == "12" for v in h.values())
    y = {(r["cell"], r["seed"]): r["primary"] for r in rows}
    for name, (a, b) in {"H1": ("rpg-rf-urkl", "grpo"), "H2": ("rpg-rf-ufkl", "grpo"), "H3": ("rpg-ufkl", "grpo"),
                         "H4": ("rpg-rf-urkl", "dapo")}.items():
        d = [y[(a, s)] - y[(b, s)] for s in range(1, 13)]
        lo, hi = stats.sign_flip_ci(d, 0.95)
        assert h[name][5] == f"{sum(d) / 12:.3f} 95 % [{lo:.3f}, {hi:.3f}]", name
        assert h[name][6] == f"{stats.sign_flip_p(d):.4g} (one-sided)", name
    assert h["H1"][6] == h["H4"][6] == f"{1 / 4096:.4g} (one-sided)"
    ps = [stats.sign_flip_p([y[(a, s)] - y[(b, s)] for s in range(1, 13)])
          for a, b in (("rpg-rf-urkl", "grpo"), ("rpg-rf-ufkl", "grpo"), ("rpg-ufkl", "grpo"), ("rpg-rf-urkl", "dapo"))]
    assert [h[n][7] for n in ("H1", "H2", "H3", "H4")] == [f"{p:.4g}" for p in stats.holm(ps)]
    assert "Holm" in text and "1/4096" in text  # the correction, and the smallest p 12 seeds allow
    # the title, and the command that rebuilds the file from its CSV
    assert text.startswith("# The paper's comparison on SmolLM2: results")
    names(text.splitlines()[0], "runs.csv", "`python -m rpg_lab.study --model smol --paper --render-only`",
          "do not edit")
    assert "60 of 60 runs finished" in text and "| DAPO | 2e-05 | 12/12 |" in text


def test_the_command_line(tmp_path, capsys):
    assert main(["--paper", "--dry-run", "--out", str(tmp_path / "s")]) == 2
    names(one_line(capsys.readouterr().err), "rpg_lab.study: --paper", "--model smol")  # the flag and the one it needs
    assert main(["--model", "smol", "--paper", "--dry-run", "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("design: declared (docs/study/smol-paper/PLAN.md)\n") and "60 runs (60 to run)" in out
    assert "smol study budget 240m00s: the estimate fits" in out and not (tmp_path / "s").exists()
    assert main(["--model", "smol", "--paper", "--dry-run", "--seeds", "3", "--out", str(tmp_path / "s")]) == 2
    err = names(one_line(capsys.readouterr().err), "rpg_lab.study: --seeds 3", "(docs/study/smol-paper/PLAN.md)",
                "--exploratory")  # the flag refused, the plan that declares the value, the way to run it anyway
    assert re.search(r"\b12\b", err.split("(docs/")[0])  # the declared 12
    assert main(["--model", "smol", "--paper", "--dry-run", "--methods", "run_rpg_7b_fkl1e-4",
                 "--out", str(tmp_path / "s")]) == 2
    names(one_line(capsys.readouterr().err), "--methods run_rpg_7b_fkl1e-4", "--model smol --paper",
          *P.PAPER.methods)  # the method refused, the study, the methods it allows
    # render-only from a CSV alone
    P.PAPER.write_csv(tmp_path / "r" / "runs.csv", _rows({}))
    assert main(["--model", "smol", "--paper", "--render-only", "--report-dir", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "results.md").read_text() == P.PAPER.render_tables(_rows({}))
    assert (tmp_path / "r" / "smol-paper.png").stat().st_size > 10_000


def test_the_committed_results_are_rebuilt_from_the_committed_csv():
    csv_path = PAPER_DIR / "runs.csv"
    if not csv_path.is_file():
        pytest.skip("docs/study/smol-paper/runs.csv does not exist yet: the plan's runs have not started")
    assert (PAPER_DIR / "results.md").read_text(encoding="utf-8") == P.PAPER.render_tables(P.PAPER.read_csv(csv_path))


def test_a_study_under_way_says_its_tests_are_no_result_and_each_interval_fits_its_seeds():
    """Seeds 3-12 not run yet, and seed 2's GRPO: results.md says the plan reads no result yet; H1 (2 seeds) gets the
    50 % interval 2 seeds allow, H2-H3 (1 seed, GRPO missing in seed 2) none."""
    rows = _rows({"rpg-rf-urkl": 0.05})
    for r in rows:
        if r["seed"] > 2 or (r["seed"] == 2 and r["cell"] == "grpo"):
            r.update(status="todo", primary=None, **{f"{DC.VAL_PREFIX}3": None})
    text = P.PAPER.render_tables(rows)
    assert "**Under way: 51 of 60 runs not finished.**" in text  # the runs not finished, counted
    h = _hypotheses(text)
    assert (h["H1"][3], h["H4"][3], h["H2"][3]) == ("1", "2", "1")
    y = {(r["cell"], r["seed"]): r["primary"] for r in rows}
    d = sorted(y[("rpg-rf-urkl", s)] - y[("dapo", s)] for s in (1, 2))
    assert h["H4"][5] == f"{sum(d) / 2:.3f} 50 % [{d[0]:.3f}, {d[1]:.3f}]" and h["H1"][5].endswith(" —")
    assert "Under way" not in P.PAPER.render_tables(_rows({}))  # every run finished: no such line
