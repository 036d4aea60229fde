"""OpenRLHF 0.11.2: ``openrlhf.models.utils.compute_approx_kl(log_probs, log_probs_base, log_probs_old,
kl_estimator, unbiased_gradient)``, called by its PPO actor as a loss (``--algo.kl.use_loss``:
``ActorPPOTrainer`` adds ``aggregate_loss(compute_approx_kl(action_log_probs, base_action_log_probs,
log_probs_old=old_action_log_probs, ...))·kl_ctl``) and, by default, in the reward
(``RemoteExperienceMaker``: ``compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator)`` on the
sampler's log-probs, then ``compute_reward``'s ``−kl_coef·kl``).

``openrlhf/models/utils.py`` is executed from its installed file: the package's ``openrlhf/models/__init__.py``
imports ``flash_attn`` (through ``ring_attn_utils``), which has no CPU build; the module itself imports deepspeed,
torch and transformers at its top, all installed (lab/scripts/setup_conformance.sh)."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from rpg_lab.conformance.probes import protocol

ESTIMATORS = ("k1", "k2", "k3")


@functools.cache
def _utils():
    package = importlib.util.find_spec("openrlhf")
    if package is None or package.origin is None:
        raise ImportError("openrlhf is not installed on this path (lab/scripts/setup_conformance.sh)")
    spec = importlib.util.spec_from_file_location("openrlhf_models_utils",
                                                  Path(package.origin).parent / "models" / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _loss(batch: dict, estimator: str, unbiased: bool) -> dict:
    return protocol.loss_terms(lambda l: _utils().compute_approx_kl(
        l, batch["l_ref"], log_probs_old=batch["l_mu"], kl_estimator=estimator, unbiased_gradient=unbiased), batch)


def _reward(batch: dict, estimator: str) -> dict:
    return protocol.reward_terms(lambda l: _utils().compute_approx_kl(l, batch["l_ref"], kl_estimator=estimator),
                                 batch)


SETTINGS = {**{f"loss:{e}": functools.partial(_loss, estimator=e, unbiased=False) for e in ESTIMATORS},
            **{f"loss:{e}-unbiased": functools.partial(_loss, estimator=e, unbiased=True) for e in ESTIMATORS},
            **{f"reward:{e}": functools.partial(_reward, estimator=e) for e in ESTIMATORS}}


DISTRIBUTION = "openrlhf"
compute = functools.partial(protocol.compute, SETTINGS)

if __name__ == "__main__":
    protocol.main(compute, DISTRIBUTION)
