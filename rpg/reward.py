"""Math reward for the RPG runs: a thin router over verl 0.9.1's own scorers.

Use it as verl's custom reward function::

    reward.custom_reward_function.path=pkg://rpg.reward
    reward.custom_reward_function.name=compute_score
    reward.reward_manager.name=dapo          # overlong shaping lives in verl's DAPO reward manager

Why a router at all: verl's ``default_compute_score`` sends ``math_dapo``, ``math``,
``math_dapo_reasoning`` and every ``aime*`` data source to the DAPO math scorer, but raises
``NotImplementedError`` for ``amc*`` (the authors' AMC23 file uses ``amc_23``) and has no route for
MinervaMath / OlympiadBench (Table 7). The paper's runs scored AIME/AMC with the DAPO scorer
(spec §6.2) and the authors' fork scored Minerva / OlympiadBench with Math-Verify (reference notes
§1.7). So:

===========================================  ====================================================
data_source                                  scorer
===========================================  ====================================================
``math_dapo``, ``math``,                     ``verl.utils.reward_score.math_dapo.compute_score``
``math_dapo_reasoning``, ``aime*``, ``amc*``  (last 300 chars, last ``Answer:`` line, Minerva
                                             normalisation, exact string match; ``\\boxed{}``
                                             fallback; score +1 / -1)
``minerva*``, ``olympiad*``                  ``verl.utils.reward_score.math_verify.compute_score``
                                             (needs the ``math-verify`` package; 1/0 mapped to
                                             +1/-1 here)
anything else                                ``verl.utils.reward_score.default_compute_score``
===========================================  ====================================================

Every route returns the same keys ``{"score": float, "acc": bool, "pred": str}``. verl's reward
loop turns every key of the dict into a per-sample ``reward_extra_info`` column, so mixed-source
validation batches need identical keys on every row.

The overlong penalty ``min(-(L - (L_max - B)) / B * factor, 0)`` is *not* added here: verl's
``dapo`` reward manager adds it (``reward.reward_kwargs.overlong_buffer_cfg`` and
``reward.reward_kwargs.max_resp_len``), exactly as in the authors' runs.
"""

from __future__ import annotations

import importlib.util
from typing import Any

__all__ = ["compute_score", "scorer_for", "MATH_DAPO", "MATH_VERIFY", "VERL_DEFAULT"]

MATH_DAPO = "math_dapo"
MATH_VERIFY = "math_verify"
VERL_DEFAULT = "verl_default"

_MATH_DAPO_EXACT = ("math_dapo", "math", "math_dapo_reasoning")
_MATH_DAPO_PREFIXES = ("aime", "amc")
_MATH_VERIFY_PREFIXES = ("minerva", "olympiad")


def scorer_for(data_source: str) -> str:
    """Name of the scorer used for ``data_source``: MATH_DAPO, MATH_VERIFY or VERL_DEFAULT."""
    if not isinstance(data_source, str):
        raise TypeError(f"data_source must be a str, got {type(data_source).__name__}")
    if data_source in _MATH_DAPO_EXACT or data_source.startswith(_MATH_DAPO_PREFIXES):
        return MATH_DAPO
    if data_source.lower().startswith(_MATH_VERIFY_PREFIXES):
        return MATH_VERIFY
    return VERL_DEFAULT


def _math_verify_available() -> bool:
    return importlib.util.find_spec("math_verify") is not None


def _check_str(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}: {value!r:.80}")


def _math_dapo(solution_str: str, ground_truth: str, strict_box_verify: bool = False) -> dict:
    from verl.utils.reward_score import math_dapo

    res = math_dapo.compute_score(solution_str, ground_truth, strict_box_verify=strict_box_verify)
    return {"score": float(res["score"]), "acc": bool(res["acc"]), "pred": _pred_str(res["pred"])}


def _pred_str(pred: Any) -> str:
    # math_dapo returns None as pred when the strict \boxed{} path finds nothing.
    return "[INVALID]" if pred is None else str(pred)


def _math_verify(data_source: str, solution_str: str, ground_truth: str) -> dict:
    if not _math_verify_available():
        raise ImportError(
            f"data_source={data_source!r} is scored with Math-Verify (as the authors' MinervaMath / "
            "OlympiadBench evaluation), but the 'math-verify' package is not installed. "
            "Install it with `pip install math-verify`."
        )
    from verl.utils.reward_score import math_dapo, math_verify

    verified = math_verify.compute_score(solution_str, ground_truth)  # 1.0 / 0.0 (0.0 on timeout)
    acc = float(verified) >= 1.0
    # `pred` is informational (verl's maj@k); Math-Verify does not expose its parse, so report what
    # the DAPO extractor reads from the response tail.
    _, pred = math_dapo.verify(solution_str[-300:], ground_truth)
    return {"score": 1.0 if acc else -1.0, "acc": acc, "pred": _pred_str(pred)}


def _verl_default(data_source, solution_str, ground_truth, extra_info, **kwargs) -> dict:
    from verl.utils.reward_score import default_compute_score

    res = default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    if isinstance(res, dict):
        return res
    score = float(res)
    return {"score": score, "acc": score > 0, "pred": ""}


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> dict:
    """Score one decoded response; signature of verl's ``reward.custom_reward_function``.

    verl 0.9.1's reward managers call it synchronously (in an executor) with keyword arguments
    ``data_source, solution_str, ground_truth, extra_info`` plus
    ``reward.custom_reward_function.reward_kwargs``. On the DAPO route only ``strict_box_verify``
    is honoured; other keyword arguments (e.g. verl's ``reward_router_address``) are ignored there
    and forwarded to verl's ``default_compute_score`` on the default route.

    Returns ``{"score": +1.0 | -1.0, "acc": bool, "pred": str}`` on the DAPO and Math-Verify routes.
    Raises TypeError for non-str inputs and ImportError when Math-Verify is needed but missing.
    """
    _check_str("solution_str", solution_str)
    _check_str("ground_truth", ground_truth)
    route = scorer_for(data_source)
    if route == MATH_DAPO:
        return _math_dapo(solution_str, ground_truth, bool(kwargs.get("strict_box_verify", False)))
    if route == MATH_VERIFY:
        return _math_verify(data_source, solution_str, ground_truth)
    return _verl_default(data_source, solution_str, ground_truth, extra_info, **kwargs)
