"""The recipe's ``rpg:`` block in the driver and the workers: checks against verl's keys, translation into them.

The block is declared once, torch-free, in ``rpg.config`` (``RPGSettings``: every key with its default,
what it allows and its doc; the ``rpg.loss`` keys derive from ``RPGLossConfig``). The driver
(``rpg.verl.main``) calls ``validate_and_apply`` before Ray starts, so a bad value fails fast with ONE
line naming the key and the allowed values; unknown keys anywhere under ``rpg.`` are rejected.

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

from rpg.config import (ACTOR_FIELDS, RPG_LOSSES, RPGLossConfig, RPGLossConfigError, RPGSettings, build_loss_config,
                        config_value, loss_error, loss_fields, parse_rpg_settings, ulysses_sizes)
from rpg.config.access import RPGConfigError
from rpg.config.access import fail as _fail

POLICY_LOSS_TARGET = "rpg.verl.policy_config.RPGPolicyLossConfig"
SCHEDULEFREE_IMPL, SCHEDULEFREE_CLASS = "schedulefree", "AdamWScheduleFree"


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
    (``rpg.verl.policy_loss``). One construction in both places (``rpg.config.build_loss_config``),
    so the driver rejects before Ray exactly what a worker would; a broken rule raises
    ``RPGLossConfigError`` (its field, value and what is allowed). ``loss_agg_mode``: the value verl
    hands the policy loss (default: the actor's).

    ``grpo_corrected`` reads beta, kl_clamp and log_ratio_guard (validated as the differentiable form,
    so a value-only ``kl_clamp`` is allowed there, as for RPG-X).
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
    return build_loss_config(pl.get("loss_mode", None), values)


def check_trainer(cfg, settings: RPGSettings) -> bool:
    """verl's v1 trainer in a mode the recipe runs (``check_trainer_mode``), no distillation. Returns True
    for a stale sampler (``colocate_async``)."""
    if not config_value(cfg, "trainer.use_v1", True):
        _fail("trainer.use_v1=False is not supported by the RPG recipe (it extends verl's v1 trainer); "
              "allowed: trainer.use_v1=True")
    stale = check_trainer_mode(cfg, settings)
    if config_value(cfg, "distillation.enabled", False):
        _fail("distillation.enabled=True is not supported together with the RPG recipe")
    return stale


def check_reference_copies(cfg, settings: RPGSettings) -> None:
    """A reference that is overwritten with actor weights (``ReferenceSettings.resets``): fsdp or fsdp2 on
    both sides with the same engine and shard layout, a separate reference model (no LoRA), and no Ulysses
    sequence parallelism when ``log_weight_diff`` probes the copy."""
    actor = "actor_rollout_ref.actor"
    ref = settings.reference
    if not ref.resets:
        return
    strategy = config_value(cfg, f"{actor}.strategy", "fsdp")
    lora_rank = config_value(cfg, "actor_rollout_ref.model.lora.rank", 0) or config_value(cfg, "actor_rollout_ref.model.lora_rank", 0)
    ref_in_actor = bool(lora_rank and lora_rank > 0) or config_value(cfg, "actor_rollout_ref.model.lora_adapter_path") is not None
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
    check_reference_shard_layout(cfg, ref.mode, a_eng)
    if ref.log_weight_diff:
        check_probe_without_sequence_parallelism(cfg)
    if ref_in_actor:
        _fail(f"rpg.reference.mode={ref.mode} needs a separate reference model; LoRA (reference = actor "
              "without adapter) is not supported; allowed modes with LoRA: sampler, fixed")


def check_reference_shard_layout(cfg, mode: str, engine_strategy: str) -> None:
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


def check_probe_without_sequence_parallelism(cfg) -> None:
    """``rpg.reference.log_weight_diff`` runs one whole probe sequence through actor and reference on
    every rank (``rpg.verl.reference_copy.probe_logits``). Under Ulysses sequence parallelism verl
    patches attention to exchange sequence *slices* between the ranks of a group, so a whole sequence
    per rank would give wrong logits (or a shape error); reject it before Ray starts."""
    big = ulysses_sizes(cfg)
    if big:
        _fail(f"rpg.reference.log_weight_diff=true is not supported with Ulysses sequence parallelism ({big[0]}): "
              "its probe runs one unsplit sequence per rank; set rpg.reference.log_weight_diff=false")


# ----------------------------------------------------------------------------- reward


VERL_REWARD_NAME = "compute_score"  # verl's default reward.custom_reward_function.name (its ppo_trainer.yaml)


def check_reward_name_has_path(cfg, spec: str | None) -> None:
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


def check_rpg_reward_kwargs(cfg) -> None:
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


# ----------------------------------------------------------------------------- trainer mode


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


def check_trainer_mode(cfg, settings: RPGSettings) -> bool:
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


# ----------------------------------------------------------------------------- translation


def apply_to_verl_config(cfg, settings: RPGSettings) -> RPGSettings:
    """Check ``settings`` against verl's keys in ``cfg`` and write the verl keys they imply.

    Mutates ``cfg`` (a composed Hydra DictConfig). Raises ``RPGConfigError`` on conflicts. Returns
    ``settings`` whose ``loss`` is, for the RPG losses, the exact config the workers will build.
    """
    from omegaconf import open_dict

    actor = "actor_rollout_ref.actor"
    loss, ref = settings.loss, settings.reference
    stale = check_trainer(cfg, settings)
    use_kl_loss = bool(config_value(cfg, f"{actor}.use_kl_loss", False))
    use_kl_in_reward = bool(config_value(cfg, "algorithm.use_kl_in_reward", False))
    loss_mode = config_value(cfg, f"{actor}.policy_loss.loss_mode", "vanilla")
    check_reference_copies(cfg, settings)

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
                raise loss_error(e) from None
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
            check_reward_name_has_path(cfg, settings.reward_function)
        if settings.reward_function and not config_value(cfg, "reward.custom_reward_function.path"):
            path, name = resolve_reward_function(settings.reward_function)
            cfg.reward.custom_reward_function.path = path
            cfg.reward.custom_reward_function.name = name
        check_rpg_reward_kwargs(cfg)
    return dataclasses.replace(settings, loss=loss)


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
