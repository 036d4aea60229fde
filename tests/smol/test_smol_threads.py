"""SmolLM2's torch threads per Ray process (rpg.smol.overrides.omp_threads, CpuModel.run_env): every core in the sync
trainer, where its phases run one after another; one in the modes where rollout and training overlap; the user's
OMP_NUM_THREADS wins; the tiny model keeps the CPU backend's one thread."""

import os

import pytest

from rpg.launch.rehearsal import CpuModel
from rpg.smol.overrides import omp_threads


@pytest.mark.parametrize("mode, world, cores, expected", [
    (None, 1, 2, 2), ("sync", 1, 2, 2), ("sync", 1, 16, 16), ("sync", 2, 2, 1), ("sync", 4, 16, 4), ("sync", 3, 2, 1),
    ("colocate_async", 1, 2, 1), ("separate_async", 1, 16, 1),
])
def test_threads_by_trainer_mode_and_world_size(mode, world, cores, expected):
    assert omp_threads(cores, mode, world) == expected


def test_run_env_sets_the_threads_of_a_smol_run_from_its_overrides():
    cores = len(os.sched_getaffinity(0))
    smol = CpuModel("smol")
    assert smol.run_env([], base={}) == {"OMP_NUM_THREADS": str(cores)}
    assert smol.run_env(["trainer.v1.trainer_mode=colocate_async"], base={}) == {"OMP_NUM_THREADS": "1"}
    assert smol.run_env(["trainer.nnodes=1", f"trainer.n_gpus_per_node={cores}"], base={}) == {"OMP_NUM_THREADS": "1"}


def test_the_users_threads_win_and_the_tiny_model_and_the_vllm_rollout_set_none():
    assert CpuModel("smol").run_env([], base={"OMP_NUM_THREADS": "3"}) == {}
    assert CpuModel("smol").run_env([], base={"RPG_CPU_ROLLOUT": "vllm"}) == {}
    assert CpuModel("tiny").run_env([], base={}) == {}


def test_the_backends_environment_forwards_the_runs_threads():
    """What run_env returns reaches every Ray process: the CPU backend's environment takes OMP_NUM_THREADS from
    the run's environment (and forwards it through ray_init.runtime_env, cpu_overrides)."""
    from rpg.backends.cpu.env_overrides import cpu_env, cpu_overrides

    env = cpu_env(base={"OMP_NUM_THREADS": "2"})
    assert env["OMP_NUM_THREADS"] == "2"
    assert "+ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS='2'" in cpu_overrides(env)
