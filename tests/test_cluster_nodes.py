"""A run on a real cluster, what a loopback test cannot show (issue 46): the job's stop time, the folders and files
every node must see, the nodes' addresses. Mechanisms are tested on this machine; Ray's own code is called where it
decides (the supervisor's runtime env), its installed source read where only its process does (the stop wait)."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import pytest

from rpg.launch.commands import STOP_WAIT_S, STOP_WAIT_VAR, ray_command
from rpg.launch.plan import plan_overrides
from rpg.launch.request import LaunchError, LaunchRequest
from rpg.launch.variants import parse

ROOT = Path(__file__).resolve().parents[1]


def _job_env_vars(**env) -> dict:
    env = {"PATH": os.environ.get("PATH", ""), "RAY_ADDRESS": "http://127.0.0.1:8265", **env}
    ov, job_env = plan_overrides(parse("run_grpo_7b"), env, [], root=ROOT, cwd=ROOT)
    cmd = ray_command(ov, LaunchRequest.read(env, ROOT, ROOT), job_env)
    return json.loads(cmd[cmd.index("--runtime-env-json") + 1])["env_vars"]


def test_a_job_gives_its_driver_time_to_print_its_stop_line():
    """``ray job stop``: SIGTERM, then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S (Ray's default 3 s); the job's runtime
    env sets it, Ray's job manager hands the job's variables to the supervisor, whose stop reads it from its env."""
    from ray.dashboard.modules.job.job_manager import JobManager
    from ray.dashboard.modules.job.job_supervisor import JobSupervisor

    env_vars = _job_env_vars()
    assert env_vars[STOP_WAIT_VAR] == str(STOP_WAIT_S) and STOP_WAIT_S > JobSupervisor.DEFAULT_RAY_JOB_STOP_WAIT_TIME_S
    supervisor_env = JobManager._get_supervisor_runtime_env(JobManager.__new__(JobManager), {"env_vars": env_vars},
                                                            "raysubmit_test", False)
    assert supervisor_env["env_vars"][STOP_WAIT_VAR] == str(STOP_WAIT_S)
    stop = inspect.getsource(JobSupervisor.run)
    assert 'os.environ.get(\n                                "RAY_JOB_STOP_WAIT_TIME_S"' in stop  # Ray 2.60's read


def test_a_stop_wait_the_user_exported_is_passed_on_and_a_bad_one_refused():
    assert _job_env_vars(RAY_JOB_STOP_WAIT_TIME_S="300")[STOP_WAIT_VAR] == "300"
    with pytest.raises(LaunchError, match=r"^RAY_JOB_STOP_WAIT_TIME_S='soon' is invalid; expected a positive integer$"):
        _job_env_vars(RAY_JOB_STOP_WAIT_TIME_S="soon")
