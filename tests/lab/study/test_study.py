"""rpg_lab.study without Ray: the grid, the overrides it launches, resuming, rendering and the CLI.

The trainer is replaced by a fake that writes verl-style file-logger records, so the resume and
render logic are tested on logs whose Last/Best values are known.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from messages import names, one_line

from rpg_lab.study import grid as G
from rpg_lab.study import records as D
from rpg_lab.study import runner as R
from rpg_lab.study.__main__ import main
from rpg_lab.study.render import render

SMALL = G.Sizes(steps=4, test_freq=2, prompts=16, n=4, val_n=4)


def _kv(overrides: list[str]) -> dict[str, str]:
    from launch_expected import effective

    return effective(overrides)


# ---- the grid ----

def test_default_grid_methods_stress_axis_and_order():
    specs = G.grid()
    labels = [s.label for s in specs[:6]]
    assert labels == ["GRPO", "DAPO", "REINFORCE++", "RPG-UFKL", "RPG-REINFORCE-UFKL", "RPG-REINFORCE-UFKL (no clip)"]
    assert all(s.updates == 4 and s.seed == 1 for s in specs[:6])
    assert [s.seed for s in specs] == [1] * 10 + [2] * 10  # every run of seed 1 before any of seed 2
    assert [s.updates for s in specs[6:10]] == [1, 1, 16, 16] and specs[10:16] == [
        G.RunSpec(s.variant, 4, 2, s.sizes) for s in specs[:6]]
    stress = specs[6:10] + specs[16:]
    # the stress methods at k=4 are already in the main grid: only k = 1 and 16 are added, per seed
    assert sorted((s.label, s.updates, s.seed) for s in stress) == sorted(
        (lab, k, seed) for lab in ("RPG-REINFORCE-UFKL", "RPG-REINFORCE-UFKL (no clip)") for k in (1, 16) for seed in (1, 2))
    assert len({s.run_id for s in specs}) == len(specs) == 20


def test_grid_rejects_bad_input():
    with pytest.raises(ValueError, match=r"\[3\] must divide --prompts 16"):
        G.grid(updates=3)
    with pytest.raises(ValueError, match="--seeds must be >= 1"):
        G.grid(seeds=0)
    with pytest.raises(ValueError, match="^no run run_ppo_7b: .*closest shipped: run_dapo_7b, run_grpo_7b"):
        G.grid(methods=("run_ppo_7b",))
    with pytest.raises(ValueError, match="--steps must be >= 1"):
        G.grid(sizes=G.Sizes(steps=0))


def test_run_id_changes_with_the_sizes_and_validations_count():
    a, b = G.RunSpec("run_dapo_7b", 4, 1, SMALL), G.RunSpec("run_dapo_7b", 4, 1, G.Sizes())
    assert a.run_id != b.run_id and a.run_id.startswith("run_dapo_7b-k4-seed1-")
    assert G.Sizes(steps=16, test_freq=4).validations == 5  # 0, 4, 8, 12, 16
    assert G.Sizes(steps=10, test_freq=4).validations == 4  # 0, 4, 8 and the last step 10


def test_time_estimate_and_calibration_from_finished_runs():
    spec = G.RunSpec("run_dapo_7b", 4, 1, SMALL)
    c = G.Costs(startup_s=10, step_s=2, update_s=0.5, val_s=3, source="test")
    assert c.run_s(spec) == 10 + 4 * (2 + 3 * 0.5) + 3 * 3
    assert c.remaining_s(spec, -1) == c.run_s(spec) and c.remaining_s(spec, 4) == 0
    assert c.remaining_s(spec, 1) == 3 * (2 + 3 * 0.5) + 2 * 3  # steps 2-4, validations at 2 and 4
    rec = {"status": "done", "steps": 4, "updates": 1, "validations": 3, "wall_time_s": 50.0, "train_wall_s": 16.0,
           "step_time_s": 8.0, "val_time_s": 6.0}
    got = G.calibrate([rec, {"status": "failed"}])
    # start-up = 50 - 16; validation 6 / 3; step = (16 - 2 validations x 2) / 4
    assert (got.startup_s, got.step_s, got.val_s) == (34.0, 3.0, 2.0) and "1 finished run" in got.source
    assert G.calibrate([]) is G.BUILTIN_COSTS
    # walls measured 2 at a time: the grid takes their sum / 2; one at a time, sum x speedup(2) / 2
    c2 = G.Costs(startup_s=10, step_s=2, update_s=0.5, val_s=3, source="test", jobs=2)
    one = c2.run_s(spec)
    assert c2.grid_s([spec, spec], 2) == pytest.approx(one)
    assert c2.grid_s([spec], 2) == pytest.approx(one * G.speedup(2) / 2)  # one run left: it goes alone
    assert c2.grid_s([spec, spec], 1) == pytest.approx(2 * one * G.speedup(2) / 2)
    assert G.speedup(8) == G.speedup(2) > G.speedup(1) == 1.0
    # calibration uses the runs of the most common concurrency only (walls at different jobs do not mix)
    slow = {**rec, "wall_time_s": 90.0, "jobs": 2}
    got = G.calibrate([rec, slow, dict(slow)])
    assert got.jobs == 2 and got.startup_s == 74.0 and "2 at a time" in got.source
    text = G.describe([spec], c, finished={spec.run_id})
    assert "done" in text and "1 runs (0 to run)" in text and "estimated time to run: 0s with 1 run(s)" in text


# ---- the overrides: the launcher's CPU path for the method + the study's sizes ----

def test_overrides_keep_the_variants_algorithm_and_set_the_off_policy_regime(tiny_assets, tmp_path):
    spec = G.RunSpec("run_rpg_7b_ufkl1e-4_rf", 16, 3, SMALL)
    kv = _kv(D.spec_overrides(spec, tmp_path))
    assert kv["actor_rollout_ref.actor.ppo_mini_batch_size"] == "1"  # 16 prompts / 16 optimizer steps
    assert kv["data.train_batch_size"] == "16" and kv["actor_rollout_ref.rollout.n"] == "4"
    assert kv["actor_rollout_ref.rollout.val_kwargs.n"] == "4" and kv["trainer.total_training_steps"] == "4"
    assert float(kv["actor_rollout_ref.actor.optim.lr"]) == pytest.approx(5e-7 * G.LR_SCALE) == 2.5e-4
    assert kv["actor_rollout_ref.actor.optim.lr_warmup_steps"] == "0"
    assert kv["data.seed"] == "3" and kv["actor_rollout_ref.rollout.seed"] == "3"
    # the variant's algorithm settings are untouched
    assert (kv["rpg.loss.form"], kv["rpg.loss.clip"], kv["rpg.loss.divergence"], kv["rpg.loss.beta"]) == (
        "reinforce", "False", "ufkl", "0.0001")
    assert kv["actor_rollout_ref.model.path"] == str(tiny_assets.model_dir)
    assert kv["trainer.default_local_dir"].startswith(str(tmp_path.resolve()))
    from omegaconf import OmegaConf

    from rpg.launch.experiments import find

    grpo_overrides = D.spec_overrides(G.RunSpec("run_grpo_7b", 4, 1, SMALL), tmp_path)
    grpo = _kv(grpo_overrides)
    assert "+experiment=run_grpo_7b" in grpo_overrides  # a shipped script: its experiment config holds its settings
    shipped = OmegaConf.load(find("run_grpo_7b").path)
    assert (shipped.actor_rollout_ref.actor.kl_loss_type, shipped.rpg.reference.mode) == ("low_var_kl", "fixed")
    assert grpo["actor_rollout_ref.actor.optim.lr"] == "0.0005"
    assert grpo["actor_rollout_ref.actor.ppo_mini_batch_size"] == "4"


def _composed(specs, tmp_path: Path, printed: str, timeout: int) -> list[list[str]]:
    """Each run's trainer command (the harness's, as the study launches it) composed by ``rpg.launch.plan.compose``
    in a subprocess (the CPU platform registers at ``import verl`` time, which must not leak into this test
    process); per run, the values of ``printed`` (a Python expression over ``cfg`` and the RPG settings ``s``)."""
    import subprocess
    import sys

    from rpg.paths.checkout import CHECKOUT, RECIPE_ENTRY
    from rpg.trainer_process import build_command

    plans, env = [], None
    for spec in specs:
        argv, env = build_command(D.spec_overrides(spec, tmp_path), entry=str(CHECKOUT / RECIPE_ENTRY))
        plans.append(argv[2:])
    (tmp_path / "plans.json").write_text(json.dumps(plans))
    code = ("import json, sys\nfrom rpg.launch.plan import compose\nfor ov in json.load(open(sys.argv[1])):\n"
            f"    cfg, s = compose(ov)\n    print('OUT', {printed})")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "plans.json")], env=env, capture_output=True,
                       text=True, timeout=timeout, cwd=CHECKOUT)
    assert p.returncode == 0, p.stderr[-3000:]
    return [line.split()[1:] for line in p.stdout.splitlines() if line.startswith("OUT ")]


def test_runs_compose_and_pass_verls_checks(tiny_assets, tmp_path):
    """The Hydra config of the fixed-reference method and of the smallest mini-batch composes and passes
    verl's validate_config on the CPU backend (no Ray). In a subprocess: the CPU platform registers at
    ``import verl`` time, which must not leak into this test process."""
    specs = [s for s in G.grid(seeds=1) if (s.variant, s.updates) in (("run_grpo_7b", 4), ("run_rpg_7b_ufkl1e-4_rf", 16))]
    sizes = _composed(specs, tmp_path, "cfg.actor_rollout_ref.actor.ppo_mini_batch_size, cfg.data.train_batch_size",
                      timeout=300)
    assert sizes == [["4", "16"], ["1", "16"]]  # 16 prompts per batch in mini-batches of 4 and 1


# ---- resuming with a fake trainer ----

def _val(step: int, seed: int, label: str) -> float:
    return round(0.1 * seed + 0.01 * step + (0.2 if "clip" in label else 0.0), 6)


class FakeTrainer:
    """Stands in for rpg.trainer_process.run_trainer: writes file-logger records, can fail."""

    def __init__(self, fail: set[str] = frozenset()):
        self.calls: list[str] = []
        self.fail = fail

    def __call__(self, overrides, *, output_dir, entry, timeout_s, on_metrics, stop=None, env=None):
        from rpg.trainer_process import TrainerRun, TrainerRunError

        kv = _kv(overrides)
        exp, steps = kv["trainer.experiment_name"], int(kv["trainer.total_training_steps"])
        self.calls.append(exp)
        out = Path(output_dir)
        lines = []
        for s in range(steps + 1):
            data = {"timing_s/step": 2.0} if s else {}
            if s:
                data.update({"critic/score/mean": -1 + s / steps, "actor/entropy": 0.3, "response_length/mean": 6.0,
                             "actor/ppo_kl": 1e-3, "actor/pg_clipfrac": 0.01})
            if s and kv.get("trainer.v1.trainer_mode") in ("colocate_async", "separate_async"):  # the loss, stale mu
                none = kv.get("rpg.loss.behavior_weight_level") == "none"
                top = 1.0 if none or kv.get("rpg.loss.behavior_weight_cap") == "1.0" else 1.0 + s
                data.update({"training/off_policy/trajectory_staleness/mean": min(s - 1, 1),
                             "actor/rpg/behavior_kl": 0.01 * s * int(kv["data.seed"]),
                             "actor/rpg/behavior_weight_min": 1.0 if none else 0.5 / s, "actor/rpg/behavior_weight_max": top,
                             "actor/rpg/behavior_weight_capped_frac": 0.1 if top == 1.0 and not none else 0.0,
                             "actor/grad_norm": 0.5})
            if s % int(kv["trainer.test_freq"]) == 0 or s == steps:
                data["val-core/math_dapo/acc/mean@4"] = _val(s, int(kv["data.seed"]), exp)
                data["timing_s/testing"] = 1.0
            lines.append(json.dumps({"step": s, "data": data}))
            on_metrics(s, data)
        (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        (out / "trainer.log").write_text(f"{exp}: {steps} steps\n")
        run = TrainerRun(0, 30.0, out, out / "trainer.log", out / "metrics.jsonl", [])
        run.metrics = {s: {} for s in range(steps + 1)}
        if exp in self.fail:
            run.returncode = 1
            raise TrainerRunError("trainer exited with code 1; log: x\n--- last lines ---\nValueError: loss is nan", run)
        return run


@pytest.fixture
def fake(monkeypatch, tiny_assets):
    from rpg import trainer_process as harness

    trainer = FakeTrainer()
    monkeypatch.setattr(harness, "run_trainer", trainer)
    return trainer


def test_a_failed_runs_record_says_why_before_the_logs_last_line():
    """A run killed at the study's timeout records the timeout, not only the stop line it printed on SIGTERM (which
    named the resume it cannot make)."""
    stop = "rpg: stopped by SIGTERM; ...; resume: cd /x && python -m rpg_lab.demo.cpu trainer.resume_mode=auto"
    assert R._failure(f"trainer timed out after 1800 s; log: x\n--- last lines ---\n{stop}") == \
        f"timed out after 1800 s: {stop}"
    assert R._failure("trainer stopped by SIGKILL; log: x") == "stopped by SIGKILL"


def test_finished_runs_are_not_repeated_failed_ones_only_on_request(fake, tmp_path, capsys):
    specs = G.grid(seeds=2, updates=4, stress=(1, 4), sizes=SMALL, methods=G.METHODS[4:])
    costs = G.BUILTIN_COSTS
    fake.fail = {specs[1].run_id}
    records = R.run_grid(specs, tmp_path, costs)
    assert len(fake.calls) == len(specs) == 8
    assert [r["status"] for r in records].count("failed") == 1
    failed = records[1]
    assert failed["error"] == "exited with code 1: ValueError: loss is nan" and failed["last_step"] == 4
    out = capsys.readouterr().out
    assert "step 2/4  reward -0.500  kl(old,new) 1.0e-03  val acc 0.220" in out and "failed 2/8" in out
    done = records[0]
    assert (done["step_time_s"], done["val_time_s"], done["wall_time_s"]) == (8.0, 3.0, 30.0)
    assert 0 <= done["train_wall_s"] < 5  # the fake writes its records at once

    fake.calls.clear()
    grid_args = ["--out", str(tmp_path), "--seeds", "2", "--stress", "1,4", "--steps", "4", "--test-freq", "2",
                 "--methods", ",".join(G.METHODS[4:]), "--jobs", "1"]
    R.run_grid(specs, tmp_path, costs)  # nothing to do: done runs kept, the failed one not retried
    assert fake.calls == []
    start = "8 runs: 7 finished, 1 failed (not retried without --retry-failed), 0 to run"
    assert start in capsys.readouterr().out
    assert main(["--dry-run", *grid_args]) == 0  # the dry run says what the start does (it counted the failed one)
    assert start in capsys.readouterr().out
    fake.fail = set()
    R.run_grid(specs, tmp_path, costs, retry_failed=True)
    assert fake.calls == [specs[1].run_id]
    start = next(ln for ln in capsys.readouterr().out.splitlines() if "to run" in ln)
    # the counts, the flag that retries, the estimate, the output folder, the failed run's old folder kept where
    names(start, "0 failed", "--retry-failed", "1 to run", "1 at a time", "1m05s", f"output {tmp_path};",
          "1 failed run(s)", f"{tmp_path / 'stale'} (kept)")
    assert json.loads((tmp_path / "stale" / f"{specs[1].run_id}.1" / D.RUN_RECORD).read_text())["status"] == "failed"
    # an interrupted run (no run.json) runs again from scratch; a changed setting makes a run stale
    (D.run_dir(tmp_path, specs[2]) / D.RUN_RECORD).unlink()
    rec = json.loads((D.run_dir(tmp_path, specs[3]) / D.RUN_RECORD).read_text())
    rec["identity"] = rec["identity"][:-1]
    G.save_json(D.run_dir(tmp_path, specs[3]) / D.RUN_RECORD, rec)
    assert D.status(tmp_path, specs[3], D.spec_overrides(specs[3], tmp_path)) == "stale"
    # a run recorded with a path written bare is done under the same path quoted (how paths are written now)
    rec_4 = json.loads((D.run_dir(tmp_path, specs[4]) / D.RUN_RECORD).read_text())
    original = rec_4["overrides"]
    assert D.status(tmp_path, specs[4], original) == "done"
    bare = [*rec_4["overrides"][:-1], "data.train_files=/my dir/t.parquet"]
    legacy = {k: v for k, v in rec_4.items() if k != "identity"}  # as written before run.json held its identity
    G.save_json(D.run_dir(tmp_path, specs[4]) / D.RUN_RECORD, {**legacy, "overrides": bare})
    assert D.status(tmp_path, specs[4], [*bare[:-1], "data.train_files='/my dir/t.parquet'"]) == "done"
    assert D.status(tmp_path, specs[4], [*bare[:-1], "data.train_files='/my dir/u.parquet'"]) == "stale"
    G.save_json(D.run_dir(tmp_path, specs[4]) / D.RUN_RECORD, rec_4)
    capsys.readouterr()
    assert main(["--dry-run", *grid_args]) == 0
    out = capsys.readouterr().out
    assert "8 runs (2 to run)" in out and "1 finished run(s) will be redone (their settings changed)" in out
    fake.calls.clear()
    R.run_grid(specs, tmp_path, costs)
    assert fake.calls == [specs[2].run_id, specs[3].run_id]
    assert json.loads((tmp_path / "stale" / f"{specs[3].run_id}.1" / D.RUN_RECORD).read_text()) == rec  # kept


def test_a_content_digest_follows_a_rewrite_of_the_same_size_and_time(tmp_path):
    """The memo of ``content_digest`` never serves a file rewritten with the same size and modification time (a
    rewrite within one timestamp tick, or a copy that kept the time): the digest is of the bytes now there."""
    import hashlib
    import os

    from rpg_lab.study.identity import content_digest

    f = tmp_path / "t.parquet"
    f.write_bytes(b"t")
    old = os.stat(f)
    os.utime(f, ns=(old.st_atime_ns - 10**10, old.st_mtime_ns - 10**10))  # older than the racy window: memoized
    assert content_digest(f) == hashlib.sha256(b"t").hexdigest()
    before = os.stat(f)
    f.write_bytes(b"u")
    os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))  # the same size and modification time as before
    assert content_digest(f) == hashlib.sha256(b"u").hexdigest()


def test_identity_is_the_settings_as_hydra_reads_them_wherever_the_folders_are(tmp_path):
    """The study's paths relative to it, the tiny assets' by content; a value written another way is the same
    setting, another value, key kind, order or content is not; an old record's absolute paths read the same."""
    import shutil

    from rpg_lab.study.identity import content_digest, identity, legacy_identity

    assets, out = tmp_path / "cache" / "abc123", tmp_path / "study"
    (assets / "model").mkdir(parents=True)
    (assets / "model" / "w.bin").write_bytes(b"w")
    (assets / "t.parquet").write_bytes(b"t")
    run = out / "runs" / "r1"
    overrides = [f"a={run}/ckpts", f"m={assets}/model", f"d=[{assets}/t.parquet]", "b=1", f"x={tmp_path}/other"]
    got = identity(overrides, out, assets)
    model, data = content_digest(assets / "model"), content_digest(assets / "t.parquet")
    assert got == [["a", "study:runs/r1/ckpts"], ["m", f"tiny:model@sha256:{model}"],
                   ["d", [f"tiny:t.parquet@sha256:{data}"]], ["b", 1], ["x", f"{tmp_path}/other"]]
    assert len(model) == len(data) == 64 and model != content_digest(assets)
    out2, assets2 = tmp_path / "moved" / "study", tmp_path / "cache2" / "xyz"
    shutil.copytree(assets, assets2)
    moved = [o.replace(str(out), str(out2)).replace(str(assets), str(assets2)) for o in overrides]
    assert identity(moved, out2, assets2) == got
    assert identity([f"a='{run}/ckpts'", *overrides[1:]], out, assets) == got  # quoted: the same path
    (assets2 / "t.parquet").write_bytes(b"u")  # other content under the same name
    assert identity(moved, out2, assets2) != got
    for other in (["b='1'"], ["+b=1"], ["b=2"]):
        assert identity([*overrides[:3], *other, overrides[4]], out, assets) != got, other
    assert identity([overrides[1], overrides[0], *overrides[2:]], out, assets) != got  # order
    inside = out / "cache" / "abc123"  # the assets under --out: still by content
    shutil.copytree(assets, inside)
    assert identity([f"m={inside}/model"], out, inside) == [["m", f"tiny:model@sha256:{model}"]]
    # a record of the code before: absolute paths of places gone; the build's folder name is its builder key
    old = [o.replace(str(out), "/gone/study").replace(str(tmp_path / "cache"), "/gone/cache") for o in overrides]
    assert legacy_identity(old, "r1", assets) == got
    assert legacy_identity(old, "r2", assets) != got  # another run's folder
    assert legacy_identity([o.replace("abc123", "def456") for o in old], "r1", assets) != got  # another build


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("written_by", ["this code", "the code before run.json held the identity"])
def test_a_moved_study_keeps_its_finished_runs_and_a_changed_setting_moves_them_aside(written_by, fake, tiny_assets,
                                                                                     tmp_path, monkeypatch, capsys):
    """Before: run.json compared the overrides with their absolute paths (the run folder, the tiny assets' cache):
    a study copied to another --out with its assets in another RPG_TINY_CACHE found every finished run stale,
    and the next start deleted each run's folder (shutil.rmtree) as it reran it, its start line saying
    "0 finished ... 1 to run". Now a run is the same wherever it is (the old places gone), --dry-run and
    the start say so in the same line, and a setting that really changed moves the run to <out>/stale, files kept."""
    import shutil

    monkeypatch.setattr("rpg_lab.study.render.render", lambda *a, **k: [])  # the report is not this test's (seconds)
    (spec,) = G.grid(seeds=1, updates=4, stress=(), sizes=SMALL, methods=G.METHODS[:1])
    cache_a, cache_b = tmp_path / "cache a", tmp_path / "cache b"
    shutil.copytree(tiny_assets.root, cache_a / tiny_assets.root.name)
    monkeypatch.setenv("RPG_TINY_CACHE", str(cache_a))
    args = ["--seeds", "1", "--stress", "", "--steps", "4", "--test-freq", "2", "--methods", spec.variant]
    a, b = tmp_path / "study a", tmp_path / "elsewhere" / "study b"
    assert main(["--out", str(a), *args]) == 0 and fake.calls == [spec.run_id]
    rec = json.loads((D.run_dir(a, spec) / D.RUN_RECORD).read_text())
    assert str(a) in json.dumps(rec["overrides"]) and str(cache_a) in json.dumps(rec["overrides"])  # as launched
    assert str(tmp_path) not in json.dumps(rec["identity"])
    if written_by != "this code":  # the overrides with their absolute paths, no identity
        G.save_json(D.run_dir(a, spec) / D.RUN_RECORD, {k: v for k, v in rec.items() if k != "identity"})
    shutil.copytree(a, b)
    shutil.rmtree(a)
    shutil.move(cache_a, cache_b)
    monkeypatch.setenv("RPG_TINY_CACHE", str(cache_b))
    files = _files(D.run_dir(b, spec))
    assert set(files) == {"metrics.jsonl", "run.json", "trainer.log"}
    fake.calls.clear()
    capsys.readouterr()

    def start() -> tuple[str, str]:
        """(the dry run's last line, the real start's output)"""
        assert main(["--dry-run", "--out", str(b), *args]) == 0
        dry = capsys.readouterr().out.splitlines()[-1]
        assert main(["--out", str(b), *args]) == 0
        return dry, capsys.readouterr().out

    dry, out = start()
    line = (f"1 runs: 1 finished, 0 failed (not retried without --retry-failed), 0 to run, 2 at a time (estimate 0s); "
            f"output {b}")
    assert dry == line and f"] {line}\n" in out  # the dry run and the start agree
    assert fake.calls == [] and _files(D.run_dir(b, spec)) == files and not (b / "stale").exists()

    monkeypatch.setattr(G, "LR_SCALE", G.LR_SCALE / 2)  # a setting that changed: the run is redone
    estimate = G.fmt_duration(G.calibrate(D.all_records(b)).grid_s([spec], 2))
    dry, out = start()
    line = (f"1 runs: 0 finished, 0 failed (not retried without --retry-failed), 1 to run, 2 at a time (estimate "
            f"{estimate}); output {b}; 1 finished run(s) will be redone (their settings changed): their old folders "
            f"are moved to {b / 'stale'} (kept)")
    assert dry == line and f"] {line}\n" in out
    assert f"moved {D.run_dir(b, spec)} (finished, settings changed) to {b / 'stale' / (spec.run_id + '.1')}\n" in out
    assert fake.calls == [spec.run_id]
    assert _files(b / "stale" / f"{spec.run_id}.1") == files  # every file of the finished run, as it was
    assert json.loads((D.run_dir(b, spec) / D.RUN_RECORD).read_text())["status"] == "done"


@pytest.mark.parametrize("bad, why", [
    ('{"step": null, "data": {"timing_s/step": 2.0}}', "step must be an integer, got None"),
    ("[1, 2]", r"expected an object with a 'step' key, got \[1, 2\]"),
    ('{"step": 1, "data": 3}', "'data' must be an object of metrics, got 3"),
    ('{"step": 1, "data": {"timing_s/step": null}}', "timing_s/step must be a number of seconds, got None"),
    ('{"step": 1, "data": {"timing_s/testing": "1.0"}}', "timing_s/testing must be a number of seconds, got '1.0'"),
])
def test_a_run_whose_metrics_cannot_be_read_is_failed_naming_the_file_and_line(bad, why, fake, tmp_path, monkeypatch,
                                                                              capsys):
    """The measured times are read by the one reader (rpg.metrics_log.file): a line that is not a record or a
    timing that is not seconds is neither summed as if valid, skipped, nor an uncaught TypeError that stops the
    grid; the run is failed (rerun with --retry-failed) with the file and line."""
    from rpg import trainer_process as harness

    specs = G.grid(seeds=1, updates=4, stress=(), sizes=SMALL, methods=G.METHODS[4:5])

    def broken(overrides, **kw):
        run = fake(overrides, **kw)
        lines = run.metrics_file.read_text().splitlines()
        run.metrics_file.write_text("\n".join([lines[0], bad, *lines[1:]]) + "\n")
        return run

    monkeypatch.setattr(harness, "run_trainer", broken)
    (rec,) = R.run_grid(specs, tmp_path, G.BUILTIN_COSTS)
    metrics = D.run_dir(tmp_path, specs[0]) / "metrics.jsonl"
    assert rec["status"] == "failed" and re.match(rf"{re.escape(str(metrics))}:2: {why}", rec["error"]), rec
    assert rec["last_step"] == 4 and f"failed 1/1 {specs[0].label}" in capsys.readouterr().out


def test_a_clean_exit_short_of_the_designs_steps_is_a_failed_run(fake, tmp_path, monkeypatch, capsys):
    """A trainer that exits with code 0 after fewer steps than the design's is not recorded done: the run is failed,
    its record names the step it reached, and --retry-failed runs it again."""
    from rpg import trainer_process as harness

    specs = G.grid(seeds=1, updates=4, stress=(), sizes=SMALL, methods=G.METHODS[4:5])

    def short(overrides, **kw):
        steps = int(_kv(overrides)["trainer.total_training_steps"])
        cut = [o for o in overrides if not o.startswith("trainer.total_training_steps=")]
        run = fake(cut + [f"trainer.total_training_steps={steps - 1}"], **kw)
        return run

    monkeypatch.setattr(harness, "run_trainer", short)
    (rec,) = R.run_grid(specs, tmp_path, G.BUILTIN_COSTS)
    steps = SMALL.steps
    assert rec["status"] == "failed" and rec["last_step"] == steps - 1, rec
    assert rec["error"] == f"the trainer exited with code 0 after step {steps - 1} of {steps}"
    assert f"failed 1/1 {specs[0].label}" in capsys.readouterr().out
    monkeypatch.setattr(harness, "run_trainer", fake)
    (rec,) = R.run_grid(specs, tmp_path, G.BUILTIN_COSTS, retry_failed=True)
    assert rec["status"] == "done" and rec["last_step"] == steps and "error" not in rec


def test_runs_go_jobs_at_a_time_in_grid_order(fake, tmp_path, monkeypatch):
    import threading
    import time

    from rpg import trainer_process as harness

    specs = G.grid(seeds=2, updates=4, stress=(), sizes=SMALL, methods=G.METHODS[4:])
    active, peak, lock = [0], [0], threading.Lock()
    both_running = threading.Barrier(2, timeout=20)  # broken (and the test failed) unless two runs overlap

    def two_at_once(*args, **kwargs):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            both_running.wait()
            time.sleep(0.5)  # both running: what each run's recorded concurrency measures
            return fake(*args, **kwargs)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(harness, "run_trainer", two_at_once)
    records = R.run_grid(specs, tmp_path, G.BUILTIN_COSTS, jobs=2)
    assert [r["status"] for r in records] == ["done"] * 4 and peak[0] == 2
    assert all(r["jobs"] == 2 and 1.5 < r["concurrency"] <= 2.0 for r in records)
    assert set(fake.calls[:2]) == {s.run_id for s in specs[:2]}  # started in grid order, two at a time
    # a run that goes alone is recorded as one at a time, whatever --jobs says (its wall is a lone run's)
    lone = G.grid(seeds=3, updates=4, stress=(), sizes=SMALL, methods=G.METHODS[5:])[2:]
    monkeypatch.setattr(harness, "run_trainer", fake)
    (rec,) = [r for r in R.run_grid(lone, tmp_path, G.BUILTIN_COSTS, jobs=2) if r["run_id"] == lone[0].run_id]
    assert rec["jobs"] == 1 and rec["concurrency"] <= 1.0


def test_an_error_stops_the_running_runs_and_leaves_no_record_for_them(tmp_path, monkeypatch, tiny_assets):
    import threading

    from rpg import trainer_process as harness
    from rpg.trainer_process import TrainerRun, TrainerRunError

    specs = G.grid(seeds=2, updates=4, stress=(), sizes=SMALL, methods=G.METHODS[4:])
    calls, stopped = [], threading.Event()

    def trainer(overrides, *, output_dir, entry, timeout_s, on_metrics, stop=None, env=None):
        exp = _kv(overrides)["trainer.experiment_name"]
        calls.append(exp)
        if exp == specs[0].run_id:  # runs until stopped, like a trainer
            assert stop is not None and stop.wait(30)
            stopped.set()
            out = Path(output_dir)
            run = TrainerRun(None, 1.0, out, out / "trainer.log", out / "metrics.jsonl", [], stopped=True)
            raise TrainerRunError("trainer stopped by the caller", run)
        raise RuntimeError("unexpected failure in the study's own code")

    monkeypatch.setattr(harness, "run_trainer", trainer)
    with pytest.raises(RuntimeError, match="unexpected failure"):
        R.run_grid(specs, tmp_path, G.BUILTIN_COSTS, jobs=2)
    assert stopped.is_set()  # the other running run was stopped, not left behind
    assert sorted(calls) == sorted(s.run_id for s in specs[:2])  # the queued runs never started
    assert [D.status(tmp_path, s) for s in specs] == ["todo"] * 4  # no record: each runs again next time


def test_render_mean_std_over_seeds_partial_label_and_run_list(fake, tmp_path):
    specs = G.grid(seeds=2, updates=4, stress=(1, 4), sizes=SMALL, methods=G.METHODS[4:])
    unclipped_k4_seed2 = next(s for s in specs if "(no clip)" in s.label and s.updates == 4 and s.seed == 2)
    fake.fail = {unclipped_k4_seed2.run_id}
    records = R.run_grid(specs, tmp_path, G.BUILTIN_COSTS)
    paths = render(tmp_path, tmp_path / "report", specs, records, main_updates=4, command="python -m rpg_lab.study --x")
    files = sorted(p.name for p in paths)
    assert files == ["curves.png", "curves.svg", "runs.md", "stress.png", "stress.svg", "table.md", "table.tex"]
    md = (tmp_path / "report" / "table.md").read_text()
    assert "PARTIAL: 7 of 8 runs finished" in md and "mean ± std over seeds" in md
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip().strip("|").split("|")[1:]]
            for line in md.splitlines() if line.startswith("| RPG")}
    # clipped, k=4: Last = mean over seeds 1, 2 of 0.1 s + 0.04 + 0.2 -> 0.39, std 0.0707; Best = Last (rising)
    clipped = rows["RPG-REINFORCE-UFKL [2 seeds]"]  # a partial grid names each row's number of seeds
    assert clipped == ["**0.3900 ± 0.0707**", "**0.3900 ± 0.0707**"]
    assert rows["RPG-REINFORCE-UFKL (no clip) [1 seed]"] == ["0.1400", "0.1400"]  # seed 2 failed
    assert rows["RPG-REINFORCE-UFKL, 1 step/batch [2 seeds]"][0] == "**0.3900 ± 0.0707**"
    runs_md = (tmp_path / "report" / "runs.md").read_text()
    assert "python -m rpg_lab.study --x" in runs_md
    failed = next(ln for ln in runs_md.splitlines() if "failed at step" in ln)  # the run, its step, its error
    names(failed, "RPG-REINFORCE-UFKL (no clip) k=4 seed 2", "step 4", "exited with code 1: ValueError: loss is nan")
    row = rf"\| {specs.index(unclipped_k4_seed2) + 1} \| RPG-REINFORCE-UFKL \(no clip\) \| 4 \| 2 \| failed \| \d+s \|"
    assert re.search(row, runs_md), runs_md  # the wall time is the machine's: any whole number of seconds
    assert "7 of 8 runs finished" in runs_md
    # the fake's step-0 values: clipped 0.3 (seed 1) / 0.4 (seed 2), unclipped 0.1 / 0.2 (it is not deterministic)
    det = next(ln for ln in runs_md.splitlines() if "determinism" in ln)  # the outcome, the spread, what it covers
    names(det, "NOT identical", "0.200", "7 runs", "2 seed(s)")
    n_val = D.read_record(tmp_path, specs[0])["overrides"]  # the tiny task's held-out file: its row count
    import pyarrow.parquet as pq

    rows_val = pq.ParquetFile(next(o.split("=", 1)[1] for o in n_val if o.startswith("data.val_files="))).metadata.num_rows
    se = (0.35 * 0.65 / (rows_val * 4)) ** 0.5
    # the value per seed, their std, the standard error they are set against
    noise = next(ln for ln in runs_md.splitlines() if "standard error" in ln)
    names(noise, "0.300, 0.400", "seeds 1, 2", "std 0.071", "accuracy 0.350", f"{rows_val} problems x 4 samples",
          f"is {se:.3f}")
    assert (tmp_path / "report" / "table.tex").read_text().count(r"\begin{table}") == 2


def test_eval_noise_checks_determinism_within_a_seed_and_measures_the_spread_between_seeds():
    from rpg_lab.study.render import eval_noise

    specs = G.grid(seeds=3, updates=4, stress=(), sizes=SMALL, methods=G.METHODS[4:])
    key = "val-core/math_dapo/acc/mean@4"
    start = {1: 0.5, 2: 0.6, 3: 0.7}
    runs = {s.run_id: {key: {0: start[s.seed], 4: 0.9}} for s in specs}
    det, noise = eval_noise(runs, specs, "acc/mean@4", val_problems=25)
    assert det.startswith("determinism:") and "identical" in det and "NOT" not in det  # the outcome
    names(det, "0.000", "6 runs", "3 seed(s)")  # the largest spread within a seed, and what it covers
    assert "gives 0.500, 0.600, 0.700 for seeds 1, 2, 3 (std 0.100)" in noise
    assert f"is {(0.6 * 0.4 / 100) ** 0.5:.3f} (an upper bound" in noise
    assert eval_noise({}, specs, "acc/mean@4", None) == ["evaluation noise: no run validated before training"]


# ---- the CLI ----

def test_cli_dry_run_prints_grid_and_estimate_and_rejects_bad_flags(tmp_path, capsys):
    assert main(["--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "20 runs (20 to run)" in out and "estimated time to run:" in out and "built-in" in out
    assert not (tmp_path / "runs").exists()
    assert main(["--dry-run", "--out", str(tmp_path), "--updates", "5"]) == 2
    assert "must divide --prompts 16" in capsys.readouterr().err
    assert main(["--dry-run", "--methods", "run_xyz", "--out", str(tmp_path)]) == 2
    assert "no run run_xyz: no experiment/run_xyz.yaml" in capsys.readouterr().err
    assert main(["--dry-run", "--jobs", "0", "--out", str(tmp_path)]) == 2
    assert "--jobs must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("flags, error", [
    (["--seeds", "0"], "--seeds must be >= 1, got 0"),  # before: the default grid (2 seeds, 20 runs)
    (["--async-weights", "--seeds", "0"], "--seeds must be >= 1, got 0"),  # before: 3 seeds
    (["--timeout", "0"], "--timeout must be a finite number of seconds > 0, got 0"),
    (["--timeout", "-1"], "--timeout must be a finite number of seconds > 0, got -1"),
    (["--timeout", "nan"], "--timeout must be a finite number of seconds > 0, got nan"),
    (["--timeout", "inf"], "--timeout must be a finite number of seconds > 0, got inf"),
])
def test_cli_refuses_each_bad_argument_in_one_line_also_under_dry_run(tmp_path, capsys, flags, error):
    for mode in (["--dry-run"], ["--render-only"]):
        assert main([*mode, "--out", str(tmp_path / "s"), *flags]) == 2
        assert capsys.readouterr().err == f"rpg_lab.study: {error}\n"
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("flag, value", [("--staleness", ""), ("--staleness", "1,,2"), ("--staleness", "1,2,"),
                                         ("--staleness", "a"), ("--stress", "1,,4")])
def test_cli_refuses_an_empty_or_holed_integer_list(tmp_path, capsys, flag, value):
    """An empty --staleness (before: the main grid, silently) or an empty element (before: dropped) is argparse's
    usage error; ``--stress ''`` stays the empty stress axis, as its help says."""
    with pytest.raises(SystemExit) as exc:
        main(["--dry-run", "--out", str(tmp_path / "s"), flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.endswith(f"error: argument {flag}: expected comma-separated integers, got {value!r}\n"), err
    assert main(["--dry-run", "--out", str(tmp_path / "s"), "--stress", ""]) == 0
    assert "12 runs (12 to run)" in capsys.readouterr().out  # the main grid only: no stress axis
    assert not (tmp_path / "s").exists()


def test_cli_refuses_an_out_that_is_a_file_and_a_render_of_no_study(fake, tmp_path, capsys):
    """Before: --out naming a file passed --dry-run, then a FileExistsError traceback; --render-only on a
    mistyped folder created it and reported "20 of 20 runs did not finish"."""
    afile = tmp_path / "afile"
    afile.write_text("")
    for flag, path in (("--out", afile), ("--out", afile / "sub"), ("--report-dir", afile)):
        for mode in (["--dry-run"], ["--render-only"], []):
            args = [*mode, "--out", str(tmp_path / "s"), flag, str(path)]
            assert main(args) == 2, args
            # the flag, its value, and the file in the way
            names(one_line(capsys.readouterr().err), f"rpg_lab.study: {flag} {path}:", f"{afile} is a file")
    assert fake.calls == [] and not (tmp_path / "s").exists()
    typo = tmp_path / "stduy"
    assert main(["--render-only", "--out", str(typo)]) == 2
    # the folder named, the runs folder it lacks, what to do
    names(one_line(capsys.readouterr().err), "rpg_lab.study: --render-only", f"--out {typo} ", f"{typo / 'runs'}",
          "run the study first")
    assert not typo.exists()
    (tmp_path / "s" / "runs").mkdir(parents=True)
    assert main(["--render-only", "--out", str(tmp_path / "s")]) == 2
    # the flag, the folder, the runs folder it read, what to do
    names(one_line(capsys.readouterr().err), "rpg_lab.study: --render-only", f"--out {tmp_path / 's'}",
          f"{tmp_path / 's' / 'runs'} ", "run the study first")
    (spec,) = G.grid(seeds=1, updates=4, stress=(), sizes=SMALL, methods=G.METHODS[:1])
    D.run_dir(tmp_path / "s", spec).mkdir()
    G.save_json(D.run_dir(tmp_path / "s", spec) / D.RUN_RECORD, {"status": "failed", "run_id": spec.run_id})
    other = ["--seeds", "2", "--stress", "", "--steps", "4", "--test-freq", "2", "--methods", G.METHODS[1]]
    assert main(["--render-only", "--out", str(tmp_path / "s"), *other]) == 2
    # the folder, the counts, the flags that choose another grid
    names(one_line(capsys.readouterr().err), "rpg_lab.study: --render-only", f"--out {tmp_path / 's'}", "2 runs",
          "1 run of another grid", "--methods", "--seeds", "--async-weights", "--staleness")
    assert fake.calls == []


def test_a_second_study_on_the_same_out_is_refused_and_touches_nothing(fake, tmp_path, capsys):
    """Before: the second study wiped the first one's running run folder (shutil.rmtree before the
    harness's lock), ran it again into the same folder, and both recorded it as done."""
    specs = G.grid(seeds=1, updates=4, stress=(), sizes=SMALL, methods=G.METHODS[:1])
    seen = {}
    first = fake.__call__

    def trainer(overrides, *, output_dir, **kw):
        out = Path(output_dir)
        if not seen:  # while the first study's run is in progress, a second study starts on the same --out
            (out / "trainer.log").write_text("the first study's run\n")
            seen["runs"] = len(fake.calls)
            try:
                R.run_grid(specs, tmp_path, G.BUILTIN_COSTS)
            except R.StudyBusyError as err:
                seen["error"] = str(err)
            seen["log"] = (out / "trainer.log").read_text() if (out / "trainer.log").exists() else None
            seen["runs_after"] = len(fake.calls)
        return first(overrides, output_dir=output_dir, **kw)

    from rpg import trainer_process as harness

    harness.run_trainer = trainer  # the fixture's monkeypatch restores the original
    records = R.run_grid(specs, tmp_path, G.BUILTIN_COSTS)
    # the folder, and who holds it
    names(one_line(seen["error"]), f"--out {tmp_path} ", "another study (python -m rpg_lab.study)")
    assert seen["log"] == "the first study's run\n" and seen["runs_after"] == seen["runs"]  # nothing wiped or run
    assert [r["status"] for r in records] == ["done"]
    R.run_grid(specs, tmp_path, G.BUILTIN_COSTS)  # released when the first study ended


# ---- the behaviour-weight grid (--async-weights) ----

def test_weights_grid_runs_each_arm_in_the_async_trainer_with_its_own_setting(tiny_assets, tmp_path):
    specs = G.weights_grid(seeds=3, updates=4, sizes=SMALL)
    assert [(s.seed, s.arm) for s in specs] == [(k, a) for k in (1, 2, 3) for a in ("exact", "truncated", "uncorrected")]
    assert {s.variant for s in specs} == {G.WEIGHTS_METHOD} and {s.updates for s in specs} == {4}
    assert len({s.run_id for s in specs}) == 9 and all(f"-{s.arm}-seed{s.seed}-" in s.run_id for s in specs)
    assert specs[1].label == "RPG-REINFORCE-UFKL, truncated weights"
    # the sync grid's run ids are unchanged (no arm in them): its finished runs stay finished
    assert G.RunSpec("run_grpo_7b", 4, 1, SMALL).run_id.startswith("run_grpo_7b-k4-seed1-")
    for spec in specs[:3]:
        kv = _kv(D.spec_overrides(spec, tmp_path))
        assert kv["trainer.v1.trainer_mode"] == "colocate_async", spec.arm
        assert kv.get("rpg.loss.behavior_weight_cap", "None") == ("1.0" if spec.arm == "truncated" else "None")
        assert kv.get("rpg.loss.behavior_weight_level", "token") == ("none" if spec.arm == "uncorrected" else "token")
        assert (kv["rpg.loss.form"], kv["rpg.loss.clip"], kv["data.seed"]) == ("reinforce", "True", "1")
    with pytest.raises(ValueError, match="arms \\['bogus'\\] are unknown"):
        G.weights_grid(arms=("bogus",))
    with pytest.raises(ValueError, match="--seeds must be >= 1"):
        G.weights_grid(seeds=0)


def test_weights_render_reports_each_arms_behaviour_statistics_over_steps_from_2(fake, tmp_path):
    specs = G.weights_grid(seeds=2, updates=4, sizes=SMALL)
    records = R.run_grid(specs, tmp_path, G.BUILTIN_COSTS)
    paths = render(tmp_path, tmp_path / "report", specs, records, main_updates=4)
    assert "weights.md" in {p.name for p in paths}
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.strip().strip("|").split("|")[1:]]
            for ln in (tmp_path / "report" / "weights.md").read_text().splitlines() if ln.startswith("| ") and "---" not in ln}
    # steps 2..4 of SMALL: staleness 1; KL 0.01 * step * seed -> step mean 0.03 (seed 1), 0.06 (seed 2), max 0.04, 0.08
    assert rows["exact"] == ["2", "1 [1, 1]", "0.045 [0.03, 0.06]", "0.06 [0.04, 0.08]", "0.125 [0.125, 0.125]",
                             "5 [5, 5]", "0 [0, 0]"]
    assert rows["truncated"][5:] == ["1 [1, 1]", "0.1 [0.1, 0.1]"]
    assert rows["uncorrected"][4:] == ["1 [1, 1]", "1 [1, 1]", "0 [0, 0]"]
    table = (tmp_path / "report" / "table.md").read_text()
    assert all(f"RPG-REINFORCE-UFKL, {a} weights" in table for a in G.WEIGHT_ARMS)  # one Last/Best row per arm


def test_cli_async_weights_dry_run_and_one_method(tmp_path, capsys):
    assert main(["--async-weights", "--dry-run", "--out", str(tmp_path), "--steps", "12", "--test-freq", "4"]) == 0
    out = capsys.readouterr().out
    assert "9 runs (9 to run); each: 12 steps" in out and out.count("uncorrected weights") == 3
    assert main(["--async-weights", "--dry-run", "--out", str(tmp_path), "--methods", "run_grpo_7b,run_dapo_7b"]) == 2
    assert "--async-weights runs one method" in capsys.readouterr().err


def test_async_benchmark_ratio_and_ranges_from_stand_in_runs():
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_async_cpu.py"
    spec = importlib.util.spec_from_file_location("bench_async_cpu", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.ratio({"rpg_sync": {"step_s": 2.0}, "rpg_colocate_async": {"step_s": 2.5}}) == 1.25
    runs = [{"series": {"actor/rpg/behavior_kl": [0.03, 0.1]}}, {"series": {"actor/rpg/behavior_kl": [0.02]}}]
    assert bench.series_range(runs, "actor/rpg/behavior_kl") == (0.02, 0.1)
    assert bench.series_range(runs, "training/off_policy/trajectory_staleness/min") is None
    assert [n for n, (_, _, ov) in bench.VARIANTS.items() if "trainer.v1.trainer_mode=colocate_async" in ov] == ["rpg_colocate_async"]


# ---- the staleness study ----

def test_staleness_grid_sets_exactly_the_mode_the_sync_step_the_threshold_and_the_arms_weights(tiny_assets, tmp_path):
    specs = G.staleness_grid(seeds=3)
    assert len(specs) == 96 and len({s.run_id for s in specs}) == 96
    assert [(s.staleness, s.updates) for s in specs[:8]] == [(1, 1)] * 8 and specs[-1].seed == 3
    assert {s.variant for s in specs} == set(G.STRESS_METHODS) and {s.arm for s in specs} == set(G.STALENESS_ARMS)
    assert specs[0].label == "RPG-REINFORCE-UFKL, staleness 1, token weights"
    # the other grids' run ids are unchanged: their finished runs stay finished
    assert G.RunSpec("run_grpo_7b", 4, 1, SMALL).run_id.startswith("run_grpo_7b-k4-seed1-")
    assert G.RunSpec(G.WEIGHTS_METHOD, 4, 1, SMALL, "exact").run_id.startswith(f"{G.WEIGHTS_METHOD}-k4-exact-seed1-")
    weights = {"token": {}, "sequence": {"rpg.loss.behavior_weight_level": "sequence"},
               "tis2": {"rpg.loss.behavior_weight_cap": "2.0"}, "none": {"rpg.loss.behavior_weight_level": "none"}}
    for spec in [s for s in specs if s.seed == 1 and s.variant == "run_rpg_7b_ufkl1e-4_rf" and s.staleness in (1, 8)]:
        k = spec.staleness
        # against the sync trainer's run of the same method, mini-batch and seed (run-id paths aside)
        sync = _kv(D.spec_overrides(G.RunSpec(spec.variant, k, 1, G.STALENESS_SIZES), tmp_path))
        kv = _kv(D.spec_overrides(spec, tmp_path))
        assert kv["actor_rollout_ref.actor.ppo_mini_batch_size"] == str(16 // k) and kv["data.train_batch_size"] == "16"
        expected = {"trainer.v1.trainer_mode": "separate_async",
                    "trainer.v1.separate_async.parameter_sync_step": str(k),
                    "trainer.v1.separate_async.num_warmup_batches": "1",
                    "trainer.v1.sampler.max_off_policy_threshold": "2",
                    "trainer.v1.sampler.max_off_policy_strategy": "drop", **weights[spec.arm]}
        if k > 1:  # separate_async computes pi_old / reference log-probs per mini-batch
            expected.update({f"actor_rollout_ref.{r}.log_prob_micro_batch_size_per_gpu": str(16 // k * 4)
                             for r in ("rollout", "ref")})
        # (the CPU backend's launch adds the mode's rollout pool and weight sync:
        # tests/verl/test_separate_async_driver.py)
        assert {key: v for key, v in kv.items() if sync.get(key) != v and spec.run_id not in v} == expected, spec.label


def test_staleness_arms_compose_and_pass_the_drivers_checks(tiny_assets, tmp_path):
    """Every arm at the smallest and largest staleness composes and passes the driver's checks (the RPG rules,
    check_separate_async, verl's validate_config) before Ray; in a subprocess, as test_runs_compose_..."""
    specs = [s for s in G.staleness_grid(seeds=1) if s.staleness in (1, 8)]
    got = _composed(specs, tmp_path, "cfg.trainer.v1.separate_async.parameter_sync_step, "
                    "cfg.trainer.v1.sampler.max_off_policy_threshold, s.loss.behavior_weight_level, "
                    "s.loss.behavior_weight_cap, s.loss.clip", timeout=600)
    arm = {"token": ["token", "None"], "sequence": ["sequence", "None"], "tis2": ["token", "2.0"],
           "none": ["none", "None"]}
    assert got == [[str(s.staleness), "2", *arm[s.arm], str("clip_ppo" in s.variant)] for s in specs]


@pytest.mark.parametrize("val, grad, why", [
    ({0: 0.4, 4: 0.6, 8: 0.7}, {1: 0.5, 2: 0.7}, ""),
    ({0: 0.4, 4: 0.6, 8: 0.7}, {1: 0.5, 2: float("nan")}, "gradient norm not finite at step 2"),
    ({0: 0.4, 4: 0.6, 8: 0.7}, {1: float("inf")}, "gradient norm not finite at step 1"),
    ({0: 0.4, 4: 0.19, 8: 0.7}, {}, "accuracy 0.190 at step 4 < 0.5 x step 0's 0.400"),
    ({0: 0.4, 4: 0.2, 8: 0.7}, {}, ""),                       # exactly half: not below
    ({0: 0.4, 4: 0.6, 8: 0.39}, {}, "final accuracy 0.390 < step 0's 0.400"),
    ({0: 0.4}, {}, ""),                                         # nothing after step 0 to judge
])
def test_collapse_criterion(val, grad, why):
    assert G.collapsed(val, grad) == why


def test_staleness_render_table_collapses_and_figure(fake, tmp_path):
    sizes = G.Sizes(steps=4, test_freq=2, prompts=16, n=4, val_n=4)
    specs = G.staleness_grid(seeds=2, staleness=(1, 2), sizes=sizes)
    records = R.run_grid(specs, tmp_path, G.STALENESS_COSTS)
    paths = {p.name for p in render(tmp_path, tmp_path / "report", specs, records, main_updates=4)}
    assert {"staleness.md", "staleness.png", "staleness.svg", "table.md", "runs.md"} <= paths
    assert "stress.png" not in paths and "curves.png" not in paths
    text = (tmp_path / "report" / "staleness.md").read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| RPG")]
    assert len(rows) == 2 * 4 * 2  # methods x arms x staleness values
    assert all(ln.rstrip().endswith("/2 |") for ln in rows)
    assert "Collapse (declared before the runs)" in text


def test_staleness_grid_default_fits_two_hours():
    """The default staleness grid (4 staleness values x 4 weights x clip on/off x 3 seeds) is sized to finish in 2 hours
    on 2 cores at --jobs 2, by its built-in costs (measured: 62 of its runs in 67 min 26 s)."""
    specs = G.staleness_grid()
    assert len(specs) == 96
    assert G.STALENESS_COSTS.grid_s(specs, 2) <= 2 * 3600


def test_cli_staleness_dry_run_estimate_and_refusals(tmp_path, capsys):
    assert main(["--staleness", "1,2,4,8", "--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "96 runs (96 to run); each: 8 steps of 16 prompts" in out and "estimated time to run:" in out
    est = re.search(r"estimated time to run: (\d+)m(\d+)s with 2", out)
    expected = G.STALENESS_COSTS.grid_s(G.staleness_grid(), 2)
    assert est and int(est[1]) * 60 + int(est[2]) == pytest.approx(expected, abs=1)
    assert not (tmp_path / "runs").exists()
    for flags, error in ((["--staleness", "0"], "--staleness must be distinct integers >= 1, got 0"),
                         (["--staleness", "2,2"], "--staleness must be distinct integers >= 1, got 2,2"),
                         (["--staleness", "3"], "optimizer steps per rollout batch [3] must divide --prompts 16"),
                         (["--staleness", "1", "--async-weights"], "--staleness and --async-weights are two different"),
                         (["--staleness", "1", "--seeds", "0"], "--seeds must be >= 1, got 0")):
        assert main(["--dry-run", "--out", str(tmp_path), *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"rpg_lab.study: {error}") and err.count("\n") == 1, err


def test_the_studys_own_method_is_what_its_name_reads_as():
    """The unclipped RPG-REINFORCE-UFKL, which no paper script runs: the overrides the study declares for it are the
    ones scripts/experiments.py gives its name (the paper setup and the settings the name decides), its model and
    data a file's."""
    from launching import generator

    from rpg_lab.study.methods import UNSHIPPED, UNSHIPPED_FILES

    gen = generator()
    for name, overrides in UNSHIPPED.items():
        v = gen.parse(name)
        assert list(overrides) == gen.to_overrides(v) and name not in gen.known_names()
        assert UNSHIPPED_FILES == dict(gen.experiment_settings(v)[:3])
