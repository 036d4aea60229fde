"""The settings of one RPG loss, declared once and torch-free: ``RPGLossConfig`` and its ``RULES``.

Each field of ``RPGLossConfig`` is declared once with its type, default and one line saying what it
does (field metadata ``doc``); ``RULES`` says what each field allows, checked in order on construction.
The recipe's ``rpg.loss`` keys, their checks, the YAML block and the docs table derive from it
(``rpg.config.block``, ``rpg.config.render_block``; how the values reach the loss:
docs/architecture.md#the-road-of-a-loss-setting).

The loss itself (``rpg.math.fused``) needs torch; this declaration does not, so that the launchers, the
run-name grammar (scripts/experiments.py) and the config checks read the same names and rules
without importing torch. ``rpg.math.fused`` re-exports every name here (``from rpg.math.fused import
RPGLossConfig`` is the library's documented spelling).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

# KL regularizers of the RPG losses: rpg.math.formulas states each one (normalized fkl/rkl,
# unnormalized k3-style ufkl/urkl), scripts/experiments.py spells them in the paper scripts' names
DIVERGENCES = ("fkl", "rkl", "ufkl", "urkl")
FORMS = ("reinforce", "differentiable")
BRANCH_RULES = ("regularized", "raw")
FD_CLIP_MODES = ("reward", "algorithm1")
AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
# behaviour weight pi_old/mu of a stale sampler, per token or per response, or none (rpg.math.behavior applies it)
BEHAVIOR_LEVELS = ("token", "sequence", "none")
# RPGLossConfig fields that verl's actor config already holds: the loss reads them from
# actor_rollout_ref.actor.<field>. Every other field is the recipe key rpg.loss.<field>.
ACTOR_FIELDS = ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_agg_mode")


def _is_real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _setting(default, doc: str, *, recorded: bool = True):
    """A field of ``RPGLossConfig``: its default and one line saying what it does (docs table).
    ``recorded``: a checkpoint records it and a resume that changes it is refused (``rpg.config.recorded_keys``);
    false only for a field that leaves the loss's value and gradient unchanged."""
    return dataclasses.field(default=default, metadata={"doc": doc, "recorded": recorded})


@dataclasses.dataclass(frozen=True)
class RPGLossConfig:
    """Settings of one RPG loss: the one declaration of each (type, default, meaning). Validated on
    construction against ``RULES`` (``RPGLossConfigError`` names the field and what is allowed)."""

    divergence: str = _setting("ufkl", "KL regularizer: fkl, rkl (normalized), ufkl, urkl (unnormalized, k3-style)")
    form: str = _setting("reinforce", "reinforce: RPG-REINFORCE (stop-gradient weight, Algorithm 2); "
                                      "differentiable: the fully differentiable surrogate (RPG-X)")
    beta: float = _setting(1e-4, "KL coefficient beta")
    clip: bool = _setting(True, "reinforce: RPG-Style Clip (Eq. 4.1); differentiable: dual-clip on the reward part")
    clip_ratio_low: float = _setting(0.2, "epsilon_1: lower ratio clip 1 - eps1")
    clip_ratio_high: float = _setting(0.28, "epsilon_2: upper ratio clip 1 + eps2")
    clip_ratio_c: float = _setting(10.0, "dual-clip threshold c (negative advantages, w >= c: no gradient)")
    loss_agg_mode: str = _setting("token-mean", "aggregation over tokens (verl's semantics)")
    branch_on: str = _setting("regularized", "reinforce + clip: branch on A' = A + C/w (regularized, the paper) "
                                              "or on A (raw, the authors' code)")
    fd_clip: str = _setting("reward", "differentiable + clip: reward (dual-clip on A, KL unclipped; the authors' "
                                      "loss) or algorithm1 (the paper's Algorithm 1, rkl/urkl only)")
    kl_clamp: float | None = _setting(None, "differentiable only: value-only guard abs(KL surrogate) <= kl_clamp "
                                            "(gradient unchanged); null = off")
    log_ratio_guard: float = _setting(60.0, "value-only guard on log-ratios, abs(log w) <= guard (60: w in [1e-26, 1e26])")
    compile: bool = _setting(False, "run the loss and its metrics as one torch.compile graph", recorded=False)
    behavior_weight_level: str = _setting("token", "stale sampler (asynchronous trainer): the weight pi_old/mu of each "
                                                   "token (token), or of its whole response (sequence); none = no weight "
                                                   "(uncorrected: biased, for comparison studies only)")
    behavior_weight_cap: float | None = _setting(None, "stale sampler: null = the exact, untruncated pi_old/mu; a "
                                                       "number c = min(pi_old/mu, c) (truncated: biased)")

    def __post_init__(self) -> None:
        for rule in RULES:
            if not rule.ok(self):
                raise RPGLossConfigError(rule.field, getattr(self, rule.field), rule.expected)


class RPGLossConfigError(ValueError):
    """A setting of ``RPGLossConfig`` broke a rule: ``field``, its ``value`` and what is ``expected``."""

    def __init__(self, field: str, value, expected: str):
        self.field, self.value, self.expected = field, value, expected
        super().__init__(f"RPGLossConfig.{field}={value!r} is invalid: expected {expected}")


@dataclasses.dataclass(frozen=True)
class Rule:
    """One validation rule of ``RPGLossConfig``, checked in order (a rule may assume the earlier ones hold).

    ``ok(config)`` must be true, else ``field`` is named with ``expected``. ``violation``: settings
    that break this rule and none before it (the tests feed each one to the recipe's driver, so no
    rule can first fire on a worker).
    """

    field: str
    expected: str
    ok: Callable[["RPGLossConfig"], bool]
    violation: dict


def _one_of(field: str, allowed: tuple, bad) -> Rule:
    return Rule(field, f"one of {', '.join(allowed)}", lambda c: getattr(c, field) in allowed, {field: bad})


def _flag(field: str) -> Rule:
    return Rule(field, "True or False", lambda c: isinstance(getattr(c, field), bool), {field: "yes"})


RULES: tuple[Rule, ...] = (
    _one_of("divergence", DIVERGENCES, "kl"),
    _one_of("form", FORMS, "ppo"),
    Rule("beta", "a finite number >= 0", lambda c: _is_real(c.beta) and c.beta >= 0, {"beta": -1.0}),
    _flag("clip"),
    Rule("clip_ratio_low", "a number in (0, 1)", lambda c: _is_real(c.clip_ratio_low) and 0 < c.clip_ratio_low < 1,
         {"clip_ratio_low": 1.5}),
    Rule("clip_ratio_high", "a number > 0", lambda c: _is_real(c.clip_ratio_high) and c.clip_ratio_high > 0,
         {"clip_ratio_high": -0.1}),
    Rule("clip_ratio_c", "a number > 1 (dual-clip threshold c)", lambda c: _is_real(c.clip_ratio_c) and c.clip_ratio_c > 1,
         {"clip_ratio_c": 1.0}),
    _one_of("loss_agg_mode", AGG_MODES, "mean"),
    _one_of("branch_on", BRANCH_RULES, "ratio"),
    _one_of("fd_clip", FD_CLIP_MODES, "kl"),
    Rule("divergence", "'rkl' or 'urkl' with fd_clip='algorithm1' (Algorithm 1 defines A-hat only for reverse KL)",
         lambda c: not (c.form == "differentiable" and c.fd_clip == "algorithm1") or c.divergence in ("rkl", "urkl"),
         {"form": "differentiable", "fd_clip": "algorithm1", "divergence": "ufkl"}),
    Rule("kl_clamp", "None or a number > 0", lambda c: c.kl_clamp is None or (_is_real(c.kl_clamp) and c.kl_clamp > 0),
         {"kl_clamp": 0.0}),
    Rule("kl_clamp", "None with form='reinforce' (the KL enters through the weight; a clamp would change the gradient)",
         lambda c: c.kl_clamp is None or c.form == "differentiable", {"form": "reinforce", "kl_clamp": 1.0}),
    Rule("log_ratio_guard", "a number > 0", lambda c: _is_real(c.log_ratio_guard) and c.log_ratio_guard > 0,
         {"log_ratio_guard": 0.0}),
    _flag("compile"),
    _one_of("behavior_weight_level", BEHAVIOR_LEVELS, "seq"),
    Rule("behavior_weight_cap", "None (exact) or a number > 0 (truncation, biased)",
         lambda c: c.behavior_weight_cap is None or (_is_real(c.behavior_weight_cap) and c.behavior_weight_cap > 0),
         {"behavior_weight_cap": 0.0}),
    Rule("behavior_weight_cap", "None with behavior_weight_level='none' (no weight to truncate)",
         lambda c: c.behavior_weight_cap is None or c.behavior_weight_level != "none",
         {"behavior_weight_level": "none", "behavior_weight_cap": 1.0}),
)


def loss_defaults() -> dict:
    """Field name -> default of ``RPGLossConfig`` (what the recipe's ``rpg.loss`` block states)."""
    return {f.name: f.default for f in dataclasses.fields(RPGLossConfig)}


def build_loss_config(name: str | None, values: dict) -> RPGLossConfig:
    """The ``RPGLossConfig`` the loss ``name`` runs with, from its field values: every construction of the loss's
    settings is this one (the ``rpg:`` block's parse, the driver's check before Ray and a worker's build, both
    through ``loss_config``), so all refuse the same inputs (``RPGLossConfigError`` names the field).
    grpo_corrected's KL term w * k3 is fully differentiable (Sec. 2.2), so it is validated as
    ``form=differentiable`` (a valid form given is not used by it; an invalid one is still refused): a value-only
    ``kl_clamp`` is allowed there, as for RPG-X."""
    if name == "grpo_corrected" and values.get("form", "reinforce") in FORMS:
        values = {**values, "form": "differentiable"}
    return RPGLossConfig(**values)


def _actor_value(actor, name: str):
    """verl's actor value of an ``ACTOR_FIELDS`` entry (None: unset, the library default applies).
    verl's rule: clip_ratio_low / clip_ratio_high fall back to clip_ratio."""
    value = actor.get(name, None)
    if value is None and name in ("clip_ratio_low", "clip_ratio_high"):
        value = actor.get("clip_ratio", None)
    return value


def loss_config(actor) -> RPGLossConfig:
    """The exact ``RPGLossConfig`` a run's loss receives, from verl's actor config (``actor_rollout_ref.actor``: the
    composed DictConfig in the driver's check before Ray, verl's ``ActorConfig`` on a worker): the loss
    ``policy_loss.loss_mode`` with ``policy_loss.rpg_loss`` (the ``rpg.loss`` block itself, by reference:
    recipe/rpg/config/rpg_trainer.yaml; its ``name`` is ``loss_mode``'s) and verl's own ``ACTOR_FIELDS``."""
    pl = actor.get("policy_loss", None)
    values = None if pl is None else pl.get("rpg_loss", None)
    if values is None:
        mode = None if pl is None else pl.get("loss_mode", None)
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.rpg_loss is missing: loss_mode {mode!r} needs the RPG "
                         "policy-loss config, RPGPolicyLossConfig with rpg_loss: ${rpg.loss} (recipe/rpg/config/"
                         "rpg_trainer.yaml sets both)")
    values = {k: values[k] for k in values if k != "name"}
    for name in ACTOR_FIELDS:
        if (value := _actor_value(actor, name)) is not None:
            values[name] = value
    return build_loss_config(pl.get("loss_mode", None), values)
