"""The Math-Verify route (MinervaMath / OlympiadBench, Table 7): right answers, and a failing scorer
never passing for a wrong answer.

The plain-script test covers this failure: verl 0.9.1's ``math_verify.compute_score`` runs its check
in a ``spawn`` process pool, which re-runs an unguarded main script in every worker; the pool breaks
and verl returns 0.0 (-> -1) for every answer after printing "Error in math_verify compute_score".
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rpg.reward import verify_pool
from rpg.reward import compute_score

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"score", "acc", "pred", "scorer_failed"}


def _timed(*args, limit: float = 180.0, **kw):
    with ThreadPoolExecutor(max_workers=1) as pool:  # a hang fails the test instead of blocking the suite
        return pool.submit(compute_score, *args, **kw).result(timeout=limit)


def test_math_verify_route():
    first = _timed("minerva_math", "Answer: $\\frac{1}{2}$", "\\frac{1}{2}")  # starts a helper
    assert first == {"score": 1.0, "acc": True, "pred": "\\frac{1}{2}", "scorer_failed": False}
    assert _timed("olympiadbench", "Thus \\boxed{0.5}", "\\frac{1}{2}", limit=35.0)["acc"] is True
    assert _timed("OlympiadBench", "Thus \\boxed{0.5}", "\\frac{1}{2}", limit=35.0)["acc"] is True  # any case
    wrong = _timed("olympiadbench", "Answer: 3", "\\frac{1}{2}", limit=35.0)
    assert wrong == {"score": -1.0, "acc": False, "pred": "3", "scorer_failed": False}
    junk = _timed("minerva_math", "\ud800 junk \x00 \u202e", "2", limit=35.0)
    assert junk["score"] == -1.0 and junk["scorer_failed"] is False and set(junk) == KEYS
    big = "We get $x^2 + \\frac{a}{b} = 3$. " * 30_000 + "\nAnswer: 42"  # ~1 MB through the pipe
    assert _timed("minerva_math", big, "42", limit=35.0)["acc"] is True


def test_unguarded_plain_script(tmp_path):
    """A script with no `if __name__ == "__main__":` guard scores Math-Verify answers correctly."""
    script = tmp_path / "score_without_main_guard.py"
    script.write_text(textwrap.dedent("""\
        import json
        from rpg.reward import compute_score
        cases = [("minerva_math", "Answer: 7", "7"), ("olympiadbench", "so \\\\boxed{\\\\frac{1}{2}}", "0.5"),
                 ("MINERVA_MATH", "Answer: $2\\\\sqrt{2}$", "\\\\sqrt{8}"), ("olympiadbench", "Answer: 8", "7")]
        print("RESULT " + json.dumps([compute_score(*c) for c in cases]), flush=True)
        raise SystemExit(3)  # what an unguarded script does after its work (kills verl's spawn workers)
        """))
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 3, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout  # the script ran once: no worker re-ran it
    got = json.loads(lines[0][len("RESULT "):])
    assert [r["score"] for r in got] == [1.0, 1.0, 1.0, -1.0], (got, proc.stderr[-3000:])
    assert not any(r["scorer_failed"] for r in got)
    assert "Error in math_verify" not in proc.stdout + proc.stderr


def test_timeout_is_counted_not_passed_off_as_a_wrong_answer(monkeypatch, capsys):
    res = verify_pool.verify("Answer: 7", "7", timeout=1e-6)  # a real helper, no time to answer
    assert res == verify_pool.TIMEOUT
    assert verify_pool.verify("Answer: 7", "7") == 1.0  # a fresh helper replaced the killed one
    for outcome in (verify_pool.TIMEOUT, verify_pool.ERROR):
        monkeypatch.setattr(verify_pool, "verify", lambda *a, o=outcome, **k: o)
        res = compute_score("minerva_math", "Answer: 7", "7")
        assert res == {"score": -1.0, "acc": False, "pred": "7", "scorer_failed": True}
        assert f"Math-Verify {outcome}" in capsys.readouterr().err


def test_a_dead_helper_is_replaced_and_a_broken_one_raises(monkeypatch):
    assert verify_pool.verify("Answer: 3", "3") == 1.0
    with verify_pool._lock:
        idle = list(verify_pool._idle)
    assert idle
    for h in idle:
        h.proc.kill()
        h.proc.wait()
    assert verify_pool.verify("Answer: 3", "3") == 1.0  # replaced once, transparently

    def broken(self):
        raise verify_pool.MathVerifyError("the Math-Verify helper did not start")

    verify_pool.shutdown()
    monkeypatch.setattr(verify_pool._Helper, "__init__", broken)
    with pytest.raises(verify_pool.MathVerifyError, match="did not start"):
        compute_score("olympiadbench", "Answer: 3", "3")


def test_a_forked_child_does_not_share_the_parents_helpers():
    """A fork (e.g. a DataLoader worker) inherits the idle helpers' pipes: the child must start its own."""
    import os

    assert verify_pool.verify("Answer: 3", "3") == 1.0
    with verify_pool._lock:
        parents = [h.proc.pid for h in verify_pool._idle]
    assert parents
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report what it sees, then leave without running the parent's atexit handlers
        code = 1
        try:
            os.close(read)
            inherited = list(verify_pool._idle)
            score = verify_pool.verify("Answer: 4", "4")
            own = [h.proc.pid for h in verify_pool._idle]
            os.write(write, json.dumps({"inherited": len(inherited), "score": score, "own": own}).encode())
            verify_pool.shutdown()
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        child = json.loads(f.read() or "{}")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child["inherited"] == 0 and child["score"] == 1.0 and not set(child["own"]) & set(parents)
    assert verify_pool.verify("Answer: 5", "5") == 1.0  # the parent's helper still answers the parent
    with verify_pool._lock:
        assert {h.proc.pid for h in verify_pool._idle} & set(parents)


# --- check_answer: verl's check, except that Math-Verify's own timeouts are failures, not wrong answers

_CASES = [  # (gold, model output): right, wrong, unparseable, equivalent forms
    ("\\boxed{540}", "so the answer is 540"), ("\\boxed{540}", "the answer is 54"), ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{\\frac{1}{2}}", "$\\frac{2}{4}$"), ("\\boxed{2\\sqrt{3}}", "$\\sqrt{12}$"), ("\\boxed{7}", "}}}{{{"),
    ("\\boxed{x^2}", "no answer here"),
]


def test_check_answer_scores_like_verls_check():
    from verl.utils.reward_score.math_verify import _verify_in_subprocess

    got = [verify_pool.check_answer(g, o) for g, o in _CASES]
    assert got == [_verify_in_subprocess(g, o) for g, o in _CASES]
    assert 1.0 in got and 0.0 in got  # both outcomes exercised


def test_a_math_verify_timeout_raises_where_verl_scores_a_wrong_answer(monkeypatch):
    import math_verify.parser
    from math_verify.errors import TimeoutException
    from verl.utils.reward_score.math_verify import _verify_in_subprocess

    def alarm_fired(*args, **kwargs):  # what Math-Verify's signal.alarm timeout raises inside parse
        raise TimeoutException("parsing took too long")

    monkeypatch.setattr(math_verify.parser, "extract_target_from_pred", alarm_fired)
    assert _verify_in_subprocess("\\boxed{540}", "540") == 0.0  # verl: the timeout is a wrong answer
    with pytest.raises(TimeoutException):
        verify_pool.check_answer("\\boxed{540}", "540")


def test_a_parse_error_is_still_a_wrong_answer(monkeypatch):
    import math_verify.parser

    def broken(*args, **kwargs):
        raise ValueError("unparseable")

    monkeypatch.setattr(math_verify.parser, "extract_target_from_pred", broken)
    assert verify_pool.check_answer("\\boxed{540}", "540") == 0.0
