"""Arithmetic problems for SmolLM2, generated from a seed: the paper's prompt template and reward.

Each problem is one operation on two integers, written plainly ("What is $17 + 8$?") or as a one-step word problem
("Mia has 17 stickers. She gets 8 more. How many stickers does she have now?"); the kinds, their operands' ranges
and their shares are ``KINDS`` and ``MIX`` (small operands, some two-digit ones: docs/smol.md gives the base model's
accuracy on them). The user turn is the paper's template around the problem (``rpg.data.template.format_prompt``:
reason step by step, the last line ``Answer: $Answer``), after one worked example in the same template
(``EXAMPLE``: ``2 + 3 = 5.`` then ``Answer: 5``) as an earlier user and assistant turn: the format the paper's rule
reads, shown once, which this model follows far more often than the template's words alone. The example's turn
holds the template too: with its bare problem instead (57 of the prompt's 186-203 tokens fewer) the base model
answered 1 of 200 validation problems right, imitating the example only where the turns match (docs/smol.md).
The ground truth is the integer's decimal string; rows carry ``data_source="math_dapo"``, so ``rpg.reward`` scores
them by the paper's rule (the last ``Answer:`` line, +1 / -1). The rows are ``rpg.data.rows.build_rows``'s, the
layout of the project's prepared data, with the example's two turns before the problem's.

Train and validation are disjoint in the arithmetic itself: no (operation, operands) pair of one split is in the
other or is the example's (``Problem.key``; ``a + b`` and ``b + a`` are one pair), whatever its wording.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rpg.data import rows as data_rows
from rpg.data.template import format_prompt

DATA_SOURCE = "math_dapo"
SEED = 2026
N_TRAIN = 256  # the default run reads 48 (6 steps), the GPU smoke run 192; the small kinds' pairs bound the total
N_VAL = 200

# kind -> (operation, range of a, range of b (inclusive), word problem?); the share of each kind in MIX. A
# subtraction's operands are ordered so that its result is >= 0.
KINDS = {
    "add": ("+", (1, 20), (1, 20), False),
    "sub": ("-", (1, 20), (1, 20), False),
    "mul": ("*", (2, 12), (2, 9), False),
    "add2": ("+", (10, 99), (10, 99), False),
    "sub2": ("-", (10, 99), (10, 99), False),
    "word_add": ("+", (1, 20), (1, 9), True),
    "word_sub": ("-", (1, 20), (1, 9), True),
}
MIX = {"add": 2, "sub": 2, "mul": 1, "add2": 1, "sub2": 1, "word_add": 1, "word_sub": 1}

_NAMES = (("Mia", "She"), ("Tom", "He"), ("Ana", "She"), ("Leo", "He"), ("Sara", "She"), ("Ben", "He"))
_ITEMS = ("apples", "stickers", "marbles", "books", "coins", "pencils", "cards", "shells")
_CONTAINERS = ("box", "bag", "jar", "basket", "shelf")
_PLURAL = {"box": "boxes", "bag": "bags", "jar": "jars", "basket": "baskets", "shelf": "shelves"}
_SYMBOL = {"+": "+", "-": "-", "*": "\\times"}


@dataclass(frozen=True)
class Problem:
    kind: str
    a: int
    b: int
    name: int = 0  # index into the word problems' names, items and containers
    item: int = 0
    container: int = 0

    @property
    def op(self) -> str:
        return KINDS[self.kind][0]

    @property
    def answer(self) -> int:
        return {"+": self.a + self.b, "-": self.a - self.b, "*": self.a * self.b}[self.op]

    @property
    def key(self) -> tuple:
        """The arithmetic (operation and operands) of the problem; commutative operands ordered."""
        a, b = (min(self.a, self.b), max(self.a, self.b)) if self.op in "+*" else (self.a, self.b)
        return self.op, a, b

    def text(self) -> str:
        """The problem as the model reads it (inside the paper's template)."""
        if not KINDS[self.kind][3]:
            return f"What is ${self.a} {_SYMBOL[self.op]} {self.b}$?"
        name, pronoun = _NAMES[self.name]
        item = _ITEMS[self.item]
        if self.op == "+":
            return f"{name} has {self.a} {item}. {pronoun} gets {self.b} more. How many {item} does " \
                   f"{pronoun.lower()} have now?"
        if self.op == "-":
            return f"{name} has {self.a} {item}. {pronoun} gives {self.b} of them to a friend. How many {item} " \
                   f"does {pronoun.lower()} have left?"
        box = _CONTAINERS[self.container]
        return f"Each {box} holds {self.a} {item}. How many {item} are in {self.b} {_PLURAL[box]}?"


EXAMPLE = Problem("add", 2, 3)  # the worked example before every problem; in neither split


def draw(rng: random.Random, kind: str) -> Problem:
    """One problem of ``kind``: its operands uniform in their ranges (a subtraction's result is >= 0)."""
    op, (a_lo, a_hi), (b_lo, b_hi), word = KINDS[kind]
    a, b = rng.randint(a_lo, a_hi), rng.randint(b_lo, b_hi)
    if op == "-" and a < b:
        a, b = b, a
    if not word:
        return Problem(kind, a, b)
    return Problem(kind, a, b, rng.randrange(len(_NAMES)), rng.randrange(len(_ITEMS)), rng.randrange(len(_CONTAINERS)))


def quotas(n: int, mix: dict[str, int]) -> dict[str, int]:
    """Problems of each kind among ``n``: ``n`` x its share, rounded by largest remainder (they sum to ``n``)."""
    total = sum(mix.values())
    exact = {k: n * w / total for k, w in mix.items()}
    out = {k: int(x) for k, x in exact.items()}
    for k in sorted(mix, key=lambda k: out[k] - exact[k])[: n - sum(out.values())]:
        out[k] += 1
    return out


def split(seed: int = SEED, n_train: int = N_TRAIN, n_val: int = N_VAL,
          mix: dict[str, int] = MIX) -> tuple[list[Problem], list[Problem]]:
    """(train, validation): each split holds ``quotas(n, mix)`` problems of each kind in an order drawn from
    ``Random(seed)`` (validation first), no ``key`` twice and none the example's (so the splits are disjoint).
    The same arguments give the same lists."""
    unknown = sorted(set(mix) - set(KINDS))
    if unknown or not mix or min(mix.values()) < 0 or sum(mix.values()) <= 0:
        raise ValueError(f"mix {mix} is invalid: expected non-negative shares of {', '.join(KINDS)}")
    rng, seen = random.Random(seed), {EXAMPLE.key}
    out: list[list[Problem]] = [[], []]
    for part, n in ((1, n_val), (0, n_train)):
        kinds = [k for k, q in quotas(n, mix).items() for _ in range(q)]
        rng.shuffle(kinds)
        for kind in kinds:
            for _ in range(10_000):  # draws of this kind until one is new
                p = draw(rng, kind)
                if p.key not in seen:
                    break
            else:
                raise ValueError(f"cannot draw {n_val} + {n_train} distinct problems from the mix {mix}: the "
                                 f"operands of {kind!r} run out")
            seen.add(p.key)
            out[part].append(p)
    return out[0], out[1]


def example_turns() -> list[dict]:
    """The worked example as a user turn in the paper's template and the assistant's answer in the paper's format."""
    return [{"role": "user", "content": format_prompt(EXAMPLE.text())},
            {"role": "assistant", "content": reference_response(EXAMPLE)}]


def rows(problems: list[Problem], split_name: str) -> list[dict]:
    """verl RLHFDataset rows in the layout of the project's prepared data (``rpg.data.rows.build_rows``;
    ``split_name`` train or test; ``extra_info.source_index`` is the problem's place in ``problems``), the
    example's turns (``example_turns``) before the problem's."""
    records = [data_rows.Problem(problem=p.text(), answer=str(p.answer), source_index=i)
               for i, p in enumerate(problems)]
    out = data_rows.build_rows(records, DATA_SOURCE, split_name)
    for row in out:
        row["prompt"] = example_turns() + row["prompt"]
    return out


def reference_response(p: Problem) -> str:
    """A correct response in the paper's format (tests: the reward scores it +1)."""
    return f"{p.a} {_SYMBOL[p.op]} {p.b} = {p.answer}.\nAnswer: {p.answer}"
