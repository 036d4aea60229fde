"""Math-Verify (MinervaMath / OlympiadBench scorer) in helper processes that never re-run ``__main__``.

Why not verl's own ``verl.utils.reward_score.math_verify.compute_score``: it sends each check to a
``ProcessPoolExecutor`` with the ``spawn`` start method (Math-Verify's timeouts use ``signal.alarm``,
which only works in a main thread). ``spawn`` re-runs the caller's main script in every pool worker;
a script without an ``if __name__ == "__main__":`` guard therefore re-enters the scorer while the
worker is bootstrapping (verl prints "Error in math_verify compute_score: An attempt has been made
to start a new process before ...") and, when the rest of the script fails or exits in the worker,
the pool breaks for good ("A child process terminated abruptly, the process pool is not usable
anymore"). verl catches every exception and returns 0.0, so each answer then scores as wrong.

Here each helper is ``python -m rpg.reward.verify_pool``: a fresh interpreter that runs verl 0.9.1's
check (``check_answer``: ``_verify_in_subprocess``'s Math-Verify parse + verify with verl's extraction
settings, in the helper's main thread so its ``signal.alarm`` timeouts work) and answers one JSON line
per request on a pipe. Nothing depends on how the caller was started. Outcomes:

* a score (1.0 / 0.0) from that check;
* ``TIMEOUT``: Math-Verify's own 5 s parse/compare timeout fired (verl's check swallows it and scores
  0, i.e. a wrong answer: here it is a scorer failure), or no answer within ``timeout`` seconds
  (verl's 30 s): the helper is killed and replaced;
* ``ERROR``: the check raised for this input (message logged);
* a helper that cannot start, or dies twice in a row, raises :class:`MathVerifyError`.

``rpg.reward`` turns TIMEOUT / ERROR into score -1 with ``scorer_failed=True`` (a per-sample metric),
never into a silent wrong answer.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["MathVerifyError", "TIMEOUT", "ERROR", "verify", "shutdown", "MAX_WORKERS"]

TIMEOUT = "timeout"
ERROR = "error"
MAX_WORKERS = 4            # as verl's pool
STARTUP_TIMEOUT_S = 120.0  # a fresh interpreter importing math_verify + sympy (slow on loaded machines)
_READY = "ready"


class MathVerifyError(RuntimeError):
    """The Math-Verify helper process could not be started or died (not a per-answer outcome)."""


class _Helper:
    """One ``python -m rpg.reward.verify_pool`` process and its pipes."""

    def __init__(self) -> None:
        pkg_root = str(Path(__file__).resolve().parents[2])  # so the helper imports this rpg
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rpg.reward.verify_pool"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=env, close_fds=True,
        )
        self._buf = b""
        try:
            line = self._read_line(time.monotonic() + STARTUP_TIMEOUT_S)
        except MathVerifyError:
            self.kill()  # reap it and close its pipes (the caller never gets this object)
            raise
        if line != _READY:
            self.kill()
            raise MathVerifyError(f"the Math-Verify helper did not start (got {line!r}); see its stderr above")

    def _read_line(self, deadline: float) -> str | None:
        """One line from the helper; None on timeout. MathVerifyError if it exited."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise MathVerifyError(f"the Math-Verify helper exited (code {self.proc.wait()}); see its stderr above")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode("ascii")

    def ask(self, gold: str, output: str, timeout: float) -> float | str:
        try:
            # ensure_ascii: lone surrogates and control characters travel as \\u escapes
            self.proc.stdin.write(json.dumps([gold, output], ensure_ascii=True).encode("ascii") + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise MathVerifyError(f"the Math-Verify helper is gone (code {self.proc.poll()}): {e}") from e
        line = self._read_line(time.monotonic() + timeout)
        if line is None:
            return TIMEOUT
        reply = json.loads(line)
        if reply.get("timeout"):
            return TIMEOUT
        if "error" in reply:
            print(f"rpg.reward: Math-Verify raised on one answer (counted in scorer_failed): {reply['error']}",
                  file=sys.stderr, flush=True)
            return ERROR
        return float(reply["score"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


_lock = threading.Lock()
_idle: list[_Helper] = []
_slots = threading.BoundedSemaphore(MAX_WORKERS)


def verify(output: str, ground_truth: str, timeout: float = 30.0) -> float | str:
    """verl's Math-Verify check of ``output`` against ``\\boxed{ground_truth}``: 1.0, 0.0, TIMEOUT or ERROR.

    Thread-safe (at most MAX_WORKERS helpers, reused). A helper that dies is replaced once; a second
    death raises MathVerifyError.
    """
    gold = "\\boxed{" + ground_truth + "}"  # what verl's compute_score passes
    with _slots:
        for attempt in (1, 2):
            with _lock:
                helper = _idle.pop() if _idle else None
            try:
                helper = helper or _Helper()
                result = helper.ask(gold, output, timeout)
            except MathVerifyError:
                if helper is not None:
                    helper.kill()
                if attempt == 2:
                    raise
                continue
            except BaseException:  # e.g. a garbled reply: never leave a helper neither idle nor killed
                if helper is not None:
                    helper.kill()
                raise
            if result == TIMEOUT:
                helper.kill()  # it may still be computing; a fresh one serves the next request
            else:
                with _lock:
                    _idle.append(helper)
            return result
    raise AssertionError("unreachable")


def _forget_helpers_after_fork() -> None:
    """In a forked child (e.g. a DataLoader worker): the inherited helpers belong to the parent.

    Sharing their pipes would interleave two processes' requests and replies, and a lock held by
    another parent thread at fork time would never be released in the child. The child gets fresh
    locks, closes its copies of the pipes (so a helper still sees EOF when the parent exits) without
    touching the helper processes, and starts its own helpers on demand.
    """
    global _lock, _slots
    _lock, _slots = threading.Lock(), threading.BoundedSemaphore(MAX_WORKERS)
    for h in _idle:
        for f in (h.proc.stdin, h.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
    _idle.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_helpers_after_fork)


@atexit.register
def shutdown() -> None:
    """Stop the idle helpers (they also exit on their own when this process's pipes close)."""
    with _lock:
        helpers, _idle[:] = list(_idle), []
    for h in helpers:
        h.kill()


def check_answer(gold_boxed: str, output: str) -> float:
    """verl 0.9.1's Math-Verify check (``verl.utils.reward_score.math_verify._verify_in_subprocess``:
    gold parsed as LaTeX, prediction as expression or LaTeX, 1.0 iff any gold verifies against the best
    prediction), with one difference: Math-Verify's own timeouts raise ``TimeoutException`` instead of
    scoring 0. Its parse/compare *errors* still score 0 as in verl (an unparseable answer is wrong);
    ``raise_on_error=True`` only lets us tell the two apart (``TimeoutException`` is a BaseException,
    so ``except Exception`` never catches it).
    """
    from math_verify.grader import verify
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig, parse

    def parsed(text, targets):
        try:
            return parse(text, targets, raise_on_error=True)
        except Exception:  # noqa: BLE001 - verl: a parse error is an empty extraction
            return []

    def matches(g, p):
        try:
            return verify(g, p, raise_on_error=True)
        except Exception:  # noqa: BLE001 - verl: a comparison error is "not equal"
            return False

    gold = parsed(gold_boxed, (LatexExtractionConfig(),))
    pred = parsed(output, (ExprExtractionConfig(), LatexExtractionConfig()))
    if gold and pred:
        return max(1.0 if any(matches(g, p) for g in gold) else 0.0 for p in pred)
    return 0.0


def _serve() -> None:
    """Helper main loop: one JSON request ``[gold, output]`` per stdin line -> one JSON reply line."""
    proto = os.fdopen(os.dup(1), "w", encoding="ascii")
    os.dup2(2, 1)  # anything a library prints goes to stderr, never into the reply pipe
    sys.stdout = sys.stderr
    from math_verify.errors import TimeoutException

    proto.write(_READY + "\n")
    proto.flush()
    for line in sys.stdin:
        gold, output = json.loads(line)
        try:
            reply = {"score": float(check_answer(gold, output))}
        except TimeoutException:  # Math-Verify's own alarm: a scorer failure, never a wrong answer
            reply = {"timeout": True}
        except Exception as e:  # noqa: BLE001 - reported to the caller, which counts it
            reply = {"error": f"{type(e).__name__}: {e}"[:500]}
        proto.write(json.dumps(reply, ensure_ascii=True) + "\n")
        proto.flush()


if __name__ == "__main__":
    _serve()
