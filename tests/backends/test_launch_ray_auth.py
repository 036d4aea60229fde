"""The Ray cluster of a run is not open to the network: by default Ray 2.60's daemons listen on every
interface, so every run's cluster runs in Ray's single-machine mode, every listener on loopback
(rpg.backends.run_env.RUN_ENV), and uses token authentication with a token of its own (``ray_auth_env``),
which also shuts out the other users of this machine.

Here: the environment every run gets. The running cluster seen from outside (no listener beyond loopback,
the GCS port unreachable through the machine's network address, a client without the run's token refused,
one with it let in) is checked on a real run's cluster, while it starts up:
``tests/e2e/test_cpu_e2e.py::test_a_runs_ray_cluster_refuses_a_client_without_its_token``.
"""

from __future__ import annotations

from rpg.trainer_process import build_command
from rpg.backends.run_env import ray_auth_env


def test_every_run_uses_ray_token_authentication_with_its_own_token(tmp_path):
    """Before: RAY_AUTH_MODE=disabled was forced on every run, even over a user's exported ``token``."""
    for base in ({}, {"RAY_AUTH_MODE": "token"}, {"RAY_AUTH_MODE": "TOKEN"}, {"RAY_AUTH_MODE": "tokne"}):
        _, env = build_command([], base_env={**base, "HOME": str(tmp_path)})
        env.update(ray_auth_env({**base, "HOME": str(tmp_path)}))
        assert env["RAY_AUTH_MODE"] == "token" and len(env["RAY_AUTH_TOKEN"]) == 64, base
    assert ray_auth_env({})["RAY_AUTH_TOKEN"] != ray_auth_env({})["RAY_AUTH_TOKEN"]  # one token per run
    # the user's own token (value or file) is kept; Ray's documented opt-out, spelled exactly, is honoured
    assert ray_auth_env({"RAY_AUTH_TOKEN": "mine"}) == {"RAY_AUTH_MODE": "token"}
    assert ray_auth_env({"RAY_AUTH_TOKEN_PATH": "/x"}) == {"RAY_AUTH_MODE": "token"}
    assert ray_auth_env({"RAY_AUTH_MODE": "disabled"}) == {"RAY_AUTH_MODE": "disabled"}
