"""The SmolLM2 comparison (``python -m rpg_lab.study --model smol``, docs/study/smol/PLAN.md) without Ray and without the
model: its grid and run order, each method's overrides (its algorithm untouched, SmolLM2's model, task and sizes, the
learning-rate rule), the composed configs through the driver's checks, the costs, the dry run and the refusals, the
plan's generated numbers, the per-run CSV and the tables and figure rebuilt from it."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pytest
from messages import names, one_line
from test_lag_study import RAN_ON

from rpg_lab.study import costs as C
from rpg_lab.study import plan_and_results as DC
from rpg_lab.study import grid as G
from rpg_lab.study import lag
from rpg_lab.study import records as D
from rpg_lab.study import runner as R
from rpg_lab.study import smol as S
from rpg_lab.study.__main__ import main

ROOT = Path(__file__).resolve().parents[3]
SMOL_DIR = ROOT / "docs" / "study" / "smol"
PAPER_LR = {"run_grpo_7b": 1e-6, "run_rpg_7b_ufkl1e-4": 1e-6, "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28": 5e-7}


def _kv(overrides: list[str]) -> dict[str, str]:
    from launch_expected import effective

    return effective(overrides)


# ---- the grid ----

def test_seeds_are_blocks_and_the_run_order_is_the_declared_seeds():
    specs = S.PILOT.grid()
    assert len(specs) == 9 and len({s.run_id for s in specs}) == 9
    assert [s.seed for s in specs] == [1, 1, 1, 2, 2, 2, 3, 3, 3]  # seed-major blocks
    for seed in (1, 2, 3):
        assert sorted(s.variant for s in specs if s.seed == seed) == sorted(S.PILOT.methods)
    assert {(s.sizes, s.updates, s.model) for s in specs} == {(S.PILOT.sizes, 4, "smol")}
    # the order within a seed is the declared order seed's (PLAN.md), and another order seed gives another order
    assert [S.PILOT.cell_of[s.variant] for s in specs] == ["rpg-rf-clip", "rpg-ufkl", "grpo", "grpo", "rpg-ufkl", "rpg-rf-clip",
                                                  "grpo", "rpg-ufkl", "rpg-rf-clip"]
    assert [s.run_id for s in S.PILOT.grid(order_seed=61)] != [s.run_id for s in specs]
    assert specs[0].run_id.startswith("run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28-smol-k4-seed1-")
    # the tiny grids' run ids are unchanged (their finished runs stay finished): the values main had
    assert G.grid()[0].run_id == "run_grpo_7b-k4-seed1-c68544"
    assert G.lag_grid()[0].run_id == "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28-k8-sep8-lag1-bypass-seed1-f8596a"
    assert G.staleness_grid()[0].run_id == "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28-k1-sep1-token-seed1-a8d7eb"
    assert G.Sizes().validations == 5 and S.PILOT.sizes.validations == 1  # 0, 4, ..., 16; only the last step


def test_the_learning_rate_rule_keeps_the_smol_runs_and_the_papers_ratios():
    from rpg.smol import overrides as smol

    assert S.lr_scale() == pytest.approx(20.0) and smol.LR == 1e-5
    for m in S.PILOT.methods:
        assert S.setting(m, S.LR_KEY) == PAPER_LR[m]  # the experiment files' learning rates


def test_each_methods_overrides_keep_its_algorithm_and_put_smol_in_place(tmp_path):
    """Against the rehearsal's own plan for the same run (``RPG_CPU_MODEL=smol``: the method's settings, SmolLM2's
    model, task and sizes), the study changes only its schedule, validation, learning rate, warm-up, seeds and names."""
    from launching import planned

    from rpg.smol import overrides as smol
    from rpg.smol.build import planned_assets

    assets = planned_assets()
    for spec in S.PILOT.grid(seeds=2):
        kv = _kv(D.spec_overrides(spec, tmp_path))
        rehearsal = _kv(planned(spec.variant, {"PATH": "/usr/bin:/bin", "RPG_CPU_MODEL": "smol"}, backend="cpu"))
        expected = {"actor_rollout_ref.model.path": str(assets.model_dir.resolve()),
                    "data.train_files": str(assets.train_file.resolve()), "data.val_files": str(assets.val_file.resolve()),
                    "data.train_batch_size": str(smol.TRAIN_BATCH_SIZE),
                    "actor_rollout_ref.actor.ppo_mini_batch_size": str(smol.MINI_BATCH_SIZE),
                    "actor_rollout_ref.rollout.n": str(smol.ROLLOUT_N), "actor_rollout_ref.rollout.val_kwargs.n": "1",
                    "data.max_response_length": "96", "data.max_prompt_length": "224",
                    "actor_rollout_ref.actor.use_dynamic_bsz": "True", "trainer.total_training_steps": "3",
                    "trainer.test_freq": "3", "trainer.val_before_train": "False", "data.val_max_samples": "200",
                    "actor_rollout_ref.actor.optim.lr": f"{PAPER_LR[spec.variant] * 20:g}",
                    "actor_rollout_ref.actor.optim.lr_warmup_steps": "0", "data.seed": str(spec.seed),
                    "actor_rollout_ref.rollout.seed": "1", "trainer.experiment_name": spec.run_id}
        assert {k: kv.get(k) for k in expected} == expected, spec.variant
        changed = {k for k in set(kv) | set(rehearsal) if kv.get(k) != rehearsal.get(k)}
        allowed = {"trainer.total_training_steps", "trainer.test_freq", "trainer.val_before_train",
                   "data.val_max_samples", "actor_rollout_ref.actor.optim.lr",
                   "actor_rollout_ref.actor.optim.lr_warmup_steps", "data.seed", "actor_rollout_ref.rollout.seed",
                   "trainer.project_name", "trainer.experiment_name", "trainer.default_local_dir", "trainer.logger",
                   "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_ROOT",
                   "ray_kwargs.ray_init.runtime_env.env_vars.TENSORBOARD_DIR",
                   "data.train_files", "data.val_files", "actor_rollout_ref.model.path"}  # (paths resolved)
        assert changed <= allowed, (spec.variant, changed - allowed)
        for key in ("data.train_files", "data.val_files", "actor_rollout_ref.model.path"):
            assert Path(kv[key]) == Path(rehearsal[key]).resolve()


def test_composed_configs_pass_the_drivers_checks(tmp_path):
    """One run per method, as the harness starts it on the CPU backend, composes and passes the driver's checks before
    Ray (the RPG rules, verl's validate_config), in a subprocess as tests/lab/study/test_study.py's."""
    from test_study import _composed

    specs = S.PILOT.grid(seeds=1)
    got = _composed(specs, tmp_path, "s.loss_name, s.loss.form, s.loss.clip, s.reference.mode, "
                    "cfg.algorithm.filter_groups.enable, cfg.actor_rollout_ref.actor.optim.lr, "
                    "cfg.actor_rollout_ref.actor.ppo_mini_batch_size, cfg.data.val_max_samples, "
                    "cfg.trainer.val_before_train, cfg.trainer.device", timeout=300)
    algorithm = ("rpg.loss.name", "rpg.loss.form", "rpg.loss.clip", "rpg.reference.mode", "algorithm.filter_groups.enable")
    assert got == [[*(str(S.setting(s.variant, k)) for k in algorithm), str(float(f"{PAPER_LR[s.variant] * 20:g}")), "2", "200",
                    "False", "cpu"] for s in specs]
    assert {tuple(g[:5]) for g in got} == {("verl", "reinforce", "True", "fixed", "False"),  # GRPO: verl's own loss
                                          ("rpg", "differentiable", "True", "sampler", "True"),
                                          ("rpg", "reinforce", "True", "sampler", "True")}


# ---- cost, dry run, refusals ----

def test_costs_and_the_budget():
    c = S.PILOT.cost_model()
    by = {s.variant: s for s in S.PILOT.grid(seeds=1)}
    start, step, val = 36.0 + 30.0, 133.1, 367.0
    assert c.run_s(by["run_grpo_7b"]) == pytest.approx(start + 3 * (step + 21.1) + val)  # + the reference's pass
    for m in S.PILOT.methods[1:]:  # + DAPO's refills: 2.5 more generation batches per step, as measured
        assert c.run_s(by[m]) == pytest.approx(start + 3 * (step + 2.5 * 39.9) + val)
    specs = S.PILOT.grid()
    assert c.grid_s(specs, 1) == pytest.approx(sum(c.run_s(s) for s in specs))
    assert c.grid_s(specs, 1) <= S.PILOT.budget_s == 3 * 3600
    assert S.PILOT.cost_model(100).val_s == pytest.approx(183.5)
    # a fourth step of every run would not fit: the design's steps are the most that do
    four = S.PILOT.grid(sizes=S.SmolSizes(steps=4, test_freq=4))
    assert c.grid_s(four, 1) > S.PILOT.budget_s
    assert S.interval_level(3) == 0.75 and S.interval_level(5) == 0.9375 and S.interval_level(12) == 0.95


def test_the_built_in_costs_are_the_committed_runs_figures():
    """The costs (rpg_lab.study.smol) and the base accuracy are read off the SmolLM2 run's committed metrics
    (docs/smol/bf32b4a-run-metrics.jsonl, the run they were measured on): the medians of steps 1-6 to 0.1 s, the validation at step 6 (the median
    of the three: 357 s at step 3 and 384 s before training, untimed in the metrics), the accuracy at step 0."""
    import statistics

    path = Path(__file__).resolve().parents[3] / "docs" / "smol" / "bf32b4a-run-metrics.jsonl"
    records = {r["step"]: r["data"] for r in map(json.loads, path.read_text().splitlines())}

    def median(key):
        return round(statistics.median(d[key] for s, d in records.items() if 1 <= s <= 6), 1)

    assert (median("timing_s/step"), median("timing_s/gen"), median("timing_s/old_log_prob")) == (
        S.PILOT.costs.step_s, S.PILOT.costs.gen_s, S.PILOT.costs.log_prob_s)
    testing = {s: d["timing_s/testing"] for s, d in records.items() if "timing_s/testing" in d}
    assert sorted(testing) == [3, 6] and testing[3] < testing[6] < 384
    assert round(testing[6]) == S.PILOT.costs.val_s_per_problem * 200
    assert records[0]["val-core/math_dapo/acc/mean@1"] == S.BASE_ACC


def test_calibration_without_a_validation_before_training_and_per_method():
    """The first record of a run without a validation before training is step 1's: the span to the last record holds
    steps 2..T and every validation, and the start-up is what is left after step 1."""
    rec = {"status": "done", "steps": 3, "updates": 4, "validations": 1, "val_before": False, "jobs": 1,
           "wall_time_s": 1000.0, "train_wall_s": 600.0, "val_time_s": 200.0, "variant": "run_grpo_7b"}
    rf = dict(rec, variant="run_rpg_7b_ufkl1e-4", train_wall_s=700.0, wall_time_s=1150.0)
    got = C.calibrate([rec], S.PILOT.cost_model())
    assert (got.startup_s, got.step_s, got.val_s) == (200.0, 200.0, 200.0)  # (600 - 200) / 2; 1000 - 600 - 200
    got = C.calibrate([rec, rf, dict(rf)], S.PILOT.cost_model())  # medians: step 250; GRPO's own 200
    extra = dict(got.method_step_s)
    assert got.step_s == 250.0 and extra["run_grpo_7b"] == -50.0 and extra["run_rpg_7b_ufkl1e-4"] == 0.0
    assert extra[S.LR_ANCHOR] == S.PILOT.costs.method_step_s(S.LR_ANCHOR)  # no run of its own: the built-in difference
    assert C.calibrate([{**rec, "steps": 1}], S.PILOT.cost_model()) == S.PILOT.cost_model()  # one step: no span to measure


def test_cli_dry_run_estimate_and_nothing_created(tmp_path, capsys):
    assert main(["--model", "smol", "--dry-run", "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    size = next(ln for ln in out.splitlines() if "9 runs" in ln)  # the grid, each run's size and its validation
    names(size, "(9 to run)", "3 steps", "8 prompts", "4 responses", "at the last step", "none before training",
          "200 of the 200", "1 response each")
    est = re.search(r"estimated time to run: (\d+)m(\d+)s with 1 run\(s\)", out)
    assert est and int(est[1]) * 60 + int(est[2]) == pytest.approx(S.PILOT.cost_model().grid_s(S.PILOT.grid(), 1), abs=1)
    assert "GRPO +21.1s per step" in out and "smol study budget 180m00s: the estimate fits" in out
    assert not (tmp_path / "s").exists()
    assert "design: declared (docs/study/smol/PLAN.md)\n" in out
    assert main(["--model", "smol", "--dry-run", "--out", str(tmp_path / "s"), "--seeds", "5", "--steps", "8",
                 "--val-problems", "100", "--methods", "run_grpo_7b,run_rpg_7b_ufkl1e-4", "--exploratory"]) == 0
    out = capsys.readouterr().out
    assert "10 runs (10 to run); each: 8 steps" in out and "on 100 of the 200" in out and "EXCEEDS it" in out
    assert out.startswith("design: EXPLORATORY")
    # the plan it departs from, each flag that departs with the plan's value, the files that record it
    names(out.splitlines()[0], "docs/study/smol/PLAN.md", "--seeds 5 (declared 3)",
          f"--methods run_grpo_7b,run_rpg_7b_ufkl1e-4 (declared {','.join(S.PILOT.methods)})", "--steps 8 (declared 3)",
          "--test-freq 8 (declared 3)", "--val-problems 100 (declared 200)", "runs.csv", "results.md")


@pytest.mark.parametrize("flags, error", [
    (["--lag"], "--lag is a study of the tiny model; --model smol runs the methods comparison"),
    (["--staleness", "1"], "--staleness is a study of the tiny model"),
    (["--async-weights"], "--async-weights is a study of the tiny model"),
    (["--cells", "lag0-noclip-token"], "--cells is a study of the tiny model"),
    (["--prompts", "16"], "--prompts: --model smol runs at the SmolLM2 run's sizes (8 prompts x 4 responses, "
                          "mini-batches of 2 prompts, 1 response per validation problem"),
    (["--n", "8"], "--n: --model smol runs at the SmolLM2 run's sizes"),
    (["--val-n", "2"], "--val-n: --model smol runs at the SmolLM2 run's sizes"),
    (["--updates", "2"], "--updates: --model smol runs at the SmolLM2 run's sizes"),
    (["--stress", "1"], "--stress: --model smol runs at the SmolLM2 run's sizes"),
    (["--stress-methods", "run_grpo_7b"], "--stress-methods: --model smol runs at the SmolLM2 run's sizes"),
    (["--jobs", "2"], "--jobs 2: --model smol runs one at a time (a SmolLM2 run keeps both cores busy"),
    (["--methods", "run_dapo_7b"], "--methods run_dapo_7b: --model smol compares some of run_grpo_7b, "),
    (["--methods", "run_grpo_7b,run_grpo_7b"], "--methods run_grpo_7b,run_grpo_7b: --model smol compares some of"),
    (["--seeds", "0"], "--seeds must be >= 1, got 0"),
    (["--steps", "0"], "--steps must be >= 1, got 0"),
    (["--test-freq", "0"], "--test-freq must be >= 1, got 0"),
    (["--val-problems", "0"], "--val-problems must be 1..200 (the task's held-out problems), got 0"),
    (["--val-problems", "201"], "--val-problems must be 1..200"),
    (["--timeout", "0"], "--timeout must be a finite number of seconds > 0, got 0"),
    # the plan's design, or --exploratory (one line naming the option and the declared value)
    (["--steps", "8"], "--steps 8: the SmolLM2 comparison declares 3 (docs/study/smol/PLAN.md); run the declared "
                       "design, or add --exploratory"),
    (["--seeds", "10"], "--seeds 10: the SmolLM2 comparison declares 3 (docs/study/smol/PLAN.md)"),
    (["--val-problems", "100"], "--val-problems 100: the SmolLM2 comparison declares 200 (docs/study/smol/PLAN.md)"),
    (["--test-freq", "1"], "--test-freq 1: the SmolLM2 comparison declares 3"),
    (["--methods", "run_grpo_7b"], "--methods run_grpo_7b: the SmolLM2 comparison declares run_grpo_7b,"
                                   "run_rpg_7b_ufkl1e-4,run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28"),
])
def test_cli_refuses_each_bad_option_in_one_line(tmp_path, capsys, monkeypatch, flags, error):
    import rpg_lab.study.__main__ as cli

    monkeypatch.setattr(cli, "build_smol", lambda: pytest.fail("a refused option reached the model's build"))
    for mode in (["--dry-run"], ["--render-only"], []):
        assert main([*mode, "--model", "smol", "--out", str(tmp_path / "s"), *flags]) == 2, flags
        err = capsys.readouterr().err
        assert err.startswith(f"rpg_lab.study: {error}") and err.count("\n") == 1, err
    assert not (tmp_path / "s").exists()


def test_cli_refuses_an_unknown_model_and_smol_options_without_it(tmp_path, capsys):
    for flags, error in ((["--model", "qwen"], "--model qwen: expected tiny or smol"),
                         (["--val-problems", "100"], "--val-problems sets SmolLM2's validation: use it with --model "
                                                     "smol")):
        assert main(["--dry-run", "--out", str(tmp_path / "s"), *flags]) == 2
        assert capsys.readouterr().err == f"rpg_lab.study: {error}\n"
    assert not (tmp_path / "s").exists()


# ---- runs, the CSV, the tables ----

class SmolFakeTrainer:
    """Stands in for rpg.trainer_process.run_trainer: a SmolLM2 run's verl-style records (no validation before
    training; the last step's holds the validation)."""

    def __init__(self):
        self.calls: list[dict] = []
        self.envs: list[dict | None] = []

    def __call__(self, overrides, *, output_dir, entry, timeout_s, on_metrics, stop=None, env=None):
        from rpg.trainer_process import TrainerRun

        kv = _kv(overrides)
        self.calls.append(kv)
        self.envs.append(env)
        steps, seed, lr = int(kv["trainer.total_training_steps"]), int(kv["data.seed"]), float(
            kv["actor_rollout_ref.actor.optim.lr"])
        out, lines = Path(output_dir), []
        for s in range(1, steps + 1):
            data = {"timing_s/step": 200.0 + s, "critic/score/mean": -0.6 + 0.1 * s, "response_length/mean": 30.0,
                    "actor/grad_norm": 0.5 * s, "actor/pg_clipfrac": 0.01}
            if s == steps:
                data.update({"val-core/math_dapo/acc/mean@1": round(0.15 + 0.01 * seed + 1000 * lr, 6),
                             "timing_s/testing": 500.0})
            lines.append(json.dumps({"step": s, "data": data}))
            on_metrics(s, data)
        (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        return TrainerRun(0, 900.0, out, out / "trainer.log", out / "metrics.jsonl", [],
                          metrics={json.loads(x)["step"]: json.loads(x)["data"] for x in lines})


def test_runs_to_csv_rows_and_the_records_calibration(monkeypatch, tmp_path):
    from rpg import trainer_process as harness

    monkeypatch.setattr(harness, "run_trainer", fake := SmolFakeTrainer())
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("RPG_CPU_ROLLOUT", raising=False)
    specs = S.PILOT.grid(seeds=2)
    records = R.run_grid(specs, tmp_path, S.PILOT.cost_model())
    # every run in the sync trainer with all of this process's cores (rpg.smol.overrides.omp_threads)
    assert fake.envs == [{"OMP_NUM_THREADS": str(len(os.sched_getaffinity(0)))}] * len(specs)
    assert all(r["status"] == "done" and r["val_before"] is False and r["model"] == "smol" for r in records)
    rows = S.PILOT.csv_rows(tmp_path, specs, records)
    assert [r["order"] for r in rows] == list(range(1, 7)) and [r["seed"] for r in rows] == [1, 1, 1, 2, 2, 2]
    grpo = next(r for r in rows if r["cell"] == "grpo" and r["seed"] == 2)
    assert grpo["primary"] == pytest.approx(0.15 + 0.02 + 1000 * 2e-5) == grpo[f"{DC.VAL_PREFIX}3"]
    assert f"{DC.VAL_PREFIX}0" not in grpo  # no validation before training
    assert grpo["step_s"] == 202.0 and grpo["grad_norm"] == 1.0 and grpo["lr"] == pytest.approx(2e-5)
    assert grpo["refill_gen_batches"] is None  # not logged: empty, never 0
    path = S.write_csv(tmp_path / "report" / "runs.csv", rows)
    assert S.read_csv(path) == rows


def _rows(effects: dict[str, float], seeds: int = 3, noise: float = 0.01, rng_seed: int = 3) -> list[dict]:
    """Synthetic runs.csv rows: primary = 0.2 + a seed's block effect (SD 0.05) + the method's effect + noise."""
    rng = random.Random(rng_seed)
    rows, order = [], 0
    for seed in range(1, seeds + 1):
        block = rng.gauss(0, 0.05)
        for m in S.PILOT.methods:
            order += 1
            y = 0.2 + block + effects.get(S.PILOT.cell_of[m], 0.0) + rng.gauss(0, noise)
            rows.append({"run_id": f"{m}-seed{seed}", "cell": S.PILOT.cell_of[m], "method": m, "lr": PAPER_LR[m] * 20,
                         "seed": seed, "order": order, "status": "done", "primary": y,
                         **{name: 1.0 + 0.1 * order for name, _ in S.DIAGNOSTICS}, "code": "abc1234",
                         "load_start_1m": 1.5, "load_end_1m": 2.25, "cpu_count": 2, "wall_time_s": 1000.5,
                         "started": "2026-11-27 10:00:00", "threads": "2", "design": DC.DECLARED,
                         **dict(S.PILOT.DESIGN.columns), **RAN_ON, f"{DC.VAL_PREFIX}3": y})
    return rows


def _contrasts(text: str) -> dict[str, list[str]]:
    return {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[1:-1]]
            for ln in text.splitlines() if re.match(r"\| C\d ", ln)}


def test_tables_give_each_contrasts_exact_p_interval_and_holm():
    """Planted: RPG-REINFORCE-UFKL with RPG-Style Clip 0.1 above the others in every seed. With 3 seeds the one-sided
    p is at best 1/8; the 75 % interval is the range of the d_s."""
    rows = _rows({"rpg-rf-clip": 0.1})
    text = S.PILOT.render_tables(rows)
    c = _contrasts(text)  # columns: name, claim, d_s, seeds, per seed, mean [interval], p, Holm p
    assert c["C1"][6] == "0.125 (one-sided)" and c["C1"][3] == "3"
    assert c["C3"][6] == "0.25 (two-sided)"  # all three positive: 2 x 1/8
    by = {(r["cell"], r["seed"]): r["primary"] for r in rows}
    d = [by[("rpg-rf-clip", s)] - by[("grpo", s)] for s in (1, 2, 3)]
    assert c["C1"][4] == ", ".join(f"{x:+.3f}" for x in d)
    assert c["C1"][5] == f"{sum(d) / 3:.3f} 75 % [{min(d):.3f}, {max(d):.3f}]"
    assert float(c["C2"][6].split()[0]) > 0.125 or c["C2"][6].startswith("0.125")
    assert "| GRPO | 2e-05 | 3/3 |" in text and "| RPG-REINFORCE-UFKL | 1e-05 | 3/3 |" in text
    names(text, "9 of 9 runs finished", "abc1234", "0123456789ab")  # the runs counted, the code's and weights' ids
    assert "smallest one-sided p is 1/8" in text


def test_tables_are_a_function_of_the_csv_and_report_missing_runs(tmp_path):
    rows = _rows({})
    rows[0].update(status="failed", primary=None)  # seed 1's GRPO
    path = S.write_csv(tmp_path / "runs.csv", rows)
    text = S.PILOT.render_tables(S.read_csv(path))
    assert text == S.PILOT.render_tables(S.read_csv(path)) and "8 of 9 runs finished" in text
    assert "* GRPO, seed 1: failed" in text
    c = _contrasts(text)
    assert (c["C1"][3], c["C2"][3], c["C3"][3]) == ("2", "2", "3")  # seed 1 leaves the contrasts with GRPO
    with pytest.raises(ValueError, match=r"cell\(s\) dapo are not in the plan"):
        S.PILOT.render_tables([dict(rows[1], cell="dapo")])
    with pytest.raises(DC.CSVError, match="missing column"):  # not the lag study's CSV
        DC.read_csv(path, lag.SCHEMA)


def test_the_figure_and_render_only_from_the_csv_alone(tmp_path, capsys):
    assert main(["--model", "smol", "--render-only", "--report-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    # the file missing and the command that makes it
    names(one_line(err), f"rpg_lab.study: --render-only: no {tmp_path / 'runs.csv'}",
          "python -m rpg_lab.study --model smol --report-dir")
    S.write_csv(tmp_path / "runs.csv", _rows({"rpg-ufkl": 0.05}))
    assert main(["--model", "smol", "--render-only", "--report-dir", str(tmp_path), "--out", str(tmp_path / "no")]) == 0
    assert (tmp_path / "results.md").read_text() == S.PILOT.render_tables(S.read_csv(tmp_path / "runs.csv"))
    assert (tmp_path / "smol.png").stat().st_size > 10_000 and not (tmp_path / "no").exists()


# ---- the plan ----

def test_the_plans_numbers_are_the_codes():
    """PLAN.md's generated block is exactly what ``python -m rpg_lab.study.smol`` prints."""
    text = (SMOL_DIR / "PLAN.md").read_text(encoding="utf-8")
    block = DC.generated_block(text, "plan_numbers")
    assert block is not None, "PLAN.md has no plan_numbers block"
    assert block == S.plan_numbers()


def test_the_committed_tables_are_rebuilt_from_the_committed_csv():
    csv_path = SMOL_DIR / "runs.csv"
    if not csv_path.is_file():
        pytest.skip("docs/study/smol/runs.csv does not exist yet: the plan's runs (docs/study/smol/PLAN.md) have not "
                    "run")
    assert (SMOL_DIR / "results.md").read_text(encoding="utf-8") == S.PILOT.render_tables(S.read_csv(csv_path))


def test_a_smol_runs_identity_names_its_assets_by_content(tmp_path):
    """SmolLM2's model and task folders enter a run's identity by content, each under its own prefix, wherever the
    cache is (``rpg_lab.study.identity``; the tiny assets' ``tiny:`` unchanged)."""
    from rpg_lab.study.identity import identity

    def ident(cache: Path, weights: bytes) -> dict:
        model, task = cache / "smollm2-135m-instruct-k1", cache / "smol-task-k2"
        for folder, name, data in ((model, "model.safetensors", weights), (task, "val.parquet", b"v")):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)
        out = tmp_path / "out"
        overrides = [f"actor_rollout_ref.model.path={model}", f"data.val_files={task / 'val.parquet'}",
                     f"trainer.default_local_dir={out / 'runs' / 'r' / 'ckpts'}"]
        return dict(identity(overrides, out, {"smol-model:": model, "smol-task:": task}))

    here = ident(tmp_path / "a", b"w")
    assert here["actor_rollout_ref.model.path"].startswith("smol-model:.@sha256:")
    assert here["data.val_files"].startswith("smol-task:val.parquet@sha256:")
    assert here["trainer.default_local_dir"] == "study:runs/r/ckpts"
    assert ident(tmp_path / "b", b"w") == here  # another cache, the same files: the same run
    assert ident(tmp_path / "c", b"x")["actor_rollout_ref.model.path"] != here["actor_rollout_ref.model.path"]
