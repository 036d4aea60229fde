"""AReaL 1.0.4: ``areal.utils.data.KLEstimator(kl_estimator)(log_probs, log_probs_base)``, called in the reward
only: ``PPOActor.compute_advantages`` sets ``rewards = −kl_ctl·KLEstimator(old_logp, ref_logp)`` per token (the
sampler's log-probs; ``actor.kl_ctl``, ``actor.kl_estimator``, k1 by default) before GAE."""

from __future__ import annotations

import functools

from rpg_lab.conformance.probes import protocol

ESTIMATORS = ("k1", "k2", "k3")


def _reward(batch: dict, estimator: str) -> dict:
    from areal.utils.data import KLEstimator

    return protocol.reward_terms(lambda l: KLEstimator(estimator)(l, batch["l_ref"]), batch)


SETTINGS = {f"reward:{e}": functools.partial(_reward, estimator=e) for e in ESTIMATORS}


def compute(batches: list[dict]) -> list[dict]:
    return [protocol.run_each(SETTINGS, batch) for batch in batches]


def version() -> str:
    from importlib.metadata import version as installed

    return installed("areal")


if __name__ == "__main__":
    protocol.main(compute, version)
