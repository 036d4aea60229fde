"""The recipe config: Hydra composition against the installed verl, strict validation of the
``rpg:`` block (one-line errors naming the key), translation into verl keys, and the
advantage-estimator registrations as verl's trainer calls them."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from messages import names, one_line
import torch
from omegaconf import OmegaConf

import rpg.verl.policy_loss
import rpg.verl.register  # noqa: F401
from rpg.config import DIVERGENCES, FORMS, LOSS_NAMES, RPGConfigError, parse_rpg_settings
from rpg.verl import block_to_verl as T
from rpg.verl.policy_loss import POLICY_LOSS_TARGET
from recipe_config import apply, compose_cfg


def test_default_recipe_is_rpg_reinforce_ufkl_with_sampler_anchor():
    cfg, s = apply()
    pl = cfg.actor_rollout_ref.actor.policy_loss
    assert (s.loss_name, s.loss.divergence, s.loss.form, s.reference.mode) == ("rpg", "ufkl", "reinforce", "sampler")
    assert pl._target_ == POLICY_LOSS_TARGET and pl.loss_mode == "rpg" and pl.rpg_anchor == "sampler"
    assert cfg.actor_rollout_ref.actor.use_kl_loss is False and cfg.algorithm.use_kl_in_reward is False
    assert cfg.algorithm.adv_estimator == "rpg"
    from verl.trainer.ppo.utils import need_reference_policy

    assert not need_reference_policy(cfg)  # no reference model in sampler mode


def test_policy_loss_config_instantiates_like_verl_does():
    cfg, _ = apply("rpg.loss.divergence=urkl", "rpg.loss.form=differentiable", "rpg.reference.mode=fixed",
                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2")
    from verl.utils.config import omega_conf_to_dataclass

    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert type(actor.policy_loss).__name__ == "RPGPolicyLossConfig"
    pl = actor.policy_loss
    assert (pl.rpg_loss["divergence"], pl.rpg_loss["form"], pl.rpg_anchor) == ("urkl", "differentiable", "reference")
    assert actor.use_kl_loss is True  # only so that verl builds the reference


@pytest.mark.parametrize("mode,extra", [("fixed", []), ("periodic", ["rpg.reference.update_every=3"]),
                                        ("kl_threshold", ["rpg.reference.kl_threshold=0.01"])])
def test_reference_modes_build_a_reference(mode, extra):
    cfg, s = apply(f"rpg.reference.mode={mode}", *extra)
    from verl.trainer.ppo.utils import need_reference_policy

    assert need_reference_policy(cfg) and cfg.actor_rollout_ref.actor.policy_loss.rpg_anchor == "reference"
    assert s.reference.resets == (mode != "fixed")


def test_every_paper_variant_composes():
    variants = [
        [f"rpg.loss.divergence={d}", f"rpg.loss.form={f}", f"rpg.loss.clip={c}"]
        for d in DIVERGENCES for f in FORMS for c in ("true", "false")
    ]
    variants += [
        ["rpg.loss.name=grpo_corrected", "rpg.reference.mode=fixed", "algorithm.adv_estimator=grpo"],
        ["rpg.loss.name=verl", "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=true",
         "rpg.reference.mode=fixed"],
        ["rpg.loss.name=verl", "algorithm.adv_estimator=reinforce_plus_plus",
         "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=kl"],
        ["rpg.loss.name=verl", "algorithm.adv_estimator=grpo", "algorithm.filter_groups.enable=true",
         "algorithm.filter_groups.metric=acc", "reward.reward_manager.name=dapo",
         "reward.reward_kwargs.overlong_buffer_cfg.enable=true"],
    ]
    for overrides in variants:
        cfg, s = apply(*overrides)
        assert s.loss_name in LOSS_NAMES


def test_verl_loss_with_sampler_kl_builds_no_reference():
    cfg, _ = apply("rpg.loss.name=verl", "actor_rollout_ref.actor.use_kl_loss=true",
                   "actor_rollout_ref.actor.kl_loss_type=kl")
    from verl.trainer.ppo.utils import need_reference_policy

    assert not need_reference_policy(cfg)
    assert cfg.actor_rollout_ref.actor.policy_loss.rpg_sampler_kl is True


def test_schedulefree_sets_verl_optimizer_keys():
    cfg, s = apply("rpg.optimizer=schedulefree")
    optim = cfg.actor_rollout_ref.actor.optim
    assert (optim.optimizer_impl, optim.optimizer) == ("schedulefree", "AdamWScheduleFree")
    from verl.workers.config.optimizer import build_optimizer
    from verl.utils.config import omega_conf_to_dataclass

    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], omega_conf_to_dataclass(optim))
    assert type(opt).__name__ == "AdamWScheduleFree"


def test_schedulefree_missing_package_is_a_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(T.importlib.util, "find_spec", lambda name, *a: None if name == "schedulefree" else real(name, *a))
    with pytest.raises(RPGConfigError, match="rpg.optimizer=schedulefree needs the 'schedulefree' package"):
        apply("rpg.optimizer=schedulefree")


BAD = [
    (["rpg.loss.divergence=kl"], "rpg.loss.divergence='kl' is invalid: expected one of fkl, rkl, ufkl, urkl"),
    (["rpg.loss.name=ppo"], "rpg.loss.name='ppo' is invalid; allowed values: rpg, grpo_corrected, verl"),
    (["rpg.loss.form=hybrid"], "rpg.loss.form"),
    (["rpg.loss.beta=-1"], "rpg.loss.beta=-1 is invalid"),
    (["rpg.loss.clip=maybe"], "rpg.loss.clip='maybe' is invalid: expected True or False"),
    (["rpg.loss.kl_clamp=0"], "rpg.loss.kl_clamp=0 is invalid"),
    (["rpg.reference.mode=ema"], "rpg.reference.mode='ema' is invalid; allowed values: sampler, fixed, periodic, kl_threshold"),
    (["rpg.reference.mode=periodic"], "rpg.reference.update_every must be >= 1 when rpg.reference.mode=periodic"),
    (["rpg.reference.update_every=4"], "rpg.reference.update_every=4 is only used with rpg.reference.mode=periodic"),
    (["rpg.reference.mode=kl_threshold"], "rpg.reference.kl_threshold must be a number > 0"),
    (["rpg.reference.mode=kl_threshold", "rpg.reference.kl_threshold=0.1", "rpg.reference.kl_ema_decay=1.0"],
     "rpg.reference.kl_ema_decay=1.0 is invalid"),
    (["rpg.reference.mode=periodic", "rpg.reference.update_every=2", "rpg.reference.kl_ema_decay=0.5"],
     "rpg.reference.kl_ema_decay=0.5 is only used with rpg.reference.mode=kl_threshold (mode is periodic); leave it at 0.9"),
    (["rpg.optimizer=sgd"], "rpg.optimizer='sgd' is invalid; allowed values: adamw, schedulefree"),
    (["+rpg.loss.gamma=1"], "rpg.loss.gamma is not a known key"),
    (["+rpg.foo=1"], "rpg.foo is not a known key"),
    (["actor_rollout_ref.actor.use_kl_loss=true"], "use_kl_loss=True conflicts with rpg.loss.name=rpg"),
    (["algorithm.use_kl_in_reward=true"], "algorithm.use_kl_in_reward=True cannot be combined"),
    (["actor_rollout_ref.actor.policy_loss.loss_mode=gspo"], "conflicts with actor_rollout_ref.actor.policy_loss.loss_mode='gspo'"),
    (["rpg.optimizer=schedulefree", "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine"],
     "rpg.optimizer=schedulefree needs actor_rollout_ref.actor.optim.lr_scheduler_type=constant"),
    (["actor_rollout_ref.actor.optim.optimizer_impl=schedulefree"], "needs rpg.optimizer=schedulefree"),
    (["rpg.loss.name=verl", "rpg.reference.mode=fixed"], "has no effect with rpg.loss.name=verl"),
    (["trainer.use_v1=false"], "trainer.use_v1=False is not supported"),
    (["rpg.reference.mode=periodic", "rpg.reference.update_every=2", "actor_rollout_ref.actor.strategy=megatron"],
     "supports actor_rollout_ref.actor.strategy fsdp or fsdp2 only"),
    (["rpg.reference.mode=periodic", "rpg.reference.update_every=2", "actor_rollout_ref.ref.strategy=fsdp"],
     "actor_rollout_ref.actor.strategy='fsdp2' and actor_rollout_ref.ref.strategy='fsdp' must be equal"),
    (["actor_rollout_ref.actor.clip_ratio_c=1.0"], "actor_rollout_ref.actor.clip_ratio_c=1.0 is invalid: expected a number > 1"),
    (["rpg.reward_function=nonexistent_pkg_xyz:score"], "module 'nonexistent_pkg_xyz' is not importable"),
    (["rpg.reference.log_weight_diff=true"], "log_weight_diff=true needs rpg.reference.mode=periodic or kl_threshold"),
    (["rpg.reference.mode=periodic", "rpg.reference.update_every=2", "rpg.reference.log_weight_diff=true",
      "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
     "log_weight_diff=true is not supported with Ulysses sequence parallelism "
     "(actor_rollout_ref.actor.ulysses_sequence_parallel_size=2)"),
    (["rpg.reference.mode=periodic", "rpg.reference.update_every=2", "rpg.reference.log_weight_diff=true",
      "actor_rollout_ref.model.use_fused_kernels=true"],
     "rpg.reference.log_weight_diff=true needs the models' logits, which actor_rollout_ref.model.use_fused_kernels=true "
     "does not return (verl's fused forward gives log-probabilities); set actor_rollout_ref.model.use_fused_kernels=false "
     "or rpg.reference.log_weight_diff=false"),
]


def test_fused_kernels_pass_without_the_logit_probe():
    """Only the pair is refused: fused kernels with a resetting reference that logs no logit differences pass."""
    cfg, _ = apply("rpg.reference.mode=periodic", "rpg.reference.update_every=2",
                   "actor_rollout_ref.model.use_fused_kernels=true")
    assert cfg.actor_rollout_ref.model.use_fused_kernels is True


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_values_fail_with_one_line_naming_the_key(overrides, message):
    with pytest.raises(RPGConfigError) as err:
        apply(*overrides)
    text = str(err.value)
    assert message in text and "\n" not in text


def test_parse_accepts_plain_mapping_and_rejects_non_mapping():
    s = parse_rpg_settings({"loss": {"beta": 0}, "reference": {"mode": "fixed"}})
    assert s.loss.beta == 0.0 and s.reference.mode == "fixed"
    with pytest.raises(RPGConfigError, match="rpg.loss must be a mapping"):
        parse_rpg_settings({"loss": 3})


def test_explicit_reward_function_path_wins_over_recipe_default(tmp_path):
    f = tmp_path / "r.py"
    f.write_text("def compute_score(*a, **k):\n    return 0.0\n")
    cfg, _ = apply(f"reward.custom_reward_function.path={f}")
    assert cfg.reward.custom_reward_function.path == str(f)


def test_main_exits_with_one_line_on_bad_value(capsys):
    from launching import recipe_main

    cfg = compose_cfg("rpg.loss.divergence=js")
    with pytest.raises(SystemExit) as e:
        recipe_main(cfg)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert one_line(err).startswith("rpg config error: ")
    names(err, "rpg.loss.divergence='js'", "fkl, rkl, ufkl, urkl")


# ----------------------------------------------------------------------------- advantage estimators


def _compute_advantage(name, rewards, mask, uids):
    """As verl's trainer calls a non-GRPO estimator (ray_trainer.compute_advantage)."""
    from verl.protocol import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    data = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": np.array(uids, dtype=object)})
    out = compute_advantage(data, adv_estimator=name, num_repeat=1,
                            config=OmegaConf.create({"adv_estimator": name}))
    return out.batch["advantages"]


def test_rpg_advantage_is_group_mean_without_std_through_verl():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.float32)
    rewards = torch.zeros(5, 3)
    last = mask.sum(1).long() - 1
    scores = torch.tensor([1.0, -1.0, 1.0, 0.5, 2.0])
    rewards[torch.arange(5), last] = scores
    uids = ["a", "a", "a", "b", "c"]
    adv = _compute_advantage("rpg", rewards, mask, uids)
    group_mean = torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0, 0.0])  # singleton groups: baseline 0, A = R
    want = (scores - group_mean)[:, None] * mask
    torch.testing.assert_close(adv, want)

    adv_b = _compute_advantage("rpg_batchmean", rewards, mask, uids)
    torch.testing.assert_close(adv_b, (scores - scores.mean())[:, None] * mask)


def test_register_is_idempotent():
    from verl.trainer.ppo import core_algos

    before = dict(core_algos.ADV_ESTIMATOR_REGISTRY)
    rpg.verl.register.register()
    rpg.verl.register.register()
    assert core_algos.ADV_ESTIMATOR_REGISTRY == before
    assert core_algos.get_policy_loss_fn("grpo_corrected") is rpg.verl.policy_loss.rpg_policy_loss


def test_the_task_runners_copy_of_verls_run_is_of_the_installed_verl():
    """rpg.verl.main.RPGTaskRunner.run repeats verl's TaskRunnerV1.run with two differences (its docstring
    says why a call is not possible): the copy must be of the verl that is installed."""
    import hashlib
    import inspect
    import textwrap

    from verl.trainer.main_ppo import TaskRunnerV1

    from rpg.verl.main import VERL_TASK_RUNNER_RUN_SHA256

    source = textwrap.dedent(inspect.getsource(TaskRunnerV1.__ray_actor_class__.run))
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == VERL_TASK_RUNNER_RUN_SHA256, (
        "verl's TaskRunnerV1.run changed: bring rpg.verl.main.RPGTaskRunner.run in line, then update the hash")
