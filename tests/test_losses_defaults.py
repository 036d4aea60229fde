"""One source of truth for the loss defaults: the recipe's ``rpg.loss`` settings and verl's policy-loss
config take them from ``rpg.losses.RPGLossConfig``, the shipped YAML states the same values, and the
``rpg.loss.compile`` key is validated like every other key (one line naming it and what is allowed)."""

from dataclasses import fields
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rpg.losses import RPGLossConfig, loss_defaults
from rpg.verl.policy_config import RPGPolicyLossConfig
from rpg.verl.settings import _LOSS_KEYS, LossSettings, RPGConfigError, parse_rpg_settings

YAML = Path(__file__).parents[1] / "recipe" / "rpg" / "config" / "rpg_trainer.yaml"
GLUE_ONLY = {"name"}  # recipe keys that are not library fields (verl glue choices)


def test_loss_defaults_are_the_library_config_defaults():
    assert loss_defaults() == {f.name: f.default for f in fields(RPGLossConfig())}
    assert RPGLossConfig(**loss_defaults()) == RPGLossConfig()


def test_recipe_settings_take_their_defaults_from_the_library():
    lib = loss_defaults()
    settings = {f.name: f.default for f in fields(LossSettings)}
    assert set(settings) == set(_LOSS_KEYS), "every rpg.loss key has a typed setting"
    shared = set(settings) - GLUE_ONLY
    assert shared <= set(lib), f"rpg.loss keys that are not RPGLossConfig fields: {shared - set(lib)}"
    assert {k: settings[k] for k in shared} == {k: lib[k] for k in shared}


def test_policy_loss_config_takes_its_defaults_from_the_library():
    lib = loss_defaults()
    policy = {f.name[len("rpg_"):]: f.default for f in fields(RPGPolicyLossConfig) if f.name.startswith("rpg_")}
    shared = set(policy) - {"anchor", "sampler_kl"}  # derived by the driver from rpg.reference / rpg.loss.name
    assert shared == set(_LOSS_KEYS) - GLUE_ONLY, "every library setting of rpg.loss reaches the workers"
    assert {k: policy[k] for k in shared} == {k: lib[k] for k in shared}


def test_shipped_yaml_states_the_library_defaults():
    block = OmegaConf.to_container(OmegaConf.load(YAML).rpg.loss)
    assert set(block) == set(_LOSS_KEYS)
    defaults = {f.name: f.default for f in fields(LossSettings)}
    assert block == defaults


@pytest.mark.parametrize("block,message", [
    ({"loss": {"compile": "yes"}}, "rpg.loss.compile='yes' is invalid; allowed values: true, false"),
    ({"loss": {"compile": True, "name": "grpo_corrected"}}, "rpg.loss.compile=true applies to rpg.loss.name=rpg only"),
])
def test_compile_key_errors_name_the_key(block, message):
    with pytest.raises(RPGConfigError) as err:
        parse_rpg_settings(block)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_compile_key_reaches_the_library_config():
    from verl.workers.config.actor import ActorConfig

    from rpg.verl.policy_loss import make_rpg_loss_config

    assert parse_rpg_settings({"loss": {"compile": True}}).loss.compile is True
    pl = RPGPolicyLossConfig(loss_mode="rpg", rpg_compile=True)
    actor = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=pl)
    assert make_rpg_loss_config(actor, "token-mean").compile is True
    assert make_rpg_loss_config(ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                                            policy_loss=RPGPolicyLossConfig(loss_mode="rpg")), "token-mean").compile is False
    with pytest.raises(ValueError, match="policy_loss.rpg_compile=1 is invalid; allowed values: True, False"):
        RPGPolicyLossConfig(loss_mode="rpg", rpg_compile=1)
    with pytest.raises(ValueError, match=r"RPGLossConfig.compile='no' is invalid: expected True or False"):
        RPGLossConfig(compile="no")


def test_compile_with_torch_compile_disabled_fails_before_ray_and_in_the_library(monkeypatch):
    import torch
    from test_verl_config import apply

    with pytest.raises(RPGConfigError, match="rpg.loss.compile=true needs torch.compile in the actor workers"):
        apply("rpg.loss.compile=true", "+ray_kwargs.ray_init.runtime_env.env_vars.TORCH_COMPILE_DISABLE='1'")
    _, settings = apply("rpg.loss.compile=true")
    assert settings.loss.compile is True
    monkeypatch.setattr(torch._dynamo.config, "disable", True)
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="RPGLossConfig.compile=True needs torch.compile, which is disabled"):
        from rpg.losses import rpg_policy_loss

        rpg_policy_loss(x, x, x, torch.ones(1, 2), RPGLossConfig(compile=True))
