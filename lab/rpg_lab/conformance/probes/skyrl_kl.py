"""SkyRL 0.4.0: ``skyrl.backends.skyrl_train.utils.ppo_utils.compute_approx_kl(log_probs, log_probs_base,
loss_mask, kl_estimator_type)``, called as a loss by default (``trainer.algorithm.use_kl_loss=True``, k3: the
policy worker adds ``masked_mean(compute_approx_kl(action_log_probs, base_action_log_probs, ...))·kl_loss_coef``,
no importance weight) and in the reward (``use_kl_in_reward=True``: ``RayPPOTrainer.apply_reward_kl_penalty``
subtracts ``kl_loss_coef·compute_approx_kl(action_log_probs, base_action_log_probs, ...)``, the sampler's
log-probs)."""

from __future__ import annotations

import functools

from rpg_lab.conformance.probes import protocol

ESTIMATORS = ("k1", "abs", "k2", "k3")


def _compute_approx_kl(batch: dict, estimator: str):
    from skyrl.backends.skyrl_train.utils.ppo_utils import compute_approx_kl

    return lambda l: compute_approx_kl(l, batch["l_ref"], kl_estimator_type=estimator)


SETTINGS = protocol.by_estimator(_compute_approx_kl, loss=ESTIMATORS, reward=ESTIMATORS)
DISTRIBUTION = "skyrl"
compute = functools.partial(protocol.compute, SETTINGS)

if __name__ == "__main__":
    protocol.main(compute, DISTRIBUTION)
