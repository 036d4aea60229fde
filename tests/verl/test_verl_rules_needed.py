"""Each rule of ``rpg.verl.verl_rules`` guards a value verl 0.9.1's own checks let through before Ray: verl's
``validate_config`` (run by verl's ``main_ppo`` before ``ray.init``; it builds the actor's config dataclass) and the
config dataclasses its TaskRunner and workers build after Ray (``worker_dataclasses``) accept each value below, or
end in a traceback that names no key; the rule refuses it in one line naming the key. When verl starts refusing such
a value itself, its case here fails: the rule then goes, and verl's refusal (one line: ``check_verl_config``) takes
its place. The values verl refuses itself have no rule of ours (``VERL_OWN``)."""

from __future__ import annotations

import contextlib
import copy
import io

import pytest

from rpg.config import RPGConfigError
from rpg.override_lists import values

from test_v1_trainer_rules import SYNC, _prepared

A, R, F = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
FILTER, OVERLONG = "algorithm.filter_groups", "reward.reward_kwargs.overlong_buffer_cfg"
DYNAMIC = [f"{A}.use_dynamic_bsz=true", f"{R}.log_prob_use_dynamic_bsz=true"]
DAPO_OVERLONG = ["reward.reward_manager.name=dapo", f"{OVERLONG}.enable=true"]
ONE_PER_RANK = [f"{R}.n=1", f"{A}.ppo_mini_batch_size=1", f"{A}.ppo_micro_batch_size_per_gpu=1",
                f"{R}.log_prob_micro_batch_size_per_gpu=1", f"{F}.log_prob_micro_batch_size_per_gpu=1"]
# rule (where verl would meet the value), the bad value on the composed sync run, the key our line names, and what
# verl's own checks before Ray do with it (None: accept it); use_kl_loss=true: verl builds the reference's dataclass
KEPT = [
    ("unread grad_clip (silently unread)", [f"{A}.grad_clip=0.5"], f"{A}.grad_clip", None),
    ("unknown logger (Tracking, TaskRunner)", ["trainer.logger=[console,tensorbord]"], "trainer.logger", None),
    ("no logger (no metrics)", ["trainer.logger=[]"], "trainer.logger", None),
    ("lr NaN (AdamW, each worker)", [f"{A}.optim.lr=nan"], f"{A}.optim.lr", None),
    ("lr < 0 (AdamW, each worker)", [f"{A}.optim.lr=-1"], f"{A}.optim.lr", None),
    ("clip_grad <= 0 (silently wrong)", [f"{A}.optim.clip_grad=0"], f"{A}.optim.clip_grad", None),
    ("total_training_steps < 1 (no step)", ["trainer.total_training_steps=0"], "trainer.total_training_steps", None),
    ("total_epochs < 1 (no step)", ["trainer.total_epochs=0"], "trainer.total_epochs", None),
    ("rollout.n < 1", [f"{R}.n=0"], f"{R}.n", None),
    ("train_batch_size < 1 (dynamic sizes)", [*DYNAMIC, "data.train_batch_size=0"], "data.train_batch_size", None),
    ("ppo_mini_batch_size < 1", [f"{A}.ppo_mini_batch_size=0"], f"{A}.ppo_mini_batch_size", None),
    ("ppo_epochs < 1", [f"{A}.ppo_epochs=0"], f"{A}.ppo_epochs", None),
    ("batch a multiple of the mini-batch (padding)", ["data.train_batch_size=7"], "data.train_batch_size", None),
    ("n_gpus_per_node < 1", ["trainer.n_gpus_per_node=0"], "trainer.n_gpus_per_node", ZeroDivisionError),
    ("nnodes < 1", ["trainer.nnodes=0"], "trainer.nnodes", ZeroDivisionError),
    ("mini-batch over the dp ranks (engine worker)", ["trainer.n_gpus_per_node=2", *ONE_PER_RANK],
     f"{A}.ppo_mini_batch_size", None),
    ("micro-batch divides a rank's mini-batch", [f"{A}.ppo_micro_batch_size_per_gpu=3"],
     f"{A}.ppo_micro_batch_size_per_gpu", None),
    ("rollout log-prob micro-batch divides", [f"{R}.log_prob_micro_batch_size_per_gpu=5"],
     f"{R}.log_prob_micro_batch_size_per_gpu", None),
    ("ref log-prob micro-batch divides", [f"{A}.use_kl_loss=true", f"{F}.log_prob_micro_batch_size_per_gpu=5"],
     f"{F}.log_prob_micro_batch_size_per_gpu", None),
    ("micro-batch size < 1 (engine worker)", [f"{A}.ppo_micro_batch_size_per_gpu=0"],
     f"{A}.ppo_micro_batch_size_per_gpu", None),
    ("per-GPU log-prob key unset, deprecated one set (engine worker)",
     [f"{R}.log_prob_micro_batch_size_per_gpu=null", f"{R}.log_prob_micro_batch_size=16"],
     f"{R}.log_prob_micro_batch_size_per_gpu", None),
    ("log-prob dynamic sizes = the actor's (engine worker)", [f"{R}.log_prob_use_dynamic_bsz=true"],
     f"{R}.log_prob_use_dynamic_bsz", None),
    ("rollout token budget (engine worker)", [*DYNAMIC, f"{R}.log_prob_max_token_len_per_gpu=null"],
     f"{R}.log_prob_max_token_len_per_gpu", None),
    ("actor token budget (engine worker)", [*DYNAMIC, f"{A}.ppo_max_token_len_per_gpu=null"],
     f"{A}.ppo_max_token_len_per_gpu", None),
    ("checkpoint engine registered (engine worker)", [f"{R}.checkpoint_engine.backend=ncl"],
     f"{R}.checkpoint_engine.backend", None),
    ("rollout replica inside the trainer's ranks (engine worker)", [f"{R}.tensor_model_parallel_size=2"],
     f"{R}.tensor_model_parallel_size", None),
    ("off-policy threshold (replay buffer)", ["trainer.v1.sampler.max_off_policy_threshold=0"],
     "trainer.v1.sampler.max_off_policy_threshold", None),
    ("off-policy strategy (replay buffer)", ["trainer.v1.sampler.max_off_policy_strategy=dorp"],
     "trainer.v1.sampler.max_off_policy_strategy", None),
    ("DAPO metric set (TaskRunner)", [f"{FILTER}.enable=true", f"{FILTER}.metric=null"], f"{FILTER}.metric", None),
    ("DAPO without a colocated reward model (TaskRunner)", [f"{FILTER}.enable=true", "reward.reward_model.enable=true"],
     f"{FILTER}.enable", None),
    ("DAPO batches in flight (replay buffer)", [f"{FILTER}.enable=true", f"{FILTER}.max_inflight_gen_batches=0"],
     f"{FILTER}.max_inflight_gen_batches", None),
    ("DAPO refill limit (the RPG trainers)", [f"{FILTER}.enable=true", f"{FILTER}.max_num_gen_batches=-1"],
     f"{FILTER}.max_num_gen_batches", None),
    ("DAPO metric a key of the rows (replay buffer)", [f"{FILTER}.enable=true", f"{FILTER}.metric=accuracy"],
     f"{FILTER}.metric", None),
    ("gen_batch_size divides the batch (trainer)", ["+data.gen_batch_size=3"], "data.gen_batch_size", None),
    ("reward model pool (TaskRunner)", ["reward.reward_model.enable_resource_pool=true", "reward.reward_model.nnodes=1",
                                        "reward.reward_model.n_gpus_per_node=0"], "reward.reward_model.n_gpus_per_node",
     None),
    ("nsys worker options (TaskRunner)", ["global_profiler.steps=[1]", "global_profiler.tool=nsys",
                                          "global_profiler.global_tool_config.nsys.worker_nsight_options=null"],
     "global_profiler.global_tool_config.nsys.worker_nsight_options", None),
    ("parameter_sync_step divides the batch (trainer)", ["+trainer.v1.sync.parameter_sync_step=3"],
     "trainer.v1.sync.parameter_sync_step", None),
    ("overlong buffer >= 1 (reward loop)", [*DAPO_OVERLONG, f"{OVERLONG}.len=0"], f"{OVERLONG}.len", None),
    ("overlong buffer <= max_resp_len (reward loop)", [*DAPO_OVERLONG, f"{OVERLONG}.len=100000"], f"{OVERLONG}.len",
     None),
    ("norm mode's loss_scale_factor > 0 (silently wrong)",
     [f"{A}.loss_agg_mode=seq-mean-token-sum-norm", f"{A}.loss_scale_factor=0"], f"{A}.loss_scale_factor", None),
]
# verl's own keys that verl refuses before Ray (validate_config, the config dataclasses): no rule restates them
VERL_OWN = [
    ([f"{A}.ppo_micro_batch_size=2"], "ppo_micro_batch_size"),  # both spellings set: FSDPActorConfig.__post_init__
    ([f"{R}.log_prob_micro_batch_size=16"], f"{R}.log_prob_micro_batch_size"),  # validate_config, both spellings
    ([f"{A}.loss_agg_mode=token-mean-typo"], "loss_agg_mode"),  # ActorConfig.__post_init__
    ([f"{A}.ulysses_sequence_parallel_size=2", "actor_rollout_ref.model.use_remove_padding=false"],
     "use_remove_padding"),  # FSDPActorConfig.validate
    ([f"{R}.val_kwargs.do_sample=true", f"{R}.temperature=0"], "temperature"),  # validate_config
    ([f"{R}.mode=sync"], f"{R}: verl's config dataclass refused it"),  # RolloutConfig.__post_init__
]


def _config(overrides):
    """The composed sync run (the driver's checks passed) with ``overrides``' values set."""
    from omegaconf import OmegaConf, open_dict

    cfg = copy.deepcopy(_prepared(tuple(SYNC)))
    with open_dict(cfg):
        for key, value in values(overrides).items():
            OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def _verls_checks(cfg) -> None:
    """verl's own checks, in the driver: validate_config and the config dataclasses built after Ray."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    from rpg.verl.verl_rules import check_verl_config

    with contextlib.redirect_stdout(io.StringIO()):
        check_verl_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


def _our_rules(cfg) -> None:
    """The driver's rules, in prepare_config's order."""
    from rpg.verl.verl_rules import check_verl_rules, set_norm_scale_factor

    check_verl_rules(cfg)
    set_norm_scale_factor(cfg, use_critic=False)


@pytest.mark.parametrize("rule,overrides,key,verl_error", KEPT, ids=[case[0] for case in KEPT])
def test_each_rule_guards_a_value_verls_own_checks_let_through(rule, overrides, key, verl_error):
    cfg = _config(overrides)
    if verl_error is None:
        _verls_checks(copy.deepcopy(cfg))  # accepted: without the rule, the run would start
    else:
        with pytest.raises(verl_error) as err:  # a traceback, no key named
            _verls_checks(copy.deepcopy(cfg))
        assert key not in str(err.value)
    with pytest.raises(RPGConfigError) as err:
        _our_rules(cfg)
    text = str(err.value)
    assert text.startswith((f"{key}=", f"{key}:")) and "\n" not in text, text


@pytest.mark.parametrize("overrides,named", VERL_OWN, ids=[" ".join(o) for o, _ in VERL_OWN])
def test_verls_own_refusals_have_no_rule_and_stay_one_line(overrides, named):
    cfg = _config(overrides)
    _our_rules(copy.deepcopy(cfg))
    with pytest.raises(RPGConfigError) as err:
        _verls_checks(cfg)
    text = str(err.value)
    assert named in text and "\n" not in text, text


def test_the_base_run_passes_both():
    """Each case above differs from a run both accept in the keys it sets."""
    cfg = _config([])
    _our_rules(copy.deepcopy(cfg))
    _verls_checks(cfg)
