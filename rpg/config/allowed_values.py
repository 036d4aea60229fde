"""What a key of the ``rpg:`` block allows: one kind per sort of value, checked strictly.

A kind checks a value as the config gives it, without coercion (the string 'yes' is not a bool,
1.5 is not an integer, true is not a number), and refuses it with one ``RPGConfigError`` line that
names the full key and what is allowed; ``expected`` states the same allowance for the docs table.
OmegaConf's typed configs are not used for this on purpose: they coerce ('yes' -> true) and their
errors span several lines.

``yaml_value`` writes a value as the recipe YAML states it (``rpg.config.render_block``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rpg.config.access import fail as _fail


@dataclass(frozen=True)
class Choice:
    """One of a few names."""

    values: tuple[str, ...]

    @property
    def expected(self) -> str:
        return f"one of {', '.join(self.values)}"

    def check(self, key: str, value: Any) -> str:
        if not isinstance(value, str) or value not in self.values:
            _fail(f"{key}={value!r} is invalid; allowed values: {', '.join(self.values)}")
        return value


@dataclass(frozen=True)
class Flag:
    """true or false (a YAML bool; no string, no number)."""

    expected = "true or false"

    def check(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            _fail(f"{key}={value!r} is invalid; allowed values: true, false")
        return value


@dataclass(frozen=True)
class Integer:
    """An integer >= ``minimum`` (a bool is not one)."""

    minimum: int

    @property
    def expected(self) -> str:
        return f"an integer >= {self.minimum}"

    def check(self, key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
            _fail(f"{key}={value!r} is invalid; expected {self.expected}")
        return value


@dataclass(frozen=True)
class Number:
    """A finite number (stored as a float) within bounds; ``open``: the bound itself is refused;
    ``nullable``: null is allowed too."""

    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False
    nullable: bool = False

    @property
    def expected(self) -> str:
        if self.low is not None and self.high is not None:
            text = f"a number in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"
        elif self.low is not None:
            text = f"a number {'>' if self.low_open else '>='} {self.low}"
        elif self.high is not None:
            text = f"a number {'<' if self.high_open else '<='} {self.high}"
        else:
            text = "a finite number"
        return f"null or {text}" if self.nullable else text

    def check(self, key: str, value: Any) -> float | None:
        if value is None and self.nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(f"{key}={value!r} is invalid; expected a number{' or null' if self.nullable else ''}")
        v = float(value)
        if v != v or v in (float("inf"), float("-inf")):
            _fail(f"{key}={value!r} is invalid; expected a finite number")
        if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
            _fail(f"{key}={value!r} is invalid; expected a value {'>' if self.low_open else '>='} {self.low}")
        if self.high is not None and (v > self.high or (self.high_open and v == self.high)):
            _fail(f"{key}={value!r} is invalid; expected a value {'<' if self.high_open else '<='} {self.high}")
        return v


@dataclass(frozen=True)
class ModuleFunction:
    """``'package.module:function'`` (a function of an importable module) or null."""

    expected = "'package.module:function' or null"

    def check(self, key: str, value: Any) -> str | None:
        if value is not None and (not isinstance(value, str) or value.count(":") != 1):
            _fail(f"{key}={value!r} is invalid; expected {self.expected}")
        return value


@dataclass(frozen=True)
class PrefixCounts:
    """A mapping {data_source prefix: count >= 1}, stored as a tuple of (lower-case prefix, count) pairs;
    null: no pair. Keys are matched case-insensitively, so two keys that differ only in case or spaces
    are refused (one would silently replace the other)."""

    expected = "null or {data_source prefix (any case): samples per problem >= 1}"

    def check(self, key: str, value: Any) -> tuple[tuple[str, int], ...]:
        if value is None:
            return ()
        if isinstance(value, tuple):  # the stored form (a default, or settings built in code)
            items = value
        elif isinstance(value, Mapping):
            items = value.items()
        else:
            _fail(f"{key}={value!r} is invalid; expected a mapping {{data_source prefix: samples per problem}}, "
                  "e.g. {minerva: 1}")
        out: list[tuple[str, int]] = []
        for prefix, n in items:
            if not isinstance(prefix, str) or not prefix.strip():
                _fail(f"{key} has an empty or non-string data_source prefix {prefix!r}")
            if any(k == prefix.strip().lower() for k, _ in out):
                _fail(f"{key} names the data_source prefix {prefix.strip().lower()!r} twice (keys differ only in case "
                      "or spaces); give it once")
            out.append((prefix.strip().lower(), Integer(1).check(f"{key}.{prefix}", n)))
        return tuple(out)


Kind = Choice | Flag | Integer | Number | ModuleFunction | PrefixCounts


# ----------------------------------------------------------------------------- values as YAML states them

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def _float(v: float) -> str:
    """Shortest round-trip text; below 1e-3 in YAML's exponent form with a dot (1.0e-4)."""
    if v == 0 or abs(v) >= 1e-3:
        return repr(v)
    for digits in range(1, 18):
        text = f"{v:.{digits}e}"
        if float(text) == v:
            break
    mantissa, exponent = text.split("e")
    mantissa = mantissa.rstrip("0")
    return f"{mantissa}{'0' if mantissa.endswith('.') else ''}e{int(exponent)}"


def yaml_value(value: Any) -> str:
    """One scalar as the recipe YAML writes it (null, true, 1.0e-4, sampler); a mapping inline."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, str):
        plain = _PLAIN.fullmatch(value) and value.lower() not in _YAML_WORDS
        return value if plain else "'" + value.replace("'", "''") + "'"
    if isinstance(value, tuple):  # PrefixCounts' stored form
        return "{" + ", ".join(f"{yaml_value(k)}: {yaml_value(n)}" for k, n in value) + "}"
    raise TypeError(f"no YAML form for {value!r}")
