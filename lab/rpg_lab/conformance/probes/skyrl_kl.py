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


def _term(kind: str, batch: dict, estimator: str) -> dict:
    from skyrl.backends.skyrl_train.utils.ppo_utils import compute_approx_kl

    def term(l):
        return compute_approx_kl(l, batch["l_ref"], kl_estimator_type=estimator)

    return protocol.terms(kind, term, batch)


SETTINGS = {**{f"loss:{e}": functools.partial(_term, "loss", estimator=e) for e in ESTIMATORS},
            **{f"reward:{e}": functools.partial(_term, "reward", estimator=e) for e in ESTIMATORS}}


def compute(batches: list[dict]) -> list[dict]:
    return [protocol.run_each(SETTINGS, batch) for batch in batches]


def version() -> str:
    from importlib.metadata import version as installed

    return installed("skyrl")


if __name__ == "__main__":
    protocol.main(compute, version)
