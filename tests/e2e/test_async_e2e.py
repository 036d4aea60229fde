"""End-to-end: the RPG loss in verl's colocate-async trainer (``trainer.v1.trainer_mode=colocate_async``) on
the CPU backend with the tiny model. ONE launch (4 steps, reference mode kl_threshold so that the
weighted reference KL runs too) shared by every assertion below.

What the quantities guarantee: at step 1 the samples come from the initial policy, which is pi_old
(staleness 0), so mu == pi_old up to float32 recomputation noise; from step 2 on each sample was
generated one update behind (verl pre-generates one warm-up batch), so KL(mu || pi_old) is that of a
whole update of the tiny model at lr 5e-4, far above 1e-4 (e2e_recipe.py: the thresholds' premise).
"""

import pytest

from e2e_recipe import K3_ROUNDING, ON_POLICY, at, rpg_run
from rpg.trainer_process import run_trainer
from rpg.tiny.overrides import tiny_overrides

pytestmark = [pytest.mark.e2e, pytest.mark.trainer_e2e]  # a CI stage: README's suite runs no trainer launch

STEPS = 4
B = "actor/rpg/behavior_"  # the loss's metrics, as verl logs them (actor/ prefix)
BEHAVIOR = tuple(B + k for k in ("kl", "kl_k3", "weight_mean", "weight_max", "weight_min", "weight_capped_frac"))


@pytest.fixture(scope="module")
def run(tiny_assets, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("async")

    def trainer(overrides, *, steps, entry, name):
        return run_trainer([*tiny_overrides(tiny_assets, steps=steps, algo="rpg"), *overrides],
                           output_dir=tmp / name, entry=entry, timeout_s=600.0)

    return rpg_run(trainer, tmp, [
        "trainer.v1.trainer_mode=colocate_async",
        "rpg.reference.mode=kl_threshold", "rpg.reference.kl_threshold=1000.0",  # weighted ref KL, never a reset
    ], steps=STEPS)


def test_every_step_runs_the_rpg_loss_with_the_behaviour_weights(run):
    assert run.returncode == 0
    for s in range(1, STEPS + 1):
        for key in ("actor/rpg/kl_estimate", "actor/rpg/ratio_mean", "actor/pg_loss", "rpg/ref_kl", *BEHAVIOR):
            assert key in run.metrics[s], (s, key)
        assert at(run, s, B + "weight_min") <= at(run, s, B + "weight_mean") \
            <= at(run, s, B + "weight_max")
        assert at(run, s, B + "weight_capped_frac") == 0.0  # untruncated by default
        assert at(run, s, B + "kl_k3") >= -K3_ROUNDING
        assert at(run, s, "rpg/ref_kl") >= -K3_ROUNDING  # b-weighted k3: >= 0 per token, positive weights
        assert at(run, s, "rpg/ref_reset") == 0.0


def test_step_one_is_on_policy_and_later_steps_are_stale(run):
    staleness = [at(run, s, "training/off_policy/trajectory_staleness/min") for s in range(1, STEPS + 1)]
    assert staleness[0] == 0 and all(x >= 1 for x in staleness[1:]), staleness
    # step 1: mu == pi_old (recomputation noise only)
    assert at(run, 1, B + "kl_k3") < 1e-6
    assert 1 - ON_POLICY < at(run, 1, B + "weight_min") <= at(run, 1, B + "weight_max") < 1 + ON_POLICY
    for s in range(2, STEPS + 1):
        assert at(run, s, B + "kl_k3") > 1e-4, s
        assert at(run, s, "rollout_corr/k3_kl") > 1e-4, s  # verl's statistic of the same KL(mu || pi_old)
        assert at(run, s, B + "weight_max") > 1 + ON_POLICY or at(run, s, B + "weight_min") < 1 - ON_POLICY


def test_the_lag_and_the_weights_step_statistics(run):
    """The lag in versions is verl's own staleness count (from the same tags: the sampler's version; equal minimum
    and maximum version on the HF rollout, which never resumes a partial sequence); in optimizer updates it is 4 per
    version (the tiny task's 8 prompts in mini-batches of 2, one epoch). The weights' effective sample size is 1 and
    the log weight's second moment 0 when mu is pi_old (step 1, up to recomputation noise), below 1 and above 0
    afterwards."""
    for s in range(1, STEPS + 1):
        for stat in ("mean", "max"):
            versions = at(run, s, f"training/rpg/lag_versions_{stat}")
            assert versions == at(run, s, f"training/off_policy/trajectory_staleness/{stat}"), (s, stat)
            assert at(run, s, f"training/rpg/lag_updates_{stat}") == 4 * versions, (s, stat)
        ess, m2 = at(run, s, B + "ess"), at(run, s, B + "log_w_m2")
        assert 0 < ess <= 1 and m2 >= 0
        if s == 1:
            assert ess > 1 - 1e-9 and m2 < 1e-9
        else:
            assert ess < 1 - 1e-4 and m2 > 1e-4, (s, ess, m2)
    assert at(run, 1, "training/rpg/lag_versions_max") == 0
    assert all(at(run, s, "training/rpg/lag_versions_mean") > 0 for s in range(2, STEPS + 1))
