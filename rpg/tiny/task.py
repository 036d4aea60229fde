"""The synthetic verifiable task: single-digit addition in the paper's answer format.

Each problem is "What is a + b?" with a, b in 0..9, followed by the instruction the paper
(and DAPO) uses: the last line must be ``Answer: $Answer``. The ground truth is the decimal
string of a + b. Rows are scored by verl's own DAPO math scorer: ``data_source="math_dapo"``
routes to ``verl.utils.reward_score.math_dapo.compute_score`` (+1 correct, -1 otherwise, and
``acc``), exactly the reward path of the real runs.

Splits (all deterministic):
* RL train prompts and validation prompts are disjoint sets of (a, b) pairs.
* The supervised warm-up set covers all 100 pairs but with *noisy* targets (``noisy_response``):
  with probability ``P_CORRECT`` the correct ``Answer: a+b``; with ``P_BAD_FORMAT`` the right
  sum without the required last line (``a + b = s``, scored -1 by the DAPO scorer); otherwise
  ``Answer:`` with an off-by-one sum. Warm-up therefore teaches both formats and approximate
  addition, and the sampled accuracy starts near ``P_CORRECT``. The noise is the same for every
  problem, so RL can raise accuracy on the *held-out* validation prompts by learning
  problem-independent behaviour: always use the required answer line (fast) and be exact
  (slower), much like format learning early in real math RL.
"""

from __future__ import annotations

import random

DATA_SOURCE = "math_dapo"
INSTRUCTION = (
    "The last line of your response should be of the form Answer: $Answer "
    "where $Answer is the answer to the problem."
)
P_CORRECT = 0.35  # warm-up targets: P(correct answer in the required format)
P_BAD_FORMAT = 0.35  # P(correct sum but no "Answer:" line); the rest: "Answer:" with an off-by-one sum
MAX_SUM = 18


def question(a: int, b: int) -> str:
    """The user message for problem (a, b)."""
    return f"What is {a} + {b}? {INSTRUCTION}"


def response(answer: int) -> str:
    """A response in the paper's format (the scorer reads the last ``Answer:`` line)."""
    return f"Answer: {answer}"


def all_pairs() -> list[tuple[int, int]]:
    return [(a, b) for a in range(10) for b in range(10)]


def split_pairs(seed: int, n_val: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Disjoint (train, val) problem sets; ``n_val`` pairs go to validation."""
    if not 0 < n_val < 100:
        raise ValueError(f"n_val must be in 1..99, got {n_val}")
    pairs = all_pairs()
    random.Random(seed).shuffle(pairs)
    return sorted(pairs[n_val:]), sorted(pairs[:n_val])


def bad_format(a: int, b: int) -> str:
    """The right sum, but without the required ``Answer:`` line (the scorer gives -1)."""
    return f"{a} + {b} = {a + b}"


def noisy_response(a: int, b: int, rng: random.Random) -> str:
    """Warm-up target (see module docstring for the three cases and their probabilities)."""
    s, u = a + b, rng.random()
    if u < P_CORRECT:
        return response(s)
    if u < P_CORRECT + P_BAD_FORMAT:
        return bad_format(a, b)
    return response(s + 1 if (s == 0 or rng.random() < 0.5) else s - 1)


def rl_row(a: int, b: int, split: str, index: int) -> dict:
    """One row in verl's RLHFDataset format."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question(a, b)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"split": split, "index": index, "a": a, "b": b},
    }
