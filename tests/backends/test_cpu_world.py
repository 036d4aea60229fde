"""World size of a CPU run (rpg.backends.cpu.world): the local Ray's logical GPUs follow trainer.nnodes x
trainer.n_gpus_per_node on every CPU path (harness, tiny demo, launcher), and a world size this machine or the
batch sizes cannot serve is one line before Ray. No processes: the e2e runs are in the distributed stage."""

from __future__ import annotations

import pytest
from messages import names, one_line
from omegaconf import OmegaConf

from rpg.backends.cpu import env_overrides, world
from rpg.config import RPGConfigError
from rpg.trainer_process import build_command
from rpg.override_lists import values


def _ray(argv):
    v = values([a for a in argv if "=" in a and not a.startswith("-")])
    return v["trainer.nnodes"], v["trainer.n_gpus_per_node"], v["ray_kwargs.ray_init.num_gpus"], v["ray_kwargs.ray_init.num_cpus"]


def test_ray_resources_scale_with_the_world_size():
    assert world.ray_resources(1, 1) == {"num_gpus": 1, "num_cpus": 8}  # the backend's earlier fixed values
    assert world.ray_resources(1, 2) == {"num_gpus": 2, "num_cpus": 11}  # one {"CPU": 3, "GPU": 1} bundle per rank
    assert world.ray_resources(2, 4) == {"num_gpus": 8, "num_cpus": 29}
    ov = env_overrides.cpu_overrides(env_overrides.cpu_env(base={}), nnodes=2, n_gpus_per_node=2)
    assert _ray(ov) == (2, 2, 4, 17)


@pytest.mark.parametrize("user, expected", [
    ([], (1, 1, 1, 8)),
    (["trainer.n_gpus_per_node=2"], (1, 2, 2, 11)),  # before: Ray kept 1 GPU and verl refused inside Ray
    (["trainer.nnodes=2", "trainer.n_gpus_per_node=2"], (2, 2, 4, 17)),
    (["trainer.n_gpus_per_node=2", "+ray_kwargs.ray_init.num_gpus=3"], (1, 2, 3, 11)),  # an explicit value wins
    (["trainer.n_gpus_per_node=two"], (1, "two", 1, 8)),  # left to the driver's one line
])
def test_harness_gives_ray_the_world_size_of_the_overrides(user, expected):
    argv, _ = build_command(user, base_env={})
    assert _ray(argv) == expected


def test_world_size_problem_names_the_keys():
    assert world.world_size_problem({"trainer.n_gpus_per_node": 2}, total_gib=24) is None
    assert world.world_size_problem({}, total_gib=24) is None
    line = world.world_size_problem({"trainer.nnodes": 2, "trainer.n_gpus_per_node": 16}, total_gib=24)
    names(one_line(line), "trainer.nnodes=2", "trainer.n_gpus_per_node=16", "32", "allowed world size 1..21")
    assert world.max_world_size(24) == 21 and world.host_ram_gib(21) <= 24 < world.host_ram_gib(22)
    line = world.world_size_problem({"trainer.n_gpus_per_node": 2, "ray_kwargs.ray_init.num_gpus": 1}, total_gib=24)
    assert line.startswith("ray_kwargs.ray_init.num_gpus=1 is below the world size") and "\n" not in line
    assert "trainer.n_gpus_per_node=0 is invalid" in world.world_size_problem({"trainer.n_gpus_per_node": 0})
    assert "trainer.nnodes=True is invalid" in world.world_size_problem({"trainer.nnodes": True})


def _cfg(**trainer):
    return OmegaConf.create({"trainer": {"device": "cpu", "nnodes": 1, "n_gpus_per_node": 1, **trainer},
                             "ray_kwargs": {"ray_init": {"num_cpus": None}}})


def test_driver_check_refuses_before_ray_on_cpu_only():
    world.check_world_fits(_cfg(n_gpus_per_node=2), environ={})
    with pytest.raises(RPGConfigError, match=r"= 4096 FSDP ranks on the CPU backend need about"):
        world.check_world_fits(_cfg(n_gpus_per_node=4096), environ={})
    world.check_world_fits(_cfg(n_gpus_per_node=4096, device="cuda"), environ={})  # the GPU path has its own checks
    # joining a cluster: it places the ranks (this machine's RAM does not bound them); the integer rule holds
    world.check_world_fits(_cfg(n_gpus_per_node=4096), environ={"RAY_ADDRESS": "127.0.0.1:6379"})
    with pytest.raises(RPGConfigError, match="trainer.nnodes=0 is invalid"):
        world.check_world_fits(_cfg(nnodes=0), environ={"RAY_ADDRESS": "127.0.0.1:6379"})


def test_tiny_task_splits_its_micro_batches_over_the_ranks(tmp_path):
    from rpg.tiny.build import TinyAssets
    from rpg.tiny.overrides import tiny_task_overrides

    for w, (micro, log_prob) in {1: (16, 64), 2: (8, 32), 4: (4, 16), 16: (1, 4)}.items():
        ov = values(tiny_task_overrides(TinyAssets.at(tmp_path), world_size=w))
        assert (ov["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"],
                ov["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"],
                ov["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"]) == (micro, log_prob, log_prob)
    with pytest.raises(ValueError, match="world size 3 .* allowed 1, 2, 4, 8, 16$"):
        tiny_task_overrides(TinyAssets.at(tmp_path), world_size=3)


@pytest.mark.parametrize("argv", [["--gpus", "3"], ["trainer.n_gpus_per_node=3"], ["--gpus", "2", "trainer.nnodes=0"]])
def test_tiny_demo_refuses_a_world_size_it_cannot_split_in_one_line(argv, capsys, monkeypatch):
    import rpg.tiny

    monkeypatch.setattr(rpg.tiny, "build_tiny_assets", lambda: pytest.fail("assets built before the check"))
    from rpg_lab.demo.cpu import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("[tiny] ") and "trainer." in err


def test_launcher_cpu_world_size_from_the_environment(tiny_assets, tmp_path):
    from launching import planned

    from rpg.launch.environment import LaunchError

    env = {"PATH": "/usr/bin"}
    for extra_env, user, (nnodes, gpus, micro) in [
        ({}, [], (1, 1, 16)),  # the GPU default of 8 ranks per node is not the CPU backend's
        ({"N_GPUS_PER_NODE": "2"}, [], (1, 2, 8)),
        ({"N_GPUS_PER_NODE": "2", "NNODES": "2"}, [], (2, 2, 4)),
        ({"N_GPUS_PER_NODE": "2"}, ["trainer.n_gpus_per_node=4"], (1, 4, 4)),  # the user's override wins
    ]:
        ov = planned("run_grpo_7b", {**env, **extra_env}, user, cwd=tmp_path, backend="cpu")
        argv, _ = build_command(ov, base_env={})
        got = values(argv[3:])
        assert (got.get("trainer.nnodes"), got.get("trainer.n_gpus_per_node"),
                got["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"]) == (nnodes, gpus, micro)
        assert got["ray_kwargs.ray_init.num_gpus"] == nnodes * gpus
    with pytest.raises(LaunchError, match="world size 3"):
        planned("run_grpo_7b", {**env, "N_GPUS_PER_NODE": "3"}, [], cwd=tmp_path, backend="cpu")


def test_verl_rules_refuse_a_world_size_that_is_not_a_positive_integer():
    from rpg.verl.verl_rules import check_verl_rules

    cfg = OmegaConf.create({
        "trainer": {"nnodes": 1, "n_gpus_per_node": 0, "total_training_steps": 2, "total_epochs": 1,
                    "logger": ["console"]},
        "data": {"train_batch_size": 8},
        "actor_rollout_ref": {"rollout": {"n": 4}, "actor": {"ppo_mini_batch_size": 2, "ppo_epochs": 1,
                                                              "optim": {"lr": 1e-6, "clip_grad": 1.0}}},
    })
    with pytest.raises(RPGConfigError, match=r"^trainer.n_gpus_per_node=0 is invalid: expected an integer >= 1$"):
        check_verl_rules(cfg)
