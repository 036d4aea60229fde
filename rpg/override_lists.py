"""Hydra override lists (``key=value`` strings), read with Hydra's own override parser.

Every place in the project that looks inside an override (its key, its value, whether it is valid)
goes through this module, and this module goes through
``hydra.core.override_parser.overrides_parser.OverridesParser``: the grammar the trainer applies
later (quoted strings, ``[a,b]`` lists, ``{k:v}`` dicts, ``${...}`` interpolations, ``+``/``++``/``~``)
is then the grammar the launchers check, and a value can never be read differently by a launcher
and by Hydra. Splitting at ``=`` or ``ast.literal_eval`` would disagree with Hydra on valid
overrides (README's ``data.val_files=[data/aime2024.parquet,data/aime2025.parquet]`` is not a
Python literal) and let invalid ones through to a traceback after Ray started.

* ``check_user_overrides``: a launcher's extra arguments (overrides only, each readable), one line if not.
* ``parse_overrides``: the parsed overrides, or ``OverrideSyntaxError``: ONE line naming the override and
  Hydra's reason (the launchers print it and exit 2). A sweep (``a=1,2``, ``choice(...)``,
  ``range(...)``, ``glob(...)``) is refused too unless ``multirun``: a single run takes one value.
* ``override_key`` / ``value_of`` / ``values``: what an override sets, as Hydra reads it.
* ``merge_overrides``: concatenation where a later value for the same key wins.
* ``resume_command``: the command that resumes a run (the driver's, the launcher's, the tiny demo's stop
  lines): ``cd`` to where it was launched, the variables, the command, the overrides with
  ``trainer.resume_mode=auto`` once.
* ``hydra_value`` / ``hydra_list``: the one way the project writes a string (or a list of strings) into an
  override so that Hydra reads back that same string (never an int, a bool or an interpolation).
* ``split_hydra_argv`` / ``bad_override_line``: a Hydra app's command line (flags such as ``--cfg job``,
  ``-m``, ``--config-name``, then overrides), read with Hydra's own argument parser, checked before
  ``hydra.main`` runs (``rpg.launch.entry.hydra_reads``, for recipe/rpg/main_rpg.py).

Used by every launcher (``rpg.launch.entry``, the CPU harness and ``rpg_lab.demo.cpu``, the GPU
smoke run, the study) and by the driver's entry script.
"""

from __future__ import annotations

import copy
import functools
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

GRAMMAR_HINT = ("Hydra's override grammar: key=value, +key=value (add), ++key=value (add or replace), ~key "
                "(delete); lists [a,b]; quote a value holding spaces or commas: key='a b'")
PREFIX = {"ADD": "+", "FORCE_ADD": "++", "DEL": "~", "CHANGE": ""}


class OverrideSyntaxError(ValueError):
    """An override Hydra cannot read (or a sweep where one value is needed): one line."""


_BARE = re.compile(r"^[A-Za-z0-9_./:+@%~-]+$")  # characters Hydra reads as a plain string when unquoted


def hydra_value(value: str, name: str = "a value", *, quote: bool = False) -> str:
    r"""``value`` written so that Hydra reads back this very string: bare when Hydra's own parser reads the bare
    text as that same string and ``quote`` is False (paths, names), else single-quoted (``quote=True``: always).
    So '1', 'true', 'null', 'inf' or '1_000' stay strings, not an int, a bool, None or a float, and '~x' (a
    delete in Hydra's grammar) is quoted.

    Quoted, Hydra's grammar escapes a backslash only before a quote or at the end of the string: a single quote
    is written ``\'`` and the backslashes before it or at the end are doubled (``o'brien`` -> ``'o\'brien'``).
    The result is read back with Hydra's parser; one it would read otherwise raises ``OverrideSyntaxError``
    naming ``name`` and the value (none is known).
    """
    if not quote and _BARE.match(value) and _reads_back(value):
        return value
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    quoted = "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped) + "'"
    if not _reads_back(quoted, value):
        raise OverrideSyntaxError(f"{name}={value!r} cannot be passed to Hydra: its parser reads {quoted} otherwise")
    return quoted


def _reads_back(text: str, value: str | None = None) -> bool:
    """Hydra's parser reads ``k=<text>`` as the string ``value`` (default: ``text`` itself)."""
    try:
        return value_of(f"k={text}") == (text if value is None else value)  # 1 == 1.0 != "1": a str only
    except OverrideSyntaxError:
        return False


def hydra_list(items: Iterable[str], name: str = "a value") -> str:
    """A list of strings for Hydra (``['a','b']``), each quoted (``hydra_value(quote=True)``)."""
    return "[" + ",".join(hydra_value(str(item), name, quote=True) for item in items) + "]"


_PARSER = None


def _parser():
    """Hydra's parser (built once: building it loads the ANTLR grammar)."""
    global _PARSER
    if _PARSER is None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        _PARSER = OverridesParser.create()
    return _PARSER


def _reason(err: Exception) -> str:
    """Hydra's message on one line: without its documentation link, its caret line and the
    'Error parsing override' header (the caller names the override itself)."""
    lines = [ln.strip() for ln in str(err).splitlines()]
    keep = [ln for ln in lines if ln and not ln.startswith("See https://") and set(ln) != {"^"}
            and not ln.startswith("Error parsing override")]
    return "; ".join(keep) or type(err).__name__


@dataclass(frozen=True)
class Parsed:
    """One override as Hydra reads it."""

    text: str  # as given
    key: str  # the dotted key (``a.b``), with ``@package`` when one is given
    kind: str  # CHANGE, ADD (+), FORCE_ADD (++) or DEL (~)
    value: Any  # Hydra's value: str, int, float, bool, None, list, dict (a sweep object only with multirun)
    value_text: str | None  # the value exactly as written (None: a deletion without a value)

    @property
    def prefix(self) -> str:
        return PREFIX[self.kind]

    @property
    def is_delete(self) -> bool:
        return self.kind == "DEL"

    def with_value_text(self, value_text: str) -> str:
        """This override's prefix and key with another value (as written)."""
        return f"{self.prefix}{self.key}={value_text}"


def parse_one(text: str, *, multirun: bool = False) -> Parsed:
    """``text`` as Hydra reads it; ``OverrideSyntaxError`` (one line) when Hydra cannot, or when it
    is a sweep and ``multirun`` is off."""
    if not isinstance(text, str):
        raise OverrideSyntaxError(f"Hydra override {text!r} is not a string")
    parsed = _parse_text(text, multirun)
    if isinstance(parsed.value, (str, int, float, bool, type(None))):
        return parsed
    return replace(parsed, value=copy.deepcopy(parsed.value))  # a list, dict or sweep: the memo's own stays as parsed


@functools.lru_cache(maxsize=8192)
def _parse_text(text: str, multirun: bool) -> Parsed:
    """``parse_one``, memoised: Hydra's ANTLR parser takes about a millisecond an override, and a study's plan reads
    the same few hundred overrides hundreds of times (its lists merged, their values read); a refusal is not kept."""
    from hydra.errors import HydraException

    try:
        (ov,) = _parser().parse_overrides([text])
    except HydraException as e:
        raise OverrideSyntaxError(f"Hydra cannot parse the override {text!r}: {_reason(e)} ({GRAMMAR_HINT})") from None
    if ov.is_sweep_override() and not multirun:
        raise OverrideSyntaxError(
            f"the override {text!r} is a sweep (several values, for Hydra's --multirun) but a run takes one value: "
            "write a list as key=[a,b], or quote a string holding commas: key='a,b'")
    key = ov.key_or_group if ov.package is None else f"{ov.key_or_group}@{ov.package}"
    key_element = ov.get_key_element()  # prefix + key (+ @package), as the parser matched it
    if text.startswith(key_element + "="):
        value_text = text[len(key_element) + 1:]
    elif ov.is_delete():
        value_text = None  # ``~key``
    else:  # pragma: no cover - the grammar puts '=' right after the key
        value_text = ov.get_value_element_as_str()
    return Parsed(text, key, ov.type.name, ov.value(), value_text)


def parse_overrides(overrides: Iterable[str], *, multirun: bool = False) -> list[Parsed]:
    """Every override parsed (``parse_one``); the first one Hydra cannot read raises."""
    return [parse_one(o, multirun=multirun) for o in overrides]


def check_user_overrides(args: Sequence[str]) -> list[Parsed]:
    """A launcher's extra arguments, read before anything is built or started: Hydra overrides only
    (``OverrideSyntaxError``, one line, for a flag or for an override Hydra cannot read)."""
    flags = [a for a in args if a.startswith("-")]
    if flags:
        raise OverrideSyntaxError(f"unrecognised arguments {flags}: extra arguments must be Hydra overrides "
                                  f"(key=value)")
    return parse_overrides(args)


def is_override(text: str) -> bool:
    """Whether Hydra reads ``text`` as one override of a single run (a flag, a bare word, a path or a
    sweep is not)."""
    if not isinstance(text, str) or text.startswith("-"):
        return False
    try:
        parse_one(text)
    except OverrideSyntaxError:
        return False
    return True


def override_key(override: str) -> str:
    """``'+a.b=1'`` -> ``'a.b'`` (the dotted key an override sets, as Hydra reads it)."""
    return parse_one(override).key


def value_of(override: str) -> Any:
    """The value Hydra gives ``override`` (``'k=[a,b]'`` -> ``['a', 'b']``, ``"k='x'"`` -> ``'x'``)."""
    return parse_one(override).value


def values(overrides: Iterable[str]) -> dict[str, Any]:
    """{key: value} of the assignments in ``overrides`` (the last one wins; a deletion removes the key)."""
    out: dict[str, Any] = {}
    for p in parse_overrides(overrides):
        if p.is_delete:
            out.pop(p.key, None)
        else:
            out[p.key] = p.value
    return out


def merge_overrides(*groups: Iterable[str]) -> list[str]:
    """Concatenate override lists; a later value for the same key replaces the earlier one.

    The first occurrence keeps its position and its ``+``/``++`` prefix (so a base that adds a
    new key with ``+k=v`` can be overridden by a caller writing ``k=v2``). ``~k`` deletions are
    kept as given, in their place; an assignment after a deletion of its key is a new entry after
    it (merging it into the earlier one would put it before the deletion, which would then delete it).
    Values are kept exactly as written. An override Hydra cannot read raises ``OverrideSyntaxError``.
    """
    slots: list[list] = []  # [Parsed of the first occurrence, value text of the latest]
    open_slot: dict[str, int] = {}
    for group in groups:
        for p in parse_overrides(group):
            if p.is_delete:
                slots.append([p, None])
                open_slot.pop(p.key, None)
            elif p.key in open_slot:
                slots[open_slot[p.key]][1] = p.value_text
            else:
                open_slot[p.key] = len(slots)
                slots.append([p, p.value_text])
    return [first.text if first.is_delete else first.with_value_text(value) for first, value in slots]


def resume_command(launch: str, overrides: Sequence[str], cwd: str, env: Mapping[str, str] | None = None,
                   env_vars: Sequence[str] = ()) -> str:
    """The command that resumes a run, which works pasted in any folder: ``cd`` to the folder it was launched
    from (``cwd``: relative paths in its variables, flags and overrides mean what they meant), the variables of
    ``env_vars`` set in ``env``, the launch command with its flags (``launch``, shell words: ``bash
    recipe/rpg/7b/<name>.sh``, ``python -m rpg_lab.demo.cpu --out <folder> ...``) and the overrides with ``trainer.resume_mode=auto``
    (replacing the run's own: it appears once)."""
    env = env or {}
    assigned = [f"{k}={shlex.quote(env[k])}" for k in env_vars if env.get(k, "").strip()]
    resumed = merge_overrides(list(overrides), ["trainer.resume_mode=auto"])
    return " ".join([f"cd {shlex.quote(str(cwd))} &&", *assigned, launch, shlex.join(resumed)])


# ----------------------------------------------------------------------------- a Hydra app's command line


def split_hydra_argv(argv: Sequence[str]):
    """``argv`` read by the argument parser ``hydra.main`` itself uses: ``(namespace, overrides)``.

    Hydra keeps that parser in ``hydra._internal.utils`` (unchanged from 1.0 to 1.3); reading the
    command line with it means Hydra's flags (``--cfg job``, ``-m``, ``--config-name x``, ...) are told
    apart from overrides exactly as ``hydra.main`` will. An unknown flag exits 2 with argparse's usage
    line, as ``hydra.main`` would.
    """
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(list(argv))
    return args, list(args.overrides)


def bad_override_line(argv: Sequence[str]) -> str | None:
    """The one line for the first override of a Hydra app's command line that Hydra cannot read
    (sweeps only with ``-m``/``--multirun``); None when all are readable."""
    args, overrides = split_hydra_argv(argv)
    try:
        parse_overrides(overrides, multirun=bool(args.multirun))
    except OverrideSyntaxError as e:
        return str(e)
    return None
