"""One check of a run's overrides against the composed config, before anything starts.

``compose_config`` composes the trainer's config with Hydra's compose API (what ``hydra.main`` will do in
the driver, without the driver): an override of a key the config does not have (``rpg.loss.divergance``,
``actor_rollout_ref.actor.optim.lrr``, ``OUT``) is Hydra's "Could not override 'x'" / "Key 'y' is not in
struct" (a 72-line traceback through Hydra's internals under ``HYDRA_FULL_ERROR=1``, or Hydra's 4 lines,
exit 1, after Ray started). Here it is ONE line (``ConfigKeyError``, an ``RPGConfigError``: the launchers
print it as the driver prints a bad value, exit 2) naming every such key, the closest key the config has
(``difflib`` over the composed config's dotted key paths) and the ``+key=value`` form that adds a new key.

Cost: one composition of ``recipe/rpg/config/rpg_trainer.yaml`` per launch (the launchers compose once
and reuse it; measured in docs/launch-scripts.md), a few more only when a key is unknown (to find every
unknown key and the valid ones).

``checked_config`` adds ``trainer.logger`` against verl's own list of tracking backends
(``rpg.verl.verl_rules.logger_problem``: verl asserts on it in the trainer, after Ray, the workers and the
model have started; the driver applies the same rule).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from rpg.config import RPGConfigError
from rpg.launch.args import is_env_var_key
from rpg.launch.experiments import CONFIG_NAME
from rpg.common.override_lists import parse_one
from rpg.verl.verl_rules import logger_problem

_NOT_OVERRIDABLE = re.compile(r"Could not override '([^']+)'")
_APPEND_EXISTS = re.compile(r"Could not append to config\. An item is already at '([^']+)'")
_DELETE_MISSING = re.compile(r"Could not delete from config\. (?:The value of )?'([^']+)'")


class ConfigKeyError(RPGConfigError):
    """An override of a key the config does not have (or ``+`` on a key it has): one line."""


def key_paths(cfg) -> list[str]:
    """Every dotted key path of a composed config (mappings only; list items are values)."""
    from omegaconf import DictConfig

    out: list[str] = []

    def walk(node, prefix: str) -> None:
        for key in node.keys():
            path = f"{prefix}{key}"
            out.append(path)
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
                walk(child, path + ".")

    walk(cfg, "")
    return out


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


def _describe(kind: str, text: str, paths: list[str]) -> str:
    p = parse_one(text)
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


def compose_config(overrides: Sequence[str], config_dir: Path | str, config_name: str = CONFIG_NAME):
    """The config ``hydra.main`` would compose from ``config_dir/config_name.yaml`` and ``overrides``;
    ``ConfigKeyError`` (one line naming every unknown key, the closest valid one and the ``+`` hint) when
    Hydra refuses an override's key, ``RPGConfigError`` (Hydra's message on one line) for any other
    composition error."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    rest, bad = list(overrides), []
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=None):
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
    if bad:
        paths = key_paths(cfg)
        raise ConfigKeyError("; ".join(_describe(kind, text, paths) for kind, text in bad))
    return cfg


def checked_config(overrides: Sequence[str], config_dir: Path | str, config_name: str = CONFIG_NAME):
    """``compose_config``, then ``trainer.logger`` against verl's list (``logger_problem``): what the launchers
    check before anything starts (the rest of the driver's checks run in the driver, before Ray)."""
    from omegaconf import OmegaConf

    cfg = compose_config(overrides, config_dir, config_name)
    loggers = OmegaConf.select(cfg, "trainer.logger")
    if (why := logger_problem(OmegaConf.to_container(loggers) if OmegaConf.is_config(loggers) else loggers)) is not None:
        raise RPGConfigError(why)
    return cfg
