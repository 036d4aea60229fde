"""rpg.reward.compute_score: routing, the paper's scorer (no \\boxed{} fallback) on the real AIME/AMC answers,
verl's fallback as an explicit option, robustness. Math-Verify: tests/reward/test_reward_math_verify.py."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from messages import names
from verl.utils.reward_score import math_dapo  # imports verl once, outside the timed calls

import rpg.reward as reward
from rpg.reward import MATH_DAPO, MATH_VERIFY, VERL_DEFAULT, compute_score, scorer_for

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
FILES = {"aime-2024.parquet": "math_dapo", "aime25.parquet": "aime2025", "amc-23.parquet": "amc_23"}
KEYS = {"score", "acc", "pred", "scorer_failed"}

_pool = ThreadPoolExecutor(max_workers=1)


def timed(*args, limit: float = 5.0, **kw):
    """compute_score with a wall-clock bound: a hang fails the test instead of blocking the suite."""
    t0 = time.perf_counter()
    res = _pool.submit(compute_score, *args, **kw).result(timeout=limit)
    assert time.perf_counter() - t0 < limit
    return res


def _ground_truths() -> list[tuple[str, str]]:
    if not SHARED.is_dir():
        pytest.skip(f"shared eval files not found at {SHARED}")
    pairs = set()
    for fname, ds in FILES.items():
        for gt in pq.read_table(SHARED / fname, columns=["reward_model"]).column("reward_model").to_pylist():
            pairs.add((ds, gt["ground_truth"]))
    return sorted(pairs)


def _wrong(gt: str) -> str:
    digits = gt.replace("^\\circ", "")
    return str(int(digits) + 1) if digits.lstrip("-").isdigit() else gt + "1"


@pytest.mark.parametrize(
    "ds,route",
    [("math_dapo", MATH_DAPO), ("aime2024", MATH_DAPO), ("aime2025", MATH_DAPO), ("amc_23", MATH_DAPO),
     ("amc2023", MATH_DAPO), ("math", MATH_DAPO), ("minerva_math", MATH_VERIFY), ("olympiadbench", MATH_VERIFY),
     ("OlympiadBench", MATH_VERIFY), ("openai/gsm8k", VERL_DEFAULT), ("math-dapo", VERL_DEFAULT),
     # letter case never matters (AIME2024 raised NotImplementedError before)
     ("AIME2024", MATH_DAPO), ("Aime_2025", MATH_DAPO), ("AMC23", MATH_DAPO), ("MATH_DAPO", MATH_DAPO),
     ("Math", MATH_DAPO), ("MINERVA_MATH", MATH_VERIFY), ("OLYMPIADBENCH", MATH_VERIFY)],
)
def test_routing(ds, route):
    assert scorer_for(ds) == route


@pytest.mark.parametrize("ds", ["AIME2024", "aime2024", "Aime2024", "AMC_23", "amc_23", "MATH_DAPO", "math_dapo"])
def test_upper_and_lower_case_sources_score_alike(ds):
    assert timed(ds, "Work.\nAnswer: 540", "540") == {"score": 1.0, "acc": True, "pred": "540", "scorer_failed": False}
    assert timed(ds, "Work.\nAnswer: 541", "540")["score"] == -1.0


def test_verl_default_does_not_route_amc_which_is_why_the_router_exists():
    from verl.utils.reward_score import default_compute_score

    with pytest.raises(NotImplementedError):
        default_compute_score("amc_23", "Answer: 1", "1")
    assert timed("amc_23", "Answer: 1", "1") == {"score": 1.0, "acc": True, "pred": "1", "scorer_failed": False}


def test_t29_answer_line():
    assert timed("math_dapo", "Let me think.\nAnswer: 42", "42")["score"] == 1.0
    res = timed("math_dapo", "Let me think. The result is 42.", "42")
    assert res == {"score": -1.0, "acc": False, "pred": "[INVALID]", "scorer_failed": False}


BOXED_ONLY = "...so the answer is \\boxed{540}."  # no Answer: line, only a boxed answer


def test_boxed_only_is_invalid_under_the_paper_rule():
    """The authors' scorer: no Answer: match -> [INVALID] -> -1 (verl 0.9.1's fallback would give +1)."""
    res = timed("aime2024", BOXED_ONLY, "540")
    assert res == {"score": -1.0, "acc": False, "pred": "[INVALID]", "scorer_failed": False}
    assert math_dapo.compute_score(BOXED_ONLY, "540")["score"] == 1.0


def test_boxed_only_scores_with_the_explicit_boxed_fallback_option():
    res = timed("aime2024", BOXED_ONLY, "540", boxed_fallback=True)
    assert res == {"score": 1.0, "acc": True, "pred": "540", "scorer_failed": False}
    assert timed("aime2024", BOXED_ONLY, "541", boxed_fallback=True)["score"] == -1.0
    # an Answer: line wins over a box under both settings
    for fallback in (False, True):
        assert timed("amc_23", "\\boxed{7}\nAnswer: 8", "8", boxed_fallback=fallback)["score"] == 1.0
        assert timed("amc_23", "\\boxed{8}\nAnswer: 7", "8", boxed_fallback=fallback)["score"] == -1.0
    # boxed_fallback=True is exactly verl 0.9.1's scorer; strict_box_verify is verl's strict mode
    for resp in (BOXED_ONLY, "Answer: 540", "no answer", "\\boxed{540}" + "." * 200):
        want = math_dapo.compute_score(resp, "540")
        got = timed("aime2025", resp, "540", boxed_fallback=True)
        assert (got["score"], got["acc"], got["pred"]) == (want["score"], want["acc"], str(want["pred"]))
    assert timed("aime2025", "x \\boxed{540}", "540", strict_box_verify=True)["score"] == 1.0
    assert timed("aime2025", "Answer: 540", "540", strict_box_verify=True)["pred"] == "[INVALID]"


@pytest.mark.parametrize("kwargs, match", [
    ({"boxed_falback": True}, "unknown rpg.reward option"),
    ({"boxed_fallback": "yes"}, "boxed_fallback='yes' is invalid"),
    ({"boxed_fallback": 1}, "expected true or false"),
    ({"boxed_fallback": True, "strict_box_verify": True}, "exclude each other"),
])
def test_bad_options_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        compute_score("aime2024", "Answer: 1", "1", **kwargs)
    assert reward.check_reward_kwargs({}) == {"boxed_fallback": False, "strict_box_verify": False}


def test_real_ground_truths_correct_wrong_missing_boxed():
    pairs = _ground_truths()
    assert len(pairs) >= 80  # 84 distinct (data_source, answer) pairs in the three shared files
    for ds, gt in pairs:
        ok = timed(ds, f"Step 1 ... step 9.\nAnswer: {gt}", gt)
        assert ok["score"] == 1.0 and ok["acc"] is True and set(ok) == KEYS, (ds, gt, ok)
        bad = timed(ds, f"Step 1.\nAnswer: {_wrong(gt)}", gt)
        assert bad["score"] == -1.0 and bad["acc"] is False, (ds, gt, bad)
        missing = timed(ds, f"So the result is {gt}.", gt)
        assert missing == {"score": -1.0, "acc": False, "pred": "[INVALID]", "scorer_failed": False}, (ds, gt)
        boxed = timed(ds, f"Hence \\boxed{{{gt}}}.", gt)
        assert boxed["score"] == -1.0 and boxed["pred"] == "[INVALID]", (ds, gt, boxed)  # paper: no Answer: line
        assert timed(ds, f"Hence \\boxed{{{gt}}}.", gt, boxed_fallback=True)["score"] == 1.0, (ds, gt)
        # the last Answer: line in the last 300 characters wins
        assert timed(ds, f"Answer: {gt}\nWait, no.\nAnswer: {_wrong(gt)}", gt)["score"] == -1.0
        assert timed(ds, f"Answer: {gt}" + "\n" + "." * 400, gt)["pred"] == "[INVALID]"


@pytest.mark.parametrize(
    "response,gt,acc",
    [
        ("Answer: 336", "336^\\circ", True),        # the AIME25 answer with degrees
        ("Answer: $336^\\circ$", "336^\\circ", True),
        ("Answer: 12 cm", "12", True),               # units dropped by Minerva normalisation
        ("Answer: 12 degrees", "12", True),
        ("Answer: 12 \\text{ cm}", "12", True),
        ("Answer: 1,000", "1000", True),
        ("Answer: x = 5", "5", True),
        ("ANSWER:   42", "42", True),
        ("Answer: \\frac12", "\\frac{1}{2}", True),  # LaTeX shorthand repaired
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", False),  # no Answer: line (paper); verl's fallback: True
        ("Answer: \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),
        ("Answer: $\\frac{1}{2}$", "\\frac{1}{2}", True),
        ("Answer: 1/2", "\\frac{1}{2}", False),     # exact string match after normalisation (paper's scorer)
        ("Answer: 0.5", "\\frac{1}{2}", False),
        ("Answer: \\dfrac{1}{2}", "\\frac{1}{2}", False),
    ],
)
def test_normalisation_cases(response, gt, acc):
    res = timed("aime2024", response, gt)
    assert res["acc"] is acc and res["score"] == (1.0 if acc else -1.0)


def test_extremely_long_response_is_fast():
    big = "lorem ipsum " * 90_000 + "\nAnswer: 204"  # ~1 MB
    assert len(big) > 1_000_000
    assert timed("aime2025", big, "204", limit=1.0)["acc"] is True
    assert timed("aime2025", "Answer: 204\n" + big[:-12], "204", limit=1.0)["acc"] is False



@pytest.mark.parametrize("source", ["aime2025", "math_dapo"])
def test_an_over_long_ground_truth_is_a_bounded_scorer_failure_not_a_wrong_answer(source, capsys):
    """verl's answer normalisation is quadratic in the ground truth's length (a 20,000-character one took
    seconds per response): beyond MAX_ANSWER_CHARS the DAPO route does not score it and says so
    (scorer_failed=True, the -1 failure score), with both options too; at the bound it scores as before."""
    long_gt = "1" * 20_000
    for opts in ({}, {"boxed_fallback": True}):
        res = timed(source, "Answer: " + "1" * 200, long_gt, limit=0.5, **opts)
        assert res == {"score": -1.0, "acc": False, "pred": "[INVALID]", "scorer_failed": True}
    (said,) = {x for x in capsys.readouterr().err.splitlines() if "ground truth" in x}  # the same line each time
    names(said, "20000 characters", f"more than {reward.MAX_ANSWER_CHARS}", "not scored")
    at_bound = "1" * reward.MAX_ANSWER_CHARS
    res = compute_score(source, "x" * 50 + "\nAnswer: 7", at_bound)
    assert res["scorer_failed"] is False and res["acc"] is False
    res = compute_score(source, "Answer: 7", "7")
    assert res == {"score": 1.0, "acc": True, "pred": "7", "scorer_failed": False}


@pytest.mark.parametrize(
    "junk",
    [
        b"\xff\xfe\x80\x81 garbage \xc3\x28".decode("utf-8", errors="replace"),
        b"\xff\xfe\x80\x81 garbage \xc3\x28".decode("utf-8", errors="surrogateescape"),
        "\ud800\udfff lone surrogates \udc80",
        "\x00\x01\x1b[31m control \u202e bidi \ufeff",
        "}" * 500 + "{" * 500 + "\\boxed{" * 200,
    ],
)
def test_non_utf8_junk_never_crashes(junk):
    res = timed("amc_23", junk, "27")
    assert set(res) == KEYS and res["score"] == -1.0
    assert timed("amc_23", junk + "\nAnswer: 27", "27")["score"] == 1.0
    res = timed("amc_23", "Answer: " + junk, "27")
    assert res["score"] == -1.0 and isinstance(res["pred"], str)


def test_bad_argument_types_are_clear_errors():
    with pytest.raises(TypeError, match="solution_str must be a str"):
        compute_score("aime2024", b"Answer: 1", "1")
    with pytest.raises(TypeError, match="ground_truth must be a str"):
        compute_score("aime2024", "Answer: 1", 1)
    with pytest.raises(TypeError, match="data_source must be a str"):
        compute_score(None, "Answer: 1", "1")


def test_verl_calling_convention_via_get_custom_reward_fn():
    """verl loads the function from config and calls it with keywords (+ reward_kwargs)."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    cfg = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": "pkg://rpg.reward", "name": "compute_score", "reward_kwargs": {}}}})
    fn = get_custom_reward_fn(cfg)
    res = fn(data_source="amc_23", solution_str="Answer: 9", ground_truth="9", extra_info={"index": 0},
             reward_router_address=None)
    assert res == {"score": 1.0, "acc": True, "pred": "9", "scorer_failed": False}
    assert fn(data_source="amc_23", solution_str="\\boxed{9}", ground_truth="9")["score"] == -1.0
    # the option reaches the function through verl's reward_kwargs
    cfg.reward.custom_reward_function.reward_kwargs = {"boxed_fallback": True}
    fn = get_custom_reward_fn(cfg)
    assert fn(data_source="amc_23", solution_str="\\boxed{9}", ground_truth="9", extra_info={})["score"] == 1.0


def test_default_route_returns_the_same_keys():
    res = timed("openai/gsm8k", "so #### 72", "72")
    assert KEYS <= set(res) and res["acc"] is True
    with pytest.raises(NotImplementedError):
        compute_score("no-such-source", "Answer: 1", "1")


def test_math_verify_missing_is_an_error_not_a_fallback(monkeypatch):
    monkeypatch.setattr(reward.scorer, "_math_verify_available", lambda: False)
    with pytest.raises(ImportError, match="pip install math-verify"):
        compute_score("minerva_math", "Answer: 2", "2")
    assert compute_score("aime2024", "Answer: 2", "2")["acc"] is True  # other routes unaffected
