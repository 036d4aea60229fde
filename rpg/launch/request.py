"""The launcher's environment, read once: ``LaunchRequest.read(env, root, cwd)``.

Every environment variable ``python -m rpg.launch`` takes is declared in ``ENV_VARS`` (the usage lists them;
one given as an argument is refused in one line, ``rpg.launch.args``). The launcher's own are read here, once,
into one frozen ``LaunchRequest``: a bad value is ``LaunchError``, one line naming the variable and what is
allowed, before anything is composed; the rest of the launcher reads the request. Three readers stay where
their variables are declared: a backend reads its own (``RPG_CPU_ROLLOUT``: ``launch_problems``), the memory
estimate its sizes (``RPG_GPU_MEM_GIB``, ``RPG_HOST_MEM_GIB``: ``rpg.launch.memory``, only for ``--describe``
and ``DRY_RUN=1``), and a resume command repeats the variables that were set
(``RESUMED_VARS``, ``rpg.common.override_lists.resume_command``); the environment itself goes, whole, to the process the launch starts.

Paths: a user's relative path is taken relative to the current directory (``cwd``: ``rpg.common.user_paths``,
as the demos and the study take theirs); defaults are under the
project root, or under ``RPG_CLUSTER_ROOT`` for a Ray submission (``cluster_root``: the checkout the driver
runs from on the cluster).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rpg.backends import BACKENDS
from rpg.common.checkout import CHECKOUT, RECIPE_ENTRY
from rpg.common.nnodes import NodeCount, parse_nnodes
from rpg.common.user_paths import user_folder, user_path
from rpg.common.run_env import NETWORK_ENV
from rpg.verl.input_paths import name_problem

# `ray job stop` SIGTERMs the driver, then SIGKILLs it after RAY_JOB_STOP_WAIT_TIME_S seconds (3 by default): Ray
# 2.60's job supervisor reads it from its own environment (ray/dashboard/modules/job/job_supervisor.py:66 and
# :408-413), which is the job's runtime env (job_manager.py:590-592, _get_supervisor_runtime_env copies its
# env_vars). The driver's stop (Ray's shutdown, the checkpoint folder read on shared storage, the stop line with
# its resume command) needs more than 3 s; a value the user exported is passed on instead.
STOP_WAIT_VAR, STOP_WAIT_S = "RAY_JOB_STOP_WAIT_TIME_S", 60
DEFAULT_MAX_RESTARTS = 3  # torchrun's --max-restarts has 0; a paper run is days long, and each restart costs minutes

# The launcher's environment variables, declared once: the usage lists them, and one given as an argument
# (``OUT_DIR=runs/x`` after the script) is refused in one line saying where it goes (rpg.launch.args).
ENV_VARS = {
    "DRY_RUN": "1: compose, check and print the config and the command, start nothing",
    "RPG_BACKEND": "gpu (default) or cpu (the tiny model/task on the CPU backend)",
    "RAY_ADDRESS": "submit to this Ray cluster (ray job submit)",
    "RPG_CLUSTER_ROOT": "the project's checkout on the cluster nodes",
    "RAY_JOB_WAIT": "1: wait for the submitted job",
    "RAY_PYTHON": "the cluster's Python",
    "MODEL_PATH": "the model (default: the variant's)",
    "DATA_DIR": "the data folder", "TRAIN_FILE": "the training file", "VAL_FILES": "the validation files",
    "CKPTS_DIR": "the checkpoint folder",
    "NNODES": "nodes: N, or MIN:MAX (elastic, on a Ray cluster: the run goes on after a node is lost)",
    "N_GPUS_PER_NODE": "GPUs per node",
    "RPG_MAX_RESTARTS": f"with NNODES=MIN:MAX, restarts after node losses [{DEFAULT_MAX_RESTARTS}]",
    "LOGGER": "trainer.logger, comma separated (verl's loggers)",
    "PROJECT_NAME": "trainer.project_name", "EXP_NAME": "trainer.experiment_name",
    "OUT_DIR": "the output folder of a CPU run",
    "CPU_TIMEOUT": "seconds before a CPU run is killed", "CPU_ECHO": "1: show a CPU run's full output",
    "RPG_CPU_ROLLOUT": "hf or vllm, a CPU run's rollout",
    "RPG_GPU_MEM_GIB": "the GPU's memory for the estimate", "RPG_HOST_MEM_GIB": "the node's RAM for the estimate",
    "VERL_FILE_LOGGER_ROOT": "where verl's file logger writes", "TENSORBOARD_DIR": "TensorBoard's folder",
    "PYTHON": "the Python of the launch scripts",
}
# The variables a resume command repeats when set (``rpg.common.override_lists.resume_command``): a dry run starts
# nothing to resume.
RESUMED_VARS = tuple(k for k in ENV_VARS if k != "DRY_RUN")
# Forwarded to the Ray job when set (never secrets: log in to W&B / HF on the nodes instead).
FORWARD_ENV = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "WANDB_MODE",
               "WANDB_ENTITY", "WANDB_DIR", "VLLM_USE_V1", "NCCL_DEBUG", *NETWORK_ENV)
DEFAULT_LOGGERS = ("console", "file")
CPU_TIMEOUT_S = 1800.0


class LaunchError(ValueError):
    """A bad environment value or launch request (one clear line)."""


def project_root() -> Path:
    root = CHECKOUT
    if not (root / RECIPE_ENTRY).is_file():
        raise LaunchError(f"cannot find {RECIPE_ENTRY} next to the rpg package ({root}); run from a checkout of the "
                          "project installed with `pip install -e .`")
    return root


def split_list(raw: str) -> list[str]:
    return [p for p in re.split(r"[,\s]+", raw.strip()) if p]


def _flag(env: Mapping[str, str], key: str) -> bool:
    value = env.get(key, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise LaunchError(f"{key}={env[key]!r} is invalid; allowed values: 1, 0, true, false")


def _positive_int(env: Mapping[str, str], key: str) -> int | None:
    raw = env.get(key, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise LaunchError(f"{key}={raw!r} is invalid; expected a positive integer")
    return int(raw)


def _node_count(env: Mapping[str, str]) -> NodeCount | None:
    """NNODES: N, or MIN:MAX (elastic: only for a Ray job, where a supervisor on the cluster can restart the run)."""
    raw = env.get("NNODES", "").strip()
    if not raw:
        return None
    try:
        count = parse_nnodes(raw)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    if count.elastic and not env.get("RAY_ADDRESS", "").strip():
        raise LaunchError(f"NNODES={raw} (elastic) needs a Ray cluster (RAY_ADDRESS): the supervisor that restarts the "
                          "run lives there; a run on this machine has one node, NNODES=1")
    return count


def _max_restarts(env: Mapping[str, str], count: NodeCount | None) -> int:
    raw = env.get("RPG_MAX_RESTARTS", "").strip()
    if not raw:
        return DEFAULT_MAX_RESTARTS
    if count is None or not count.elastic:
        raise LaunchError(f"RPG_MAX_RESTARTS={raw} applies to an elastic run only (NNODES=MIN:MAX on a Ray cluster); "
                          "a run with a fixed NNODES stops at a node loss with its resume command")
    if not raw.isdigit():
        raise LaunchError(f"RPG_MAX_RESTARTS={raw!r} is invalid; expected an integer >= 0")
    return int(raw)


def _seconds(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise LaunchError(f"{key}={raw!r} is invalid; expected a number of seconds > 0")
    return value


def _path(env: Mapping[str, str], key: str, cwd: Path) -> str | None:
    raw = env.get(key, "").strip()
    return user_path(raw, cwd) if raw else None


def _run_name(env: Mapping[str, str], key: str) -> str | None:
    """PROJECT_NAME / EXP_NAME: unset -> None (the default); a name that could leave its directory
    (checkpoints, logs) is refused (``rpg.verl.input_paths.name_problem``)."""
    if key not in env:
        return None
    value = env[key].strip()
    if (why := name_problem(key, value)) is not None:
        raise LaunchError(why)
    return value


def cluster_root(env: Mapping[str, str], root: Path) -> Path:
    """Root of every default path: ``RPG_CLUSTER_ROOT`` for a Ray submission, else this checkout."""
    raw = env.get("RPG_CLUSTER_ROOT", "").strip()
    if not raw or not env.get("RAY_ADDRESS", "").strip():
        return root
    if not raw.startswith("/"):
        raise LaunchError(f"RPG_CLUSTER_ROOT={raw!r} must be an absolute path (the project's checkout on the cluster nodes)")
    return Path(raw)


@dataclass(frozen=True)
class LaunchRequest:
    """What the environment asks of a launch (None: not set, the default applies where it is used)."""

    env: Mapping[str, str]  # the environment itself: what the started process inherits
    root: Path  # this checkout
    cwd: Path
    backend: str  # RPG_BACKEND: a name of rpg.backends
    dry: bool  # DRY_RUN
    address: str  # RAY_ADDRESS as given (checked by rpg.launch.ray_job_api; blank: a run on this machine)
    job_wait: bool  # RAY_JOB_WAIT
    ray_python: str  # RAY_PYTHON
    run_root: Path  # RPG_CLUSTER_ROOT for a Ray submission, else root: the root of every default path
    model_path: str | None
    data_dir: str | None
    train_file: str | None
    val_files: tuple[str, ...] | None
    ckpts_dir: str | None
    nnodes: int | None  # NNODES, or MAX of an elastic count (the run is planned and checked at MAX)
    node_count: NodeCount | None  # NNODES as given
    max_restarts: int  # RPG_MAX_RESTARTS (elastic runs)
    stop_wait_s: int  # RAY_JOB_STOP_WAIT_TIME_S for a Ray job (Ray's int(): a bad value is refused here)
    n_gpus_per_node: int | None
    loggers: tuple[str, ...] | None  # LOGGER
    project: str | None
    experiment: str | None
    file_logger_root: str | None  # VERL_FILE_LOGGER_ROOT
    tensorboard_dir: str | None  # TENSORBOARD_DIR
    out_dir: Path | None  # OUT_DIR (a run through the harness)
    timeout_s: float  # CPU_TIMEOUT
    echo: bool  # CPU_ECHO
    job_env: Mapping[str, str]  # FORWARD_ENV's variables that are set
    cluster_root_unused: bool  # RPG_CLUSTER_ROOT set without RAY_ADDRESS (a local run: ignored, with a warning)

    @property
    def cluster(self) -> bool:
        return bool(self.address.strip())

    @property
    def elastic(self) -> bool:
        return self.node_count is not None and self.node_count.elastic

    @classmethod
    def read(cls, env: Mapping[str, str], root: Path, cwd: Path) -> LaunchRequest:
        backend = env.get("RPG_BACKEND", "").strip().lower() or BACKENDS[0]
        if backend not in BACKENDS:
            raise LaunchError(f"RPG_BACKEND={env['RPG_BACKEND']!r} is invalid; allowed values: {', '.join(BACKENDS)}")
        address = env.get("RAY_ADDRESS", "")
        val = env.get("VAL_FILES", "").strip()
        logger = env.get("LOGGER", "").strip()
        out = env.get("OUT_DIR", "").strip()
        count = _node_count(env)
        return cls(
            env=dict(env), root=root, cwd=cwd, backend=backend, dry=_flag(env, "DRY_RUN"), address=address,
            job_wait=_flag(env, "RAY_JOB_WAIT"), ray_python=env.get("RAY_PYTHON", "").strip() or "python3",
            run_root=cluster_root(env, root),
            project=_run_name(env, "PROJECT_NAME"), experiment=_run_name(env, "EXP_NAME"),
            model_path=env.get("MODEL_PATH", "").strip() or None,
            data_dir=_path(env, "DATA_DIR", cwd), train_file=_path(env, "TRAIN_FILE", cwd),
            val_files=tuple(user_path(p, cwd) for p in split_list(val)) if val else None,
            ckpts_dir=_path(env, "CKPTS_DIR", cwd),
            nnodes=None if count is None else count.high, node_count=count, max_restarts=_max_restarts(env, count),
            stop_wait_s=_positive_int(env, STOP_WAIT_VAR) or STOP_WAIT_S,
            n_gpus_per_node=_positive_int(env, "N_GPUS_PER_NODE"),
            loggers=tuple(split_list(logger)) if logger else None,
            file_logger_root=_path(env, "VERL_FILE_LOGGER_ROOT", cwd), tensorboard_dir=_path(env, "TENSORBOARD_DIR", cwd),
            out_dir=user_folder(out, cwd) if out else None,
            timeout_s=_seconds(env, "CPU_TIMEOUT", CPU_TIMEOUT_S), echo=_flag(env, "CPU_ECHO"),
            job_env={k: env[k] for k in FORWARD_ENV if env.get(k)},
            cluster_root_unused=bool(env.get("RPG_CLUSTER_ROOT", "").strip()) and not address.strip(),
        )
