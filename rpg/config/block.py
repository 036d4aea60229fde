"""The recipe's ``rpg:`` block, declared once: ``RPGSettings`` (and ``ReferenceSettings``, ``RPGLossConfig``).

Each key is a dataclass field declared once with its default, what it allows (a kind,
``rpg.config.allowed_values``) and one line saying what it does; ``RULES`` hold what relates keys to each
other (e.g. ``periodic`` needs ``update_every >= 1``), checked in order. The ``rpg.loss`` keys are
``name`` and every field of ``RPGLossConfig`` but ``ACTOR_FIELDS`` (derived on each call: a field
added to the dataclass is a recipe key at once), checked by its own ``RULES``. From this one
declaration derive:

* the defaults: ``RPGSettings()``, which is what an empty block parses to;
* the validation: ``parse_rpg_settings`` (unknown keys anywhere under ``rpg.`` refused, naming the keys
  allowed there; each value checked by its kind, strictly; then the rules), and the same checks when
  settings are built in code; every refusal is one ``RPGConfigError`` line naming the full key;
* the recipe YAML's ``rpg:`` block and the docs table (``rpg.config.render_block``).

How each setting reaches verl and the loss: docs/architecture.md#the-road-of-a-loss-setting.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rpg.config.access import RPGConfigError
from rpg.config.allowed_values import Choice, Flag, Integer, Kind, ModuleFunction, Number, PrefixCounts
from rpg.config.loss import ACTOR_FIELDS, RPGLossConfig, RPGLossConfigError, build_loss_config

RPG_LOSSES = ("rpg", "grpo_corrected")  # rpg.loss.name values that run an RPG actor loss (registered loss modes)
LOSS_NAMES = (*RPG_LOSSES, "verl")  # "verl": verl's own actor loss
REFERENCE_MODES = ("sampler", "fixed", "periodic", "kl_threshold")
RESETTING_MODES = ("periodic", "kl_threshold")  # modes that overwrite the reference with actor weights
OPTIMIZERS = ("adamw", "schedulefree")
# the recipe's reward function (rpg.reward.scored_sources reads it)
RPG_MODULE, RPG_FUNCTION = "rpg.reward", "compute_score"
RECIPE_REWARD = f"{RPG_MODULE}:{RPG_FUNCTION}"  # rpg.reward_function's value for rpg.reward's compute_score
# the paper's Table 7 protocol: one sample per MinervaMath / OlympiadBench problem (rpg.verl.validation)
PAPER_SAMPLES_PER_PROBLEM = (("minerva", 1), ("olympiad", 1))
KL_EMA_DECAY = 0.9  # rpg.reference.kl_ema_decay's default (the only value allowed unless mode=kl_threshold)
ROOT = "rpg"
REF = f"{ROOT}.reference"


def setting(default, kind: Kind, doc: str, *, recorded: bool, key: str | None = None):
    """A key of the block: its default, what it allows and one line saying what it does. ``recorded``
    (each key decides): a checkpoint records its value and a resume that changes it is refused
    (``recorded_keys``), true for what changes the estimator. ``key``: its path under the owner's prefix
    when it is not the field's name (``loss.name``)."""
    return dataclasses.field(default=default, metadata={"kind": kind, "doc": doc, "key": key, "recorded": recorded})


@dataclass(frozen=True)
class BlockRule:
    """A rule between keys of the block, checked in order after every key's own kind (a rule may assume the
    earlier ones hold). ``ok(settings)`` must be true, else ``message(settings)`` is the one-line error;
    ``key``: the key it is about, ``expected``: what it allows (docs table); ``violation``: an ``rpg:`` block
    that breaks this rule and none before it (a test parses each one)."""

    key: str
    expected: str
    ok: Callable[[Any], bool]
    message: Callable[[Any], str]
    violation: dict


class _Checked:
    """Construction checks every declared key by its kind (the stored value is the kind's: an int given
    for a number is stored as a float), then ``RULES``."""

    PREFIX: ClassVar[str]
    RULES: ClassVar[tuple[BlockRule, ...]] = ()

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            kind = f.metadata.get("kind")
            if kind is not None:
                key = f"{self.PREFIX}.{f.metadata['key'] or f.name}"
                object.__setattr__(self, f.name, kind.check(key, getattr(self, f.name)))
        for rule in self.RULES:
            if not rule.ok(self):
                raise RPGConfigError(rule.message(self))


@dataclass(frozen=True)
class ReferenceSettings(_Checked):
    """``rpg.reference``: the KL anchor of the RPG losses (or of verl's KL with ``rpg.loss.name=verl``)."""

    PREFIX: ClassVar[str] = REF
    mode: str = setting("sampler", Choice(REFERENCE_MODES),
                        "sampler (the anchor is pi_old of each step; no reference model is built), fixed (the initial "
                        "model), periodic (the actor copied into the reference every update_every steps), "
                        "kl_threshold (copied when the EMA of the token KL(pi_old||pi_ref) exceeds kl_threshold)",
                        recorded=True)
    update_every: int = setting(0, Integer(0), "periodic: K >= 1 training steps between copies; 0 otherwise",
                                recorded=True)
    kl_threshold: float | None = setting(None, Number(low=0.0, low_open=True, nullable=True),
                                         "kl_threshold: the threshold kappa > 0 of a copy; null otherwise",
                                         recorded=True)
    kl_ema_decay: float = setting(KL_EMA_DECAY, Number(low=0.0, high=1.0, high_open=True),
                                  "kl_threshold: ema = d*ema + (1-d)*kl each step", recorded=True)
    log_weight_diff: bool = setting(False, Flag(), "[added] periodic/kl_threshold: log actor-reference differences (shards, "
                                                   "probe logits) before and after each copy", recorded=False)

    RULES: ClassVar[tuple[BlockRule, ...]] = (
        BlockRule(f"{REF}.update_every", ">= 1 with mode=periodic", lambda r: r.mode != "periodic" or r.update_every >= 1,
                  lambda r: f"{REF}.update_every must be >= 1 when {REF}.mode=periodic (got {r.update_every})",
                  {"reference": {"mode": "periodic"}}),
        BlockRule(f"{REF}.update_every", "0 unless mode=periodic", lambda r: r.mode == "periodic" or r.update_every == 0,
                  lambda r: f"{REF}.update_every={r.update_every} is only used with {REF}.mode=periodic (mode is "
                            f"{r.mode}); set it to 0", {"reference": {"update_every": 4}}),
        BlockRule(f"{REF}.kl_threshold", "a number with mode=kl_threshold",
                  lambda r: r.mode != "kl_threshold" or r.kl_threshold is not None,
                  lambda r: f"{REF}.kl_threshold must be a number > 0 when {REF}.mode=kl_threshold",
                  {"reference": {"mode": "kl_threshold"}}),
        BlockRule(f"{REF}.kl_threshold", "null unless mode=kl_threshold",
                  lambda r: r.mode == "kl_threshold" or r.kl_threshold is None,
                  lambda r: f"{REF}.kl_threshold={r.kl_threshold} is only used with {REF}.mode=kl_threshold (mode is "
                            f"{r.mode}); set it to null", {"reference": {"kl_threshold": 0.1}}),
        BlockRule(f"{REF}.kl_ema_decay", f"{KL_EMA_DECAY} unless mode=kl_threshold",
                  lambda r: r.mode == "kl_threshold" or r.kl_ema_decay == KL_EMA_DECAY,
                  lambda r: f"{REF}.kl_ema_decay={r.kl_ema_decay} is only used with {REF}.mode=kl_threshold (mode is "
                            f"{r.mode}); leave it at {KL_EMA_DECAY}",
                  {"reference": {"kl_ema_decay": 0.5}}),
        BlockRule(f"{REF}.log_weight_diff", f"false unless mode={' or '.join(RESETTING_MODES)}",
                  lambda r: not r.log_weight_diff or r.resets,
                  lambda r: f"{REF}.log_weight_diff=true needs {REF}.mode={' or '.join(RESETTING_MODES)}",
                  {"reference": {"log_weight_diff": True}}),
    )

    @property
    def resets(self) -> bool:
        """True when the reference model is overwritten with actor weights during training."""
        return self.mode in RESETTING_MODES


_LOSS_DOC = ("the loss: name, and every field of rpg.config.RPGLossConfig (same default) except those verl's actor "
             f"config holds, which stay actor_rollout_ref.actor keys ({', '.join(ACTOR_FIELDS)})")


@dataclass(frozen=True)
class RPGSettings(_Checked):
    """The whole ``rpg:`` block, typed. Field order is the block's order; ``key``: a key's path under ``rpg.``
    when it is not the field's name."""

    PREFIX: ClassVar[str] = ROOT
    loss_name: str = setting("rpg", Choice(LOSS_NAMES),
                             "rpg (the RPG losses), grpo_corrected (GRPO with the corrected KL, Sec. 2.2) or verl "
                             "(verl's own actor loss: stock GRPO, DAPO, REINFORCE++)", recorded=True, key="loss.name")
    # rpg.loss values; after rpg.verl.block_to_verl.apply_to_verl_config, also verl's ACTOR_FIELDS values
    loss: RPGLossConfig = dataclasses.field(default=RPGLossConfig(), metadata={"loss": True, "key": "loss",
                                                                               "doc": _LOSS_DOC})
    reference: ReferenceSettings = dataclasses.field(default=ReferenceSettings(), metadata={
        "group": True, "key": "reference", "doc": "the KL anchor (rpg.verl.trainer keeps its schedule)"})
    optimizer: str = setting("adamw", Choice(OPTIMIZERS),
                             "adamw, or schedulefree (schedulefree.AdamWScheduleFree; needs a constant lr schedule)",
                             recorded=True)
    reward_function: str | None = setting(
        RECIPE_REWARD, ModuleFunction(),
        "[added] scores the run when reward.custom_reward_function.path is null (the driver resolves the module to its "
        "file); null = verl's default_compute_score. rpg.reward: the paper's rule (the Answer: line only; verl's "
        "boxed fallback: reward_kwargs.boxed_fallback=true)", recorded=False)
    samples_per_problem: tuple[tuple[str, int], ...] = setting(
        PAPER_SAMPLES_PER_PROBLEM, PrefixCounts(),
        "[added] samples per validation problem by data_source prefix (any case); other sets get "
        "actor_rollout_ref.rollout.val_kwargs.n (32: mean@32). The paper's Table 7: one sample per MinervaMath / "
        "OlympiadBench problem (acc/mean@1); null = val_kwargs.n for every set", recorded=False,
        key="validation.samples_per_problem")
    allow_changed_settings: bool = setting(
        False, Flag(), "a checkpoint records the run's RPG settings, model and lengths; a resume with other values is "
                       "refused before Ray (one line naming each key, old -> new) unless this is true", recorded=False,
        key="resume.allow_changed_settings")

    RULES: ClassVar[tuple[BlockRule, ...]] = (
        BlockRule(f"{ROOT}.loss.compile", "false unless rpg.loss.name=rpg",
                  lambda s: not s.loss.compile or s.loss_name == "rpg",
                  lambda s: f"{ROOT}.loss.compile=true applies to {ROOT}.loss.name=rpg only (got {s.loss_name}); set "
                            f"{ROOT}.loss.compile=false", {"loss": {"name": "grpo_corrected", "compile": True}}),
    )

    @property
    def uses_rpg_actor_loss(self) -> bool:
        return self.loss_name in RPG_LOSSES


BLOCK_RULES: tuple[BlockRule, ...] = (*ReferenceSettings.RULES, *RPGSettings.RULES)  # every rule between keys


# ----------------------------------------------------------------------------- the loss block


def loss_fields() -> tuple[str, ...]:
    """The ``rpg.loss`` keys besides ``name``: every ``RPGLossConfig`` field not in ``ACTOR_FIELDS``
    (derived on each call, so a field added to the dataclass is a recipe key at once)."""
    return tuple(f.name for f in dataclasses.fields(RPGLossConfig) if f.name not in ACTOR_FIELDS)


def loss_key(field: str) -> str:
    """The config key that sets ``RPGLossConfig.<field>`` in a recipe run."""
    return f"actor_rollout_ref.actor.{field}" if field in ACTOR_FIELDS else f"{ROOT}.loss.{field}"


def loss_error(e: RPGLossConfigError) -> RPGConfigError:
    """A broken ``RPGLossConfig`` rule as the one line naming the key a run sets it with."""
    return RPGConfigError(f"{loss_key(e.field)}={e.value!r} is invalid: expected {e.expected}")


# ----------------------------------------------------------------------------- the keys, derived


@dataclass(frozen=True)
class Key:
    """One key of the block as declared: ``path`` (full), where its value goes (``owner``: the ``RPGSettings``
    field holding it, None for ``RPGSettings`` itself; ``name``: the field), its default, kind (None: an
    ``RPGLossConfig`` field, checked by its ``RULES``), doc, and whether a checkpoint records it."""

    path: str
    owner: str | None
    name: str
    default: Any
    kind: Kind | None
    doc: str
    recorded: bool


def declared_keys(*, actor_fields: bool = False) -> tuple[Key, ...]:
    """Every key of the ``rpg:`` block in the block's order; ``actor_fields``: with the ``ACTOR_FIELDS`` keys
    (verl's, outside the block) where the loss declares them."""
    out: list[Key] = []
    for f in dataclasses.fields(RPGSettings):
        if f.metadata.get("loss"):
            # a loss field declared without rpg.config.loss._setting: no doc, and recorded (it may change the loss)
            out += [Key(loss_key(g.name), f.name, g.name, g.default, None, g.metadata.get("doc", ""),
                        g.metadata.get("recorded", True))
                    for g in dataclasses.fields(RPGLossConfig) if actor_fields or g.name not in ACTOR_FIELDS]
        elif f.metadata.get("group"):
            cls = type(f.default)
            out += [Key(f"{cls.PREFIX}.{g.name}", f.name, g.name, g.default, g.metadata["kind"], g.metadata["doc"],
                        g.metadata["recorded"]) for g in dataclasses.fields(cls)]
        else:
            out.append(Key(f"{ROOT}.{f.metadata['key'] or f.name}", None, f.name, f.default, f.metadata["kind"],
                           f.metadata["doc"], f.metadata["recorded"]))
    return tuple(out)


def recorded_keys() -> tuple[str, ...]:
    """The keys of the ``rpg:`` block (and the loss's verl actor keys) that a checkpoint records, in the
    block's order: those declared ``recorded`` (what changes the estimator; not logging, validation or
    resume settings, nor ``rpg.loss.compile``, the same loss compiled). ``rpg.verl.checkpoints`` adds
    verl's keys that change it."""
    return tuple(k.path for k in declared_keys(actor_fields=True) if k.recorded)


def group_docs() -> dict[str, str]:
    """Full path -> doc of the nested blocks that have one (``rpg.loss``, ``rpg.reference``)."""
    return {f"{ROOT}.{f.metadata['key']}": f.metadata["doc"] for f in dataclasses.fields(RPGSettings)
            if f.metadata.get("loss") or f.metadata.get("group")}


def key_tree() -> dict:
    """The block as nested mappings: name -> sub-mapping, or the ``Key`` at a leaf."""
    tree: dict = {}
    for k in declared_keys():
        *parents, leaf = k.path.split(".")[1:]
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = k
    return tree


# ----------------------------------------------------------------------------- parsing


def _to_plain(block: Any) -> Any:
    """A composed config's block as plain Python (interpolations resolved); a plain mapping as it is."""
    if type(block).__module__.startswith("omegaconf."):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(block, resolve=True)
    return block


def _read(path: str, value: Any, node: dict, out: dict) -> None:
    """The given values of ``node``'s leaves into ``out`` (Key -> value); a mapping's keys must be declared."""
    if value is None:  # an empty (null) block: every default
        return
    if not isinstance(value, Mapping):
        raise RPGConfigError(f"{path} must be a mapping with keys: {', '.join(node)}")
    unknown = sorted(set(value) - set(node), key=str)
    if unknown:
        raise RPGConfigError(f"{path}.{unknown[0]} is not a known key; allowed keys under {path}: {', '.join(node)}")
    for name, given in value.items():
        sub = node[name]
        if isinstance(sub, dict):
            _read(f"{path}.{name}", given, sub, out)
        else:
            out[sub] = given


def parse_rpg_settings(block: Any) -> RPGSettings:
    """Strictly parse the ``rpg:`` block (a mapping or DictConfig) into ``RPGSettings``: unknown keys refused,
    ``rpg.loss.name`` checked first (the loss fields are validated as that loss reads them), then the loss
    fields by ``RPGLossConfig``'s rules, then every other key by its kind and the rules between keys.
    Raises ``RPGConfigError`` (a ``ValueError``) with one line."""
    given: dict[Key, Any] = {}
    _read(ROOT, _to_plain(block), key_tree(), given)
    by_owner: dict[str | None, dict[str, Any]] = {}
    for k, v in given.items():
        by_owner.setdefault(k.owner, {})[k.name] = v
    top = by_owner.get(None, {})
    name_field = next(f for f in dataclasses.fields(RPGSettings) if f.name == "loss_name")
    top["loss_name"] = name_field.metadata["kind"].check(f"{ROOT}.{name_field.metadata['key']}",
                                                         top.get("loss_name", name_field.default))
    nested = {}
    for f in dataclasses.fields(RPGSettings):
        if f.metadata.get("loss"):
            try:
                nested[f.name] = build_loss_config(top["loss_name"], by_owner.get(f.name, {}))
            except RPGLossConfigError as e:
                raise loss_error(e) from None
        elif f.metadata.get("group"):
            nested[f.name] = type(f.default)(**by_owner.get(f.name, {}))
    return RPGSettings(**top, **nested)
