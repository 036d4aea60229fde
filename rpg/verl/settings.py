"""The recipe's ``rpg:`` config block: typed settings, strict validation, translation to verl keys.

Runs in the driver before Ray starts (``rpg.verl.main``), so a bad value fails fast with ONE
line naming the key and the allowed values. Unknown keys anywhere under ``rpg.`` are rejected.

Block (``rpg.loss`` keys are derived from ``rpg.losses.RPGLossConfig``: ``name`` plus every field
that verl's actor config does not already hold, ``loss_fields()``)::

    rpg:
      loss:      {name, <loss_fields()>: divergence, form, beta, clip, branch_on, fd_clip, kl_clamp,
                  log_ratio_guard, compile}
      reference: {mode, update_every, kl_threshold, kl_ema_decay, log_weight_diff}
      optimizer: adamw | schedulefree
      reward_function: "rpg.reward:compute_score" | null
      validation: {samples_per_problem: {data_source prefix: n}}
      resume:    {allow_changed_settings}

How each setting reaches verl (``apply_to_verl_config``):

* ``rpg.loss.*`` -> ``actor_rollout_ref.actor.policy_loss`` becomes an ``RPGPolicyLossConfig``
  (``_target_`` override, verl's own mechanism for typed loss settings) whose ``rpg_loss`` mapping
  carries the ``loss_fields()`` to the actor workers (workers only see ``actor_rollout_ref``); the
  clip ratios and the aggregation stay verl's own actor keys (``ACTOR_FIELDS``). ``loss_config``
  builds the exact ``RPGLossConfig`` from that actor config: the driver calls it before Ray and
  each worker calls it in the loss, so both reject the same inputs (one validator: the library's
  ``RULES``). ``loss_mode`` = ``rpg`` or ``grpo_corrected``: registered policy losses.
* ``rpg.reference.mode`` -> whether verl builds a reference model: ``sampler`` keeps
  ``actor.use_kl_loss=False`` and ``algorithm.use_kl_in_reward=False`` (no reference worker, no
  extra forward pass; the loss anchors on ``old_log_probs``); other modes set
  ``actor.use_kl_loss=True`` only so that verl builds the reference and fills ``ref_log_prob``
  (verl's own KL term is not used: the RPG actor loss replaces ``ppo_loss``).
* ``rpg.optimizer=schedulefree`` -> ``actor.optim.optimizer_impl=schedulefree``,
  ``actor.optim.optimizer=AdamWScheduleFree`` (verl's ``build_optimizer``); constant lr schedule.
* ``rpg.validation.samples_per_problem`` -> read by ``RPGTrainer`` (``rpg.verl.validation``): validation
  rows whose data source starts with a key get that many samples, the others ``val_kwargs.n``.
* ``rpg.resume.allow_changed_settings`` -> read by the driver's resume check (``rpg.verl.checkpoints``):
  a checkpoint records the run's RPG settings (``resume_keys()`` there); a resume with other values is
  refused (one line naming each key, old -> new) unless this is true.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any, Mapping

from rpg.config import FORMS, RPGLossConfig, RPGLossConfigError
from rpg.config.access import RPGConfigError, config_value, ulysses_sizes

RPG_LOSSES = ("rpg", "grpo_corrected")  # rpg.loss.name values that run an RPG actor loss (registered loss modes)
LOSS_NAMES = (*RPG_LOSSES, "verl")  # "verl": verl's own actor loss
# RPGLossConfig fields that verl's actor config already holds: the loss reads them from
# actor_rollout_ref.actor.<field>. Every other field is the recipe key rpg.loss.<field>.
ACTOR_FIELDS = ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_agg_mode")
REFERENCE_MODES = ("sampler", "fixed", "periodic", "kl_threshold")
OPTIMIZERS = ("adamw", "schedulefree")
POLICY_LOSS_TARGET = "rpg.verl.policy_config.RPGPolicyLossConfig"
SCHEDULEFREE_IMPL, SCHEDULEFREE_CLASS = "schedulefree", "AdamWScheduleFree"

_REF_KEYS = ("mode", "update_every", "kl_threshold", "kl_ema_decay", "log_weight_diff")
_TOP_KEYS = ("loss", "reference", "optimizer", "reward_function", "validation", "resume")
_VALIDATION_KEYS = ("samples_per_problem",)
_RESUME_KEYS = ("allow_changed_settings",)
# the paper's Table 7 protocol: one sample per MinervaMath / OlympiadBench problem (rpg.verl.validation)
PAPER_SAMPLES_PER_PROBLEM = (("minerva", 1), ("olympiad", 1))


def loss_fields() -> tuple[str, ...]:
    """The ``rpg.loss`` keys besides ``name``: every ``RPGLossConfig`` field not in ``ACTOR_FIELDS``
    (derived on each call, so a field added to the dataclass is a recipe key at once)."""
    return tuple(f.name for f in dataclasses.fields(RPGLossConfig) if f.name not in ACTOR_FIELDS)


def loss_key(field: str) -> str:
    """The config key that sets ``RPGLossConfig.<field>`` in a recipe run."""
    return f"actor_rollout_ref.actor.{field}" if field in ACTOR_FIELDS else f"rpg.loss.{field}"


def _actor_value(actor, field: str):
    """verl's actor value of an ``ACTOR_FIELDS`` entry (None: unset, the library default applies).
    verl's rule: clip_ratio_low / clip_ratio_high fall back to clip_ratio."""
    value = actor.get(field, None)
    if value is None and field in ("clip_ratio_low", "clip_ratio_high"):
        value = actor.get("clip_ratio", None)
    return value


def loss_config(actor, loss_agg_mode: str | None = None) -> RPGLossConfig:
    """The exact ``RPGLossConfig`` the loss runs with, from a verl actor config: the composed
    DictConfig in the driver (``apply_to_verl_config``), verl's ``ActorConfig`` on a worker
    (``rpg.verl.policy_loss``). One construction in both places, so the driver rejects before Ray
    exactly what a worker would; a broken rule raises ``RPGLossConfigError`` (its field, value and
    what is allowed). ``loss_agg_mode``: the value verl hands the policy loss (default: the actor's).

    ``grpo_corrected`` reads beta, kl_clamp and log_ratio_guard (``_for_loss``: validated as the
    differentiable form, so a value-only ``kl_clamp`` is allowed there, as for RPG-X).
    """
    pl = actor.get("policy_loss", None)
    values = None if pl is None else pl.get("rpg_loss", None)
    if values is None:
        mode = None if pl is None else pl.get("loss_mode", None)
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.rpg_loss is missing: loss_mode {mode!r} needs "
                         f"policy_loss._target_={POLICY_LOSS_TARGET} (use recipe/rpg/main_rpg.py, which sets it "
                         "from the rpg: block)")
    values = {k: values[k] for k in values}
    for field in ACTOR_FIELDS:
        value = loss_agg_mode if field == "loss_agg_mode" and loss_agg_mode is not None else _actor_value(actor, field)
        if value is not None:
            values[field] = value
    return RPGLossConfig(**_for_loss(pl.get("loss_mode", None), values))


def _for_loss(name: str | None, values: dict) -> dict:
    """``values`` as the loss ``name`` reads them: grpo_corrected's KL term w * k3 is fully differentiable
    (Sec. 2.2), so it is validated as ``form=differentiable`` (a valid form given is not used by it; an
    invalid one is still refused)."""
    if name == "grpo_corrected" and values.get("form", "reinforce") in FORMS:
        return {**values, "form": "differentiable"}
    return values


def _loss_error(e: RPGLossConfigError) -> RPGConfigError:
    return RPGConfigError(f"{loss_key(e.field)}={e.value!r} is invalid: expected {e.expected}")


@dataclass(frozen=True)
class ReferenceSettings:
    mode: str = "sampler"
    update_every: int = 0
    kl_threshold: float | None = None
    kl_ema_decay: float = 0.9
    log_weight_diff: bool = False

    @property
    def resets(self) -> bool:
        """True when the reference model is overwritten with actor weights during training."""
        return self.mode in ("periodic", "kl_threshold")


@dataclass(frozen=True)
class RPGSettings:
    loss_name: str = "rpg"  # rpg | grpo_corrected | verl (verl's own actor loss)
    loss: RPGLossConfig = RPGLossConfig()  # rpg.loss values; after apply_to_verl_config, also verl's clip keys
    reference: ReferenceSettings = ReferenceSettings()
    optimizer: str = "adamw"
    reward_function: str | None = None
    samples_per_problem: tuple[tuple[str, int], ...] = PAPER_SAMPLES_PER_PROBLEM  # (data_source prefix, n)
    allow_changed_settings: bool = False  # rpg.resume: resume a checkpoint trained with other RPG settings

    @property
    def uses_rpg_actor_loss(self) -> bool:
        return self.loss_name in RPG_LOSSES


# ----------------------------------------------------------------------------- parsing helpers


def _fail(msg: str):
    raise RPGConfigError(msg)


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        _fail(f"{key}={value!r} is invalid; allowed values: {', '.join(allowed)}")
    return value


def _number(key: str, value: Any, *, minimum: float | None = None, strict_min: bool = False,
            maximum: float | None = None, strict_max: bool = False, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(f"{key}={value!r} is invalid; expected a number{' or null' if allow_none else ''}")
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")):
        _fail(f"{key}={value!r} is invalid; expected a finite number")
    if minimum is not None and (v < minimum or (strict_min and v == minimum)):
        _fail(f"{key}={value!r} is invalid; expected a value {'>' if strict_min else '>='} {minimum}")
    if maximum is not None and (v > maximum or (strict_max and v == maximum)):
        _fail(f"{key}={value!r} is invalid; expected a value {'<' if strict_max else '<='} {maximum}")
    return v


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        _fail(f"{key}={value!r} is invalid; allowed values: true, false")
    return value


def _int(key: str, value: Any, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        _fail(f"{key}={value!r} is invalid; expected an integer >= {minimum}")
    return value


def _mapping(key: str, value: Any, allowed: tuple[str, ...]) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        _fail(f"{key} must be a mapping with keys: {', '.join(allowed)}")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        _fail(f"{key}.{unknown[0]} is not a known key; allowed keys under {key}: {', '.join(allowed)}")
    return dict(value)


def _to_plain(block: Any) -> Any:
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(block, DictConfig):
            return OmegaConf.to_container(block, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with hydra/verl
        pass
    return block


def parse_rpg_settings(block: Any) -> RPGSettings:
    """Strictly parse the ``rpg:`` block (a mapping or DictConfig) into ``RPGSettings``.

    Checks each value and the within-block consistency (e.g. ``periodic`` needs
    ``update_every >= 1``). Raises ``RPGConfigError`` (a ``ValueError``) with one line.
    """
    top = _mapping("rpg", _to_plain(block), _TOP_KEYS)
    loss = _mapping("rpg.loss", top.get("loss"), ("name", *loss_fields()))
    ref = _mapping("rpg.reference", top.get("reference"), _REF_KEYS)
    d_ref = ReferenceSettings()
    name = _choice("rpg.loss.name", loss.pop("name", "rpg"), LOSS_NAMES)
    try:
        loss_s = RPGLossConfig(**_for_loss(name, loss))
    except RPGLossConfigError as e:
        raise _loss_error(e) from None
    if loss_s.compile and name != "rpg":
        _fail(f"rpg.loss.compile=true applies to rpg.loss.name=rpg only (got {name}); set rpg.loss.compile=false")
    ref_s = ReferenceSettings(
        mode=_choice("rpg.reference.mode", ref.get("mode", d_ref.mode), REFERENCE_MODES),
        update_every=_int("rpg.reference.update_every", ref.get("update_every", d_ref.update_every)),
        kl_threshold=_number("rpg.reference.kl_threshold", ref.get("kl_threshold", d_ref.kl_threshold),
                             minimum=0.0, strict_min=True, allow_none=True),
        kl_ema_decay=_number("rpg.reference.kl_ema_decay", ref.get("kl_ema_decay", d_ref.kl_ema_decay),
                             minimum=0.0, maximum=1.0, strict_max=True),
        log_weight_diff=_bool("rpg.reference.log_weight_diff", ref.get("log_weight_diff", d_ref.log_weight_diff)),
    )
    optimizer = _choice("rpg.optimizer", top.get("optimizer", "adamw"), OPTIMIZERS)
    reward_function = top.get("reward_function", None)
    if reward_function is not None and (not isinstance(reward_function, str) or reward_function.count(":") != 1):
        _fail(f"rpg.reward_function={reward_function!r} is invalid; expected 'package.module:function' or null")

    # within-block consistency
    if ref_s.mode == "periodic":
        if ref_s.update_every < 1:
            _fail("rpg.reference.update_every must be >= 1 when rpg.reference.mode=periodic "
                  f"(got {ref_s.update_every})")
    elif ref_s.update_every != 0:
        _fail(f"rpg.reference.update_every={ref_s.update_every} is only used with rpg.reference.mode=periodic "
              f"(mode is {ref_s.mode}); set it to 0")
    if ref_s.mode == "kl_threshold":
        if ref_s.kl_threshold is None:
            _fail("rpg.reference.kl_threshold must be a number > 0 when rpg.reference.mode=kl_threshold")
    elif ref_s.kl_threshold is not None:
        _fail(f"rpg.reference.kl_threshold={ref_s.kl_threshold} is only used with rpg.reference.mode=kl_threshold "
              f"(mode is {ref_s.mode}); set it to null")
    elif ref_s.kl_ema_decay != d_ref.kl_ema_decay:
        _fail(f"rpg.reference.kl_ema_decay={ref_s.kl_ema_decay} is only used with rpg.reference.mode=kl_threshold "
              f"(mode is {ref_s.mode}); leave it at {d_ref.kl_ema_decay}")
    if ref_s.log_weight_diff and not ref_s.resets:
        _fail("rpg.reference.log_weight_diff=true needs rpg.reference.mode=periodic or kl_threshold")
    resume = _mapping("rpg.resume", top.get("resume"), _RESUME_KEYS)
    allow_changed = _bool("rpg.resume.allow_changed_settings", resume.get("allow_changed_settings", False))
    return RPGSettings(loss_name=name, loss=loss_s, reference=ref_s, optimizer=optimizer,
                       reward_function=reward_function, samples_per_problem=_samples_per_problem(top.get("validation")),
                       allow_changed_settings=allow_changed)


def _samples_per_problem(block: Any) -> tuple[tuple[str, int], ...]:
    """``rpg.validation.samples_per_problem``: {data_source prefix (any case): samples >= 1}."""
    validation = _mapping("rpg.validation", block, _VALIDATION_KEYS)
    if "samples_per_problem" not in validation:
        return PAPER_SAMPLES_PER_PROBLEM
    key = "rpg.validation.samples_per_problem"
    rule = validation["samples_per_problem"]
    if rule is None:
        return ()
    if not isinstance(rule, Mapping):
        _fail(f"{key}={rule!r} is invalid; expected a mapping {{data_source prefix: samples per problem}}, "
              "e.g. {minerva: 1}")
    out = []
    for prefix, n in rule.items():
        if not isinstance(prefix, str) or not prefix.strip():
            _fail(f"{key} has an empty or non-string data_source prefix {prefix!r}")
        clash = next((k for k, _ in out if k == prefix.strip().lower()), None)
        if clash is not None:  # keys are matched case-insensitively: one would silently replace the other
            _fail(f"{key} names the data_source prefix {prefix.strip().lower()!r} twice (keys differ only in case "
                  "or spaces); give it once")
        out.append((prefix.strip().lower(), _int(f"{key}.{prefix}", n, minimum=1)))
    return tuple(out)


# ----------------------------------------------------------------------------- verl translation


def resolve_reward_function(spec: str) -> tuple[str, str]:
    """``'pkg.module:function'`` -> (file path of the module, function name). Clear error if absent."""
    module_name, fn_name = spec.split(":")
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.origin:
        _fail(f"rpg.reward_function={spec!r}: module {module_name!r} is not importable; "
              "install it, set rpg.reward_function=null, or set reward.custom_reward_function.path")
    module = importlib.import_module(module_name)
    if not callable(getattr(module, fn_name, None)):
        _fail(f"rpg.reward_function={spec!r}: {module_name} has no function {fn_name!r}")
    return found.origin, fn_name


def _check_reference_shard_layout(cfg, mode: str, engine_strategy: str) -> None:
    """Everything that decides the reference's local shard shapes must equal the actor's (the reset
    copies rank-local shards). Checked here so a mismatch fails before Ray, not at the first reset.

    * ``fsdp_size``: the shard group (``verl.workers.engine.fsdp.utils.create_device_mesh``: a size
      < 0 or >= the world size shards over all ranks, otherwise over groups of that size);
    * FSDP1 only: ``wrap_policy`` (which modules form a flat parameter) and ``use_orig_params``
      (flat parameters or per-parameter views). FSDP2 shards each parameter on its own, so these do
      not change its shards.

    Not needed: ``reshard_after_forward`` (the copy releases gathered parameters first,
    ``rpg.verl.reference_copy``), ``model_dtype`` (the copy casts), offload settings (placement only).
    """
    from omegaconf import OmegaConf

    a, r = "actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config"
    world = int(config_value(cfg, "trainer.n_gpus_per_node", 1)) * int(config_value(cfg, "trainer.nnodes", 1))
    a_size, r_size = int(config_value(cfg, f"{a}.fsdp_size", -1)), int(config_value(cfg, f"{r}.fsdp_size", -1))
    a_group, r_group = (world if n < 0 or n >= world else n for n in (a_size, r_size))
    if a_group != r_group:
        _fail(f"rpg.reference.mode={mode} copies actor shards into the reference: {a}.fsdp_size={a_size} and "
              f"{r}.fsdp_size={r_size} shard over {a_group} and {r_group} of {world} ranks; set them equal")
    if engine_strategy != "fsdp":
        return
    for key, default in (("wrap_policy", None), ("use_orig_params", False)):
        a_val, r_val = (OmegaConf.select(cfg, f"{side}.{key}", default=default) for side in (a, r))
        a_val, r_val = (OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for v in (a_val, r_val))
        if a_val != r_val:
            _fail(f"rpg.reference.mode={mode} copies FSDP1 flat-parameter shards into the reference: "
                  f"{a}.{key}={a_val!r} and {r}.{key}={r_val!r} must be equal")


def _check_probe_without_sequence_parallelism(cfg) -> None:
    """``rpg.reference.log_weight_diff`` runs one whole probe sequence through actor and reference on
    every rank (``rpg.verl.reference_copy.probe_logits``). Under Ulysses sequence parallelism verl
    patches attention to exchange sequence *slices* between the ranks of a group, so a whole sequence
    per rank would give wrong logits (or a shape error); reject it before Ray starts."""
    big = ulysses_sizes(cfg)
    if big:
        _fail(f"rpg.reference.log_weight_diff=true is not supported with Ulysses sequence parallelism ({big[0]}): "
              "its probe runs one unsplit sequence per rank; set rpg.reference.log_weight_diff=false")


VERL_REWARD_NAME = "compute_score"  # verl's default reward.custom_reward_function.name (its ppo_trainer.yaml)


def _check_reward_name_has_path(cfg, spec: str | None) -> None:
    """``reward.custom_reward_function.name`` set without ``.path``: verl ignores a name without a path, and the
    recipe would replace it with ``rpg.reward_function``'s; the run would be scored by another function than
    the one asked for. Refused in one line (verl's default name and the recipe function's own name pass)."""
    name = config_value(cfg, "reward.custom_reward_function.name")
    if name is None or name == VERL_REWARD_NAME or (spec is not None and name == spec.split(":")[1]):
        return
    instead = (f"the recipe would otherwise score with {spec}, rpg.reward_function" if spec else
               "verl would otherwise score with its default_compute_score, rpg.reward_function=null")
    _fail(f"reward.custom_reward_function.name={name} without reward.custom_reward_function.path: set the path of "
          f"the file that defines {name} ({instead})")


def _check_rpg_reward_kwargs(cfg) -> None:
    """When the reward function is ``rpg.reward.compute_score``: its options (reward_kwargs) are valid."""
    from omegaconf import OmegaConf

    import rpg.reward
    from rpg.reward.sources import is_rpg_reward

    fn = cfg.reward.get("custom_reward_function") or {}
    if is_rpg_reward(fn.get("path"), fn.get("name")):
        kwargs = OmegaConf.to_container(fn.get("reward_kwargs") or OmegaConf.create({}), resolve=True)
        try:
            rpg.reward.check_reward_kwargs(kwargs, where="reward.custom_reward_function.reward_kwargs")
        except ValueError as e:
            raise RPGConfigError(str(e)) from None


TRAINER_MODES = ("sync", "colocate_async")  # trainer.v1.trainer_mode values the recipe runs (rpg.verl.main)
_GPU_ASYNC = ("needs two or more GPUs (a separate rollout pool) and a GPU weight-sync backend, not the CPU "
              "backend's naive one")
REFUSED_ASYNC = {
    "separate_async": f"{_GPU_ASYNC}, and swaps the actor worker for verl's DetachActorWorker, which does not "
                      "install the RPG loss (plan: docs/verl-integration.md)",
    "one_step_off_policy": f"is verl's older recipe (python -m verl.experimental.one_step_off_policy.main_ppo): it "
                           f"{_GPU_ASYNC} and rewrites the actor's loss_mode to bypass_mode, replacing the RPG loss",
    "fully_async_policy": f"is verl's older recipe (python -m verl.experimental.fully_async_policy.fully_async_main): "
                          f"it {_GPU_ASYNC} and rewrites the actor's loss_mode to bypass_mode, replacing the RPG loss "
                          "(verl points its users to separate_async)",
}
_DEFAULT_BEHAVIOR = RPGLossConfig()
ASYNC_RESUME_WHY = ("resuming an asynchronous run (verl's replay buffer, samples in flight) is not supported by the "
                    "recipe yet")


def resume_hint(mode: str, command: str) -> str:
    """The last part of a stop line: ``resume: <command>`` in sync mode; in an asynchronous trainer mode, whose
    resume the driver refuses before Ray (``trainer.resume_mode=auto`` with a checkpoint, ``resume_path``), that
    the run cannot be resumed and why, rather than a command that would be refused."""
    if mode == "sync":
        return f"resume: {command}"
    return (f"cannot be resumed: trainer.v1.trainer_mode={mode} ({ASYNC_RESUME_WHY}: the driver refuses "
            "trainer.resume_mode=auto with a checkpoint); start a new run in a new output directory")


def _check_trainer_mode(cfg, settings: RPGSettings) -> bool:
    """``trainer.v1.trainer_mode``: sync, or colocate_async with everything that keeps the loss exact under a
    stale sampler mu (one line each otherwise). Returns True for a stale sampler."""
    mode = config_value(cfg, "trainer.v1.trainer_mode", "sync")
    if mode in REFUSED_ASYNC:
        _fail(f"trainer.v1.trainer_mode={mode} is not supported by the RPG recipe: it {REFUSED_ASYNC[mode]}; "
              f"allowed: {', '.join(TRAINER_MODES)}")
    if mode not in TRAINER_MODES:
        _fail(f"trainer.v1.trainer_mode={mode!r} is not supported by the RPG recipe; allowed: {', '.join(TRAINER_MODES)}")
    loss, rc = settings.loss, "algorithm.rollout_correction"
    if mode == "sync":
        for field in ("behavior_weight_level", "behavior_weight_cap"):
            if getattr(loss, field) != getattr(_DEFAULT_BEHAVIOR, field):
                _fail(f"rpg.loss.{field}={getattr(loss, field)!r} is only used with a stale sampler "
                      f"(trainer.v1.trainer_mode=colocate_async); leave it at {getattr(_DEFAULT_BEHAVIOR, field)!r}")
        return False
    # colocate_async: every sample comes from mu, one or more updates behind pi_old
    why = "the samples come from a stale policy mu"
    if settings.optimizer == "schedulefree":
        _fail(f"rpg.optimizer=schedulefree is not supported with trainer.v1.trainer_mode={mode}: its validation "
              "switch sleeps the replicas and pushes the averaged weights while the asynchronous rollout is still "
              "generating; use rpg.optimizer=adamw")
    if config_value(cfg, "trainer.resume_mode", "auto") == "resume_path":
        _fail(f"trainer.resume_mode=resume_path is not supported with trainer.v1.trainer_mode={mode}: resuming an "
              "asynchronous run (verl's replay buffer, samples in flight) is not tested by the recipe; use "
              "trainer.resume_mode=disable or auto with no checkpoint")
    if not config_value(cfg, "actor_rollout_ref.rollout.calculate_log_probs", False):
        _fail(f"actor_rollout_ref.rollout.calculate_log_probs=False with trainer.v1.trainer_mode={mode}: {why} and "
              "its log-probs are needed for the exact weights pi_old/mu; set it to True")
    bypass = bool(config_value(cfg, f"{rc}.bypass_mode", False))
    rollout_is = config_value(cfg, f"{rc}.rollout_is", None)
    if settings.uses_rpg_actor_loss:
        if rollout_is is not None:
            _fail(f"{rc}.rollout_is={rollout_is!r} with rpg.loss.name={settings.loss_name}: the RPG loss applies "
                  "the exact weights pi_old/mu itself (verl's would apply them twice); set it to null "
                  "(truncation, biased: rpg.loss.behavior_weight_cap)")
        if config_value(cfg, f"{rc}.rollout_rs", None) is not None:
            _fail(f"{rc}.rollout_rs={config_value(cfg, f'{rc}.rollout_rs')!r} with rpg.loss.name={settings.loss_name} "
                  f"and trainer.v1.trainer_mode={mode}: rejecting tokens by their weight changes the distribution "
                  "the exact weights correct for; set it to null")
        return True
    # rpg.loss.name=verl: verl's own loss must see mu
    if config_value(cfg, "actor_rollout_ref.actor.use_kl_loss", False):
        _fail(f"actor_rollout_ref.actor.use_kl_loss=True with rpg.loss.name=verl and trainer.v1.trainer_mode={mode}: "
              f"{why} and verl's KL loss term ignores the importance weights; use rpg.loss.name=rpg or grpo_corrected "
              "(exact) or set use_kl_loss=False")
    if not bypass and rollout_is is None:
        _fail(f"rpg.loss.name=verl with trainer.v1.trainer_mode={mode} and {rc}.rollout_is=null: {why} and verl's "
              f"loss would ignore it; set {rc}.rollout_is=token|sequence or {rc}.bypass_mode=True, or use "
              "rpg.loss.name=rpg")
    return True


def apply_to_verl_config(cfg, settings: RPGSettings) -> RPGSettings:
    """Check ``settings`` against verl's keys in ``cfg`` and write the verl keys they imply.

    Mutates ``cfg`` (a composed Hydra DictConfig). Raises ``RPGConfigError`` on conflicts. Returns
    ``settings`` whose ``loss`` is, for the RPG losses, the exact config the workers will build.
    """
    from omegaconf import open_dict

    actor = "actor_rollout_ref.actor"
    loss, ref = settings.loss, settings.reference

    # --- trainer: our subclass is the v1 sync trainer (see rpg.verl.main)
    if not config_value(cfg, "trainer.use_v1", True):
        _fail("trainer.use_v1=False is not supported by the RPG recipe (it extends verl's v1 trainer); "
              "allowed: trainer.use_v1=True")
    stale = _check_trainer_mode(cfg, settings)
    if config_value(cfg, "distillation.enabled", False):
        _fail("distillation.enabled=True is not supported together with the RPG recipe")

    use_kl_loss = bool(config_value(cfg, f"{actor}.use_kl_loss", False))
    use_kl_in_reward = bool(config_value(cfg, "algorithm.use_kl_in_reward", False))
    loss_mode = config_value(cfg, f"{actor}.policy_loss.loss_mode", "vanilla")
    strategy = config_value(cfg, f"{actor}.strategy", "fsdp")
    lora_rank = config_value(cfg, "actor_rollout_ref.model.lora.rank", 0) or config_value(cfg, "actor_rollout_ref.model.lora_rank", 0)
    ref_in_actor = bool(lora_rank and lora_rank > 0) or config_value(cfg, "actor_rollout_ref.model.lora_adapter_path") is not None

    if ref.resets:
        if strategy not in ("fsdp", "fsdp2"):
            _fail(f"rpg.reference.mode={ref.mode} copies actor weights into the reference and supports "
                  f"{actor}.strategy fsdp or fsdp2 only (got {strategy!r})")
        # the FSDP version each engine runs: verl's FSDPActorConfig.__post_init__ overwrites
        # fsdp_config.strategy with the role's own strategy (verl/workers/config/actor.py:325), for the
        # actor and for the reference, whose config is built the same way (verl/workers/engine_workers.py:553;
        # ref.strategy defaults to the actor's, verl/trainer/config/ref/ref.yaml:5)
        a_eng = strategy
        r_eng = config_value(cfg, "actor_rollout_ref.ref.strategy", a_eng)
        if a_eng != r_eng:
            _fail(f"rpg.reference.mode={ref.mode} copies actor shards into the reference: "
                  f"{actor}.strategy={a_eng!r} and actor_rollout_ref.ref.strategy={r_eng!r} must be equal")
        _check_reference_shard_layout(cfg, ref.mode, a_eng)
        if ref.log_weight_diff:
            _check_probe_without_sequence_parallelism(cfg)
        if ref_in_actor:
            _fail(f"rpg.reference.mode={ref.mode} needs a separate reference model; LoRA (reference = actor "
                  "without adapter) is not supported; allowed modes with LoRA: sampler, fixed")

    with open_dict(cfg):
        if settings.uses_rpg_actor_loss:
            if loss_mode not in ("vanilla", settings.loss_name):
                _fail(f"rpg.loss.name={settings.loss_name} conflicts with {actor}.policy_loss.loss_mode={loss_mode!r}; "
                      "leave loss_mode unset (the recipe sets it) or use rpg.loss.name=verl")
            if use_kl_in_reward:
                _fail(f"algorithm.use_kl_in_reward=True cannot be combined with rpg.loss.name={settings.loss_name} "
                      "(the KL term is inside the RPG loss); set algorithm.use_kl_in_reward=False")
            if ref.mode == "sampler":
                if use_kl_loss:
                    _fail(f"{actor}.use_kl_loss=True conflicts with rpg.loss.name={settings.loss_name} and "
                          "rpg.reference.mode=sampler (no reference model; the KL is inside the RPG loss); "
                          f"set {actor}.use_kl_loss=False or choose rpg.reference.mode fixed|periodic|kl_threshold")
            else:
                # only to make verl build the reference and fill ref_log_prob: the RPG actor loss gives
                # verl's ppo_loss use_kl_loss=False, so verl's own KL term is never added; its coefficient
                # is 0 so that the printed config says so too (the KL coefficient is rpg.loss.beta)
                cfg.actor_rollout_ref.actor.use_kl_loss = True
                cfg.actor_rollout_ref.actor.kl_loss_coef = 0.0
            pl = cfg.actor_rollout_ref.actor.policy_loss
            pl._target_ = POLICY_LOSS_TARGET
            pl.loss_mode = settings.loss_name
            pl.rpg_loss = {field: getattr(loss, field) for field in loss_fields()}
            try:  # the workers' construction (rpg.verl.policy_loss), on this config: same inputs, same verdict
                loss = loss_config(cfg.actor_rollout_ref.actor)
            except RPGLossConfigError as e:
                raise _loss_error(e) from None
            if loss.compile and str(config_value(cfg, "ray_kwargs.ray_init.runtime_env.env_vars.TORCH_COMPILE_DISABLE", "0")) == "1":
                _fail("rpg.loss.compile=true needs torch.compile in the actor workers, but "
                      "ray_kwargs.ray_init.runtime_env.env_vars.TORCH_COMPILE_DISABLE=1 disables it there (the CPU "
                      "backend sets it); set rpg.loss.compile=false or TORCH_COMPILE_DISABLE=0")
            pl.rpg_anchor = "sampler" if ref.mode == "sampler" else "reference"
            pl.rpg_sampler_kl = False
            pl.rpg_stale_sampler = stale
        else:  # rpg.loss.name == "verl": verl's own ppo_loss; the reference settings govern its KL reference
            if loss_mode in RPG_LOSSES:
                _fail(f"{actor}.policy_loss.loss_mode={loss_mode} needs rpg.loss.name={loss_mode} "
                      "(the recipe then wires the loss settings)")
            wants_ref = use_kl_loss or use_kl_in_reward
            pl = cfg.actor_rollout_ref.actor.policy_loss
            pl._target_ = POLICY_LOSS_TARGET
            pl.rpg_sampler_kl = False
            if ref.mode == "sampler" and use_kl_loss:
                if use_kl_in_reward:
                    _fail("algorithm.use_kl_in_reward=True needs a reference model; with rpg.loss.name=verl use "
                          "rpg.reference.mode fixed|periodic|kl_threshold")
                # KL loss against the sampling policy pi_old (REINFORCE++ as in the paper's scripts):
                # no reference model is built; the worker feeds old_log_probs as ref_log_prob.
                cfg.actor_rollout_ref.actor.use_kl_loss = False
                pl.rpg_sampler_kl = True
                pl.rpg_anchor = "sampler"
            elif ref.mode == "sampler" and use_kl_in_reward:
                _fail("algorithm.use_kl_in_reward=True needs a reference model; with rpg.loss.name=verl use "
                      "rpg.reference.mode fixed|periodic|kl_threshold")
            elif ref.mode != "sampler" and not wants_ref:
                _fail(f"rpg.reference.mode={ref.mode} has no effect with rpg.loss.name=verl unless "
                      f"{actor}.use_kl_loss=True or algorithm.use_kl_in_reward=True; use rpg.reference.mode=sampler")
            else:
                pl.rpg_anchor = "sampler" if ref.mode == "sampler" else "reference"

        # --- optimizer
        optim = cfg.actor_rollout_ref.actor.optim
        impl = config_value(cfg, f"{actor}.optim.optimizer_impl", "torch.optim")
        sched = config_value(cfg, f"{actor}.optim.lr_scheduler_type", "constant")
        warmup_style = config_value(cfg, f"{actor}.optim.warmup_style", None)
        if settings.optimizer == "schedulefree":
            if importlib.util.find_spec(SCHEDULEFREE_IMPL) is None:
                _fail("rpg.optimizer=schedulefree needs the 'schedulefree' package, which is not installed "
                      "(pip install schedulefree); allowed without it: rpg.optimizer=adamw")
            if impl not in ("torch.optim", SCHEDULEFREE_IMPL):
                _fail(f"rpg.optimizer=schedulefree conflicts with {actor}.optim.optimizer_impl={impl!r}")
            if sched != "constant" or (warmup_style not in (None, "constant")):
                _fail(f"rpg.optimizer=schedulefree needs {actor}.optim.lr_scheduler_type=constant "
                      f"(got {warmup_style or sched!r}); schedule-free replaces the lr schedule")
            optim.optimizer_impl = SCHEDULEFREE_IMPL
            optim.optimizer = SCHEDULEFREE_CLASS
        elif impl == SCHEDULEFREE_IMPL:
            _fail(f"{actor}.optim.optimizer_impl=schedulefree needs rpg.optimizer=schedulefree "
                  "(the recipe places the optimizer's train()/eval() switches)")

        # --- default reward function (explicit reward.custom_reward_function.path wins; a name alone is refused)
        if not config_value(cfg, "reward.custom_reward_function.path"):
            _check_reward_name_has_path(cfg, settings.reward_function)
        if settings.reward_function and not config_value(cfg, "reward.custom_reward_function.path"):
            path, name = resolve_reward_function(settings.reward_function)
            cfg.reward.custom_reward_function.path = path
            cfg.reward.custom_reward_function.name = name
        _check_rpg_reward_kwargs(cfg)
    return dataclasses.replace(settings, loss=loss)


def describe(cfg, settings: RPGSettings) -> str:
    """One line saying what will run (printed by the driver)."""
    from omegaconf import OmegaConf

    pl = OmegaConf.select(cfg, "actor_rollout_ref.actor.policy_loss")
    loss = settings.loss
    if settings.uses_rpg_actor_loss:
        what = (f"loss=rpg divergence={loss.divergence} form={loss.form} beta={loss.beta} clip={loss.clip}"
                + (" compiled" if loss.compile else "") if settings.loss_name == "rpg"
                else f"loss=grpo_corrected beta={loss.beta}")
    else:
        what = f"loss=verl:{pl.get('loss_mode', 'vanilla')}"
    ref = settings.reference
    if ref.mode == "sampler":
        anchor = "anchor=sampler (pi_old; no reference model)"
        if not settings.uses_rpg_actor_loss and not pl.get("rpg_sampler_kl", False):
            anchor = "no KL anchor (no reference model)"
    else:
        anchor = f"anchor=reference mode={ref.mode}"
        if ref.mode == "periodic":
            anchor += f" K={ref.update_every}"
        if ref.mode == "kl_threshold":
            anchor += f" kappa={ref.kl_threshold} decay={ref.kl_ema_decay}"
    adv = OmegaConf.select(cfg, "algorithm.adv_estimator")
    return f"rpg: {what}; {anchor}; adv_estimator={adv}; optimizer={settings.optimizer}{_describe_async(cfg, settings)}"


def _describe_async(cfg, settings: RPGSettings) -> str:
    """The asynchronous trainer's settings ('' for sync)."""
    mode = config_value(cfg, "trainer.v1.trainer_mode", "sync")
    if mode == "sync":
        return ""
    v1 = f"trainer.v1.{mode}"
    bypass = bool(config_value(cfg, "algorithm.rollout_correction.bypass_mode", False))
    out = (f"; trainer={mode} warmup_batches={config_value(cfg, f'{v1}.num_warmup_batches', 1)} "
           f"max_off_policy={config_value(cfg, 'trainer.v1.sampler.max_off_policy_threshold', None)} "
           f"({config_value(cfg, 'trainer.v1.sampler.max_off_policy_strategy', 'drop')}) "
           f"old_log_probs={'rollout (bypass: pi_old := mu)' if bypass else 'recomputed (decoupled)'}")
    if settings.uses_rpg_actor_loss:
        loss = settings.loss
        cap = "untruncated (exact)" if loss.behavior_weight_cap is None else f"truncated at {loss.behavior_weight_cap} (biased)"
        if loss.behavior_weight_level == "none":
            out += " behavior_weights=none (dropped: uncorrected, biased)"
        else:
            out += f" behavior_weights=pi_old/mu per {loss.behavior_weight_level}, {cap}"
    else:
        out += f" rollout_is={config_value(cfg, 'algorithm.rollout_correction.rollout_is', None)}"
    return out


def validate_and_apply(cfg) -> RPGSettings:
    """Driver entry: parse ``cfg.rpg`` strictly, then apply it to the verl keys of ``cfg``."""
    from omegaconf import OmegaConf

    block = OmegaConf.select(cfg, "rpg")
    if block is None:
        _fail("the config has no rpg: block; use recipe/rpg/config/rpg_trainer.yaml")
    return apply_to_verl_config(cfg, parse_rpg_settings(block))


def settings_table() -> str:
    """The loss settings as a markdown table (docs/verl-integration.md holds it; a test checks it is
    current): key, default and allowed values from ``RPGLossConfig``'s fields and ``RULES``."""
    from rpg.config import RULES

    rows = ["| key | default | allowed | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(RPGLossConfig):
        allowed = "; ".join(r.expected for r in RULES if r.field == f.name)
        rows.append(f"| `{loss_key(f.name)}` | `{f.default!r}` | {allowed} | {f.metadata.get('doc', '')} |")
    return "\n".join(rows)
