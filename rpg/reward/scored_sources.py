"""Which ``data_source`` values a reward function scores, asked before anything runs.

verl's reward loop hands every row's ``data_source`` to the run's reward function; one it does not know
raises ``NotImplementedError`` at the first validation, after Ray, the model load and the whole rollout
(the trainer then dies with an unrelated TransferQueue error). ``rpg.data`` (``--data-source``) and the
checks before Ray (``rpg.data.checks``, ``rpg.verl.input_paths``) ask this module instead:

* ``rpg_handles``: ``rpg.reward.compute_score``'s own routes (``rpg.reward.scorer_for``: the paper's rule,
  Math-Verify), then verl's ``default_compute_score`` for anything else, as ``compute_score`` does;
* ``verl_handles``: verl's ``default_compute_score`` alone (``rpg.reward_function=null`` and no
  ``reward.custom_reward_function``). Its sources are read from verl's own code (the ``data_source ==``,
  ``in [...]`` and ``.startswith(...)`` tests of that function, parsed, never imported or called), so
  they follow the installed verl.

A user's own ``reward.custom_reward_function`` is trusted with any ``data_source`` (``Scorer.handles`` None).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass

from rpg.config.block import RPG_FUNCTION, RPG_MODULE
from rpg.reward.scorer import _MATH_DAPO_EXACT, _MATH_DAPO_PREFIXES, _MATH_VERIFY_PREFIXES, VERL_DEFAULT, scorer_for

VERL_MODULE = "verl.utils.reward_score"
VERL_FUNCTION = "default_compute_score"


@functools.lru_cache(maxsize=1)
def verl_sources() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(exact names, prefixes) of the data sources verl's ``default_compute_score`` scores, in its order."""
    spec = importlib.util.find_spec(VERL_MODULE)
    with open(spec.origin, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == VERL_FUNCTION)
    param = fn.args.args[0].arg  # data_source
    exact: dict[str, None] = {}
    prefixes: dict[str, None] = {}

    def strings(node) -> list[str]:
        items = node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else [node]
        return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]

    for node in ast.walk(fn):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == param:
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.Eq, ast.In)):
                    exact.update(dict.fromkeys(strings(right)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == param and node.args):
            prefixes.update(dict.fromkeys(strings(node.args[0])))
    return tuple(exact), tuple(prefixes)


def verl_handles(data_source: str) -> bool:
    """Whether verl's ``default_compute_score`` scores ``data_source`` (compared as verl does: exactly)."""
    exact, prefixes = verl_sources()
    return data_source in exact or data_source.startswith(prefixes)


def rpg_handles(data_source: str) -> bool:
    """Whether ``rpg.reward.compute_score`` scores ``data_source``: its own routes (any letter case), else verl's."""
    return scorer_for(data_source) != VERL_DEFAULT or verl_handles(data_source)


def verl_allowed() -> str:
    exact, prefixes = verl_sources()
    return ", ".join([*(repr(s) for s in exact), *(f"{p}*" for p in prefixes)])


def rpg_allowed() -> str:
    own = [*_MATH_DAPO_EXACT, *(f"{p}*" for p in (*_MATH_DAPO_PREFIXES, *_MATH_VERIFY_PREFIXES))]
    return f"{', '.join(own)} and verl's {VERL_FUNCTION} sources ({verl_allowed()})"


def is_rpg_reward(path: str | None, name: str | None) -> bool:
    """Whether ``reward.custom_reward_function`` (path, name) is ``rpg.reward.compute_score``: ``pkg://rpg.reward``
    or the file of the installed ``rpg.reward`` (what the recipe's ``rpg.reward_function`` resolves to)."""
    import rpg.reward

    if not path or name != RPG_FUNCTION:
        return False
    return path == f"pkg://{RPG_MODULE}" or (
        not path.startswith("pkg://") and os.path.realpath(path) == os.path.realpath(rpg.reward.__file__))


@dataclass(frozen=True)
class Scorer:
    """The reward function that scores a run's rows, for the checks' messages: ``name``, the ``data_source``
    values it ``handles`` (None: any, a user's own function), what it allows and how to change it, and whether
    each row's ``reward_model.ground_truth`` must be text that is not blank (``text_answers``: ``rpg.reward``
    raises on anything else, verl's scorers compare strings; a user's own function is given what the row holds)."""

    name: str
    handles: Callable[[str], bool] | None
    allowed: str = ""
    hint: str = ""
    text_answers: bool = False

    def unscored(self, data_sources) -> list[str]:
        return [] if self.handles is None else [ds for ds in data_sources if not self.handles(ds)]


def rpg_scorer(hint: str) -> Scorer:
    return Scorer(f"{RPG_MODULE}.{RPG_FUNCTION}", rpg_handles, rpg_allowed(), hint, text_answers=True)


def verl_scorer(why: str, hint: str) -> Scorer:
    """verl's ``default_compute_score``; ``why``: the setting that chose it, for the message."""
    return Scorer(f"verl's {VERL_FUNCTION} {why}".rstrip(), verl_handles, verl_allowed(), hint, text_answers=True)


ANY = Scorer("your reward function", None)


def _top_level_names(tree: ast.Module) -> set[str] | None:
    """Names a module defines at its top level (in ``if``/``try``/``with`` blocks too); None when a star import
    or a module ``__getattr__`` could define any name."""
    names: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" for a in node.names):
                return None
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            body += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *(s for h in getattr(node, "handlers", []) for s in h.body)]
    return None if "__getattr__" in names else names


def reward_name_problem(path: str | None, name: str | None) -> str | None:
    """One line when the file ``reward.custom_reward_function.path`` names (a file, ``file://`` or ``pkg://``)
    defines no top-level ``name`` (verl would fail to load it in a worker, after Ray), read with ``ast``, never
    executed; None when it does, when the file is missing (named elsewhere) or when that cannot be told."""
    if not path or not name:
        return None
    if path.startswith("pkg://"):
        try:
            spec = importlib.util.find_spec(path[len("pkg://"):].replace("/", "."))
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None if spec is not None else f"reward.custom_reward_function.path={path}: no such module"
        file = spec.origin
    else:
        file = path[len("file://"):] if path.startswith("file://") else path
    if not os.path.isfile(file):
        return None
    try:
        with open(file, encoding="utf-8") as fh:
            names = _top_level_names(ast.parse(fh.read(), file))
    except (SyntaxError, UnicodeDecodeError, ValueError) as err:
        return f"reward.custom_reward_function.path={path}: not valid Python ({' '.join(str(err).split())})"
    if names is None or name in names:
        return None
    functions = sorted(n for n in names if not n.startswith("_"))
    return (f"reward.custom_reward_function.name={name}: {file} (reward.custom_reward_function.path) defines no "
            f"{name}; it defines {', '.join(functions) or 'nothing public'}")
