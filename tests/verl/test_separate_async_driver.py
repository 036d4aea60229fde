"""``trainer.v1.trainer_mode=separate_async`` before Ray: what the CPU and the GPU backend's launch set, what the driver
accepts (and wires: the stale-sampler weights, the trainer and worker classes), every paper script on GPUs with verl's
nccl engine, the per-token log-probs of verl's partial-rollout client, and each setting the recipe has not run,
refused in one line."""

from __future__ import annotations

import pytest

from rpg.backends.cpu import backend as cpu_backend
from rpg.backends.cpu import world
from rpg.backends.gpu import backend as gpu_backend
from rpg.backends.cpu.env_overrides import ENGINE_MODULE, ENGINE_NAME
from rpg.override_lists import values
from rpg.config import RPGConfigError

from recipe_config import SEPARATE_ASYNC as MODE, SEPARATE_ASYNC_CPU as CPU, SEPARATE_ASYNC_OK as OK, TINY_SIZES as SIZES
from recipe_config import apply
# on GPUs: the GPU launch's additions (verl's nccl engine) and a rollout pool of 2 GPUs (the user's to size)
GPU = ["trainer.device=cuda", *gpu_backend.mode_overrides(values([MODE])), "actor_rollout_ref.rollout.name=vllm",
       "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=2"]
GPU_OK = [MODE, *GPU, *SIZES]


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

    from rpg.verl.async_resume import AsyncResumeMixin
    from rpg.verl.refill_limit import RefillLimitMixin
    from rpg.verl.sample_order_and_lag import RunOrderMixin
    from rpg.verl.trainer import RPG_TRAINERS, RPGTrainerMixin
    from rpg.verl.worker import RPGActorRolloutRefWorker, RPGDetachActorWorker

    cls = RPG_TRAINERS["separate_async"]
    assert cls.__mro__[1:6] == (RPGTrainerMixin, RefillLimitMixin, RunOrderMixin, AsyncResumeMixin,
                                PPOTrainerSeparateAsync)
    assert cls.worker_cls is RPGDetachActorWorker
    assert issubclass(RPGDetachActorWorker, RPGActorRolloutRefWorker) and issubclass(RPGDetachActorWorker, DetachActorWorker)
    # the RPG loss install (init_model) and verl's pi_old restore are both there; the save is the copying one
    assert RPGDetachActorWorker.init_model is RPGActorRolloutRefWorker.init_model
    assert RPGDetachActorWorker.restore_model_from_cpu is DetachActorWorker.restore_model_from_cpu
    assert RPGDetachActorWorker.save_model_to_cpu is not DetachActorWorker.save_model_to_cpu


def test_the_gpu_launch_sets_verls_nccl_engine_and_leaves_the_pool_to_the_user():
    assert gpu_backend.mode_overrides(values([MODE])) == ["actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"]
    assert gpu_backend.mode_overrides(values([MODE, "actor_rollout_ref.rollout.checkpoint_engine.backend=x"])) == []
    assert gpu_backend.mode_overrides(values(["trainer.v1.trainer_mode=colocate_async"])) == []
    ov = values(gpu_backend.run_overrides({}, [MODE]))  # a harness run gets it too
    assert ov["actor_rollout_ref.rollout.checkpoint_engine.backend"] == "nccl"
    assert "actor_rollout_ref.rollout.nnodes" not in ov


@pytest.mark.parametrize("extra", [[], ["actor_rollout_ref.rollout.tensor_model_parallel_size=2"],
                                   ["actor_rollout_ref.rollout.nnodes=2", "actor_rollout_ref.rollout.n_gpus_per_node=4",
                                    "actor_rollout_ref.rollout.tensor_model_parallel_size=8"]])
def test_accepted_on_gpus_with_nccl_and_the_vllm_rollout(extra):
    cfg, _ = apply(*GPU_OK, *extra)
    assert cfg.actor_rollout_ref.actor.policy_loss.rpg_stale_sampler is True
    assert cfg.actor_rollout_ref.rollout.checkpoint_engine.backend == "nccl"


def test_every_paper_script_on_gpus_with_nccl_passes_or_is_refused_in_one_line():
    """Each paper run name composed on the GPU backend (its launch: verl's nccl engine; the paper setup:
    parameter_sync_step=16 = 512 / 32) with the documented settings (docs/launch-scripts.md, "Fully asynchronous
    runs on GPUs"): the RPG runs with AdamW pass every check before Ray; schedule-free runs and verl-loss baselines
    without a correction are refused, each with its reason."""
    import contextlib
    import io

    from launch_expected import ALL_ROWS
    from launching import ROOT as root, planned

    from rpg.launch.plan import compose

    user = [MODE, "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=8",
            "actor_rollout_ref.rollout.calculate_log_probs=True"]
    env = {"PATH": "", "HOME": str(root)}
    passed, failures = 0, []
    for row in ALL_ROWS:
        overrides = planned(row["name"], env, user, backend="gpu")
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                cfg, _ = compose(overrides)
        except RPGConfigError as e:
            line = str(e)
            if row["optimizer"] == "schedulefree":
                expected = "rpg.optimizer=schedulefree is not supported with trainer.v1.trainer_mode=separate_async"
            elif row["algo"] != "rpg":  # verl's own loss: its KL term or its loss ignores mu
                expected = "with rpg.loss.name=verl and trainer.v1.trainer_mode=separate_async"
                expected = expected if "use_kl_loss=True" in line else "rpg.loss.name=verl with trainer.v1"
            else:
                expected = "(an RPG run with AdamW passes)"
            if expected not in line or "\n" in line:
                failures.append(f"{row['name']}: {line}")
            continue
        if row["algo"] != "rpg" or row["optimizer"] != "adamw":
            failures.append(f"{row['name']}: passed, expected a refusal")
        rollout = cfg.actor_rollout_ref.rollout
        if (rollout.checkpoint_engine.backend, rollout.name, cfg.trainer.v1.separate_async.parameter_sync_step) != (
                "nccl", "vllm", 16):
            failures.append(f"{row['name']}: {rollout.checkpoint_engine.backend} {rollout.name}")
        passed += 1
    assert not failures, "\n".join(failures)
    assert passed == sum(row["algo"] == "rpg" and row["optimizer"] == "adamw" for row in ALL_ROWS) > 0


def test_partial_rollouts_keep_each_tokens_log_prob_from_the_policy_that_sampled_it(monkeypatch):
    """verl's client of the asynchronous trainers (``FullyAsyncLLMServerClient``) re-submits an aborted request
    (a weight sync mid-sequence) with the tokens so far and appends only the new tokens' log-probs, each from the
    server that sampled it: every token's rollout log-prob is log mu of the policy that generated it, so pi_old/mu
    per token stays exact across the update."""
    import asyncio
    from types import SimpleNamespace

    from verl.workers.rollout import llm_server
    from verl.workers.rollout.replica import TokenOutput

    prompt, calls = [7, 8], []
    # two policy versions: version 3 samples two tokens, is aborted by the sync, version 4 finishes
    scripted = [TokenOutput(token_ids=[1, 2], log_probs=[-0.1, -0.2], stop_reason="aborted",
                            extra_fields={"global_steps": 3}),
                TokenOutput(token_ids=[3, 4, 5], log_probs=[-1.3, -1.4, -1.5], stop_reason="completed",
                            extra_fields={"global_steps": 4})]

    async def server_generate(self, request_id, *, prompt_ids, sampling_params, **kw):
        calls.append((list(prompt_ids), dict(sampling_params)))
        return scripted[len(calls) - 1]

    async def no_wait(_):
        return None

    monkeypatch.setattr(llm_server.LLMServerClient, "generate", server_generate)
    monkeypatch.setattr(llm_server.asyncio, "sleep", no_wait)
    client = object.__new__(llm_server.FullyAsyncLLMServerClient)
    client.config = SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(response_length=8)))
    out = asyncio.run(client.generate("r", prompt_ids=prompt, sampling_params={"logprobs": 0}))
    assert [c[0] for c in calls] == [prompt, prompt + [1, 2]]  # resumed after the tokens already sampled
    assert calls[1][1]["max_tokens"] == 6  # the budget counts them
    assert out.token_ids == [1, 2, 3, 4, 5] and out.log_probs == [-0.1, -0.2, -1.3, -1.4, -1.5]
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (3, 4)


REFUSED = [
    ([MODE, "trainer.device=cpu", *SIZES], "actor_rollout_ref.rollout.checkpoint_engine.backend=naive"),
    ([MODE, *SIZES], "actor_rollout_ref.rollout.checkpoint_engine.backend=naive with "
                     "trainer.v1.trainer_mode=separate_async on GPUs"),
    ([*GPU_OK, "actor_rollout_ref.rollout.checkpoint_engine.backend=nixl"], "allowed: nccl"),
    ([*GPU_OK, "actor_rollout_ref.rollout.nnodes=0"], "actor_rollout_ref.rollout.nnodes=0 with"),
    ([*GPU_OK, "actor_rollout_ref.rollout.tensor_model_parallel_size=4", "actor_rollout_ref.rollout.n_gpus_per_node=6"],
     "= 6 GPUs with trainer.v1.trainer_mode=separate_async: the standalone rollout pool is split into replicas"),
    ([*GPU_OK, "actor_rollout_ref.rollout.nnodes=2", "actor_rollout_ref.rollout.n_gpus_per_node=3",
      "actor_rollout_ref.rollout.tensor_model_parallel_size=2"], "actor_rollout_ref.rollout.n_gpus_per_node=3 with"),
    ([*GPU_OK, "actor_rollout_ref.rollout.name=hf"], "actor_rollout_ref.rollout.name=hf with "
                                                     "trainer.v1.trainer_mode=separate_async on GPUs"),
    ([*GPU_OK, "data.train_batch_size=16"], "; set parameter_sync_step=8"),
    ([*GPU_OK, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64"],
     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64 with"),
    ([*GPU_OK, "rpg.optimizer=schedulefree"], "validation switch pushes the averaged weights x to the hybrid replicas "
                                              "only"),
    ([*OK, "trainer.device=npu"], "trainer.device=npu with trainer.v1.trainer_mode=separate_async"),
    ([MODE, "trainer.device=cpu", *SIZES], "actor_rollout_ref.rollout.checkpoint_engine.backend=naive"),
    ([*OK, "actor_rollout_ref.rollout.nnodes=0"], "actor_rollout_ref.rollout.nnodes=0 with"),
    ([*OK, "actor_rollout_ref.actor.ppo_mini_batch_size=4"], "data.train_batch_size=8 with"),
    *(([*OK, f"trainer.v1.separate_async.parameter_sync_step={k}"],  # was "one weight sync every 0 updates"
       f"trainer.v1.separate_async.parameter_sync_step={k} with trainer.v1.trainer_mode=separate_async: the optimizer "
       "updates between two weight syncs, an integer >= 1 (data.train_batch_size=8 / "
       "actor_rollout_ref.actor.ppo_mini_batch_size=2); set parameter_sync_step=4") for k in ("0", "-4", "True")),
    ([*OK, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64"],
     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64 with"),
    ([*OK, "actor_rollout_ref.hybrid_engine=False"], "actor_rollout_ref.hybrid_engine=False with"),
    ([*OK, "trainer.v1.separate_async.hybrid_rollout.enable_switch=True"], "enable_switch=True with"),
    ([*OK, "actor_rollout_ref.rollout.name=vllm"], "with trainer.v1.trainer_mode=separate_async on the CPU backend "
                                                   "is not supported by the recipe: its standalone vLLM replicas were "
                                                   "never run in the vLLM-CPU environment"),
    ([*OK, "rpg.optimizer=schedulefree"], "rpg.optimizer=schedulefree is not supported with trainer.v1.trainer_mode=separate_async"),
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
