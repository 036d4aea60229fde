"""The loss comparison on SmolLM2 (``python -m rpg_lab.study --model smol --loss``, docs/study/smol-loss/PLAN.md) without
Ray and without the model: its grid, seeds and run order; every arm's composed config against every other's (they
differ only in the loss and KL keys, and the filter arms in the filter and penalty keys); the overrides the study adds
(4 responses per validation problem, the rollout seed per block); the power's SDs read off the paper comparison's
committed runs.csv; the plan's generated numbers; the two Holm families on planted data; the command line."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from messages import names, one_line
from reading_rows import ROW, SEEDS_ROW, agrees

from rpg_lab.study import loss_arms as A
from rpg_lab.study import plan_and_results as DC
from rpg_lab.study import records as D
from rpg_lab.study import smol as S
from rpg_lab.study import smol_loss as L
from rpg_lab.study import stats
from rpg_lab.study.__main__ import main

ROOT = Path(__file__).resolve().parents[3]
CELLS = ("grpo", "dapo", "rpg-rf-urkl", "rpg-ufkl", "grpo-nofilter", "rpg-rf-urkl-nofilter")


def test_the_grid_is_six_arms_by_twelve_new_seeds_in_the_declared_order():
    specs = L.LOSS.grid()
    assert len(specs) == 72 and len({s.run_id for s in specs}) == 72
    assert [s.seed for s in specs] == [seed for seed in range(101, 113) for _ in range(6)]  # neither 1-3 nor 1-12
    assert set(L.LOSS.cells) == set(CELLS)
    assert {(s.sizes.steps, s.sizes.test_freq, s.sizes.val_n, s.sizes.val_problems, s.updates) for s in specs} == {
        (6, 6, 4, 200, 4)}
    for seed in (101, 112):  # the order within a seed: SHA-256 of "79:<seed>:<cell>"
        got = [L.LOSS.cell_of[s.variant] for s in specs if s.seed == seed]
        assert got == sorted(CELLS, key=lambda c: hashlib.sha256(f"79:{seed}:{c}".encode()).hexdigest())
    assert all(S.setting(m, S.LR_KEY) == 1e-6 for m in L.LOSS.methods)  # Table 3's one rate, x 20 on SmolLM2


def test_the_study_overrides_give_four_responses_and_the_blocks_rollout_seed():
    spec = next(s for s in L.LOSS.grid() if s.seed == 105)
    ov = spec.study_overrides(D._assets("smol"))
    assert "actor_rollout_ref.rollout.val_kwargs.n=4" in ov and "actor_rollout_ref.rollout.seed=105" in ov
    assert sum("val_kwargs.n=" in o for o in ov) == sum("rollout.seed=" in o for o in ov) == 1
    assert "data.seed=105" in ov and f"{S.LR_KEY}=2e-05" in ov
    # the earlier comparisons' runs keep their overrides (their identities): one response, rollout seed 1
    from rpg_lab.study.smol_paper import PAPER

    old = PAPER.grid(seeds=1)[0].study_overrides(D._assets("smol"))
    assert "actor_rollout_ref.rollout.seed=1" in old and "actor_rollout_ref.rollout.val_kwargs.n=1" in old


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict[str, dict]:
    """Every arm's config as the study launches it (seed 101), composed and through the driver's checks in a
    subprocess (the CPU platform registers at ``import verl`` time), resolved and flattened to dotted keys."""
    from rpg.paths.checkout import CHECKOUT, RECIPE_ENTRY
    from rpg.trainer_process import build_command

    tmp = tmp_path_factory.mktemp("loss")
    specs = L.LOSS.grid(seeds=1)
    plans, env = [], None
    for spec in specs:
        argv, env = build_command(D.spec_overrides(spec, tmp), entry=str(CHECKOUT / RECIPE_ENTRY))
        plans.append(argv[2:])
    (tmp / "plans.json").write_text(json.dumps(plans))
    code = ("import json, sys\nfrom omegaconf import OmegaConf\nfrom rpg.launch.plan import compose\nout = []\n"
            "for ov in json.load(open(sys.argv[1])):\n    cfg, s = compose(ov)\n"
            "    out.append(OmegaConf.to_container(cfg, resolve=True))\n"
            "json.dump(out, open(sys.argv[2], 'w'), default=str)")
    p = subprocess.run([sys.executable, "-c", code, str(tmp / "plans.json"), str(tmp / "cfgs.json")], env=env,
                       capture_output=True, text=True, timeout=300, cwd=CHECKOUT)
    assert p.returncode == 0, p.stderr[-3000:]
    cfgs = json.loads((tmp / "cfgs.json").read_text())
    return {L.LOSS.cell_of[s.variant]: (s.run_id, _flat(c)) for s, c in zip(specs, cfgs)}


def _differ(a: tuple[str, dict], b: tuple[str, dict]) -> set[str]:
    """The keys whose values differ between two arms' configs, less those that name the run itself (its folders and
    experiment name: each value holds its own run id)."""
    (id_a, x), (id_b, y) = a, b
    keys = {k for k in x.keys() | y.keys() if x.get(k) != y.get(k)}
    return {k for k in keys if not (id_a in str(x.get(k)) and id_b in str(y.get(k)))}


def _is_loss_key(key: str) -> bool:
    # the declared keys, and where the driver puts the loss they select (verl's actor policy_loss block)
    return key in A.LOSS_KEYS or key.startswith("actor_rollout_ref.actor.policy_loss.")


def test_the_arms_configs_differ_only_in_the_loss_and_kl_keys_and_the_filter(resolved):
    on = [c for c, _, f in A.ARMS if f]
    for i, a in enumerate(on):  # the four losses on one script: loss keys only, never the filter's or anything else
        for b in on[i + 1:]:
            keys = _differ(resolved[a], resolved[b])
            assert keys and all(_is_loss_key(k) for k in keys), (a, b, sorted(k for k in keys if not _is_loss_key(k)))
    for cell, loss, filtered in A.ARMS:
        if not filtered:  # the second factor: the same loss, the filter and penalty keys and nothing else
            assert _differ(resolved[cell], resolved[loss]) == set(A.FILTER_KEYS), cell
    cfg = {c: x for c, (_, x) in resolved.items()}
    for c in CELLS:  # what the script fixes, in every arm
        assert (cfg[c]["algorithm.adv_estimator"], cfg[c]["algorithm.norm_adv_by_std_in_grpo"],
                cfg[c]["actor_rollout_ref.actor.loss_agg_mode"], cfg[c]["actor_rollout_ref.actor.optim.lr"],
                cfg[c]["actor_rollout_ref.rollout.val_kwargs.n"], cfg[c]["trainer.total_training_steps"]) == (
            "rpg", False, "token-mean", 2e-05, 4, 6), c
        assert cfg[c]["algorithm.filter_groups.enable"] is (not c.endswith("nofilter")), c
    # each loss as declared
    assert (cfg["grpo"]["actor_rollout_ref.actor.use_kl_loss"], cfg["grpo"]["actor_rollout_ref.actor.kl_loss_type"],
            cfg["grpo"]["actor_rollout_ref.actor.kl_loss_coef"], cfg["grpo"]["rpg.reference.mode"],
            cfg["grpo"]["actor_rollout_ref.actor.clip_ratio_high"]) == (True, "low_var_kl", 0.001, "fixed", 0.2)
    assert (cfg["dapo"]["actor_rollout_ref.actor.use_kl_loss"], cfg["dapo"]["rpg.loss.name"],
            cfg["dapo"]["actor_rollout_ref.actor.clip_ratio_high"]) == (False, "verl", 0.28)
    assert [cfg["rpg-rf-urkl"][f"rpg.loss.{k}"] for k in ("name", "form", "divergence", "clip", "beta")] == [
        "rpg", "reinforce", "urkl", True, 0.0001]
    assert [cfg["rpg-ufkl"][f"rpg.loss.{k}"] for k in ("name", "form", "divergence")] == [
        "rpg", "differentiable", "ufkl"]


def test_the_differ_check_can_fail():
    """A key outside the loss's, changed in one arm, is caught; the run's own names are not counted."""
    x = {"rpg.loss.name": "verl", "trainer.experiment_name": "run-a", "data.seed": 1}
    y = {"rpg.loss.name": "rpg", "trainer.experiment_name": "run-b", "data.seed": 2}
    assert _differ(("run-a", x), ("run-b", y)) == {"rpg.loss.name", "data.seed"}
    assert not all(_is_loss_key(k) for k in _differ(("run-a", x), ("run-b", y)))


def test_the_power_reads_the_paper_comparisons_committed_runs():
    """The SDs recomputed here from docs/study/smol-paper/runs.csv, and the 4-response SD by its formula."""
    import csv

    with open(ROOT / "docs/study/smol-paper/runs.csv", newline="") as fh:
        y = {(r["cell"], int(r["seed"])): float(r["primary"]) for r in csv.DictReader(fh)}
    got = {a.name: a for a in L.analogue_sds()}
    for name, (a, b) in L.ANALOGUE.items():
        d = [y[(a, s)] - y[(b, s)] for s in range(1, 13)]
        assert got[name].sd == pytest.approx(statistics.stdev(d), abs=1e-12)
        pa, pb = (statistics.fmean(y[(c, s)] for s in range(1, 13)) for c in (a, b))
        v = (pa * (1 - pa) + pb * (1 - pb)) / 200
        assert got[name].sd_k == pytest.approx(math.sqrt(max(0.0, statistics.variance(d) - v) + v / 4), abs=1e-12)
        assert got[name].sd_k < got[name].sd
    assert got["L1"].sd == pytest.approx(0.045, abs=5e-4) and got["L2"].sd == pytest.approx(0.082, abs=5e-4)
    assert L.with_responses(0.01, 0.3, 0.3, 4, 200) == pytest.approx(math.sqrt(2 * 0.21 / 200 / 4))  # all binomial


def test_the_plans_numbers_are_the_codes():
    text = (ROOT / L.LOSS.plan).read_text(encoding="utf-8")
    block = DC.generated_block(text, "plan_numbers")
    assert block is not None, f"{L.LOSS.plan} has no plan_numbers block"
    assert block == L.plan_numbers()
    assert L.LOSS.cost_model().grid_s(L.LOSS.grid(), 1) <= L.LOSS.budget_s


def _rows(effects: dict[str, float], noise: float = 0.01, rng_seed: int = 7) -> list[dict]:
    rng = random.Random(rng_seed)
    rows, order = [], 0
    for seed in range(101, 113):
        block = rng.gauss(0, 0.05)
        for m in L.LOSS.methods:
            order += 1
            cell = L.LOSS.cell_of[m]
            v = 0.4 + block + effects.get(cell, 0.0) + rng.gauss(0, noise)
            rows.append({"run_id": f"{m}-seed{seed}", "cell": cell, "method": m, "lr": 2e-5, "seed": seed,
                         "order": order, "status": "done", "primary": v, **{n: 1.0 for n, _ in S.DIAGNOSTICS},
                         "code": "abc1234", "load_start_1m": 1.0, "load_end_1m": 1.0, "cpu_count": 2,
                         "wall_time_s": 400.0, "started": "2026-11-29 10:00:00", "threads": "2",
                         "design": DC.DECLARED, **dict(L.LOSS.DESIGN.columns), f"{DC.VAL_PREFIX}6": v})
    return rows


def test_holm_runs_within_each_family():
    """Planted: RPG-REINFORCE-URKL's loss 0.1 above every other arm with the filter. Holm adjusts L1-L3 among
    themselves and F1-F3 among themselves, never across."""
    rows = _rows({"rpg-rf-urkl": 0.1})
    tested = L.LOSS.tested(rows)
    assert [t.result.contrast.name for t in tested] == ["L1", "L2", "L3", "F1", "F2", "F3"]
    assert [t.two_sided for t in tested] == [False, False, False, True, True, False]
    ps = [t.p for t in tested]
    assert [t.holm for t in tested] == pytest.approx(stats.holm(ps[:3]) + stats.holm(ps[3:]))
    assert stats.holm(ps) != pytest.approx(stats.holm(ps[:3]) + stats.holm(ps[3:]))  # one family would differ
    y = {(r["cell"], r["seed"]): r["primary"] for r in rows}
    d = [y[("rpg-rf-urkl", s)] - y[("rpg-rf-urkl-nofilter", s)] for s in range(101, 113)]
    assert tested[4].p == pytest.approx(min(1.0, 2 * min(stats.sign_flip_p(d), stats.sign_flip_p([-x for x in d]))))
    text = L.LOSS.render_tables(rows)
    assert "Holm within each family (L1-L3; F1-F3)" in text and "72 of 72 runs finished" in text
    rows[0]["seed"] = 1  # a declared runs.csv holds seeds 101-112 only
    with pytest.raises(ValueError, match="not the 72 runs the plan declares"):
        L.LOSS.render_tables(rows)


def test_the_plans_descriptive_contrasts_are_reported_without_a_test():
    """PLAN.md's four descriptive contrasts, each d_s computed here from the rows by its own formula: DAPO - GRPO,
    RPG-UFKL - RPG-REINFORCE-URKL, the interaction (F2 - F1) and rpg-rf-urkl - grpo-nofilter; no p-value beside
    them. A run that finished without its primary metric is named and leaves them, as it leaves the tests."""
    rows = _rows({"dapo": 0.03, "rpg-rf-urkl": 0.05, "grpo-nofilter": -0.02})
    y = {(r["cell"], r["seed"]): r["primary"] for r in rows}
    want = {"D1": lambda s: y["dapo", s] - y["grpo", s],
            "D2": lambda s: y["rpg-ufkl", s] - y["rpg-rf-urkl", s],
            "D3": lambda s: (y["rpg-rf-urkl", s] - y["rpg-rf-urkl-nofilter", s]) - (y["grpo", s] - y["grpo-nofilter", s]),
            "D4": lambda s: y["rpg-rf-urkl", s] - y["grpo-nofilter", s]}
    text = L.LOSS.render_tables(rows)
    section = text.split("## Descriptive contrasts")[1]
    for name, f in want.items():
        d = [f(s) for s in range(101, 113)]
        line = next(x for x in section.splitlines() if x.startswith(f"| {name} |"))
        assert f"| 12 | {', '.join(f'{x:+.3f}' for x in d)} | {statistics.fmean(d):+.3f} ± " \
               f"{statistics.stdev(d):.3f} |" in line, line
    assert [c.name for c in L.LOSS.descriptive] == list(want)
    assert "| contrast | what | d_s | seeds | per seed | mean d_s ± SD |" in section  # no p-value column
    gone = next(r for r in rows if r["cell"] == "dapo" and r["seed"] == 105)
    gone["primary"] = None  # finished, but no held-out accuracy at step 6 in its metrics
    text = L.LOSS.render_tables(rows)
    assert "* DAPO's loss, seed 105: done without its primary metric (the held-out accuracy at step 6)" in text
    assert f"| {S.label_of(gone['method'])} | 2e-05 | 11/12 | " in text
    d1 = next(x for x in text.split("## Descriptive contrasts")[1].splitlines() if x.startswith("| D1 |"))
    l3 = next(t for t in L.LOSS.tested(rows) if t.result.contrast.name == "L3")
    assert "| 11 |" in d1 and 105 not in l3.result.seeds and len(l3.result.d) == 11


def test_the_sensitivity_check_leaves_out_the_seeds_run_on_two_kinds_of_kernels():
    """Seeds whose arms record two kinds of CPU kernels (104 and 107 in the committed runs.csv) leave the sensitivity
    check; each family is tested on the other ten seeds, its p-values computed here from the rows by hand."""
    rows = _rows({"rpg-rf-urkl": 0.04})
    for r in rows:
        r["kernels"] = "AVX2" if (r["seed"], r["order"] % 6) in ((104, 1), (107, 2)) else "AVX512"
    r = next(r for r in rows if r["seed"] == 109 and r["cell"] == "grpo")
    r["status"], r["kernels"] = "failed", "AVX2"  # a run that did not finish does not split its seed
    assert L.mixed_kernel_seeds(rows) == (104, 107)
    left_out, tested = L.without_mixed_kernels(rows)
    assert left_out == (104, 107)
    seeds = [s for s in range(101, 113) if s not in (104, 107)]
    y = {(r["cell"], r["seed"]): r["primary"] for r in rows if r["status"] == "done"}
    l1 = [y["rpg-rf-urkl", s] - y["grpo", s] for s in seeds if ("grpo", s) in y]
    f1 = [y["grpo", s] - y["grpo-nofilter", s] for s in seeds if ("grpo", s) in y and ("grpo-nofilter", s) in y]
    by = {t.result.contrast.name: t for t in tested}
    assert all(104 not in t.result.seeds and 107 not in t.result.seeds for t in tested)
    assert by["L1"].result.d == pytest.approx(l1) and by["L1"].p == pytest.approx(stats.sign_flip_p(l1))
    assert by["F1"].p == pytest.approx(min(1.0, 2 * min(stats.sign_flip_p(f1), stats.sign_flip_p([-x for x in f1]))))
    ps = [t.p for t in tested]
    assert [t.holm for t in tested] == pytest.approx(stats.holm(ps[:3]) + stats.holm(ps[3:]))
    assert L.mixed_kernel_seeds([dict(r, kernels="AVX512") for r in rows]) == ()
    with pytest.raises(ValueError, match=r"runs.csv: run .*seed101 finished without its CPU kernels recorded"):
        L.mixed_kernel_seeds([dict(r, kernels=None) if r["seed"] == 101 else r for r in rows])
    # the committed runs.csv splits the seeds DEVIATIONS.md section 4 names, and no other (a new one needs its entry)
    assert L.mixed_kernel_seeds(L.LOSS.read_csv(ROOT / L.LOSS.folder / "runs.csv")) == (104, 107)


def test_the_reading_tables_are_the_codes_and_wait_for_every_run(tmp_path, capsys):
    """``reading_tables`` prints each hypothesis and the same tests without the seeds of two kinds of kernels in the
    form docs/study.md's Reading check reads back, to the digits printed; the command line prints them from a CSV and
    refuses, in one line and with no number, while a run is unfinished."""
    rows = _rows({"rpg-rf-urkl": 0.05, "grpo-nofilter": -0.08})
    for r in rows:
        r["kernels"] = "AVX2" if (r["seed"], r["cell"]) == (107, "dapo") else "AVX512"
    lines = L.reading_tables(rows).splitlines()
    main_rows = [m for x in lines if (m := ROW.match(x))]
    seed_rows = [m for x in lines if (m := SEEDS_ROW.match(x))]
    tested, (left_out, without) = L.LOSS.tested(rows), L.without_mixed_kernels(rows)
    assert [m["name"] for m in main_rows] == [m["name"] for m in seed_rows] == ["L1", "L2", "L3", "F1", "F2", "F3"]
    assert left_out == (107,) and "Without seeds 107 (a sensitivity check, not a test):" in lines
    for ms, ts in ((main_rows, tested), (seed_rows, without)):
        for m, t in zip(ms, ts):
            lo, hi = t.result.ci
            for key, value in (("mean", t.result.mean), ("lo", lo), ("hi", hi), ("p", t.p), ("holm", t.holm)):
                assert agrees(m[key], value), (m.group(0), key, value)
    for m, t in zip(main_rows, tested):
        assert m["verdict"] == ("supported" if t.holm <= 0.05 else "not supported")
        assert ("(two-sided)" if t.two_sided else "(one-sided)") in m.group(0)
    planted = {"L1", "L3", "F1", "F2", "F3"}  # 0.05 or 0.08 in every seed against a noise SD of 0.014
    assert all(m["verdict"] == "supported" for m in main_rows if m["name"] in planted)
    for m, t in zip(seed_rows, without):
        assert (int(m["n"]), int(m["up"])) == (len(t.result.d), sum(x > 0 for x in t.result.d)) and int(m["n"]) == 11
    assert (int(seed_rows[0]["n"]), int(seed_rows[0]["up"])) == (11, 11)
    L.LOSS.write_csv(tmp_path / "runs.csv", rows)
    assert L.main(["--reading", str(tmp_path / "runs.csv")]) == 0
    assert capsys.readouterr().out == L.reading_tables(L.LOSS.read_csv(tmp_path / "runs.csv"))
    for status in ("todo", "failed"):  # a failed run is rerun once first (PLAN.md, Missing data)
        L.LOSS.write_csv(tmp_path / "open.csv", [dict(r, status=status, primary=None) if i == 5 else r
                                                 for i, r in enumerate(rows)])
        assert L.main(["--reading", str(tmp_path / "open.csv")]) == 2
        out, err = capsys.readouterr()
        names(one_line(err), "open.csv", "1 of 72 runs not done", "before all of them finish")
        assert out == "" and not re.search(r"\d\.\d", err)
    with pytest.raises(ValueError, match=r"run .* finished without its primary metric"):
        L.reading_tables([dict(r, primary=None) if i == 5 else r for i, r in enumerate(rows)])
    with pytest.raises(ValueError, match="an exploratory design: its p-values are descriptive"):
        L.reading_tables([dict(r, design="exploratory: --steps 3") for r in rows])
    with pytest.raises(ValueError, match="not the 72 runs the plan declares"):
        L.reading_tables(rows[:-1])


def test_a_readings_verdict_is_holms_not_the_raw_p():
    """L2's one-sided p is 0.019 (10 of 12 seeds +0.05, two -0.05), L1's and L3's about 0.5: Holm's 3 x 0.019 > 0.05,
    so L2 is not supported although its raw p is below 0.05."""
    rows = _rows({}, noise=0.0)
    d = dict(zip(range(101, 113), [0.05] * 10 + [-0.05] * 2))
    for r in rows:
        up = {"rpg-ufkl": d[r["seed"]], "rpg-rf-urkl": 0.01 * (-1) ** r["seed"]}.get(r["cell"], 0.0)
        r["primary"] = r[f"{DC.VAL_PREFIX}6"] = r["primary"] + up
        r["kernels"] = "AVX512"
    l2 = next(t for t in L.LOSS.tested(rows) if t.result.contrast.name == "L2")
    assert l2.p <= 0.05 < l2.holm, (l2.p, l2.holm)
    line = next(x for x in L.reading_tables(rows).splitlines() if x.startswith("| L2 |"))
    assert ROW.match(line)["verdict"] == "not supported", line


def test_the_command_line(tmp_path, capsys):
    assert main(["--loss", "--dry-run", "--out", str(tmp_path / "s")]) == 2
    names(one_line(capsys.readouterr().err), "rpg_lab.study: --loss", "--model smol")  # the flag and the one it needs
    with pytest.raises(SystemExit) as stop:  # argparse's one line: the two are exclusive
        main(["--model", "smol", "--loss", "--paper", "--dry-run", "--out", str(tmp_path / "s")])
    assert stop.value.code == 2 and "argument --paper: not allowed with argument --loss" in capsys.readouterr().err
    assert main(["--model", "smol", "--loss", "--dry-run", "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("design: declared (docs/study/smol-loss/PLAN.md)\n") and "72 runs (72 to run)" in out
    assert re.search(r"seed101-\w+\n", out) and "seed113" not in out and not (tmp_path / "s").exists()
    assert "smol study budget 540m00s: the estimate fits" in out
    assert main(["--model", "smol", "--loss", "--dry-run", "--steps", "3", "--out", str(tmp_path / "s")]) == 2
    err = names(one_line(capsys.readouterr().err), "rpg_lab.study: --steps 3", "(docs/study/smol-loss/PLAN.md)",
                "--exploratory")  # the flag refused, the plan that declares the value, the way to run it anyway
    assert re.search(r"\b6\b", err.split("(docs/")[0])  # the declared 6


def test_results_are_rendered_from_a_csv_alone(tmp_path):
    """runs.csv of the 72 declared runs (seeds 101-112) read back exactly, results.md and the figure from it."""
    rows = _rows({"rpg-rf-urkl": 0.05})
    L.LOSS.write_csv(tmp_path / "runs.csv", rows)
    back = L.LOSS.read_csv(tmp_path / "runs.csv")  # with what each run ran on, not recorded here: None
    assert [{k: r[k] for k in rows[0]} for r in back] == rows and {r["model_sha256"] for r in back} == {None}
    assert main(["--model", "smol", "--loss", "--render-only", "--report-dir", str(tmp_path)]) == 0
    text = (tmp_path / "results.md").read_text()
    assert text == L.LOSS.render_tables(rows) and text.startswith("# The loss comparison on SmolLM2: results")
    assert "| GRPO's loss, no filter or penalty | 2e-05 | 12/12 | " in text and "seed 101 |" in text
    assert (tmp_path / "smol-loss.png").stat().st_size > 10_000


def test_runs_csv_records_each_runs_settings_digest(tmp_path):
    """runs.csv's ``settings``: 12 hex digits of the sha256 of the run's identity (its run.json), so two arms'
    rows name different settings and a run not started none."""
    specs = L.LOSS.grid(seeds=1)[:2]
    idents = [[["data.seed", "101"], ["rpg.loss.name", name]] for name in ("verl", "rpg")]
    rows = L.LOSS.csv_rows(tmp_path, specs, [{"status": "todo", "identity": i} for i in idents])
    want = [hashlib.sha256(json.dumps(i, sort_keys=True).encode()).hexdigest()[:12] for i in idents]
    assert [r["settings"] for r in rows] == want and want[0] != want[1]
    assert L.LOSS.csv_rows(tmp_path, specs[:1], [{}])[0]["settings"] is None
    L.LOSS.write_csv(tmp_path / "runs.csv", rows)
    assert [r["settings"] for r in L.LOSS.read_csv(tmp_path / "runs.csv")] == want
