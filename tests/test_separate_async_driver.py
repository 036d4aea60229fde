"""``trainer.v1.trainer_mode=separate_async`` before Ray: what the CPU backend's launch sets, what the driver accepts
(and wires: the stale-sampler weights, the trainer and worker classes), and each setting the recipe has not run,
refused in one line."""

from __future__ import annotations

import pytest

from rpg.backends.cpu import backend as cpu_backend
from rpg.backends.cpu import world
from rpg.backends.cpu.settings import ENGINE_MODULE, ENGINE_NAME, separate_async_overrides
from rpg.common.overrides import values
from rpg.config import RPGConfigError

from test_verl_config import apply

MODE = "trainer.v1.trainer_mode=separate_async"
CPU = ["trainer.device=cpu", *separate_async_overrides(values([MODE]))]
# the tiny task's sizes: 8 prompts = 4 mini-batches of 2, 8 responses each, log-probs per mini-batch
SIZES = ["trainer.n_gpus_per_node=1", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=8",
         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
         "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
         "actor_rollout_ref.rollout.calculate_log_probs=True"]
OK = [MODE, *CPU, *SIZES]


def test_the_cpu_launch_sets_the_weight_sync_and_sizes_ray_for_both_pools():
    ov = values(cpu_backend.run_overrides({}, [MODE]))
    assert ov["actor_rollout_ref.rollout.checkpoint_engine.backend"] == ENGINE_NAME
    assert ov["actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module"] == ENGINE_MODULE
    assert (ov["actor_rollout_ref.rollout.nnodes"], ov["actor_rollout_ref.rollout.n_gpus_per_node"]) == (1, 1)
    assert ov["ray_kwargs.ray_init.num_gpus"] == 2  # one trainer rank + one standalone rollout rank
    assert ov["ray_kwargs.ray_init.num_cpus"] == world.ray_resources(1, 1)["num_cpus"] + 2
    # a pool the user names wins, and sizes Ray; other modes keep naive and one pool
    ov = values(cpu_backend.run_overrides({}, [MODE, "actor_rollout_ref.rollout.n_gpus_per_node=2",
                                               "trainer.n_gpus_per_node=2"]))
    assert ov["ray_kwargs.ray_init.num_gpus"] == 4 and "actor_rollout_ref.rollout.n_gpus_per_node" not in ov
    ov = values(cpu_backend.run_overrides({}, ["trainer.v1.trainer_mode=colocate_async"]))
    assert ov["actor_rollout_ref.rollout.checkpoint_engine.backend"] == "naive" and ov["ray_kwargs.ray_init.num_gpus"] == 1


def test_the_world_check_counts_the_rollout_pool():
    cfg = {"trainer.v1.trainer_mode": "separate_async", "actor_rollout_ref.rollout.nnodes": 1,
           "actor_rollout_ref.rollout.n_gpus_per_node": 1}
    assert world.world_size_problem({**cfg, "ray_kwargs.ray_init.num_gpus": 2}, total_gib=64) is None
    line = world.world_size_problem({**cfg, "ray_kwargs.ray_init.num_gpus": 1}, total_gib=64)
    assert "standalone rollout pool" in line and ">= 2" in line and "\n" not in line
    assert world.host_ram_gib(1, 1) == world.host_ram_gib(1) + world.ROLLOUT_RANK_GIB
    line = world.world_size_problem({**cfg, "actor_rollout_ref.rollout.nnodes": 0}, total_gib=64)
    assert line.startswith("actor_rollout_ref.rollout.nnodes=0 is invalid")


@pytest.mark.parametrize("extra", [[], ["rpg.loss.name=grpo_corrected"], ["rpg.reference.mode=fixed"],
                                   ["rpg.reference.mode=periodic", "rpg.reference.update_every=2"],
                                   ["rpg.reference.mode=kl_threshold", "rpg.reference.kl_threshold=0.1"],
                                   ["rpg.loss.form=differentiable", "rpg.loss.divergence=urkl"],
                                   ["algorithm.rollout_correction.bypass_mode=true"],
                                   ["trainer.v1.separate_async.parameter_sync_step=2",
                                    "actor_rollout_ref.actor.ppo_mini_batch_size=4"]])
def test_accepted_on_the_cpu_backend_with_the_behaviour_weights(extra):
    cfg, _ = apply(*OK, *extra)
    assert cfg.actor_rollout_ref.actor.policy_loss.rpg_stale_sampler is True


def test_the_trainer_and_worker_of_the_mode():
    from verl.experimental.separation.engine_workers import DetachActorWorker
    from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync

    from rpg.verl.trainer import RPG_TRAINERS, RPGTrainerMixin
    from rpg.verl.worker import RPGActorRolloutRefWorker, RPGDetachActorWorker

    cls = RPG_TRAINERS["separate_async"]
    assert cls.__mro__[1:3] == (RPGTrainerMixin, PPOTrainerSeparateAsync)
    assert cls.worker_cls is RPGDetachActorWorker
    assert issubclass(RPGDetachActorWorker, RPGActorRolloutRefWorker) and issubclass(RPGDetachActorWorker, DetachActorWorker)
    # the RPG loss install (init_model) and verl's pi_old restore are both there; the save is the copying one
    assert RPGDetachActorWorker.init_model is RPGActorRolloutRefWorker.init_model
    assert RPGDetachActorWorker.restore_model_from_cpu is DetachActorWorker.restore_model_from_cpu
    assert RPGDetachActorWorker.save_model_to_cpu is not DetachActorWorker.save_model_to_cpu


REFUSED = [
    ([MODE, *SIZES], "trainer.v1.trainer_mode=separate_async is supported on the CPU backend only"),
    ([MODE, "trainer.device=cpu", *SIZES], "actor_rollout_ref.rollout.checkpoint_engine.backend=naive"),
    ([*OK, "actor_rollout_ref.rollout.nnodes=0"], "actor_rollout_ref.rollout.nnodes=0 with"),
    ([*OK, "actor_rollout_ref.actor.ppo_mini_batch_size=4"], "data.train_batch_size=8 with"),
    ([*OK, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64"],
     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64 with"),
    ([*OK, "actor_rollout_ref.hybrid_engine=False"], "actor_rollout_ref.hybrid_engine=False with"),
    ([*OK, "trainer.v1.separate_async.hybrid_rollout.enable_switch=True"], "enable_switch=True with"),
    ([*OK, "actor_rollout_ref.rollout.name=vllm"], "actor_rollout_ref.rollout.name=vllm with"),
    ([*OK, "rpg.optimizer=schedulefree"], "rpg.optimizer=schedulefree is not supported with trainer.v1.trainer_mode=separate_async"),
    ([*OK, "trainer.resume_mode=resume_path"], "trainer.resume_mode=resume_path is not supported with"),
    ([*OK, "actor_rollout_ref.rollout.calculate_log_probs=False"], "calculate_log_probs=False"),
    ([*OK, "algorithm.rollout_correction.rollout_is=token"], "rollout_is='token' with rpg.loss.name=rpg"),
]


@pytest.mark.parametrize("overrides,message", REFUSED, ids=[o[-1] for o, _ in REFUSED])
def test_refused_before_ray_in_one_line(overrides, message):
    with pytest.raises(RPGConfigError) as err:
        apply(*overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_tiny_task_computes_log_probs_per_mini_batch_in_this_mode(world_size, tmp_path):
    from rpg.tiny.build import TinyAssets
    from rpg.tiny.overrides import MINI_BATCH_SIZE, ROLLOUT_N, TRAIN_BATCH_SIZE, tiny_task_overrides

    key = "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
    assets = TinyAssets.at(tmp_path)
    sync = values(tiny_task_overrides(assets, world_size=world_size))
    sep = values(tiny_task_overrides(assets, world_size=world_size, trainer_mode="separate_async"))
    assert sync[key] == TRAIN_BATCH_SIZE * ROLLOUT_N // world_size
    assert sep[key] == sep["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"] == MINI_BATCH_SIZE * ROLLOUT_N // world_size
    assert {k: v for k, v in sync.items() if "log_prob" not in k} == {k: v for k, v in sep.items() if "log_prob" not in k}
