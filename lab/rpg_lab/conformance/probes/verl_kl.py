"""verl 0.9.1: ``verl.trainer.ppo.core_algos.kl_penalty(logprob, ref_logprob, kl_penalty)``, the one function both of
verl's KL paths call: as a loss (``actor.use_kl_loss=True``: ``verl.workers.utils.losses.ppo_loss`` adds
``agg_loss(kl_penalty(log_prob, ref_log_prob, actor.kl_loss_type))·kl_loss_coef``, no importance weight) and in the
reward (``algorithm.use_kl_in_reward=True``: ``verl.trainer.ppo.ray_trainer.apply_kl_penalty`` subtracts
``β·kl_penalty(old_log_probs, ref_log_prob, algorithm.kl_penalty)`` from the token rewards)."""

from __future__ import annotations

import functools

from rpg_lab.conformance.probes import protocol

# the kl_penalty values verl 0.9.1 accepts (core_algos.kl_penalty_forward; "+": k2's gradient, straight through)
LOSS_TYPES = ("kl", "abs", "mse", "low_var_kl", "kl+", "low_var_kl+", "full")
REWARD_TYPES = ("kl", "abs", "mse", "low_var_kl", "full")


def _kl_penalty(batch: dict, estimator: str):
    from verl.trainer.ppo.core_algos import kl_penalty

    return lambda l: kl_penalty(logprob=l, ref_logprob=batch["l_ref"], kl_penalty=estimator)


SETTINGS = protocol.by_estimator(_kl_penalty, loss=LOSS_TYPES, reward=REWARD_TYPES)
DISTRIBUTION = "verl"
compute = functools.partial(protocol.compute, SETTINGS)

if __name__ == "__main__":
    protocol.main(compute, DISTRIBUTION)
