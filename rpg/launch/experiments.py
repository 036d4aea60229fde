"""A run's experiment file, ``recipe/rpg/config/experiment/<run>.yaml``: the run's settings on the paper setup.

The file is the run: ``+experiment=<run>`` composes it (a new run is a new file, in the recipe's folder or in a
folder on ``hydra.searchpath``). Read here as the launch reads it: where Hydra finds it, what its first comment
lines say of the run, whether it is a paper run's file or the user's, and what a user's overrides change of the
settings it states (the run is then named for them).
"""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rpg.paths.checkout import CHECKOUT, RECIPE_CONFIG_DIR, RECIPE_DIR

GROUP = "experiment"
EXPERIMENT_DIR = RECIPE_CONFIG_DIR / GROUP  # relative to the checkout
CONFIG_NAME = "rpg_trainer"  # recipe/rpg/config/rpg_trainer.yaml, the config main_rpg.py composes
MAX_NODES = 10_000  # what a file may expand to, YAML aliases followed (a shipped file: about 100; an alias bomb: 10^6)
NEAR_EDITS = 2  # a name within this many single-character edits of a shipped one is named as its likely typo
# Settings of a file that say where the run reads and writes, not what it runs: an override of one keeps the name
FILE_ONLY = frozenset({"actor_rollout_ref.model.path", "data.train_files", "data.val_files", "trainer.project_name",
                       "trainer.experiment_name"})
# Settings that pack micro-batches or size vLLM's share of a GPU: memory and speed, never the math
MEMORY_KEYS = frozenset({"actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                         "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
                         "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                         "actor_rollout_ref.rollout.max_num_batched_tokens",
                         "actor_rollout_ref.rollout.gpu_memory_utilization"})


class ExperimentError(ValueError):
    """No experiment file for a run name (one line: the closest shipped names), or one that cannot be read."""


@dataclass(frozen=True)
class Experiment:
    """A run: its name, the file Hydra composes for it, the settings the file states (dotted keys, the paper
    setup's not included) and the overrides that compose it (``+experiment=<name>``)."""

    name: str
    path: Path | None
    settings: dict[str, Any] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()
    description: tuple[str, ...] = ()  # the file's first comment lines: "<name>: <paper row> [<tables>]", ...

    @property
    def row(self) -> str:
        """What the first description line says of the run after its name (its paper row), or ""."""
        first = self.description[0] if self.description else ""
        return first.removeprefix(f"{self.name}: ") if first.startswith(f"{self.name}: ") else ""


def shipped_names() -> list[str]:
    """The runs of the recipe's experiment folder."""
    return sorted(p.stem for p in (CHECKOUT / EXPERIMENT_DIR).glob("*.yaml"))


def edits(a: str, b: str) -> int:
    """Single-character edits from ``a`` to ``b``: insert, delete, substitute, or swap two adjacent characters."""
    before, prev = None, list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], before[j - 2] + 1)
        before, prev = prev, row
    return prev[-1]


def closest_shipped(name: str) -> list[str]:
    """The shipped names at the fewest ``edits`` when that is at most ``NEAR_EDITS``, else difflib's best three."""
    shipped = [s for s in shipped_names() if s != name]
    near = sorted((edits(name, s), s) for s in shipped)
    if near and near[0][0] <= NEAR_EDITS:
        return [s for d, s in near if d == near[0][0]]
    return difflib.get_close_matches(name, shipped, n=3, cutoff=0.75)


def search_folders(user: Sequence[str] = ()) -> list[Path]:
    """Where Hydra looks for ``experiment/<name>.yaml``, in its order: the recipe's config folder, then each
    ``file://`` folder of ``hydra.searchpath`` (the user's override, else rpg_trainer.yaml's)."""
    from omegaconf import OmegaConf

    from rpg.override_lists import parse_overrides

    given = [p.value for p in parse_overrides(user) if p.key == "hydra.searchpath"][-1:]
    searchpath = given[0] if given else OmegaConf.select(_trainer_yaml(), "hydra.searchpath", default=[])
    extra = [Path(str(s).removeprefix("file://")) for s in searchpath or [] if str(s).startswith("file://")]
    return [CHECKOUT / RECIPE_CONFIG_DIR, *extra]


def find(name: str, user: Sequence[str] = ()) -> Experiment:
    """The run ``name``'s experiment file on Hydra's search path (``ExperimentError`` naming the closest shipped
    names when there is none)."""
    for folder in search_folders(user):
        path = folder / GROUP / f"{name}.yaml"
        if path.is_file():
            return load(path, name)
    close = closest_shipped(name)
    hint = f"; closest shipped: {', '.join(close)}" if close else ""
    raise ExperimentError(f"no run {name}: no {GROUP}/{name}.yaml in {RECIPE_CONFIG_DIR} or a folder of "
                          f"hydra.searchpath{hint}; a new run is a new file there (a copy of a shipped one, edited)")


def load(path: Path, name: str | None = None) -> Experiment:
    """The experiment file at ``path`` (its name: the file's stem)."""
    from omegaconf import OmegaConf

    import yaml

    text = path.read_text()
    try:
        if (size := expanded_size(text)) > MAX_NODES:
            raise ExperimentError(f"{path}: its YAML expands to {'an endless' if size == math.inf else f'{size:,}'} "
                                  f"values through its aliases (&name / *name), over {MAX_NODES:,}: an experiment file "
                                  "sets keys, write them out")
        loaded = OmegaConf.to_container(OmegaConf.load(path))
    except yaml.YAMLError as e:
        raise ExperimentError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    loaded.pop("defaults", None)
    name = name or path.stem
    return Experiment(name, path, dict(_leaves(loaded)), (f"+{GROUP}={name}",), _description(text))


def expanded_size(text: str) -> float:
    """How many YAML values (scalars, mappings, lists; keys counted) ``text`` holds once every alias is expanded, as
    OmegaConf builds them, counted on PyYAML's node graph without expanding it (an alias is the anchor's node: each
    node is counted once, times its uses); ``math.inf`` for an alias inside its own anchor."""
    import yaml

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    sizes: dict[int, float] = {}
    open_nodes: set[int] = set()

    def size(node) -> float:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:  # an alias of an anchor it is inside of
            return math.inf
        open_nodes.add(id(node))
        children = node.value if isinstance(node, yaml.SequenceNode) else \
            [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else []
        sizes[id(node)] = total = 1 + sum(size(child) for child in children)
        open_nodes.discard(id(node))
        return total

    return 0 if root is None else size(root)


def _leaves(node: dict, prefix: str = ""):
    for k, v in node.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _description(text: str) -> tuple[str, ...]:
    """The comment lines after ``# @package ...`` up to the first bare ``#`` or the first setting."""
    out = []
    for line in text.splitlines():
        if line.startswith("# @package"):
            continue
        if not line.startswith("# "):
            break
        out.append(line[2:].strip())
    return tuple(out)


def file_note(exp: Experiment) -> str | None:
    """One line when the run composes a file other than a paper script's in the recipe's folder: a file of the
    user's (a paper script's file is its run as it stands; ``python scripts/experiments.py --check`` compares it
    with the script's name)."""
    if exp.path is None:
        return None
    shown = exp.path.relative_to(CHECKOUT) if exp.path.is_relative_to(CHECKOUT) else exp.path
    if exp.path.parent != CHECKOUT / EXPERIMENT_DIR or not list((CHECKOUT / RECIPE_DIR).glob(f"*/{exp.name}.sh")):
        return f"the run composes your experiment file {shown} (+{GROUP}={exp.name})"
    return None


def name_changes(exp: Experiment, overrides: Sequence[str]) -> list[tuple[str, str]]:
    """(key, value as written) of each setting the file states (not ``FILE_ONLY`` or ``MEMORY_KEYS``) that
    ``overrides`` (Hydra's parser; a later one wins) give another value; a mapping on a parent key
    (``rpg.loss={clip:false}``, merged by Hydra) counts for each key in it."""
    from rpg.override_lists import parse_overrides
    from rpg.config.allowed_values import yaml_value

    named = {k: v for k, v in exp.settings.items() if k not in FILE_ONLY | MEMORY_KEYS}
    changed: dict[str, str] = {}
    for p in parse_overrides(list(overrides)):
        if p.kind == "DEL":
            continue
        leaves = [(p.key, p.value, p.value_text)]
        if isinstance(p.value, dict):
            leaves = [(f"{p.key}.{k}", x, None) for k, x in _leaves(p.value)]
        for key, value, text in leaves:
            if key in named:
                changed.pop(key, None)  # its place: where it was last set
                if isinstance(value, bool) != isinstance(named[key], bool) or value != named[key]:
                    changed[key] = text if text is not None else str(value) if isinstance(value, list) \
                        else yaml_value(value)
    return list(changed.items())


def changed_name(exp: Experiment, changes: list[tuple[str, str]]) -> str:
    """The run name followed by the settings ``changes`` give it, each key by its shortest dotted tail no other
    setting of the file ends with: ``run_rpg_7b_ufkl1e-4+divergence=urkl,clip=false``."""
    if not changes:
        return exp.name

    def short(key: str) -> str:
        parts = key.split(".")
        for n in range(1, len(parts)):
            tail = ".".join(parts[-n:])
            if sum(k == tail or k.endswith("." + tail) for k in exp.settings) == 1:
                return tail
        return key

    return f"{exp.name}+" + ",".join(f"{short(k)}={text}" for k, text in changes)


@functools.lru_cache(maxsize=1)
def _trainer_yaml():
    from omegaconf import OmegaConf

    return OmegaConf.load(CHECKOUT / RECIPE_CONFIG_DIR / f"{CONFIG_NAME}.yaml")


@functools.lru_cache(maxsize=1)
def recipe_yaml():
    """rpg_trainer.yaml's own keys merged with the paper setup (verl's defaults not read); read once."""
    from omegaconf import OmegaConf

    base = _trainer_yaml().copy()
    base.pop("defaults", None)
    base.pop("hydra", None)
    return OmegaConf.merge(base, OmegaConf.load(CHECKOUT / RECIPE_CONFIG_DIR / "paper" / "default.yaml"))


def recipe_value(key: str) -> Any:
    """``key``'s value in ``recipe_yaml`` (plain Python), None when it sets none."""
    from omegaconf import OmegaConf

    value = OmegaConf.select(recipe_yaml(), key, default=None)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
