"""One declaration per loss setting: ``RPGLossConfig`` (``rpg.config.loss``, re-exported by ``rpg.math.fused``).
The recipe's ``rpg.loss`` keys, their defaults, their validation and what verl's policy-loss config carries to the
workers all derive from it; the shipped YAML states the same values (checked here), and a field added to the dataclass
is accepted, validated and delivered to the loss with nothing else edited."""

import dataclasses
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import rpg.config.block as B
import rpg.config.loss as L
import rpg.math.fused
from rpg.config import (ACTOR_FIELDS, RULES, RPGConfigError, RPGLossConfig, RPGLossConfigError, Rule, loss_defaults,
                        loss_fields, parse_rpg_settings)
from rpg.config import loss_config
from rpg.verl.policy_loss import RPGPolicyLossConfig

YAML = Path(__file__).parents[2] / "recipe" / "rpg" / "config" / "rpg_trainer.yaml"


def test_the_library_reexports_the_one_declaration():
    """``from rpg.math.fused import RPGLossConfig`` (the library's documented spelling) is the torch-free
    declaration."""
    assert rpg.math.fused.RPGLossConfig is RPGLossConfig and rpg.math.fused.RULES is RULES
    assert rpg.math.fused.RPGLossConfig.__module__ == "rpg.config.loss"


def test_loss_defaults_are_the_library_config_defaults():
    assert loss_defaults() == {f.name: f.default for f in dataclasses.fields(RPGLossConfig())}
    assert RPGLossConfig(**loss_defaults()) == RPGLossConfig()


def test_recipe_keys_are_the_library_fields_verl_does_not_hold():
    assert set(loss_fields()) | set(ACTOR_FIELDS) == set(loss_defaults())
    assert not set(loss_fields()) & set(ACTOR_FIELDS)
    assert parse_rpg_settings({}).loss == RPGLossConfig()  # no value given: the library's defaults


def test_shipped_yaml_states_the_library_defaults():
    """rpg.loss in the YAML = name + the library's defaults; verl's actor keys the loss reads = the same
    library defaults (the paper's eps1, eps2, c and token-mean)."""
    cfg = OmegaConf.load(YAML)
    block = OmegaConf.to_container(cfg.rpg.loss)
    assert block.pop("name") == "rpg"
    assert block == {k: loss_defaults()[k] for k in loss_fields()}
    actor = OmegaConf.to_container(cfg.actor_rollout_ref.actor)
    assert {k: actor[k] for k in ACTOR_FIELDS} == {k: loss_defaults()[k] for k in ACTOR_FIELDS}


def test_every_rule_has_a_violation_that_breaks_only_it():
    """The rules are data: each one's ``violation`` trips that rule first (the driver tests feed them)."""
    for rule in RULES:
        with pytest.raises(RPGLossConfigError) as err:
            RPGLossConfig(**rule.violation)
        assert (err.value.field, err.value.expected) == (rule.field, rule.expected), rule
        assert "\n" not in str(err.value)


def test_recipe_error_names_the_recipe_key():
    with pytest.raises(RPGConfigError) as err:
        parse_rpg_settings({"loss": {"compile": "yes"}})
    assert str(err.value) == "rpg.loss.compile='yes' is invalid: expected True or False"
    with pytest.raises(RPGConfigError, match="rpg.loss.compile=true applies to rpg.loss.name=rpg only"):
        parse_rpg_settings({"loss": {"compile": True, "name": "grpo_corrected"}})
    with pytest.raises(RPGConfigError, match=r"^rpg.loss.surprise is not a known key; allowed keys under rpg.loss: name, "):
        parse_rpg_settings({"loss": {"surprise": 1}})


def test_worker_builds_the_same_config_as_the_driver():
    """The worker's actor config is verl's own conversion of the composed config (omega_conf_to_dataclass,
    as verl's engine workers do); the loss builds from it the config the driver built and checked."""
    from verl.utils.config import omega_conf_to_dataclass

    from recipe_config import apply

    cfg, settings = apply("rpg.loss.divergence=urkl", "rpg.loss.compile=true",
                          "actor_rollout_ref.actor.clip_ratio_high=0.3", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2")
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert type(actor.policy_loss) is RPGPolicyLossConfig
    assert loss_config(actor) == settings.loss
    assert (settings.loss.divergence, settings.loss.compile, settings.loss.clip_ratio_high) == ("urkl", True, 0.3)


# ----------------------------------------------------------------------------- adding a setting


@dataclasses.dataclass(frozen=True)
class _WithKnob(RPGLossConfig):
    """A temporary copy of the library config with one more setting and its rule."""

    knob: float = dataclasses.field(default=1.0, metadata={"doc": "a new setting (test only)"})

    def __post_init__(self):
        super().__post_init__()
        rule = Rule("knob", "a number > 0", lambda c: c.knob > 0, {"knob": -1.0})
        if not rule.ok(self):
            raise RPGLossConfigError(rule.field, self.knob, rule.expected)


def test_a_field_added_to_the_dataclass_is_accepted_validated_and_delivered(monkeypatch):
    from verl.workers.config.actor import ActorConfig

    import rpg.verl.policy_loss as glue

    monkeypatch.setattr(B, "RPGLossConfig", _WithKnob)  # the name the block's keys derive from
    monkeypatch.setattr(L, "RPGLossConfig", _WithKnob)  # the one the builder builds (the driver, the workers)
    assert "knob" in loss_fields()
    from rpg.verl.checkpoints import resume_keys

    assert "rpg.loss.knob" in resume_keys()  # recorded by a checkpoint: a resume that changes it is refused
    assert parse_rpg_settings({"loss": {"knob": 2.5}}).loss.knob == 2.5  # accepted
    with pytest.raises(RPGConfigError, match=r"^rpg.loss.knob=-1.0 is invalid: expected a number > 0$"):
        parse_rpg_settings({"loss": {"knob": -1.0}})  # validated, named as the recipe key

    from recipe_config import apply  # verl's policy-loss config holds rpg.loss by reference

    cfg, _ = apply("+rpg.loss.knob=2.5")
    pl = OmegaConf.to_container(cfg.actor_rollout_ref.actor.policy_loss, resolve=True)
    assert pl["rpg_loss"]["knob"] == 2.5
    pl.pop("_target_")

    seen = []  # delivered: the config the library loss receives on the worker
    real = glue.library_loss
    monkeypatch.setattr(glue, "library_loss", lambda **kw: (seen.append(kw["config"]), real(**kw))[1])
    actor = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_c=10.0,
                        policy_loss=RPGPolicyLossConfig(**pl))
    object.__setattr__(actor, "global_batch_info", {})
    x = torch.zeros(2, 3)
    glue.rpg_policy_loss(old_log_prob=x, log_prob=x, advantages=x, response_mask=torch.ones(2, 3), config=actor)
    assert isinstance(seen[0], _WithKnob) and seen[0].knob == 2.5


def test_compile_with_torch_compile_disabled_fails_before_ray_and_in_the_library(monkeypatch):
    from recipe_config import apply

    with pytest.raises(RPGConfigError, match="rpg.loss.compile=true needs torch.compile in the actor workers"):
        apply("rpg.loss.compile=true", "+ray_kwargs.ray_init.runtime_env.env_vars.TORCH_COMPILE_DISABLE='1'")
    _, settings = apply("rpg.loss.compile=true")
    assert settings.loss.compile is True
    monkeypatch.setattr(torch._dynamo.config, "disable", True)
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="RPGLossConfig.compile=True needs torch.compile, which is disabled"):
        from rpg.math.fused import rpg_policy_loss

        rpg_policy_loss(log_prob=x, old_log_prob=x, advantages=x, response_mask=torch.ones(1, 2),
                        config=RPGLossConfig(compile=True))


def test_shipped_yaml_states_the_other_rpg_defaults():
    """rpg.reference / optimizer / reward_function / validation / resume: the YAML's values are the parser's
    defaults (an empty block parses to the same settings as the shipped one)."""
    shipped = parse_rpg_settings(OmegaConf.to_container(OmegaConf.load(YAML).rpg))
    assert shipped == parse_rpg_settings({})
    assert shipped.reward_function == "rpg.reward:compute_score"
