"""verl 0.9.1's v1 trainer asserts on keys a user sets, 30-50 s into a run, after Ray (its replay buffer, its engine
workers, the config dataclasses they build): each is refused by the driver before Ray in one line naming the key
and what is allowed (``rpg.verl.verl_rules``), under ``DRY_RUN=1`` too (exit 2)."""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from messages import names

from rpg.override_lists import values
from rpg.config import RPGConfigError
from rpg.backends.cpu.env_overrides import separate_async_overrides

from recipe_config import compose_cfg

ROOT = Path(__file__).resolve().parents[2]
S, R = "trainer.v1.sampler", "actor_rollout_ref.rollout"
# the tiny task's sizes on the CPU backend, one rank: runs in every mode (tests/verl/test_separate_async_driver.py)
SIZES = ["trainer.device=cpu", "trainer.n_gpus_per_node=1", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=8",
         "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.use_dynamic_bsz=false",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", f"{R}.log_prob_micro_batch_size_per_gpu=16",
         "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16", f"{R}.calculate_log_probs=True",
         f"{R}.tensor_model_parallel_size=1", f"{R}.name=hf"]  # as the CPU backend sets them (verl: TP 2, no name)
SYNC = ["trainer.v1.trainer_mode=sync", *SIZES]
SEPARATE = ["trainer.v1.trainer_mode=separate_async", *SIZES,
            *separate_async_overrides(values(["trainer.v1.trainer_mode=separate_async"]))]
COLOCATE = ["trainer.v1.trainer_mode=colocate_async", *SIZES]


def prepare(*overrides):
    """The driver's checks before Ray as DRY_RUN makes them (``rpg.launch.plan.compose``: no paths, no node). verl's
    platform here is CUDA's (no accelerator: its fallback), whose ``auto_set_device`` would turn trainer.device=cpu
    into cuda; a CPU-backend run imports verl on its CPU platform (VERL_PLATFORM=cpu), which leaves it."""
    import rpg.verl.main

    cfg = compose_cfg(*overrides)
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(io.StringIO()):
        mp.setattr(rpg.verl.main, "auto_set_device", lambda config: None)
        rpg.verl.main.prepare_config(cfg, check_paths=False, check_node=False)
    return cfg


THRESHOLD = f"{S}.max_off_policy_threshold=0 is invalid: expected an integer >= 1 or null"
HYBRID = (f"{R}.tensor_model_parallel_size=2 is invalid: expected sizes whose replica (tensor_model_parallel_size=2 x "
          "data_parallel_size=1 x pipeline_model_parallel_size=1 = 2 ranks) divides the trainer's 1 ranks "
          "(trainer.nnodes x trainer.n_gpus_per_node): verl builds the rollout replicas inside the trainer's ranks")
TWO_RANKS = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.n=4", f"{R}.log_prob_micro_batch_size_per_gpu=4",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4"]
# composed and checked as the driver does, each (the rpg: block translated again)
COMPOSED = [
    # the red team's three (verl/trainer/ppo/v1/replay_buffer.py:166 and :175, verl/workers/engine_workers.py:659)
    ([*SYNC, f"{S}.max_off_policy_threshold=0"], THRESHOLD),
    ([*SEPARATE, f"{S}.max_off_policy_threshold=0"], THRESHOLD),
    ([*COLOCATE, f"{S}.max_off_policy_strategy=dorp"],
     f"{S}.max_off_policy_strategy='dorp' is invalid: expected one of drop, wait (did you mean 'drop'?)"),
    ([*SEPARATE, f"{R}.tensor_model_parallel_size=2", f"{R}.n_gpus_per_node=2"], HYBRID),
    # the standalone pool's split, on the CPU backend too
    ([*SEPARATE, *TWO_RANKS, f"{R}.tensor_model_parallel_size=2"],
     f"{R}.nnodes=1 x {R}.n_gpus_per_node=1 = 1 GPUs with trainer.v1.trainer_mode=separate_async: the standalone "
     "rollout pool is split into replicas of tensor_model_parallel_size=2"),
    ([*SEPARATE, "reward.reward_model.enable=true"],
     "reward.reward_model.enable_resource_pool=False with trainer.v1.trainer_mode=separate_async and a reward model: "
     "verl does not colocate it in this mode"),
    ([*SYNC, "rpg.reference.mode=fixed", "actor_rollout_ref.ref.fsdp_config.strategy=fsdp9"],
     "actor_rollout_ref.ref: verl's config dataclass refused it (after Ray, otherwise): Error in call to target "
     "'verl.workers.config.engine.FSDPEngineConfig': AssertionError('strategy fsdp9 not supported')"),
]
# the sweep's others, each on the composed sync run with the keys set (rpg.verl.verl_rules: check_verl_rules, then
# check_verl_config as prepare_config calls them)
ON_SYNC = [
    ([f"{R}.tensor_model_parallel_size=2"], HYBRID),
    ([*TWO_RANKS, f"{R}.data_parallel_size=2", f"{R}.tensor_model_parallel_size=2"],
     f"{R}.tensor_model_parallel_size=2 is invalid: expected sizes whose replica (tensor_model_parallel_size=2 x "
     "data_parallel_size=2"),
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=null"],
     "algorithm.filter_groups.metric=None is invalid: expected a reward metric name (e.g. acc) with "
     "algorithm.filter_groups.enable=True"),
    (["algorithm.filter_groups.enable=true", "reward.reward_model.enable=true"],
     "algorithm.filter_groups.enable=True is invalid: expected False with a colocated reward model"),
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_inflight_gen_batches=0"],
     "algorithm.filter_groups.max_inflight_gen_batches=0 is invalid: expected an integer >= 1"),
    *[(["algorithm.filter_groups.enable=true", f"algorithm.filter_groups.max_num_gen_batches={v}"],
       f"algorithm.filter_groups.max_num_gen_batches={shown} is invalid: expected an integer >= 0: the generation "
       "batches of data.train_batch_size prompts DAPO's refills may dispatch per training batch (0: no limit)")
      for v, shown in (("-1", "-1"), ("2.5", "2.5"), ("true", "True"), ("twenty", "'twenty'"))],
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=accuracy"],
     "algorithm.filter_groups.metric='accuracy' is invalid: expected one of reward, score, acc, scorer_failed"),
    (["reward.reward_manager.name=dapo", "reward.reward_kwargs.overlong_buffer_cfg.enable=true",
      "reward.reward_kwargs.overlong_buffer_cfg.len=0"],
     "reward.reward_kwargs.overlong_buffer_cfg.len=0 is invalid: expected an integer >= 1"),
    (["reward.reward_manager.name=dapo", "reward.reward_kwargs.overlong_buffer_cfg.enable=true",
      "reward.reward_kwargs.overlong_buffer_cfg.len=100000"],
     "reward.reward_kwargs.overlong_buffer_cfg.len=100000 is invalid: expected at most "
     "reward.reward_kwargs.max_resp_len="),
    (["reward.reward_model.enable_resource_pool=true", "reward.reward_model.nnodes=1",
      "reward.reward_model.n_gpus_per_node=0"],
     "reward.reward_model.n_gpus_per_node=0 is invalid: expected an integer >= 1"),
    (["global_profiler.steps=[1]", "global_profiler.tool=nsys",
      "global_profiler.global_tool_config.nsys.worker_nsight_options=null"],
     "global_profiler.global_tool_config.nsys.worker_nsight_options=None is invalid: expected the workers' nsight "
     "options"),
    (["data.gen_batch_size=3"], "data.gen_batch_size=3 is invalid: expected a divisor of data.train_batch_size=8 (each "
                                "step fetches its prompts in whole gen_batch_size batches) or null"),
    (["trainer.v1.sync.parameter_sync_step=3"],
     "trainer.v1.sync.parameter_sync_step=3 is invalid: expected a divisor of data.train_batch_size=8"),
    ([f"{R}.log_prob_use_dynamic_bsz=true"], f"{R}.log_prob_use_dynamic_bsz=True is invalid: expected "
                                             "actor_rollout_ref.actor.use_dynamic_bsz=False"),
    (["actor_rollout_ref.actor.use_dynamic_bsz=true", f"{R}.log_prob_use_dynamic_bsz=true",
      f"{R}.log_prob_max_token_len_per_gpu=null"], f"{R}.log_prob_max_token_len_per_gpu=None is invalid: expected an "
                                                   "integer >= 1"),
    ([f"{R}.log_prob_micro_batch_size_per_gpu=null", f"{R}.log_prob_micro_batch_size=16"],
     f"{R}.log_prob_micro_batch_size_per_gpu=None is invalid: expected an integer >= 1 without "
     "actor_rollout_ref.actor.use_dynamic_bsz (verl's v1 engine worker reads it; the deprecated "
     "log_prob_micro_batch_size is not read)"),
    ([f"{R}.checkpoint_engine.backend=ncl"],
     f"{R}.checkpoint_engine.backend='ncl' is invalid: expected one of delta_sharded, kimi_ckpt_engine, mooncake, "
     "naive, nccl, nixl (did you mean 'nccl'?)"),
    # config dataclasses built after Ray (rpg.verl.verl_rules.worker_dataclasses)
    ([f"{R}.mode=sync"], f"{R}: verl's config dataclass refused it (after Ray, otherwise): Error in call to target "
                         "'verl.workers.config.rollout.RolloutConfig': ValueError(\"Rollout mode 'sync' has been "
                         "removed."),
    ([f"{R}.name=???"], f"{R}: verl's config dataclass refused it (after Ray, otherwise): Missing mandatory value: "
                        f"{R}.name"),
]
ON_SEPARATE = [
    (["trainer.v1.separate_async.hybrid_rollout.switch_threshold_ratio=0"],
     "trainer.v1.separate_async.hybrid_rollout: verl's config dataclass refused it (after Ray, otherwise): Error in "
     "call to target 'verl.trainer.config.config.HybridRolloutSwitchConfig': ValueError('switch_threshold_ratio must "
     "be in (0, 1], got 0"),
]


@functools.lru_cache(maxsize=None)
def _prepared(base: tuple[str, ...]):
    return prepare(*base)


def with_keys(base: list[str], overrides: list[str]):
    """The driver's verl rules on ``base`` (composed and checked once) with ``overrides``' values set: what
    ``prepare_config`` runs after the rpg: block (``check_verl_rules``, then ``check_verl_config``)."""
    from omegaconf import OmegaConf, open_dict
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    from rpg.verl.verl_rules import check_verl_config, check_verl_rules

    cfg = copy.deepcopy(_prepared(tuple(base)))
    with open_dict(cfg):
        for key, value in values(overrides).items():
            OmegaConf.update(cfg, key, value, force_add=True)
    check_verl_rules(cfg)
    check_verl_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


def _one_line(err, message: str) -> None:
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("overrides,message", COMPOSED, ids=[" ".join(o[len(SYNC):]) for o, _ in COMPOSED])
def test_each_rule_is_one_line_naming_the_key_and_what_is_allowed(overrides, message):
    with pytest.raises(RPGConfigError) as err:
        prepare(*overrides)
    _one_line(err, message)


@pytest.mark.parametrize("base,overrides,message", [(SYNC, o, m) for o, m in ON_SYNC] +
                         [(SEPARATE, o, m) for o, m in ON_SEPARATE],
                         ids=[" ".join(o) for o, _ in ON_SYNC + ON_SEPARATE])
def test_each_swept_rule_is_one_line_too(base, overrides, message):
    with pytest.raises(RPGConfigError) as err:
        with_keys(base, overrides)
    _one_line(err, message)


@pytest.mark.parametrize("base,overrides", [
    (SYNC, [f"{S}.max_off_policy_threshold=null", f"{S}.max_off_policy_strategy=wait", "+data.gen_batch_size=4",
            "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_inflight_gen_batches=2",
            "algorithm.filter_groups.max_num_gen_batches=20",
            "+trainer.v1.sync.parameter_sync_step=2", f"{R}.checkpoint_engine.backend=nccl"]),
    (SYNC, [*TWO_RANKS, f"{R}.tensor_model_parallel_size=2"]),
    (SEPARATE, [*TWO_RANKS, f"{R}.tensor_model_parallel_size=2", f"{R}.n_gpus_per_node=2"]),
    (COLOCATE, []),
], ids=["sync-values", "sync-tp2-of-2", "separate-tp2", "colocate"])
def test_each_rule_has_a_passing_neighbour(base, overrides):
    prepare(*base, *overrides)


def test_the_rules_restate_verls_own_values():
    """The allowed values are read from the installed verl where they live, or checked against its source here."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from rpg.verl.verl_rules import OFF_POLICY_STRATEGIES

    source = inspect.getsource(ReplayBuffer.__init__)
    assert f"self.max_off_policy_strategy in {json.dumps(list(OFF_POLICY_STRATEGIES))}" in source
    assert "self.max_off_policy_threshold > 0" in source


def test_dry_run_refuses_the_red_teams_typo_in_one_line(tmp_path):
    """``DRY_RUN=1`` of a paper script: was "validated", and a launch ended in an AssertionError in the TaskRunner
    after Ray."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATA_DIR", "TRAIN_FILE", "VAL_FILES", "RPG_BACKEND")}
    env.update(DRY_RUN="1", DATA_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, str(ROOT / "recipe/rpg/main_rpg.py"), "+experiment=run_grpo_7b",
                        f"{S}.max_off_policy_strategy=dorp"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("rpg config error:")]
    assert p.returncode == 2 and len(errors) == 1, p.stderr[-2000:]
    names(errors[0], f"{S}.max_off_policy_strategy='dorp'", "drop, wait", "'drop'?")
    assert "validated config" not in p.stdout


@pytest.mark.parametrize("overrides,warned", [
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=0"], True),
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=20"], False),
    (["algorithm.filter_groups.enable=false", "algorithm.filter_groups.max_num_gen_batches=0"], False),
], ids=["filter-no-limit", "filter-limit", "no-filter"])
def test_dapos_filter_without_a_limit_is_one_warning(overrides, warned, capsys):
    """verl's replay buffer refills DAPO's dropped groups without end; max_num_gen_batches=0 (no limit, the
    rpg.verl.refill_limit count) is allowed, said in one line before Ray."""
    prepare(*SYNC, *overrides)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "max_num_gen_batches" in ln]
    assert len(lines) == (1 if warned else 0), lines
    for line in lines:
        assert line.startswith("rpg: warning: ")
        names(line, "algorithm.filter_groups.max_num_gen_batches=0", "algorithm.filter_groups.enable=True",
              "algorithm.filter_groups.max_num_gen_batches=<n>")
