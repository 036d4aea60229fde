"""rpg.reward.compute_score: routing, the paper's DAPO scorer on the real AIME/AMC answers, robustness."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import rpg.reward as reward
from rpg.reward import MATH_DAPO, MATH_VERIFY, VERL_DEFAULT, compute_score, scorer_for

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
FILES = {"aime-2024.parquet": "math_dapo", "aime25.parquet": "aime2025", "amc-23.parquet": "amc_23"}
KEYS = {"score", "acc", "pred"}

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
     ("OlympiadBench", MATH_VERIFY), ("openai/gsm8k", VERL_DEFAULT), ("math-dapo", VERL_DEFAULT)],
)
def test_routing(ds, route):
    assert scorer_for(ds) == route


def test_verl_default_does_not_route_amc_which_is_why_the_router_exists():
    from verl.utils.reward_score import default_compute_score

    with pytest.raises(NotImplementedError):
        default_compute_score("amc_23", "Answer: 1", "1")
    assert timed("amc_23", "Answer: 1", "1") == {"score": 1.0, "acc": True, "pred": "1"}


def test_spec_t29_answer_line():
    assert timed("math_dapo", "Let me think.\nAnswer: 42", "42")["score"] == 1.0
    res = timed("math_dapo", "Let me think. The result is 42.", "42")
    assert res == {"score": -1.0, "acc": False, "pred": "[INVALID]"}


def test_real_ground_truths_correct_wrong_missing_boxed():
    pairs = _ground_truths()
    assert len(pairs) >= 80  # 84 distinct (data_source, answer) pairs in the three shared files
    for ds, gt in pairs:
        ok = timed(ds, f"Step 1 ... step 9.\nAnswer: {gt}", gt)
        assert ok["score"] == 1.0 and ok["acc"] is True and set(ok) == KEYS, (ds, gt, ok)
        bad = timed(ds, f"Step 1.\nAnswer: {_wrong(gt)}", gt)
        assert bad["score"] == -1.0 and bad["acc"] is False, (ds, gt, bad)
        missing = timed(ds, f"So the result is {gt}.", gt)
        assert missing == {"score": -1.0, "acc": False, "pred": "[INVALID]"}, (ds, gt)
        boxed = timed(ds, f"Hence \\boxed{{{gt}}}.", gt)
        assert boxed["score"] == 1.0, (ds, gt, boxed)
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
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),
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
    assert res == {"score": 1.0, "acc": True, "pred": "9"}


def test_default_route_returns_the_same_keys():
    res = timed("openai/gsm8k", "so #### 72", "72")
    assert KEYS <= set(res) and res["acc"] is True
    with pytest.raises(NotImplementedError):
        compute_score("no-such-source", "Answer: 1", "1")


def test_math_verify_missing_is_an_error_not_a_fallback(monkeypatch):
    monkeypatch.setattr(reward, "_math_verify_available", lambda: False)
    with pytest.raises(ImportError, match="pip install math-verify"):
        compute_score("minerva_math", "Answer: 2", "2")
    assert compute_score("aime2024", "Answer: 2", "2")["acc"] is True  # other routes unaffected


@pytest.mark.skipif(not reward._math_verify_available(), reason="math-verify not installed")
def test_math_verify_route():
    first = timed("minerva_math", "Answer: $\\frac{1}{2}$", "\\frac{1}{2}", limit=60.0)  # spawns verl's pool
    assert first == {"score": 1.0, "acc": True, "pred": "\\frac{1}{2}"}
    assert timed("olympiadbench", "Thus \\boxed{0.5}", "\\frac{1}{2}", limit=35.0)["acc"] is True
    wrong = timed("olympiadbench", "Answer: 3", "\\frac{1}{2}", limit=35.0)
    assert wrong["score"] == -1.0 and set(wrong) == KEYS
    junk = timed("minerva_math", "\ud800 junk \x00", "2", limit=35.0)
    assert junk["score"] == -1.0
    big = "We get $x^2 + \\frac{a}{b} = 3$. " * 30_000 + "\nAnswer: 42"  # ~1 MB
    assert timed("minerva_math", big, "42", limit=35.0)["acc"] is True
