"""``trainer.v1.trainer_mode=colocate_async`` in the driver, before Ray: what is accepted (and wired to the
workers), and every setting under which the loss would ignore the stale sampler mu, refused in one line."""

import contextlib
import io

import pytest
from messages import names

from rpg.config import RPGConfigError
from rpg.verl.block_checks import REFUSED_ASYNC

from recipe_config import apply

ASYNC = "trainer.v1.trainer_mode=colocate_async"


@pytest.mark.parametrize("extra", [[], ["rpg.loss.name=grpo_corrected"], ["rpg.reference.mode=fixed"],
                                   ["rpg.reference.mode=kl_threshold", "rpg.reference.kl_threshold=0.1"],
                                   ["rpg.loss.form=differentiable", "rpg.loss.clip=false"],
                                   ["algorithm.rollout_correction.bypass_mode=true"],
                                   ["rpg.loss.behavior_weight_cap=2.0", "rpg.loss.behavior_weight_level=sequence"]])
def test_colocate_async_is_accepted_and_turns_the_behaviour_weights_on(extra):
    cfg, settings = apply(ASYNC, *extra)
    assert cfg.actor_rollout_ref.actor.policy_loss.rpg_stale_sampler is True
    assert settings.loss.behavior_weight_cap == (2.0 if "rpg.loss.behavior_weight_cap=2.0" in extra else None)


def test_sync_mode_keeps_the_weights_off():
    cfg, _ = apply()
    assert cfg.actor_rollout_ref.actor.policy_loss.rpg_stale_sampler is False


def test_the_trainer_class_follows_the_mode():
    from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from rpg.verl.block_checks import TRAINER_MODES
    from rpg.verl.refill_limit import RefillLimitMixin
    from rpg.verl.async_resume import AsyncResumeMixin
    from rpg.verl.sample_order_and_lag import RunOrderMixin
    from rpg.verl.trainer import RPG_TRAINERS, RPGTrainerMixin

    assert set(RPG_TRAINERS) == set(TRAINER_MODES)
    assert issubclass(RPG_TRAINERS["sync"], PPOTrainerSync)
    cls = RPG_TRAINERS["colocate_async"]
    assert issubclass(cls, PPOTrainerColocateAsync) and not issubclass(cls, PPOTrainerSync)
    # RPG's hooks (the refill limit's and the run order's among them) first, then verl's colocate-async hooks
    # (nothing of the sync trainer in between)
    assert cls.__mro__[1:6] == (RPGTrainerMixin, RefillLimitMixin, RunOrderMixin, AsyncResumeMixin,
                                PPOTrainerColocateAsync)
    for hook in ("on_step_end", "on_sample_end", "on_train_begin", "get_llm_client"):
        assert getattr(cls, hook) is getattr(PPOTrainerColocateAsync, hook), hook


RC = "algorithm.rollout_correction"
REFUSED = [
    ([ASYNC, "rpg.optimizer=schedulefree"], "rpg.optimizer=schedulefree is not supported with trainer.v1.trainer_mode=colocate_async"),
    ([ASYNC, "actor_rollout_ref.rollout.calculate_log_probs=false"], "actor_rollout_ref.rollout.calculate_log_probs=False"),
    ([ASYNC, f"{RC}.rollout_is=token"], f"{RC}.rollout_is='token' with rpg.loss.name=rpg"),
    ([ASYNC, "rpg.loss.name=grpo_corrected", f"{RC}.rollout_is=sequence"], f"{RC}.rollout_is='sequence' with rpg.loss.name=grpo_corrected"),
    ([ASYNC, f"{RC}.rollout_rs=token_k1"], f"{RC}.rollout_rs='token_k1'"),
    ([ASYNC, "rpg.loss.name=verl", "actor_rollout_ref.actor.use_kl_loss=true"],
     "actor_rollout_ref.actor.use_kl_loss=True with rpg.loss.name=verl and trainer.v1.trainer_mode=colocate_async"),
    ([ASYNC, "rpg.loss.name=verl", "actor_rollout_ref.actor.use_kl_loss=true", f"{RC}.rollout_is=token"],
     "verl's KL loss term ignores the importance weights"),
    ([ASYNC, "rpg.loss.name=verl"], f"{RC}.rollout_is=null"),
    (["rpg.loss.behavior_weight_cap=2.0"], "rpg.loss.behavior_weight_cap=2.0 is only used with a stale sampler"),
    (["rpg.loss.behavior_weight_level=sequence"], "rpg.loss.behavior_weight_level='sequence' is only used with a stale sampler"),
    (["trainer.v1.trainer_mode=separate_async"], "actor_rollout_ref.rollout.checkpoint_engine.backend=naive with "
                                                 "trainer.v1.trainer_mode=separate_async on GPUs"),
    (["trainer.v1.trainer_mode=one_step_off_policy"], "rewrites the actor's loss_mode to bypass_mode"),
    (["trainer.v1.trainer_mode=fully_async_policy"], "rewrites the actor's loss_mode to bypass_mode"),
    (["trainer.v1.trainer_mode=turbo"], "trainer.v1.trainer_mode='turbo' is not supported by the RPG recipe; allowed: sync, colocate_async, separate_async"),
]


@pytest.mark.parametrize("overrides,message", REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_refused_before_ray_in_one_line(overrides, message):
    with pytest.raises(RPGConfigError) as err:
        apply(*overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_verl_loss_is_accepted_when_it_sees_mu():
    for extra in ([f"{RC}.rollout_is=token"], [f"{RC}.bypass_mode=true"]):
        cfg, _ = apply(ASYNC, "rpg.loss.name=verl", *extra)
        assert cfg.actor_rollout_ref.actor.policy_loss.get("rpg_stale_sampler", False) is False  # verl's own loss


SCRIPT = "run_rpg_4b_ctx2k_ufkl1e-4"


def _dry_run(capsys, tmp_path, *overrides):
    from launching import launch as main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([SCRIPT, *overrides], {"DRY_RUN": "1", "DATA_DIR": str(tmp_path)})
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("rpg.launch: warning:")]
    return code, out.getvalue(), err


def test_dry_run_of_a_4b_script_prints_the_async_settings(capsys, tmp_path):
    code, out, _ = _dry_run(capsys, tmp_path, ASYNC)
    assert code == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("rpg: loss="))
    names(line, "trainer=colocate_async", "warmup_batches=1", "max_off_policy=8 (drop)", "old_log_probs=recomputed")
    assert "behavior_weights=pi_old/mu per token, untruncated (exact)" in line


def test_the_uncorrected_level_is_described_as_dropped_weights():
    """behavior_weight_level=none is named for what it is in the driver's line (was: 'per none, untruncated (exact)')."""
    from recipe_config import apply

    from rpg.verl.run_banner import describe

    cfg, s = apply("trainer.v1.trainer_mode=colocate_async", "actor_rollout_ref.rollout.calculate_log_probs=True",
                   "rpg.loss.behavior_weight_level=none")
    line = describe(cfg, s)
    assert "behavior_weights=none (dropped: uncorrected, biased)" in line and "exact" not in line, line


@pytest.mark.parametrize("mode", sorted(REFUSED_ASYNC))
def test_dry_run_of_a_4b_script_refuses_the_gpu_async_modes(mode, capsys, tmp_path):
    code, _, err = _dry_run(capsys, tmp_path, f"trainer.v1.trainer_mode={mode}")
    assert code == 2
    assert len(err) == 1 and err[0].startswith(f"rpg config error: trainer.v1.trainer_mode={mode} is not supported"), err
    assert "GPU" in err[0]


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_an_asynchronous_run_that_finds_a_checkpoint_resumes_it(mode, capsys):
    """resume_mode=auto with a complete checkpoint (resolve_resume pins it as resume_path), and resume_path given by
    the user: both go on to verl in each asynchronous mode (the checkpoint's own checks:
    tests/verl/test_async_resume.py)."""
    from rpg.verl import main as M

    from recipe_config import SEPARATE_ASYNC_OK

    base = [ASYNC] if mode == "colocate_async" else SEPARATE_ASYNC_OK
    for extra in ([], ["trainer.resume_mode=resume_path", "trainer.resume_from_path=/x/global_step_2"]):
        cfg, settings = apply(*base, *extra)

        def fake_resolve(config):
            config.trainer.resume_mode = "resume_path"  # what rpg.verl.input_paths.resolve_resume does on a find
            return "resuming from /x/global_step_2"

        with pytest.MonkeyPatch.context() as mp:
            for name in ("check_input_paths", "check_run_names", "check_verl_rules", "check_verl_config"):
                mp.setattr(M, name, lambda *a, **k: None)
            mp.setattr(M, "validate_and_apply", lambda config: settings)
            mp.setattr(M, "resolve_resume", fake_resolve)
            M.prepare_config(cfg, check_node=False)
        assert "rpg: resuming from /x/global_step_2" in capsys.readouterr().out
