"""The ``rpg:`` block written into verl's keys in the driver, before Ray: ``apply_to_verl_config``.

verl's typed policy-loss config (``RPGPolicyLossConfig``: ``rpg.verl.policy_loss``) holds the ``rpg.loss`` block by
reference (recipe/rpg/config/rpg_trainer.yaml: ``rpg_loss: ${rpg.loss}``) and carries it to the actor workers; here
its ``loss_mode`` is set and ``rpg.config.loss_config``, the builder every worker runs once, builds the same
``RPGLossConfig`` from it, so both refuse the same inputs (one validator, ``RULES``). The road of a setting: docs/architecture.md#the-road-of-a-loss-setting.
``rpg.reference.mode`` decides whether verl builds a reference model, ``rpg.optimizer=schedulefree`` sets verl's
optimizer keys, and the trainer and the driver's resume check read ``rpg.validation`` and ``rpg.resume``. The checks
against verl's own keys (``rpg.verl.block_checks``) run first; every refusal is one line.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util

from rpg.config import (RPG_LOSSES, RPGLossConfigError, RPGSettings, config_value, loss_config, loss_error,
                        parse_rpg_settings)
from rpg.config.access import fail as _fail
from rpg.verl.block_checks import (check_reference_copies, check_reward_name_has_path, check_rpg_reward_kwargs,
                             check_trainer)
from rpg.verl.policy_loss import POLICY_LOSS_TARGET

SCHEDULEFREE_IMPL, SCHEDULEFREE_CLASS = "schedulefree", "AdamWScheduleFree"


def apply_to_verl_config(cfg, settings: RPGSettings) -> RPGSettings:
    """Check ``settings`` against verl's keys in ``cfg`` and write the verl keys they imply.

    Mutates ``cfg`` (a composed Hydra DictConfig). Raises ``RPGConfigError`` on conflicts. Returns
    ``settings`` whose ``loss`` is, for the RPG losses, the exact config the workers will build.

    * ``rpg.loss.*`` -> ``actor_rollout_ref.actor.policy_loss``: an ``RPGPolicyLossConfig`` whose ``rpg_loss`` is the
      ``rpg.loss`` block by reference (workers only see ``actor_rollout_ref``); the clip ratios and the aggregation
      stay verl's own actor keys (``ACTOR_FIELDS``); ``loss_mode`` = ``rpg`` or ``grpo_corrected``.
    * ``rpg.reference.mode``: ``sampler`` keeps ``actor.use_kl_loss=False`` and ``algorithm.use_kl_in_reward=False``
      (no reference worker, no extra forward; the loss anchors on ``old_log_probs``); the other modes set
      ``actor.use_kl_loss=True`` only so that verl builds the reference and fills ``ref_log_prob`` (the RPG actor
      loss keeps verl's own KL term off).
    * ``rpg.optimizer=schedulefree`` -> ``actor.optim.optimizer_impl=schedulefree``,
      ``actor.optim.optimizer=AdamWScheduleFree`` (verl's ``build_optimizer``), a constant lr schedule.
    * ``rpg.validation.samples_per_problem`` is read by ``RPGTrainer`` (``rpg.verl.validation``) and
      ``rpg.resume.allow_changed_settings`` by the driver's resume check (``rpg.verl.checkpoints``).
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
            pl = _policy_loss(cfg)
            pl.loss_mode = settings.loss_name
            try:  # the workers' construction (rpg.config.loss_config), on this config: same inputs, same verdict
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
            pl = _policy_loss(cfg)
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


def _policy_loss(cfg):
    """verl's policy-loss config of ``cfg``: the RPG policy-loss config with the ``rpg.loss`` block by reference, as
    recipe/rpg/config/rpg_trainer.yaml declares it (one line otherwise: the workers would not see ``rpg.loss``)."""
    key = "actor_rollout_ref.actor.policy_loss"
    pl = cfg.actor_rollout_ref.actor.policy_loss
    if config_value(cfg, f"{key}._target_") != POLICY_LOSS_TARGET:
        _fail(f"{key}._target_ must be {POLICY_LOSS_TARGET} (recipe/rpg/config/rpg_trainer.yaml sets it; got "
              f"{config_value(cfg, f'{key}._target_')!r})")
    if pl._get_node("rpg_loss")._dereference_node() is not cfg.rpg._get_node("loss"):
        _fail(f"{key}.rpg_loss must be ${{rpg.loss}} (recipe/rpg/config/rpg_trainer.yaml sets it): set the loss's "
              "settings under rpg.loss")
    return pl


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


def validate_and_apply(cfg) -> RPGSettings:
    """Driver entry: parse ``cfg.rpg`` strictly, then apply it to the verl keys of ``cfg``."""
    from omegaconf import OmegaConf

    block = OmegaConf.select(cfg, "rpg")
    if block is None:
        _fail("the config has no rpg: block; use recipe/rpg/config/rpg_trainer.yaml")
    return apply_to_verl_config(cfg, parse_rpg_settings(block))
