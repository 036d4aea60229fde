"""The launchers' command lines, read in one place: a paper run's (``rpg.launch.entry``, every paper script) and
the tiny demo's (``python -m rpg_lab.demo.cpu``, recipe/rpg/tiny/run_tiny_cpu.sh).

A launcher's extra arguments are Hydra overrides and nothing else. ``read_overrides`` refuses, in ONE
line and before anything is built or started (the launchers print it and exit 2):

* a flag (``--x``), and an override Hydra's parser cannot read (``rpg.override_lists``);
* one of the tool's own environment variables given as an argument (``OUT=runs/x`` after the script):
  Hydra would read it as the key ``OUT`` and the trainer would die on it after Ray started. The line
  says where it goes: ``OUT is an environment variable: OUT=runs/x bash recipe/rpg/tiny/run_tiny_cpu.sh``.
  Each tool declares its variables once (``rpg.launch.environment.VARIABLES``, ``rpg_lab.demo.cpu.ENV_VARS``)
  and prints the same list in its usage.

``OneLineParser``: argparse with its errors on one line (``prefix: argument --steps: ...``, exit 2)
instead of the usage block; ``positive_int``: an argparse type for counts (``--steps 0`` is refused).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence

from rpg.override_lists import OverrideSyntaxError, Parsed, check_user_overrides


class EnvVarArgumentError(OverrideSyntaxError):
    """An environment variable of the tool given as an argument (one line: where it goes)."""


def env_var_problem(arg: str, env_vars: Mapping[str, str], command: str) -> str | None:
    """The one line for ``arg`` when it sets one of ``env_vars`` ({name: what it sets}) as ``NAME=value``
    (Hydra reads that as an override of a key ``NAME``, unknown to the config); None otherwise.
    ``command``: how the tool is run, shown after the variable (``bash recipe/rpg/tiny/run_tiny_cpu.sh``)."""
    name, sep, value = arg.partition("=")
    if not sep or name.lstrip("+~") not in env_vars:
        return None
    name = name.lstrip("+~")
    return (f"{name} is an environment variable ({env_vars[name]}), not a Hydra override: set it before the "
            f"command, {name}={value} {command} ...")


def read_overrides(args: Sequence[str], env_vars: Mapping[str, str], command: str) -> list[Parsed]:
    """A launcher's extra arguments, read before anything starts: every one a Hydra override of a single
    run, none an environment variable of the tool (``OverrideSyntaxError``: one line naming it)."""
    for a in args:
        if (why := env_var_problem(a, env_vars, command)) is not None:
            raise EnvVarArgumentError(why)
    return check_user_overrides(args)


def is_env_var_key(key: str) -> bool:
    """``OUT``, ``MY_VAR``: an upper-case name without dots, which no key of the trainer's config is."""
    return "." not in key and key.upper() == key and any(c.isalpha() for c in key)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r} (expected an integer >= 1)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected an integer >= 1")
    return value


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0 (a time limit; 0, a negative number or nan would end a run
    at once or never)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value: {text!r} (expected a number of seconds > 0)") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected a finite number of seconds > 0")
    return value


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line ``<prefix> argument --x (ENV): why`` (exit code 2); ``env_of``
    maps a flag to the environment variable a wrapper script sets it from (``--steps`` -> ``STEPS``)."""

    def __init__(self, *a, prefix: str, env_of: Mapping[str, str] | None = None, **kw):
        super().__init__(*a, **kw)
        self.prefix, self.env_of = prefix, dict(env_of or {})

    def error(self, message: str):  # noqa: D401 - argparse's hook
        for flag, env in self.env_of.items():
            message = message.replace(f"argument {flag}:", f"argument {flag} ({env}):")
        print(f"{self.prefix} {message}; see --help", file=sys.stderr, flush=True)
        sys.exit(2)

