"""End-to-end: verl's real trainer on the CPU backend with the tiny model (2 GRPO steps, each
trained in 4 mini-batches, i.e. off-policy after the first).

Assertions state what a quantity guarantees (a k3 KL is >= 0 up to float32 rounding; equal where the
same weights and seeds make it so), and "moved" needs a non-zero gradient (asserted where used).

One 2-step run of the default v1 trainer (TransferQueue) is shared by the assertions below and
also writes a checkpoint per step; a second run resumes from the step-1 checkpoint. A third,
optional run covers the legacy v0 trainer. Each run takes about a minute on 2 cores.
"""

import json
import math
import re

import pytest

from rpg.backends.cpu.harness import run_trainer
from rpg.tiny.overrides import tiny_overrides

pytestmark = pytest.mark.e2e

_WEIGHTS_LINE = re.compile(r"\[hf-rollout\] weights v(\d+) loaded \(global_steps=(\w+), checksum=([-0-9.e]+)")


def weight_loads(run) -> list[tuple[int, str, float]]:
    """(version, global_steps, checksum) of every actor->rollout weight sync, in order."""
    return [(int(v), g, float(c)) for v, g, c in _WEIGHTS_LINE.findall(run.log)]


def val_acc(data: dict) -> float | None:
    keys = [k for k in data if k.startswith("val-core/math_dapo/acc/mean@")]
    return data[keys[0]] if keys else None


def rollout_prompts(path, step: int) -> list[str]:
    rows = [json.loads(line) for line in (path / f"{step}.jsonl").read_text().splitlines() if line.strip()]
    return sorted(r["input"] for r in rows)


@pytest.fixture(scope="module")
def grpo(tiny_assets, tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo_v1")
    run = run_trainer(
        [
            *tiny_overrides(tiny_assets, steps=2),
            "trainer.save_freq=1",
            f"trainer.default_local_dir={out / 'ckpt'}",
            f"trainer.rollout_data_dir={out / 'rollouts'}",
        ],
        output_dir=out / "run",
        timeout_s=600,
    )
    return run, out


def test_two_steps_reach_the_end_with_validation(grpo):
    run, _ = grpo
    assert run.returncode == 0
    assert run.metrics[1]["training/global_step"] == 1
    assert run.metrics[2]["training/global_step"] == 2
    assert run.last_step() == 2
    # validation before training (logged at step 0) and after the last step
    assert val_acc(run.metrics[0]) is not None and val_acc(run.metrics[2]) is not None
    assert 0.0 <= val_acc(run.metrics[0]) <= 1.0


# float32 rounding of verl's k3 ("low_var_kl": exp(x) - x - 1, exp near 1 rounded by up to 6e-8)
K3_ROUNDING = 1e-6


def test_updates_move_away_from_the_reference(grpo):
    """verl's k3 KL loss against the fixed reference (= the initial actor) is >= 0 token by token, so
    at every step up to float32 rounding; at step 2 pi_theta is the actor after step 1's update (a
    non-zero gradient: test_actor_weights_change_and_reach_the_rollout), so every token's log-ratio to
    the reference is non-zero and the loss is > 0. (verl's ``ppo_kl`` is k1 against pi_old: no sign,
    and recomputation noise makes it non-zero even on-policy, so it proves nothing here.)"""
    run, _ = grpo
    for step in (1, 2):
        assert run.metrics[step]["actor/kl_loss"] >= -K3_ROUNDING, step
    assert run.metrics[2]["actor/kl_loss"] > K3_ROUNDING


def test_rollout_and_actor_agree_after_weight_sync(grpo):
    run, _ = grpo
    for step in (1, 2):
        m = run.metrics[step]
        # verl compares the rollout's log-probs with the actor's recomputation of the same tokens
        # (float32 on both sides here; the GPU path only reports it, bf16 vs bf16: docs/gpu-smoke.md)
        assert m["training/rollout_probs_diff_max"] < 1e-3, m["training/rollout_probs_diff_max"]
        assert m["training/rollout_actor_probs_pearson_corr"] > 0.999


def test_actor_weights_change_and_reach_the_rollout(grpo):
    run, _ = grpo
    loads = weight_loads(run)
    # initial sync (global_steps=0) + one after each of the 2 updates (global_steps=1, 2)
    assert [g for _, g, _ in loads] == ["0", "1", "2"], run.tail()
    checksums = [c for _, _, c in loads]
    assert checksums[0] != checksums[1] != checksums[2]
    assert run.metrics[1]["actor/grad_norm"] > 0


def test_metrics_are_finite(grpo):
    run, _ = grpo
    bad = {
        (s, k): v
        for s, d in run.metrics.items()
        for k, v in d.items()
        if isinstance(v, (int, float)) and not math.isfinite(v)
    }
    assert not bad


def test_no_ray_process_left_behind(grpo):
    run, _ = grpo
    assert run.leftover_pids == []


def test_checkpoint_resume_continues_with_the_same_data(grpo, tiny_assets, tmp_path):
    """Save at step 1, resume from it, train step 2: same prompts and same starting weights."""
    first, out = grpo
    ckpt = out / "ckpt" / "global_step_1"
    assert (ckpt / "data.pt").exists(), sorted(p.name for p in ckpt.iterdir())
    resumed = run_trainer(
        [
            *tiny_overrides(tiny_assets, steps=2),
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={ckpt}",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            f"trainer.rollout_data_dir={tmp_path / 'rollouts'}",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
        ],
        output_dir=tmp_path / "run",
        timeout_s=600,
    )
    # only step 2 is trained, continuing the global step count
    assert resumed.metrics[2]["training/global_step"] == 2
    assert 1 not in resumed.metrics
    # identical dataloader position: step 2 sees exactly the prompts the uninterrupted run saw
    assert rollout_prompts(tmp_path / "rollouts", 2) == rollout_prompts(out / "rollouts", 2)
    # the resumed actor starts from the step-1 weights (first sync == the original run's sync after step 1)
    first_loads, resumed_loads = weight_loads(first), weight_loads(resumed)
    after_step_1 = [c for _, g, c in first_loads if g == "1"]  # the sync that follows step 1's update
    assert after_step_1 and resumed_loads[0][2] == pytest.approx(after_step_1[0], rel=0, abs=1e-6)
    assert resumed.metrics[2]["actor/kl_loss"] > K3_ROUNDING  # the fixed reference is the initial model again
    # same weights, same prompts, and the rollout's per-sequence seeds depend on the step, not on
    # the process: step 2 samples the same responses (same rewards and lengths). The weights after
    # step 2 are not compared: verl's v1 replay buffer orders the batch by rollout completion, so
    # which responses share a mini-batch varies from run to run.
    for key in ("critic/score/mean", "response_length/mean"):
        assert resumed.metrics[2][key] == pytest.approx(first.metrics[2][key], rel=1e-6), key
    assert resumed.leftover_pids == []


def test_legacy_v0_trainer_runs_two_steps(cpu_trainer):
    run = cpu_trainer(["trainer.use_v1=False", "trainer.val_before_train=False"], steps=2)
    assert run.metrics[2]["training/global_step"] == 2
    # k3 against the fixed reference: >= 0 (float32 rounding aside); > 0 once step 1's update moved the actor
    assert run.metrics[1]["actor/kl_loss"] >= -K3_ROUNDING and run.metrics[2]["actor/kl_loss"] > K3_ROUNDING
    assert run.metrics[2]["training/rollout_probs_diff_max"] < 1e-3
    assert val_acc(run.metrics[2]) is not None
    assert run.leftover_pids == []
