"""Unit tests of the CPU switch (env_overrides.py) and the harness's command assembly (no processes)."""

import pytest
from messages import names, one_line

from rpg.backends.cpu import env_overrides
from rpg.override_lists import merge_overrides, override_key
from rpg.trainer_process import build_command, read_metrics


def test_cpu_env_selects_platform_and_registration_module():
    env = env_overrides.cpu_env(base={})
    assert env["VERL_PLATFORM"] == "cpu"
    assert env["VERL_USE_EXTERNAL_MODULES"] == env_overrides.REGISTER_MODULE
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["TQ_NUM_THREADS"] == "1"  # TransferQueue's own torch thread count (default 8 -> cores)


def test_a_cpu_runs_ray_exports_no_metrics_unless_the_user_asks():
    """Ray's metrics off and its agent's node report once a minute (nobody reads them on the CPU backend); a value the
    user set wins. The GPU backend's runs keep Ray's defaults (a GPU cluster's dashboard reads them)."""
    from rpg.backends.gpu.env_overrides import gpu_env

    env = env_overrides.cpu_env(base={})
    assert env["RAY_enable_metrics_collection"] == "0" and int(env["REPORTER_UPDATE_INTERVAL_MS"]) >= 60_000
    asked = env_overrides.cpu_env(base={"RAY_enable_metrics_collection": "1"})
    assert asked["RAY_enable_metrics_collection"] == "1" and asked["REPORTER_UPDATE_INTERVAL_MS"] == "60000"
    assert not {"RAY_enable_metrics_collection", "REPORTER_UPDATE_INTERVAL_MS"} & set(gpu_env(base={}))
    # a job on a running cluster: its nodes' settings decide (their dashboard may read the metrics)
    job = env_overrides.cluster_job_env({}, "file:///shared/rendezvous")
    assert not {"RAY_enable_metrics_collection", "REPORTER_UPDATE_INTERVAL_MS"} & set(job)


def test_external_modules_keeps_existing_and_extra_without_duplicates():
    env = env_overrides.cpu_env(["rpg.verl.register", env_overrides.REGISTER_MODULE],
                                base={"VERL_USE_EXTERNAL_MODULES": "a,b"})
    assert env["VERL_USE_EXTERNAL_MODULES"] == f"{env_overrides.REGISTER_MODULE},a,b,rpg.verl.register"


def test_cpu_overrides_cover_the_required_switches():
    ov = env_overrides.cpu_overrides(env_overrides.cpu_env(base={}))
    keys = {override_key(o): o.split("=", 1)[1] for o in ov}
    assert keys["trainer.device"] == "cpu"
    assert keys["actor_rollout_ref.rollout.name"] == env_overrides.ROLLOUT_NAME
    assert keys["actor_rollout_ref.actor.strategy"] == "fsdp2"
    assert keys["actor_rollout_ref.ref.fsdp_config.strategy"] == "fsdp2"
    assert keys["ray_kwargs.ray_init.num_gpus"] == "1"
    assert keys["transfer_queue.backend.SimpleStorage.num_data_storage_units"] == "1"
    # env values forwarded to Ray workers as Hydra *strings* (runtime_env rejects ints)
    assert keys["ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM"] == "'cpu'"
    assert keys["ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS"] == "'1'"
    assert keys["ray_kwargs.ray_init.runtime_env.env_vars.TQ_NUM_THREADS"] == "'1'"


def test_merge_overrides_later_wins_and_keeps_first_prefix():
    merged = merge_overrides(["a=1", "+b.c=2", "d=3"], ["b.c=5", "a=7", "+e=1"])
    assert merged == ["a=7", "+b.c=5", "d=3", "+e=1"]


def test_merge_overrides_rejects_non_assignments():
    with pytest.raises(ValueError, match="key=value"):
        merge_overrides(["trainer.device"])


def test_forwarding_keeps_a_value_with_a_quote():
    from rpg.override_lists import values

    forwarded = values(env_overrides.cpu_overrides({"OMP_NUM_THREADS": "1'2"}))
    assert forwarded["ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS"] == "1'2"


def test_build_command_adds_file_logger_and_user_overrides_last(tmp_path):
    argv, env = build_command(["trainer.device=cuda", "x.y=1"], base_env={})
    assert argv[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert "trainer.device=cuda" in argv and "trainer.device=cpu" not in argv
    assert "trainer.logger=['console','file']" in argv
    assert env["VERL_PLATFORM"] == "cpu"
    script = tmp_path / "main_x.py"
    script.write_text("")
    argv, _ = build_command([], entry=str(script), base_env={})
    assert argv[1] == str(script.resolve())
    with pytest.raises(ValueError, match="entry script not found"):
        build_command([], entry=str(tmp_path / "missing.py"), base_env={})


def test_build_command_adds_the_file_logger_to_a_custom_logger():
    """The harness reads verl's file logger: a trainer.logger without it gets it added (it was a ValueError
    traceback from the tiny demo), the user's loggers kept."""
    argv, _ = build_command(["trainer.logger=['console']"], base_env={})
    assert argv[-1] == "trainer.logger=['console','file']"


def test_read_metrics_merges_records_of_a_step(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 0, "data": {"v": 1}}\n{"step": 1, "data": {"a": 2}}\n{"step": 1, "data": {"b": 3}}\n{"st')
    assert read_metrics(p) == {0: {"v": 1}, 1: {"a": 2, "b": 3}}


def test_tiny_task_is_off_policy_by_default(tmp_path):
    """Several optimizer steps per rollout batch (mini-batch < batch), one micro-batch per mini-batch."""
    from rpg.tiny.build import TinyAssets
    from rpg.tiny.overrides import tiny_task_overrides

    ov = dict(o.split("=", 1) for o in tiny_task_overrides(TinyAssets.at(tmp_path), n=8))
    batch, mini = int(ov["data.train_batch_size"]), int(ov["actor_rollout_ref.actor.ppo_mini_batch_size"])
    assert batch // mini >= 4 and batch % mini == 0
    assert int(ov["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"]) == mini * 8
    assert int(ov["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"]) == batch * 8
    with pytest.raises(ValueError, match="mini_batch_size=3"):
        tiny_task_overrides(TinyAssets.at(tmp_path), mini_batch_size=3)


def test_paths_reach_hydra_as_the_same_strings(tmp_path, monkeypatch):
    """A folder name with a comma, a space or an '=' (a cache, a checkout, TMPDIR): the tiny task's files and
    model, the GPU smoke run's checkpoint folders and the harness's Ray folder are read back by Hydra's own
    parser as those very paths (bare, ``a,b`` was a sweep: OverrideSyntaxError)."""
    from types import SimpleNamespace

    from rpg.override_lists import values
    from rpg_lab.demo import gpu_smoke
    from rpg.trainer_process import run_trainer
    from rpg.tiny.build import TinyAssets
    from rpg.tiny.overrides import tiny_task_overrides

    odd = tmp_path / "my,cache dir=1"
    assets = TinyAssets.at(odd)
    got = values(tiny_task_overrides(assets))
    assert got["data.train_files"] == str(assets.train_file) and got["data.val_files"] == str(assets.val_file)
    assert got["actor_rollout_ref.model.path"] == str(assets.model_dir)
    args = SimpleNamespace(steps=2, resume_steps=1, lr=1e-6, rollout="hf", gpus=1, no_offload=False)
    got = values(gpu_smoke.smoke_overrides(assets, args, first=False, ckpt=odd / "ckpt"))
    assert got["trainer.default_local_dir"] == str(odd / "ckpt")
    assert got["trainer.resume_from_path"] == str(odd / "ckpt" / "global_step_2")
    import shutil
    import tempfile
    from pathlib import Path

    from rpg.paths.ray_temp import SHORT_BASES

    # the Ray folder's parent: as odd, and short enough for Ray's socket paths (under pytest's long tmp_path the
    # run's folder would be made elsewhere: rpg.paths.ray_temp)
    short = Path(tempfile.mkdtemp(prefix=", =", dir=SHORT_BASES[0]))  # 16 bytes: rpg.paths.ray_temp.longest_base
    monkeypatch.setattr("tempfile.tempdir", str(short))
    seen = {}

    def capture(overrides, *a, **k):
        seen.update(values(overrides))
        raise RuntimeError("captured")

    monkeypatch.setattr("rpg.trainer_process.run.build_command", capture)
    try:
        with pytest.raises(RuntimeError, match="captured"):
            run_trainer([], output_dir=tmp_path / "out", entry="x.py", timeout_s=1)
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert seen["ray_kwargs.ray_init._temp_dir"].startswith(str(short / "rpgray")), seen


def test_demo_progress_shows_ratio_range_kl_and_clip_fraction():
    from rpg_lab.demo.progress import policy_stats

    rpg = {"actor/rpg/ratio_min": 0.52, "actor/rpg/ratio_max": 1.31, "actor/rpg/kl_estimate": 3.0e-3,
           "actor/rpg/clipfrac": 0.037, "actor/ppo_kl": 9.0, "actor/pg_clipfrac": 9.0}
    assert policy_stats(rpg) == "ratio [0.52, 1.31]  kl 3.0e-03  clipped 3.7%"
    verl = {"actor/ppo_kl": 2.0e-3, "actor/pg_clipfrac": 0.01, "actor/kl_loss": 4.0e-4}
    assert policy_stats(verl) == "kl 2.0e-03  clipped 1.0%  kl_loss(ref) 4.0e-04"


def test_demo_validation_accuracy_is_read_from_each_data_source_the_run_logs(capsys):
    """Before: only val-core/math_dapo/acc/mean@N was read, so a run validating on another data source printed
    "validation accuracy: before n/a -> after n/a" although val-core/aime2025/acc/mean@4 was logged."""
    from rpg_lab.demo.progress import progress, val_accs, val_summary

    one = {0: {"val-core/aime2025/acc/mean@4": 0.25}, 1: {"critic/score/mean": 0.0},
           2: {"val-core/aime2025/acc/mean@4": 0.5, "val-aux/aime2025/acc/std@4": 0.1}}
    assert val_summary(one) == ({"aime2025": {"before": 0.25, "after": 0.5, "curve": [[0, 0.25], [2, 0.5]]}},
                                "before 0.250 -> after 0.500")
    two = {0: {"val-core/aime2024/acc/mean@32": 0.1, "val-core/aime2025/acc/mean@32": 0.2},
           4: {"val-core/aime2024/acc/mean@32": 0.3, "val-core/aime2025/acc/mean@32": 0.4}}
    names(one_line(val_summary(two)[1]), "aime2024 before 0.100 -> after 0.300", "aime2025 before 0.200 -> after 0.400")
    names(one_line(val_summary({1: {"critic/score/mean": 0.0}})[1]), "before n/a -> after n/a",
          "val-core/<data source>/acc/mean@N")
    assert val_accs({"val-core/x/acc/mean@1": 0.9, "val-core/x/acc/mean@4": 0.5}) == {"x": 0.5}  # the largest N
    show = progress(4, "[tiny]")
    show(0, one[0])
    show(2, {**one[2], "critic/score/mean": 0.0})
    show(0, two[0])
    out = capsys.readouterr().out
    assert "[tiny] validation before training: acc 0.250\n" in out and "[tiny] validation at step 2: acc 0.500\n" in out
    (both,) = [x for x in out.splitlines() if x.startswith("[tiny] validation before training") and "aime2024" in x]
    names(both, "aime2024 0.100", "aime2025 0.200")


def test_startup_progress_names_stages_and_heartbeats(capsys):
    import time

    from rpg_lab.demo.cpu import PREFIX, STARTUP_STAGES
    from rpg_lab.demo.progress import StartupProgress

    progress = StartupProgress(STARTUP_STAGES, PREFIX, heartbeat_s=0.2)
    progress.on_line("(RPGTaskRunner pid=1) something")  # the Ray stage line was skipped: still reported
    progress.on_line("unrelated output")
    printed, t0 = "", time.time()
    while "waiting (" not in printed and time.time() - t0 < 60:  # the first heartbeat (due 0.2 s after the line)
        time.sleep(0.05)
        printed += capsys.readouterr().out
    progress.finish()
    progress.on_line(STARTUP_STAGES[-1][0])  # after the first metrics: silent
    out = (printed + capsys.readouterr().out).splitlines()
    assert STARTUP_STAGES[1][1] in out[0] and out[0].startswith(PREFIX)
    assert any("waiting (" + STARTUP_STAGES[1][1] in line for line in out[1:])
    assert not any(STARTUP_STAGES[-1][1] in line for line in out)
