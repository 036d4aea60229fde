"""The paper's math scorer, built from verl 0.9.1's own functions, routed by each response's ``data_source``.

Use it as verl's custom reward function (the recipe does this through ``rpg.reward_function``)::

    reward.custom_reward_function.path=pkg://rpg.reward
    reward.custom_reward_function.name=compute_score
    reward.reward_manager.name=dapo          # overlong shaping lives in verl's DAPO reward manager

Routing (``data_source`` compared in lower case, so ``AIME2024`` and ``aime2024`` are the same set):

===========================================  ====================================================
data_source                                  scorer
===========================================  ====================================================
``math_dapo``, ``math``,                     **the paper's rule** (the authors' scorer):     last 300 characters,
``math_dapo_reasoning``, ``aime*``, ``amc*``  last ``Answer:`` match (none -> ``[INVALID]``),
                                             Minerva normalisation, string equality, +1 / -1.
                                             = verl's ``math_dapo.is_correct_minerva`` on the tail.
``minerva*``, ``olympiad*``                  Math-Verify, verl's check (``rpg.reward.verify_pool``);
                                             1/0 mapped to +1/-1 (the authors' Table 7 scorer)
anything else                                ``verl.utils.reward_score.default_compute_score``
===========================================  ====================================================

Options (keyword arguments; in a run: ``+reward.custom_reward_function.reward_kwargs.<name>=true``,
checked by the driver before Ray starts):

* ``boxed_fallback`` (default False): verl 0.9.1's ``math_dapo.compute_score`` instead of the paper's
  rule. verl added a ``\\boxed{}`` fallback after the paper: a response without an ``Answer:`` line
  is scored by its last ``\\boxed{...}`` in the last 100 characters (exact string match), so
  ``"... the answer is \\boxed{540}."`` scores +1 there and -1 in the paper.
* ``strict_box_verify`` (default False): verl's strict ``\\boxed{}``-only check (no ``Answer:`` line).

Every route returns the same keys ``{"score": float, "acc": bool, "pred": str, "scorer_failed": bool}``
(verl's reward loop turns each key into a per-sample ``reward_extra_info`` column, so mixed-source
validation batches need identical keys). ``scorer_failed`` is True only when Math-Verify timed out or
raised on that answer, or when a ground truth is longer than ``MAX_ANSWER_CHARS`` on the DAPO route (the
bound on its cost per response): the score is then -1 (the authors' timeout score) and the failure shows as
``val-aux/<data_source>/scorer_failed/mean@N`` instead of passing for a wrong answer.

The overlong penalty ``min(-(L - (L_max - B)) / B * factor, 0)`` is *not* added here: verl's
``dapo`` reward manager adds it (``reward.reward_kwargs.overlong_buffer_cfg``), as in the authors' runs.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["compute_score", "scorer_for", "check_reward_kwargs", "OPTIONS", "MATH_DAPO", "MATH_VERIFY",
           "VERL_DEFAULT"]

MATH_DAPO = "math_dapo"
MATH_VERIFY = "math_verify"
VERL_DEFAULT = "verl_default"

OPTIONS = {"boxed_fallback": False, "strict_box_verify": False}  # name -> default (all bool)
TAIL_CHARS = 300  # the authors' scorer reads only the last 300 characters of the response
# The longest ground truth the DAPO route scores. verl's normalize_final_answer (applied to the prediction
# and to the ground truth) runs re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", ...), quadratic in the length: a
# 10,000-character answer cost seconds per response. The prediction is bounded by the 300-character tail;
# this bounds the other input: 1,000 characters (over three times what the tail can hold; about 15 ms at
# worst measured; the AIME/AMC answers have at most 9) keeps the cost per response bounded. A longer ground
# truth is a scorer failure (score -1, scorer_failed=True), never a plain wrong answer.
MAX_ANSWER_CHARS = 1000
# keyword arguments verl's reward managers add by themselves (reward-model router); not options
_VERL_CALL_KWARGS = ("reward_router_address", "reward_model_tokenizer")

_MATH_DAPO_EXACT = ("math_dapo", "math", "math_dapo_reasoning")
_MATH_DAPO_PREFIXES = ("aime", "amc")
_MATH_VERIFY_PREFIXES = ("minerva", "olympiad")


def scorer_for(data_source: str) -> str:
    """Name of the scorer used for ``data_source`` (any letter case): MATH_DAPO, MATH_VERIFY or VERL_DEFAULT."""
    if not isinstance(data_source, str):
        raise TypeError(f"data_source must be a str, got {type(data_source).__name__}")
    ds = data_source.lower()
    if ds in _MATH_DAPO_EXACT or ds.startswith(_MATH_DAPO_PREFIXES):
        return MATH_DAPO
    if ds.startswith(_MATH_VERIFY_PREFIXES):
        return MATH_VERIFY
    return VERL_DEFAULT


def check_reward_kwargs(kwargs: Mapping[str, Any], where: str = "compute_score") -> dict[str, bool]:
    """The options in ``kwargs`` with defaults filled in; ValueError naming ``where`` for a bad one.

    Unknown names are errors (a misspelt ``boxed_falback`` must not silently keep the default).
    """
    unknown = sorted(set(kwargs) - set(OPTIONS) - set(_VERL_CALL_KWARGS))
    if unknown:
        raise ValueError(f"{where}: unknown rpg.reward option(s) {', '.join(unknown)}; allowed: {', '.join(OPTIONS)}")
    opts = {}
    for name, default in OPTIONS.items():
        value = kwargs.get(name, default)
        if not isinstance(value, bool):
            raise ValueError(f"{where}.{name}={value!r} is invalid; expected true or false")
        opts[name] = value
    if opts["boxed_fallback"] and opts["strict_box_verify"]:
        raise ValueError(f"{where}: boxed_fallback and strict_box_verify exclude each other; set at most one")
    return opts


def _math_verify_available() -> bool:
    return importlib.util.find_spec("math_verify") is not None


def _check_str(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}: {value!r:.80}")


def _result(acc: bool, pred: Any, failed: bool = False) -> dict:
    # math_dapo returns None as pred when the strict \boxed{} path finds nothing.
    return {"score": 1.0 if acc else -1.0, "acc": bool(acc), "pred": "[INVALID]" if pred is None else str(pred),
            "scorer_failed": failed}


def _math_dapo(solution_str: str, ground_truth: str, opts: dict[str, bool]) -> dict:
    from verl.utils.reward_score import math_dapo

    if len(ground_truth) > MAX_ANSWER_CHARS:  # bounded cost per response (MAX_ANSWER_CHARS)
        print(f"rpg.reward: a ground truth of {len(ground_truth)} characters (more than {MAX_ANSWER_CHARS}) is not "
              "scored: scored -1, counted in scorer_failed", file=sys.stderr, flush=True)
        return _result(False, None, failed=True)

    if opts["boxed_fallback"] or opts["strict_box_verify"]:  # verl 0.9.1's scorer as it is
        res = math_dapo.compute_score(solution_str, ground_truth, strict_box_verify=opts["strict_box_verify"])
        return _result(res["acc"], res["pred"])
    # The paper's rule: verl's Minerva path alone on the last 300 characters (no \boxed{} fallback).
    acc, pred = math_dapo.is_correct_minerva(solution_str[-TAIL_CHARS:], ground_truth)
    return _result(acc, pred)


def _math_verify(data_source: str, solution_str: str, ground_truth: str) -> dict:
    if not _math_verify_available():
        raise ImportError(
            f"data_source={data_source!r} is scored with Math-Verify (as the authors' MinervaMath / "
            "OlympiadBench evaluation), but the 'math-verify' package is not installed. "
            "Install it with `pip install math-verify`."
        )
    from verl.utils.reward_score import math_dapo

    from rpg.reward import verify_pool

    verified = verify_pool.verify(solution_str, ground_truth)  # 1.0 / 0.0 / TIMEOUT / ERROR
    failed = verified in (verify_pool.TIMEOUT, verify_pool.ERROR)
    if failed:
        print(f"rpg.reward: Math-Verify {verified} on a {data_source} answer: scored -1, counted in scorer_failed",
              file=sys.stderr, flush=True)
    # `pred` is informational (verl's maj@k); Math-Verify does not expose its parse, so report what
    # verl's DAPO extractor (Answer: line, else \boxed{}) reads from the response tail.
    pred = None  # (its normalisation of a long ground truth would be unbounded: MAX_ANSWER_CHARS)
    if len(ground_truth) <= MAX_ANSWER_CHARS:
        _, pred = math_dapo.verify(solution_str[-TAIL_CHARS:], ground_truth)
    return _result(not failed and float(verified) >= 1.0, pred, failed)


def _verl_default(data_source, solution_str, ground_truth, extra_info, **kwargs) -> dict:
    from verl.utils.reward_score import default_compute_score

    res = default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    if isinstance(res, dict):
        return {**res, "scorer_failed": bool(res.get("scorer_failed", False))}
    score = float(res)
    return {"score": score, "acc": score > 0, "pred": "", "scorer_failed": False}


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict:
    """Score one decoded response; signature of verl's ``reward.custom_reward_function``.

    verl 0.9.1's reward managers call it (in an executor thread) with keyword arguments
    ``data_source, solution_str, ground_truth, extra_info`` plus
    ``reward.custom_reward_function.reward_kwargs`` (the OPTIONS above). On the default route the
    keyword arguments other than OPTIONS are forwarded to verl's ``default_compute_score``.

    Returns ``{"score": +1.0 | -1.0, "acc", "pred", "scorer_failed"}`` on the DAPO and Math-Verify routes.
    Raises TypeError for non-str inputs, ValueError for a bad option, ImportError when Math-Verify is
    needed but missing, rpg.reward.verify_pool.MathVerifyError when its helper process cannot run.
    """
    _check_str("solution_str", solution_str)
    _check_str("ground_truth", ground_truth)
    route = scorer_for(data_source)
    if route == VERL_DEFAULT:
        passthrough = {k: v for k, v in kwargs.items() if k not in OPTIONS}
        check_reward_kwargs({k: v for k, v in kwargs.items() if k in OPTIONS})
        return _verl_default(data_source, solution_str, ground_truth, extra_info, **passthrough)
    opts = check_reward_kwargs(kwargs)
    if route == MATH_DAPO:
        return _math_dapo(solution_str, ground_truth, opts)
    return _math_verify(data_source, solution_str, ground_truth)
