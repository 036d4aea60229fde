"""A paper run's vLLM start is never silent (rpg.backends.run_env.vllm_log_env): every Ray process of the run, on
every node, gets VLLM_LOGGING_LEVEL=INFO through ray_init's runtime env (verl sets WARN otherwise), a user's value
kept; the GPU backend's own runs (the smoke run) too."""

from __future__ import annotations

from pathlib import Path

from launching import env as _env

from rpg.backends.gpu.env_overrides import gpu_env, gpu_forwarded_overrides
from rpg.launch.environment import Request
from rpg.launch.experiments import find
from rpg.launch.plan import plan
from rpg.override_lists import values

ROOT = Path(__file__).resolve().parents[2]
PAPER = "run_rpg_7b_ufkl1e-4"
KEY = "ray_kwargs.ray_init.runtime_env.env_vars.VLLM_LOGGING_LEVEL"


def test_a_paper_run_logs_vllms_start_at_info_on_every_node_unless_the_user_sets_a_level():
    exp = find(PAPER)
    assert values(plan(exp, Request.read(_env(), ROOT), []))[KEY] == "INFO"
    assert values(plan(exp, Request.read(_env(VLLM_LOGGING_LEVEL="DEBUG"), ROOT), []))[KEY] == "DEBUG"


def test_the_gpu_backends_runs_log_vllms_start_at_info_unless_the_user_sets_a_level():
    env = gpu_env([], base={})
    assert env["VLLM_LOGGING_LEVEL"] == "INFO"
    assert values(gpu_forwarded_overrides(env))[KEY] == "INFO"
    assert "VLLM_LOGGING_LEVEL" not in gpu_env([], base={"VLLM_LOGGING_LEVEL": "DEBUG"})  # the user's stays
