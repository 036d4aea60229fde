"""Every rule the workers enforce is checked in the driver, before Ray: the loss library's own rules
(``rpg.math.fused.RULES``, enumerated here) fire in the driver with the recipe key they read, and
``DRY_RUN=1`` on a paper script rejects exactly what a launch would (exit 2, one line)."""

import contextlib
import io

import pytest
from messages import names, one_line

from rpg.config import RULES, RPGConfigError, loss_key

from recipe_config import apply


def _overrides(violation: dict) -> list[str]:
    """The rule's violating settings as recipe overrides (None -> null)."""
    return [f"{loss_key(k)}={'null' if v is None else v}" for k, v in violation.items()]


# grpo_corrected is validated as form=differentiable (its KL is w * k3, rpg.config.build_loss_config): the
# one rule that needs form=reinforce cannot fire for it (its kl_clamp is allowed, tests/verl/test_verl_adapter.py)
CASES = [(rule, name) for name in ("rpg", "grpo_corrected") for rule in RULES
         if not (name == "grpo_corrected" and rule.violation.get("form") == "reinforce")]


@pytest.mark.parametrize("rule,loss_name", CASES, ids=[f"{n}-{r.field}:{r.expected[:30]}" for r, n in CASES])
def test_every_library_rule_fires_in_the_driver(rule, loss_name):
    """The driver builds the workers' RPGLossConfig (``rpg.config.loss_config``): a violation of any
    library rule is refused there, naming the recipe key and what the rule allows."""
    assert len(CASES) == 2 * len(RULES) - 1
    with pytest.raises(RPGConfigError) as err:
        apply(f"rpg.loss.name={loss_name}", *_overrides(rule.violation))
    text = str(err.value)
    assert text.startswith(f"{loss_key(rule.field)}=") and rule.expected in text and "\n" not in text


@pytest.mark.parametrize("override,key", [
    ("actor_rollout_ref.actor.policy_loss._target_=verl.workers.config.PolicyLossConfig", "policy_loss._target_"),
    ("++actor_rollout_ref.actor.policy_loss.rpg_loss={beta:0.5}", "policy_loss.rpg_loss"),
])
def test_the_policy_loss_must_hold_the_loss_block_by_reference(override, key):
    """verl's policy-loss config carries rpg.loss to the workers by reference (rpg_trainer.yaml): a run that replaces
    its target or its rpg_loss (the workers would not see rpg.loss) is refused before Ray, one line naming the key."""
    with pytest.raises(RPGConfigError) as err:
        apply(override)
    text = str(err.value)
    assert text.startswith(f"actor_rollout_ref.actor.{key} must be ") and "\n" not in text, text


SCRIPT = "run_rpg_4b_ctx8k_urkl1e-4_rf_clip_ppo_0.2_0.28"
WORKER_ONLY_BEFORE = [  # each passed DRY_RUN and failed 45-52 s into a launch, inside a Ray worker
    (["rpg.loss.form=reinforce", "rpg.loss.kl_clamp=1.0"], "rpg.loss.kl_clamp=1.0 is invalid: expected None with form='reinforce'"),
    (["rpg.loss.form=differentiable", "rpg.loss.fd_clip=algorithm1", "rpg.loss.divergence=ufkl"],
     "rpg.loss.divergence='ufkl' is invalid: expected 'rkl' or 'urkl' with fd_clip='algorithm1'"),
    (["actor_rollout_ref.actor.clip_ratio_low=1.5"], "actor_rollout_ref.actor.clip_ratio_low=1.5 is invalid: expected a number in (0, 1)"),
    (["actor_rollout_ref.actor.clip_ratio_high=-0.1"], "actor_rollout_ref.actor.clip_ratio_high=-0.1 is invalid: expected a number > 0"),
]


@pytest.mark.parametrize("overrides,line", WORKER_ONLY_BEFORE, ids=[" ".join(o) for o, _ in WORKER_ONLY_BEFORE])
def test_dry_run_of_a_4b_script_rejects_what_a_worker_would(overrides, line, capsys, tmp_path):
    from launching import launch as main

    with contextlib.redirect_stdout(io.StringIO()):
        code = main([SCRIPT, *overrides], {"DRY_RUN": "1", "DATA_DIR": str(tmp_path)})
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("rpg.launch: warning:")]
    assert code == 2
    assert len(err) == 1 and err[0].startswith("rpg config error: ") and line in err[0], err


# ----------------------------------------------------------------------------- verl's numeric and divisibility rules

PAPER_DRY_RUN_REFUSALS = [  # each passed DRY_RUN ("validated") and could not run: rpg.verl.verl_rules
    ("actor_rollout_ref.actor.optim.lr=nan", "actor_rollout_ref.actor.optim.lr=nan is invalid: expected a finite number >= 0"),
    ("actor_rollout_ref.actor.optim.lr=-1", "actor_rollout_ref.actor.optim.lr=-1 is invalid: expected a finite number >= 0"),
    ("trainer.total_training_steps=0", "trainer.total_training_steps=0 is invalid: expected an integer >= 1 or null"),
    ("actor_rollout_ref.rollout.n=0", "actor_rollout_ref.rollout.n=0 is invalid: expected an integer >= 1"),
    ("data.train_batch_size=7", "data.train_batch_size=7 is invalid: expected a multiple of "
                                "actor_rollout_ref.actor.ppo_mini_batch_size=32"),
    ("actor_rollout_ref.actor.grad_clip=0.5", "actor_rollout_ref.actor.grad_clip=0.5 is not read by verl 0.9.1: "
                                              "gradient clipping is actor_rollout_ref.actor.optim.clip_grad (now 1.0)"),
]


@pytest.mark.parametrize("override,line", PAPER_DRY_RUN_REFUSALS, ids=[o for o, _ in PAPER_DRY_RUN_REFUSALS])
def test_dry_run_of_a_4b_script_applies_verls_numeric_rules(override, line, capsys, tmp_path):
    """DRY_RUN=1 on a paper script: exit 2 and ONE line naming the key and what is allowed, before Ray."""
    from launching import launch as main

    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = main([SCRIPT, override], {"DRY_RUN": "1", "DATA_DIR": str(tmp_path)})
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("rpg.launch: warning:")]
    assert code == 2 and "validated config" not in out.getvalue()
    assert len(err) == 1 and err[0].startswith(f"rpg config error: {line}"), err


def _rules(*overrides):
    """The composed recipe config after the rpg: translation, then the numeric rules (rpg.verl.verl_rules)."""
    from rpg.verl.verl_rules import check_verl_rules

    cfg, _ = apply(*overrides)
    check_verl_rules(cfg)
    return cfg


TINY = ["trainer.n_gpus_per_node=2", "trainer.nnodes=1", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4"]
RULE_CASES = [
    (["actor_rollout_ref.actor.optim.lr=inf"], "actor_rollout_ref.actor.optim.lr=inf is invalid: expected a finite number >= 0"),
    (["actor_rollout_ref.actor.optim.clip_grad=0"], "actor_rollout_ref.actor.optim.clip_grad=0 is invalid: expected a finite number > 0"),
    (["trainer.total_training_steps=-5"], "trainer.total_training_steps=-5 is invalid"),
    (["trainer.total_epochs=0"], "trainer.total_epochs=0 is invalid: expected an integer >= 1"),
    (["actor_rollout_ref.actor.ppo_epochs=0"], "actor_rollout_ref.actor.ppo_epochs=0 is invalid"),
    (["data.train_batch_size=6"], "data.train_batch_size=6 is invalid: expected a multiple of "
                                  "actor_rollout_ref.actor.ppo_mini_batch_size=4"),
    (["data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4"], "data.train_batch_size=2 is invalid"),
    (["actor_rollout_ref.rollout.n=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1", "data.train_batch_size=7",
      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1"],
     "actor_rollout_ref.actor.ppo_mini_batch_size=1 is invalid: expected a value whose mini-batch of 1 x rollout.n=1 "
     "responses divides over the 2 data-parallel ranks"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3 is invalid: expected a divisor of the 8 responses"),
    (["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=5"],
     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=5 is invalid: expected a divisor of the 16 responses"),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0"],
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0 is invalid: expected an integer >= 1 without "
     "actor_rollout_ref.actor.use_dynamic_bsz (verl's v1 engine worker reads it; the deprecated ppo_micro_batch_size "
     "is not read)"),
]


@pytest.mark.parametrize("overrides,message", RULE_CASES, ids=[" ".join(o) for o, _ in RULE_CASES])
def test_each_numeric_rule_is_one_line_naming_the_key(overrides, message):
    with pytest.raises(RPGConfigError) as err:
        _rules(*TINY, *overrides)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_settings_that_run_pass_the_numeric_rules():
    """The sizes above are consistent (each rule has a passing neighbour); the paper setup passes too. (The bare
    recipe sets no micro-batch size without use_dynamic_bsz: verl's v1 workers assert it, the rules refuse it.)"""
    _rules(*TINY)
    _rules(*TINY, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "data.train_batch_size=12")
    _rules("+paper=default")
    with pytest.raises(RPGConfigError, match="ppo_micro_batch_size_per_gpu=None is invalid"):
        _rules()


def test_verls_own_validate_config_refusal_is_one_line():
    """verl's validate_config raises AssertionError/ValueError with multi-line text; the driver prints one line."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    from rpg.verl.verl_rules import check_verl_config

    cfg, _ = apply(*TINY, "actor_rollout_ref.actor.ppo_micro_batch_size=2")  # both spellings set: verl refuses
    with pytest.raises(RPGConfigError) as err:
        check_verl_config(cfg, need_reference_policy(cfg), need_critic(cfg))
    assert str(err.value).startswith("verl's validate_config refused the config: ") and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- the keys verl reads (strategy, clipping)


def test_the_fsdp1_layout_check_reads_the_strategy_verl_reads():
    """verl overwrites fsdp_config.strategy with actor.strategy / ref.strategy (FSDPActorConfig.__post_init__):
    actor.strategy=fsdp (ref follows it) runs FSDP1 on both, so a periodic reset with different
    use_orig_params (flat parameters vs per-parameter views) must be refused before Ray, although
    fsdp_config.strategy still says fsdp2."""
    with pytest.raises(RPGConfigError) as err:
        apply("rpg.reference.mode=periodic", "rpg.reference.update_every=2", "actor_rollout_ref.actor.strategy=fsdp",
              "actor_rollout_ref.ref.fsdp_config.use_orig_params=true")
    names(one_line(str(err.value)), "rpg.reference.mode=periodic",
          "actor_rollout_ref.actor.fsdp_config.use_orig_params=False", "actor_rollout_ref.ref.fsdp_config.use_orig_params=True")
    apply("rpg.reference.mode=periodic", "rpg.reference.update_every=2",  # FSDP2: use_orig_params does not matter
          "actor_rollout_ref.ref.fsdp_config.use_orig_params=true")


def test_a_paper_script_clips_with_the_key_verl_reads():
    """The paper's clip at 1.0 (App. H) is actor.optim.clip_grad, which verl's engine reads; the paper default no
    longer sets the unread actor.grad_clip (it keeps verl's own default); verl's dataclass carries the 1.0."""
    from verl.utils.config import omega_conf_to_dataclass

    from launching import ROOT as root, planned

    from rpg.launch.plan import compose

    overrides = planned(SCRIPT, {"DATA_DIR": "data"})
    with contextlib.redirect_stdout(io.StringIO()):
        cfg, _ = compose(overrides)
    assert cfg.actor_rollout_ref.actor.optim.clip_grad == 1.0
    assert omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.optim).clip_grad == 1.0
    paper = (root / "recipe" / "rpg" / "config" / "paper" / "default.yaml").read_text()
    assert "grad_clip" not in paper
    with contextlib.redirect_stdout(io.StringIO()):  # the old key with the same value as clip_grad: nothing to say
        compose([*overrides, "actor_rollout_ref.actor.grad_clip=1.0"])
        compose([*overrides, "actor_rollout_ref.actor.optim.clip_grad=0.5", "actor_rollout_ref.actor.grad_clip=0.5"])


# ----------------------------------------------------------------------------- seq-mean-token-sum-norm's constant

NORM = "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"


def test_the_driver_sets_the_norm_scale_factor_to_the_response_length_and_says_so(capsys, tmp_path):
    """Unset, verl divides by each micro-batch's longest response (split-dependent: tests/verl/test_dp_equivalence.py's
    negative control); the driver (prepare_config, DRY_RUN too) writes data.max_response_length into it, one line."""
    from launching import launch as main

    code = main([SCRIPT, NORM, "data.max_response_length=1024"], {"DRY_RUN": "1", "DATA_DIR": str(tmp_path)})
    out = capsys.readouterr().out
    assert code == 0
    notes = [ln for ln in out.splitlines() if "loss_scale_factor unset" in ln]
    (note,) = notes
    assert note.startswith("rpg: ")
    names(note, "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
          "actor_rollout_ref.actor.loss_scale_factor", "data.max_response_length=1024")
    assert "  loss_scale_factor: 1024\n" in out  # the composed actor config verl's workers get


@pytest.mark.parametrize("extra, scale, message", [
    ([NORM, "actor_rollout_ref.actor.loss_scale_factor=16"], 16, None),  # the user's constant is kept
    ([], None, None),  # other modes: nothing set, nothing said
    ([NORM, "actor_rollout_ref.actor.loss_scale_factor=0"], None,
     "actor_rollout_ref.actor.loss_scale_factor=0 is invalid: expected a finite number > 0"),
])
def test_norm_scale_factor_rules(extra, scale, message):
    from rpg.verl.verl_rules import set_norm_scale_factor

    cfg, _ = apply(*extra)
    if message:
        with pytest.raises(RPGConfigError, match=f"^{message}$"):
            set_norm_scale_factor(cfg, use_critic=False)
        return
    assert set_norm_scale_factor(cfg, use_critic=False) == []
    assert cfg.actor_rollout_ref.actor.loss_scale_factor == scale


def test_a_critic_in_norm_mode_gets_the_constant_too():
    """verl's value loss aggregates with critic.loss_agg_mode / critic.loss_scale_factor (its own keys)."""
    from rpg.verl.verl_rules import set_norm_scale_factor

    cfg, _ = apply("critic.loss_agg_mode=seq-mean-token-sum-norm", "data.max_response_length=64")
    assert set_norm_scale_factor(cfg, use_critic=False) == []  # no critic built: nothing to do
    notes = set_norm_scale_factor(cfg, use_critic=True)
    assert len(notes) == 1 and notes[0].startswith("critic.loss_agg_mode=seq-mean-token-sum-norm with critic.")
    assert cfg.critic.loss_scale_factor == 64 and cfg.actor_rollout_ref.actor.loss_scale_factor is None
