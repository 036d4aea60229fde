"""AReaL 1.0.4: ``areal.utils.data.KLEstimator(kl_estimator)(log_probs, log_probs_base)``, called in the reward
only: ``PPOActor.compute_advantages`` sets ``rewards = −kl_ctl·KLEstimator(old_logp, ref_logp)`` per token (the
sampler's log-probs; ``actor.kl_ctl``, ``actor.kl_estimator``, k1 by default) before GAE."""

from __future__ import annotations

import functools

from rpg_lab.conformance.probes import protocol

ESTIMATORS = ("k1", "k2", "k3")


def _kl_estimator(batch: dict, estimator: str):
    from areal.utils.data import KLEstimator

    return lambda l: KLEstimator(estimator)(l, batch["l_ref"])


SETTINGS = protocol.by_estimator(_kl_estimator, reward=ESTIMATORS)
DISTRIBUTION = "areal"
compute = functools.partial(protocol.compute, SETTINGS)

if __name__ == "__main__":
    protocol.main(compute, DISTRIBUTION)
