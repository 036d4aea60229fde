"""The synthetic verifiable task: single-digit addition in the paper's answer format.

Each problem is "What is a + b?" with a, b in 0..9, followed by the instruction the paper
(and DAPO) uses: the last line must be ``Answer: $Answer``. The ground truth is the decimal
string of a + b. Rows are scored by verl's own DAPO math scorer: ``data_source="math_dapo"``
routes to ``verl.utils.reward_score.math_dapo.compute_score`` (+1 correct, -1 otherwise, and
``acc``), exactly the reward path of the real runs.

Splits (all deterministic):
* RL train prompts and validation prompts are disjoint sets of (a, b) pairs.
* The supervised warm-up set covers all 100 pairs but with *noisy* labels: the stated answer
  is correct with probability ``P_CORRECT`` and otherwise off by one or uniformly random.
  Warm-up therefore teaches the output format and approximate addition, while the noise
  (which is the same for every problem) leaves sampling accuracy low. RL can raise accuracy on
  held-out validation prompts only by learning the problem-independent "be exact" behaviour.
"""

from __future__ import annotations

import random

DATA_SOURCE = "math_dapo"
INSTRUCTION = (
    "The last line of your response should be of the form Answer: $Answer "
    "where $Answer is the answer to the problem."
)
P_CORRECT = 0.35  # warm-up label noise: P(stated answer == a + b)
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


def noisy_answer(a: int, b: int, rng: random.Random) -> int:
    """Warm-up label: correct w.p. P_CORRECT, else a+b-1, a+b+1 or uniform in 0..MAX_SUM."""
    s = a + b
    u = rng.random()
    if u < P_CORRECT:
        return s
    if u < P_CORRECT + (1 - P_CORRECT) / 3:
        return abs(s - 1)
    if u < P_CORRECT + 2 * (1 - P_CORRECT) / 3:
        return s + 1
    return rng.randint(0, MAX_SUM)


def rl_row(a: int, b: int, split: str, index: int) -> dict:
    """One row in verl's RLHFDataset format."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question(a, b)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"split": split, "index": index, "a": a, "b": b},
    }
