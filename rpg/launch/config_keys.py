"""One check of a run's overrides against the composed config, before anything starts.

``compose_config`` composes the trainer's config with Hydra's compose API (what ``hydra.main`` will do in
the driver, without the driver): an override of a key the config does not have (``rpg.loss.divergance``,
``actor_rollout_ref.actor.optim.lrr``, ``OUT``) is Hydra's "Could not override 'x'" / "Key 'y' is not in
struct" (a 72-line traceback through Hydra's internals under ``HYDRA_FULL_ERROR=1``, or Hydra's 4 lines,
exit 1, after Ray started). Here it is ONE line (``ConfigKeyError``, an ``RPGConfigError``: the launchers
print it as the driver prints a bad value, exit 2) naming every such key, the closest key the config has
(``difflib`` over the composed config's dotted key paths) and the ``+key=value`` form that adds a new key.

Cost: one composition of ``recipe/rpg/config/rpg_trainer.yaml`` per launch (the launchers compose once
and reuse it; measured in docs/launch-scripts.md), one more per process with a run (``base_keys``), a few more
only when a key is unknown (to find every unknown key and the valid ones).

With ``+experiment=<run>`` the run's experiment file is checked the same way (``experiment_key_problems``): Hydra
merges a file of the defaults list without its struct check, so a key the config does not have
(``data.max_respons_length``, ``algorithm.filter_groups.enabel``, a block ``bomb:``) would sit beside the default it
meant to change. Every key the file adds to the config composed without it (its key set composed once per process,
``base_keys``) is one line naming the file, the key and the closest key the config has; a key is new legitimately
only under a mapping whose keys are the reader's: an empty mapping (verl's ``override_config``, ``engine_kwargs``,
``apply_chat_template_kwargs``, ...), a null value, a value of the ``rpg:`` block (its kind checks it), or
``OPEN_MAPPINGS``; and where a ``+key=value`` override adds it.

``checked_config`` adds ``trainer.logger`` against verl's own list of tracking backends
(``rpg.verl.verl_rules.logger_problem``: verl asserts on it in the trainer, after Ray, the workers and the
model have started; the driver applies the same rule).
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from rpg.config import RPGConfigError
from rpg.launch.args import is_env_var_key
from rpg.launch.experiments import CONFIG_NAME, GROUP
from rpg.override_lists import parse_one
from rpg.verl.verl_rules import logger_problem

_NOT_OVERRIDABLE = re.compile(r"Could not override '([^']+)'")
_APPEND_EXISTS = re.compile(r"Could not append to config\. An item is already at '([^']+)'")
_DELETE_MISSING = re.compile(r"Could not delete from config\. (?:The value of )?'([^']+)'")
# Mappings whose keys are their reader's, not the config's (a file may set any key under them): ray.init's keyword
# arguments (verl passes ray_kwargs.ray_init on), the reward function's keyword arguments (rpg.reward's options)
OPEN_MAPPINGS = ("ray_kwargs.ray_init", "reward.custom_reward_function.reward_kwargs")


class ConfigKeyError(RPGConfigError):
    """An override of a key the config does not have (or ``+`` on a key it has): one line."""


def _nodes(cfg):
    """(dotted key path, node) of every key of a composed config (mappings only; list items are values)."""
    from omegaconf import DictConfig

    def walk(node, prefix: str):
        for key in node.keys():
            path, child = f"{prefix}{key}", node._get_node(key)
            yield path, child
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
                yield from walk(child, path + ".")

    yield from walk(cfg, "")


def key_paths(cfg) -> list[str]:
    """Every dotted key path of a composed config (mappings only; list items are values)."""
    return [path for path, _ in _nodes(cfg)]


def closest_key(key: str, paths: Iterable[str]) -> str | None:
    """The config key closest to ``key`` (difflib's ratio >= 0.75 on the dotted path), or None."""
    found = difflib.get_close_matches(key, list(paths), n=1, cutoff=0.75)
    return found[0] if found else None


def _bad_override(message: str, overrides: Sequence[str]) -> tuple[int, str] | None:
    """(index in ``overrides``, kind) of the override a Hydra composition error is about."""
    for pattern, kind in ((_NOT_OVERRIDABLE, "unknown"), (_APPEND_EXISTS, "exists"), (_DELETE_MISSING, "delete")):
        m = pattern.search(message)
        if m:
            for i in range(len(overrides) - 1, -1, -1):  # the last one: a later value wins, and is the user's
                if parse_one(overrides[i]).key == m.group(1):
                    return i, kind
    return None


def _one_line(message: str) -> str:
    return "; ".join(ln.strip() for ln in message.splitlines() if ln.strip() and not ln.startswith("See "))


# keys the recipe's config sets by reference to another block (recipe/rpg/config/rpg_trainer.yaml): a key under one is
# set in the block it refers to
REFERENCES = {"actor_rollout_ref.actor.policy_loss.rpg_loss": "rpg.loss"}


def _describe(kind: str, text: str, paths: list[str]) -> str:
    p = parse_one(text)
    for ref, block in REFERENCES.items():
        if p.key.startswith(ref + "."):
            field = p.key[len(ref) + 1:]
            return f"{p.key} is {block}.{field} by reference ({ref}: ${{{block}}}): write {block}.{field}={p.value_text}"
    if kind == "exists":
        return (f"{p.text} adds the key {p.key}, which the config already has: write {p.key}={p.value_text} to change "
                f"it (++{p.key}=... adds or replaces)")
    if kind == "delete":
        return f"{p.text} deletes {p.key}, which the config does not have"
    close = closest_key(p.key, paths)
    line = f"{p.key} is not a key of the config" + (f" (did you mean {close}?)" if close else "")
    if is_env_var_key(p.key):
        line += f"; if {p.key} is an environment variable, set it before the command: {p.key}={p.value_text} ..."
    return line + f"; to add a new key write +{p.key}={p.value_text}"


@functools.lru_cache(maxsize=4)
def base_keys(config_dir: str, config_name: str, searchpath: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    """(every key path, the paths under which any key may be set) of the config composed without a run (Hydra
    initialised on ``config_dir``; ``searchpath``: the ``hydra.searchpath`` overrides), composed once per process."""
    from hydra import compose
    from omegaconf import DictConfig

    from rpg.config import declared_keys

    paths, open_paths = [], {k.path for k in declared_keys()}
    for path, node in _nodes(compose(config_name=config_name, overrides=list(searchpath))):
        paths.append(path)
        if node._is_none() or (isinstance(node, DictConfig) and not node._is_missing() and len(node) == 0):
            open_paths.add(path)
    return frozenset(paths), frozenset(open_paths)


def experiment_key_problems(cfg, overrides: Sequence[str], keys: frozenset[str], open_paths: frozenset[str],
                            exp) -> list[str]:
    """One line per key the experiment ``exp`` (``rpg.launch.experiments.Experiment``) adds to the composed ``cfg``
    that the config without it (``keys``, ``open_paths``: ``base_keys``) does not have and no ``+`` override of
    ``overrides`` adds: the file, the key, the closest key the config has."""
    from rpg.paths.checkout import CHECKOUT

    added = [p.key for p in map(parse_one, overrides) if p.kind in ("ADD", "FORCE_ADD") and p.key != GROUP]

    def under(key: str, roots: Iterable[str]) -> bool:
        return any(key == r or key.startswith(r + ".") for r in roots)

    new = []
    for key in key_paths(cfg):
        parent = key.rpartition(".")[0]
        if key in keys or (parent and parent not in keys):  # known, or under a new key (named instead)
            continue
        if parent in open_paths or under(key, OPEN_MAPPINGS) or under(key, added) or any(a.startswith(key + ".")
                                                                                        for a in added):
            continue
        new.append(key)
    if not new:
        return []
    shown = exp.path.relative_to(CHECKOUT) if exp.path.is_relative_to(CHECKOUT) else exp.path
    if new == [GROUP]:  # no "# @package _global_" line: Hydra put the whole file under experiment.
        return [f"{shown}: its keys land under {GROUP}. (a key no config reads): its first line must be "
                "# @package _global_, as in the shipped files"]
    lines = []
    for key in new:
        close = closest_key(key, keys)
        mine = any(s == key or s.startswith(key + ".") for s in exp.settings)
        lines.append(f"{shown}{'' if mine else ' (through its defaults list)'} sets {key}, which is not a key of the "
                     f"config" + (f" (did you mean {close}?)" if close else ""))
    return lines + ["a key the config does not have is added on the command line, +key=value"]


def _check_experiment(cfg, overrides: Sequence[str], exp, config_dir: str, config_name: str) -> None:
    """``ConfigKeyError`` for a key the run's experiment file ``exp`` adds (Hydra initialised on ``config_dir``)."""
    searchpath = tuple(o for o in overrides if o.startswith("hydra.searchpath="))
    keys, open_paths = base_keys(config_dir, config_name, searchpath)
    if problems := experiment_key_problems(cfg, overrides, keys, open_paths, exp):
        raise ConfigKeyError("; ".join(problems))


def check_composed(cfg, overrides: Sequence[str], config_dir: Path | str, config_name: str = CONFIG_NAME) -> None:
    """``compose_config``'s checks of a config composed elsewhere from ``overrides`` (the launcher composes a
    paper run's): the keys its experiment file adds, then ``trainer.logger`` (``checked_config``); one line each."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from rpg.launch.experiments import find

    runs = [o[len(f"+{GROUP}="):] for o in overrides if o.startswith(f"+{GROUP}=")]
    if runs:
        if GlobalHydra.instance().is_initialized():
            GlobalHydra.instance().clear()
        config_dir = str(Path(config_dir).resolve())
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            _check_experiment(cfg, overrides, find(runs[-1], overrides), config_dir, config_name)
    _check_logger(cfg)


def compose_config(overrides: Sequence[str], config_dir: Path | str, config_name: str = CONFIG_NAME):
    """The config ``hydra.main`` would compose from ``config_dir/config_name.yaml`` and ``overrides``;
    ``ConfigKeyError`` (one line naming every unknown key, the closest valid one and the ``+`` hint) when
    Hydra refuses an override's key, ``RPGConfigError`` (Hydra's message on one line) for any other
    composition error; with ``+experiment=<run>``, ``ConfigKeyError`` for a key the run's file adds
    (``experiment_key_problems``)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException

    from rpg.launch.experiments import find

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    runs = [o[len(f"+{GROUP}="):] for o in overrides if o.startswith(f"+{GROUP}=")]
    exp = find(runs[-1], overrides) if runs else None  # read first: what its YAML expands to is bounded
    rest, bad = list(overrides), []
    config_dir = str(Path(config_dir).resolve())
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        while True:
            try:
                cfg = compose(config_name=config_name, overrides=rest)
            except ConfigCompositionException as e:
                found = _bad_override(str(e), rest)
                if found is None:
                    raise RPGConfigError(_one_line(str(e))) from None
                i, kind = found
                bad.append((kind, rest.pop(i)))
                continue
            break
        if exp is not None and not bad:
            _check_experiment(cfg, overrides, exp, config_dir, config_name)
    if bad:
        paths = key_paths(cfg)
        raise ConfigKeyError("; ".join(_describe(kind, text, paths) for kind, text in bad))
    return cfg


def checked_config(overrides: Sequence[str], config_dir: Path | str, config_name: str = CONFIG_NAME):
    """``compose_config``, then ``trainer.logger`` against verl's list (``logger_problem``): what the launchers
    check before anything starts (the rest of the driver's checks run in the driver, before Ray)."""
    cfg = compose_config(overrides, config_dir, config_name)
    _check_logger(cfg)
    return cfg


def _check_logger(cfg) -> None:
    from omegaconf import OmegaConf

    loggers = OmegaConf.select(cfg, "trainer.logger")
    if (why := logger_problem(OmegaConf.to_container(loggers) if OmegaConf.is_config(loggers) else loggers)) is not None:
        raise RPGConfigError(why)
