"""Arithmetic problems for SmolLM2, generated from a seed: the paper's prompt template and reward.

Each problem is one operation on two integers, written plainly ("What is 47 + 85?") or as a one-step word
problem ("Mia has 47 stickers. She gets 85 more. How many stickers does she have now?"); the kinds and their
shares are ``MIX``. The user turn is the paper's template around it (``rpg.data.template.format_prompt``: reason
step by step, the last line ``Answer: $Answer``); the ground truth is the integer's decimal string; rows carry
``data_source="math_dapo"``, so ``rpg.reward`` scores them by the paper's rule (the last ``Answer:`` line, +1 / -1).
The rows are ``rpg.data.rows.build_rows``'s, the layout of the project's prepared data.

Train and validation are disjoint in the arithmetic itself: no (operation, operands) pair of one split is in the
other (``Problem.key``; ``a + b`` and ``b + a`` are one pair), whatever its wording.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rpg.data import rows as data_rows

DATA_SOURCE = "math_dapo"
SEED = 2026
N_TRAIN = 2000
N_VAL = 256

# kind -> (operation, digits of a, digits of b, word problem?); the share of each kind in MIX
KINDS = {
    "add2": ("+", 2, 2, False),
    "add3": ("+", 3, 3, False),
    "sub2": ("-", 2, 2, False),
    "sub3": ("-", 3, 3, False),
    "mul": ("*", 2, 1, False),
    "word_add": ("+", 2, 2, True),
    "word_sub": ("-", 2, 2, True),
    "word_mul": ("*", 2, 1, True),
}
MIX = {"add2": 2, "add3": 1, "sub2": 2, "sub3": 1, "mul": 1, "word_add": 1, "word_sub": 1, "word_mul": 1}

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


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1) if digits > 1 else rng.randint(2, 9)


def draw(rng: random.Random, mix: dict[str, int] = MIX) -> Problem:
    """One problem: a kind by its share in ``mix``, then its operands (a subtraction's result is >= 0)."""
    kind = rng.choices(list(mix), weights=list(mix.values()))[0]
    op, da, db, word = KINDS[kind]
    a, b = _operand(rng, da), _operand(rng, db)
    if op == "-" and a < b:
        a, b = b, a
    if not word:
        return Problem(kind, a, b)
    return Problem(kind, a, b, rng.randrange(len(_NAMES)), rng.randrange(len(_ITEMS)), rng.randrange(len(_CONTAINERS)))


def split(seed: int = SEED, n_train: int = N_TRAIN, n_val: int = N_VAL,
          mix: dict[str, int] = MIX) -> tuple[list[Problem], list[Problem]]:
    """(train, validation): ``n_val`` then ``n_train`` problems drawn from ``Random(seed)``, no ``key`` twice (so the
    splits are disjoint). The same arguments give the same lists."""
    unknown = sorted(set(mix) - set(KINDS))
    if unknown or not mix or min(mix.values()) < 0 or sum(mix.values()) <= 0:
        raise ValueError(f"mix {mix} is invalid: expected non-negative shares of {', '.join(KINDS)}")
    rng, seen = random.Random(seed), set()
    out: list[list[Problem]] = [[], []]
    for part, n in ((1, n_val), (0, n_train)):
        misses = 0  # draws in a row that repeated a problem
        while len(out[part]) < n:
            p = draw(rng, mix)
            if p.key in seen:
                misses += 1
                if misses > 10_000:
                    raise ValueError(f"cannot draw {n_val} + {n_train} distinct problems from the mix {mix}")
                continue
            misses = 0
            seen.add(p.key)
            out[part].append(p)
    return out[0], out[1]


def rows(problems: list[Problem], split_name: str) -> list[dict]:
    """verl RLHFDataset rows in the layout of the project's prepared data (``rpg.data.rows.build_rows``;
    ``split_name`` train or test; ``extra_info.source_index`` is the problem's place in ``problems``)."""
    records = [data_rows.Problem(problem=p.text(), answer=str(p.answer), source_index=i)
               for i, p in enumerate(problems)]
    return data_rows.build_rows(records, DATA_SOURCE, split_name)


def reference_response(p: Problem) -> str:
    """A correct response in the paper's format (tests: the reward scores it +1)."""
    return f"{p.a} {_SYMBOL[p.op]} {p.b} = {p.answer}.\nAnswer: {p.answer}"
