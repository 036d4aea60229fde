"""End-to-end: verl's real trainer on the CPU backend with the tiny model: verl's stock GRPO through
the recipe (``rpg.loss.name=verl``: the path of the paper's GRPO scripts and of the tiny demo's
``ALGO=grpo``), 2 steps, each trained in 4 mini-batches (off-policy after the first), a fixed
reference with verl's k3 KL loss.

One run is shared by the assertions below (about a minute on 2 cores). Resuming from a checkpoint:
tests/test_verl_reference_resume_e2e.py.
"""

import math
import re
from pathlib import Path

import psutil
import pytest
from e2e_recipe import network_listeners

from rpg.launch.harness import run_trainer
from rpg.tiny.overrides import tiny_algorithm, tiny_overrides

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]

_WEIGHTS_LINE = re.compile(r"\[hf-rollout\] weights v(\d+) loaded \(global_steps=(\w+), checksum=([-0-9.e]+)")
# float32 rounding of verl's k3 ("low_var_kl": exp(x) - x - 1, exp near 1 rounded by up to 6e-8)
K3_ROUNDING = 1e-6


def weight_loads(run) -> list[tuple[int, str, float]]:
    """(version, global_steps, checksum) of every actor->rollout weight sync, in order."""
    return [(int(v), g, float(c)) for v, g, c in _WEIGHTS_LINE.findall(run.log)]


def val_acc(data: dict) -> float | None:
    keys = [k for k in data if k.startswith("val-core/math_dapo/acc/mean@")]
    return data[keys[0]] if keys else None


@pytest.fixture(scope="module")
def grpo(tiny_assets, tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo")
    entry, _ = tiny_algorithm("grpo")
    listeners: dict[int, list[str]] = {}

    def on_metrics(step, _data):  # while the run is up: every process of it (Ray's daemons included)
        listeners[step] = network_listeners(psutil.Process().children(recursive=True))

    run = run_trainer(
        [*tiny_overrides(tiny_assets, steps=2, test_freq=2, algo="grpo"), f"trainer.default_local_dir={out / 'ckpt'}"],
        output_dir=out / "run",
        entry=str(ROOT / entry),
        timeout_s=600,
        on_metrics=on_metrics,
    )
    run.network_listeners = listeners
    return run


def test_two_steps_reach_the_end_with_validation(grpo):
    run = grpo
    assert run.returncode == 0
    assert run.metrics[1]["training/global_step"] == 1
    assert run.metrics[2]["training/global_step"] == 2
    assert run.last_step() == 2
    # validation before training (logged at step 0) and after the last step
    assert val_acc(run.metrics[0]) is not None and val_acc(run.metrics[2]) is not None
    assert 0.0 <= val_acc(run.metrics[0]) <= 1.0


def test_verls_own_loss_and_a_fixed_reference_through_the_recipe(grpo):
    """rpg.loss.name=verl with a reference mode: verl builds the reference model and adds its own KL
    term; the RPG loss never runs; the recipe's trainer logs the reference diagnostics."""
    run = grpo
    all_keys = {k for d in run.metrics.values() for k in d}
    assert "loss=verl:vanilla" in run.log and "anchor=reference mode=fixed" in run.log
    assert "timing_s/ref" in all_keys and not any(k.startswith("actor/rpg/") for k in all_keys)
    assert "actor/pg_clipfrac_lower" in all_keys and "actor/kl_loss" in all_keys  # verl's vanilla loss + KL term
    assert "rpg/ref_reset" not in all_keys  # fixed: never reset


def test_updates_move_away_from_the_reference(grpo):
    """verl's k3 KL loss against the fixed reference (= the initial actor) is >= 0 token by token, so
    at every step up to float32 rounding; at step 2 pi_theta is the actor after step 1's update (a
    non-zero gradient: test_actor_weights_change_and_reach_the_rollout), so every token's log-ratio to
    the reference is non-zero and the loss is > 0. The same for the recipe's k3 estimate of
    KL(pi_old || pi_ref) on the step's batch (``rpg/ref_kl``): pi_old of step 1 is the reference.
    (verl's ``ppo_kl`` is k1 against pi_old: no sign, and recomputation noise makes it non-zero even
    on-policy, so it proves nothing here.)"""
    run = grpo
    for step in (1, 2):
        assert run.metrics[step]["actor/kl_loss"] >= -K3_ROUNDING, step
        assert run.metrics[step]["rpg/ref_kl"] >= -K3_ROUNDING, step
    assert run.metrics[2]["actor/kl_loss"] > K3_ROUNDING
    assert run.metrics[1]["rpg/ref_kl"] < K3_ROUNDING < run.metrics[2]["rpg/ref_kl"]


def test_rollout_and_actor_agree_after_weight_sync(grpo):
    run = grpo
    for step in (1, 2):
        m = run.metrics[step]
        # verl compares the rollout's log-probs with the actor's recomputation of the same tokens
        # (float32 on both sides here; the GPU path only reports it, bf16 vs bf16: docs/gpu-smoke.md)
        assert m["training/rollout_probs_diff_max"] < 1e-3, m["training/rollout_probs_diff_max"]
        assert m["training/rollout_actor_probs_pearson_corr"] > 0.999


def test_actor_weights_change_and_reach_the_rollout(grpo):
    run = grpo
    loads = weight_loads(run)
    # initial sync (global_steps=0) + one after each of the 2 updates (global_steps=1, 2)
    assert [g for _, g, _ in loads] == ["0", "1", "2"], run.tail()
    checksums = [c for _, _, c in loads]
    assert checksums[0] != checksums[1] != checksums[2]
    assert run.metrics[1]["actor/grad_norm"] > 0


def test_metrics_are_finite(grpo):
    run = grpo
    bad = {
        (s, k): v
        for s, d in run.metrics.items()
        for k, v in d.items()
        if isinstance(v, (int, float)) and not math.isfinite(v)
    }
    assert not bad


def test_no_ray_process_left_behind(grpo):
    assert grpo.leftover_pids == []


def test_no_process_of_the_run_listens_beyond_loopback(grpo):
    """Checked at every logged step, while the trainer, Ray's daemons, the rollout server and the
    workers are up. Before: gcs_server, raylet, workers and the agents listened on every interface or the
    node's address (fixed by Ray's single-machine mode, rpg.launch.run_env), and so did torch.distributed's
    TCPStore of the FSDP worker group (fixed by a file rendezvous, rpg.launch.harness)."""
    assert sorted(grpo.network_listeners) == [0, 1, 2]
    assert all(found == [] for found in grpo.network_listeners.values()), grpo.network_listeners
