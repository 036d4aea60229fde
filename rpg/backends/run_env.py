"""The environment of a trainer run started on this machine, whatever the backend (rpg.trainer_process).

* ``RUN_ENV``: variables every local run sets (Ray on loopback only, no tokenizer threads, no usage stats,
  Hydra's full errors in the trainer's log);
* ``wandb_env``: W&B as the user asked (their ``WANDB_MODE``, and ``trainer.logger``), else off;
* ``ray_auth_env``: Ray token authentication for the run's own cluster, with a token of its own;
* ``vllm_log_env``: vLLM's start-up logged at INFO in every GPU run (the GPU backend's runs, the paper's runs);
* ``external_modules``: the ``VERL_USE_EXTERNAL_MODULES`` list (modules ``import verl`` loads in every
  process), a backend's registration first;
* ``forwarded_env_overrides``: hand environment variables to every Ray process explicitly (Ray workers on
  this node inherit the driver's environment; the forward keeps it right when they do not, e.g. on a
  pre-started cluster).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping

from rpg.override_lists import hydra_value

EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"  # verl/__init__.py imports the modules it lists, in every process

# No Python workers started ahead of the first driver: Ray starts one per logical CPU of the cluster
# (``--num_prestart_python_workers``, ray/_private/services.py), each importing Ray, and verl's actors, whose
# runtime environment differs, never take them; each run then starts only the workers it uses.
NO_PRESTART_ENV = {"RAY_prestart_worker_first_driver": "0"}

# Ray's metrics off and its agent's node report once a minute, where nobody reads them: the CPU backend's runs (a
# private Ray without its dashboard; rpg.backends.cpu.env_overrides.cpu_env, a user's value wins; not a job on a
# cluster, whose nodes' settings decide) and the tests' loopback clusters (tests/support/multinode.py). Every Ray
# process exports its metrics to its node's agent every 10 s, and the agent reads every process's stats for its report
# every 5 s: measured on the 2-core machines, a two-node run took 220 CPU-seconds with them and 164 without
# (2026-11-29), a local 6-step tiny run 156 and 146 (rpg_lab.demo.cpu, 2026-11-30, one after the other, with Ray's task
# events and event statistics off as well). The GPU backend keeps them (a GPU cluster's dashboard reads them).
QUIET_RAY_ENV = {"RAY_enable_metrics_collection": "0", "REPORTER_UPDATE_INTERVAL_MS": "60000"}

# Every local run of the trainer (the CPU backend, and the GPU smoke run of rpg_lab.demo.gpu_smoke).
RUN_ENV = {
    # Ray's single-machine mode: with ENABLE_RAY_CLUSTER off, ``ray._private.services.get_node_ip_address``
    # answers the loopback address, and every process of the run's cluster (GCS, raylet, workers, the
    # dashboard and runtime-env agents, the autoscaler's and the agents' Prometheus exporters) binds to it
    # instead of ``*``/the node's address (measured with Ray 2.60: no listener of the run left on a
    # non-loopback address). Ray reads it only there and in ``ray start`` (which then refuses to join a
    # multi-node cluster); a local run starts a private cluster of its own (rpg.trainer_process), so nothing
    # else changes. The token (``ray_auth_env``) stays on as well: other users of this machine reach loopback.
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
    "HYDRA_FULL_ERROR": "1",
    **NO_PRESTART_ENV,
}


# The network interfaces of a multi-node run, forwarded to a Ray job when set (rpg.launch.environment.FORWARD_ENV):
# torch's gloo groups (verl's ``cpu:gloo``) bind to the address the hostname resolves to unless GLOO_SOCKET_IFNAME
# names an interface (on many images the hostname resolves to 127.0.1.1: ranks on other nodes cannot connect);
# NCCL picks its interfaces and InfiniBand devices by its own variables (NCCL's documentation, "Environment Variables")
NETWORK_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "NCCL_SOCKET_FAMILY", "NCCL_IB_DISABLE", "NCCL_IB_HCA",
               "NCCL_IB_GID_INDEX", "NCCL_NET")
GLOO_IFNAME = NETWORK_ENV[0]

# vLLM's start-up at INFO (its engine's spawn, the weights loaded, torch.compile's start and end, the KV cache, the CUDA
# graphs captured, each with its seconds: vllm/v1/worker/gpu_model_runner.py, vllm/compilation/monitor.py) in every
# worker's log, on every node: verl sets WARN unless the driver's environment has the variable
# (trainer/constants_ppo.py), which left the H200's first vLLM start silent for its last 93 s (docs/gpu-smoke.md)
VLLM_LOG_ENV, VLLM_START_LEVEL = "VLLM_LOGGING_LEVEL", "INFO"


def vllm_log_env(base: Mapping[str, str]) -> dict[str, str]:
    """vLLM's log level for a GPU run: INFO, unless the launching environment ``base`` sets one (it wins)."""
    return {} if base.get(VLLM_LOG_ENV) else {VLLM_LOG_ENV: VLLM_START_LEVEL}


WANDB_LOGGERS = ("wandb", "tracking", "vemlp_wandb")  # verl's loggers that start a W&B run (verl/utils/tracking.py)


def wandb_env(base: Mapping[str, str], loggers, run_dir) -> dict[str, str]:
    """W&B's environment for a local run (``base``: the launching environment; ``loggers``: ``trainer.logger``).

    The user's ``WANDB_MODE`` is always honoured (``offline``: a W&B run folder without an account, synced
    later with ``wandb sync``; ``online`` needs ``wandb login``). A run whose loggers include wandb writes its
    W&B run folder under the run's output folder (``run_dir/wandb/``) unless ``WANDB_DIR`` is set. A run that
    does not ask for wandb gets ``WANDB_MODE=disabled`` (nothing it imports reaches W&B: quiet, as before).
    """
    names = [loggers] if isinstance(loggers, str) else list(loggers or ())
    env = {}
    if any(n in WANDB_LOGGERS for n in names):
        if not base.get("WANDB_DIR"):
            env["WANDB_DIR"] = str(run_dir)
    elif not base.get("WANDB_MODE"):
        env["WANDB_MODE"] = "disabled"
    return env


def ray_auth_env(base: Mapping[str, str]) -> dict[str, str]:
    """Token authentication for the Ray cluster a run starts (``base``: the launching environment).

    Ray 2.60's GCS, raylet and workers listen on every interface whatever the node address (measured:
    ``*:<port>`` with ``_node_ip_address=127.0.0.1``), so anyone who reaches the node could connect to
    a cluster without authentication and run code as its user. Ray's own guard is token mode
    (``RAY_AUTH_MODE=token``): every connection must carry the cluster's token. A run gets a fresh
    random token in ``RAY_AUTH_TOKEN`` (every process of the run inherits it; Ray then writes no
    ``~/.ray/auth_token``), unless the user supplies one (``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``).
    Only an explicit ``RAY_AUTH_MODE=disabled`` (Ray's documented opt-out, exact spelling) turns it off;
    any other value is token mode, as Ray reads ``token`` in any case.
    """
    if base.get("RAY_AUTH_MODE") == "disabled":
        return {"RAY_AUTH_MODE": "disabled"}
    env = {"RAY_AUTH_MODE": "token"}
    if not base.get("RAY_AUTH_TOKEN") and not base.get("RAY_AUTH_TOKEN_PATH"):
        env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    return env


def external_modules(extra: Iterable[str] = (), base: str | None = None, first: Iterable[str] = ()) -> str:
    """Comma list for VERL_USE_EXTERNAL_MODULES: ``first`` (a backend's registration), then ``base`` and
    ``extra``, each once."""
    mods = list(first)
    for m in [*(base or "").split(","), *extra]:
        m = m.strip()
        if m and m not in mods:
            mods.append(m)
    return ",".join(mods)


def forwarded_env_overrides(env: Mapping[str, str], keys: Iterable[str]) -> list[str]:
    """Overrides that hand ``env[key]`` (for each of ``keys`` present) to every Ray process."""
    return [f"+ray_kwargs.ray_init.runtime_env.env_vars.{key}={hydra_value(env[key], key, quote=True)}" for key in keys if key in env]
