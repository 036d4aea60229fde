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


def test_the_trainer_command_forwards_the_runs_threads_to_every_ray_process():
    """What run_env returns, given to the harness as the run's environment (run_trainer's env), is the trainer's
    OMP_NUM_THREADS and reaches every Ray process through ray_init.runtime_env."""
    from rpg.trainer_process import build_command

    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "RPG_CPU_ROLLOUT")}
    run_env = CpuModel("smol").run_env([], base=base)
    argv, env = build_command([], entry="recipe/rpg/main_rpg.py", base_env={**base, **run_env}, backend="cpu")
    cores = str(len(os.sched_getaffinity(0)))
    assert env["OMP_NUM_THREADS"] == cores
    assert f"+ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS='{cores}'" in argv
