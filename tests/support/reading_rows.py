"""The rows of a study's Reading tables in docs/study.md, as the tests read them back: a hypothesis's row (claim,
effect [interval], p, Holm p, verdict) and a row of the same tests on a subset of the seeds, and whether a printed
number is a computed value to the digits printed."""

from __future__ import annotations

import re

NUMBER = r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
# | H1 | claim | +0.205 [0.068, 0.343] | 0.0042 | 0.017 | supported |
ROW = re.compile(rf"^\| (?P<name>[A-Z]\d) \| [^|]+ \| (?P<mean>{NUMBER}) \[(?P<lo>{NUMBER}), (?P<hi>{NUMBER})\] \| "
                 rf"(?P<p>{NUMBER}) \| (?P<holm>{NUMBER}) \| (?P<verdict>[^|]+) \|$")

# | H1 | 9 | 8 of 9 | +0.065 [0.022, 0.105] | 0.0059 | 0.023 |
SEEDS_ROW = re.compile(rf"^\| (?P<name>[A-Z]\d) \| (?P<n>\d+) \| (?P<up>\d+) of (?P=n) \| (?P<mean>{NUMBER}) "
                       rf"\[(?P<lo>{NUMBER}), (?P<hi>{NUMBER})\] \| (?P<p>{NUMBER}) \| (?P<holm>{NUMBER}) \|$")


def agrees(printed: str, value: float) -> bool:
    """``printed`` is ``value`` to the digits printed: within half a unit of its last decimal place (or of its last
    significant digit in scientific notation)."""
    x = float(printed)
    if "e" in printed.lower():
        mantissa, exponent = printed.lower().split("e")
        decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
        return abs(x - value) <= 0.5 * 10.0 ** (int(exponent) - decimals) * (1 + 1e-9)
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(x - value) <= 0.5 * 10.0 ** -decimals + 1e-12
