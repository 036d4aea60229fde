"""What a probe hands back, and how it is run: torch only, so that a probe runs in a framework's own environment
(``python -m rpg_lab.conformance.probes.<framework> REQUEST RESPONSE`` with the lab's folder on ``PYTHONPATH``).

The request (``torch.save``) is a list of batches, one per scenario, each its enumerated sequences, float64, one row
per sequence y:

* ``l`` [N, T]: log πθ(y_t | y_<t), the current policy's token log-probs (the point the gradient is taken at);
* ``l_mu`` [N, T]: the sampler's (the old policy whose samples these are, π_old = μ);
* ``l_ref`` [N, T]: the reference's; ``logits`` [N, T, V]: πθ's logits at each position; ``seqs`` [N, T];
* ``keys``: the settings to compute (the probe's ``SETTINGS``).

The response has, per batch, a dict from each key to a dict: ``value`` [N, T], the framework's per-token KL term; for a term used as a
loss, ``slope`` [N, T] = ∂(Σ_t value[y, t])/∂l[y, s] (sequences never interact, so the batch's sum has the
per-sequence derivative), or ``slope_logits`` [N, T, V] for a probe that differentiates through the logits; or
``error``: one line saying why the framework could not compute it. ``version`` and ``meta`` say what ran.
"""

from __future__ import annotations

import sys
import traceback

import torch


def loss_terms(term, batch: dict) -> dict:
    """A per-token function ``term(l)`` of the current log-probs: its value and per-token slope (autograd)."""
    l = batch["l"].clone().requires_grad_(True)
    value = term(l)
    (slope,) = torch.autograd.grad(value.sum(), l, allow_unused=True)
    return {"value": value.detach(), "slope": torch.zeros_like(l) if slope is None else slope}


def reward_terms(term, batch: dict) -> dict:
    """A KL folded into the reward: computed from the sampler's log-probs (no gradient), as a trainer computes it
    when it makes the experience."""
    with torch.no_grad():
        return {"value": term(batch["l_mu"]).detach()}


def terms(form: str, term, batch: dict) -> dict:
    """``loss_terms`` or ``reward_terms`` by the row's form."""
    return {"loss": loss_terms, "reward": reward_terms}[form](term, batch)


def by_estimator(term_of, loss: tuple = (), reward: tuple = ()) -> dict:
    """The SETTINGS of a framework whose KL is one function of (log-probs, reference log-probs, estimator):
    ``term_of(batch, estimator)`` gives the per-token function of the log-probs; ``loss:<e>`` differentiates it at
    πθ's, ``reward:<e>`` evaluates it at the sampler's."""
    def setting(form, estimator):
        return lambda batch: terms(form, term_of(batch, estimator), batch)

    return {**{f"loss:{e}": setting("loss", e) for e in loss}, **{f"reward:{e}": setting("reward", e) for e in reward}}


def run_each(settings: dict, batch: dict) -> dict:
    """Each asked-for setting, or its error in one line (a setting the framework refuses is a row that says why)."""
    out = {}
    for key in batch["keys"]:
        try:
            out[key] = settings[key](batch)
        except Exception as error:  # noqa: BLE001 - the framework's own refusal is the row's content
            said = str(error).strip().splitlines()
            out[key] = {"error": f"{type(error).__name__}: {said[0][:300]}" if said else type(error).__name__}
    return out


def compute(settings: dict, batches: list[dict]) -> list[dict]:
    """Every batch's settings (``run_each``): a probe's ``compute`` is this with its ``SETTINGS``."""
    return [run_each(settings, batch) for batch in batches]


def version(distribution: str) -> str:
    from importlib.metadata import version as installed

    return installed(distribution)


def main(compute, distribution: str) -> None:
    """``python -m <probe> REQUEST RESPONSE``: ``compute(batches) -> [{key: terms}]``, and the installed version of
    ``distribution``. One thread: the tensors are tiny, and torch's thread pool on a loaded machine costs 100 times
    the work."""
    torch.set_num_threads(1)
    request, response = sys.argv[1:3]
    try:
        batches = torch.load(request, weights_only=True)
        torch.save({"version": version(distribution), "terms": compute(batches)}, response)
    except Exception:
        traceback.print_exc()
        sys.exit(1)
