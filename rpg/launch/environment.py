"""The environment variables of a paper run's launch, declared once (``VARIABLES``), and what they make of a run.

A variable that only sets a Hydra key names it in the table (the docs' table is written from it, and one given as
an argument is refused in one line naming where it goes). ``Request.read`` reads the rest once (a bad value: one
line naming the variable); ``env_overrides`` turns the paths, cluster size, loggers and names into overrides on the
run's experiment file: defaults under the checkout (``RPG_CLUSTER_ROOT`` for a Ray job), a user's relative path
taken where the user is (``rpg.paths.user``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rpg.backends import BACKENDS
from rpg.paths.checkout import CHECKOUT
from rpg.node_counts import NodeCount, parse_nnodes
from rpg.override_lists import hydra_list, hydra_value
from rpg.backends.run_env import NETWORK_ENV, forwarded_env_overrides
from rpg.paths.user import user_folder, user_path
from rpg.verl.input_paths import name_problem

CPU_MODELS = ("tiny", "smol")
# name: (the Hydra key it sets, or None; what it is [default])
VARIABLES: dict[str, tuple[str | None, str]] = {
    "DRY_RUN": (None, "1: compose, check and print the run, start nothing"),
    "RPG_BACKEND": (None, "gpu, or cpu: a rehearsal on the CPU backend with a small model and task [gpu]"),
    "RPG_CPU_MODEL": (None, "the rehearsal's model: tiny, or smol (SmolLM2-135M-Instruct, docs/smol.md) [tiny]"),
    "RAY_ADDRESS": (None, "a Ray cluster's job API, http(s)://HOST:PORT: the run is submitted there (rpg.cluster)"),
    "RPG_CLUSTER_ROOT": (None, "with RAY_ADDRESS: the checkout's absolute path on the nodes [this checkout]"),
    "RAY_JOB_WAIT": (None, "with RAY_ADDRESS, 1: follow the job's logs"),
    "RAY_PYTHON": (None, "with RAY_ADDRESS: the nodes' Python [python3]"),
    "MODEL_PATH": ("actor_rollout_ref.model.path", "the model, a Hugging Face id or a local folder [the file's]"),
    "DATA_DIR": (None, "the folder of the run's data files (the file's names in it) [<checkout>/data]"),
    "TRAIN_FILE": ("data.train_files", "the training file [in DATA_DIR]"),
    "VAL_FILES": ("data.val_files", "the validation files, comma or space separated [in DATA_DIR]"),
    "CKPTS_DIR": ("trainer.default_local_dir", "the checkpoint folder [<checkout>/ckpts/<project>/<run>]"),
    "NNODES": ("trainer.nnodes", "nodes [1]; MIN:MAX on a Ray cluster: an elastic run"),
    "N_GPUS_PER_NODE": ("trainer.n_gpus_per_node", "GPUs per node [8; the CPU backend's ranks: 1]"),
    "RPG_MAX_RESTARTS": (None, "with NNODES=MIN:MAX: restarts after node losses [3]"),
    "LOGGER": ("trainer.logger", "verl's loggers, comma separated [console,file]"),
    "PROJECT_NAME": ("trainer.project_name", "the project's folder name [rpg]"),
    "EXP_NAME": ("trainer.experiment_name", "the run's folder name [the run name + what the overrides change]"),
    "OUT_DIR": (None, "a CPU rehearsal's output folder [a new <checkout>/outputs/cpu/<run>/<time>]"),
    "CPU_TIMEOUT": (None, "seconds before a CPU rehearsal is stopped [1800]"),
    "CPU_ECHO": (None, "1: show a CPU rehearsal's whole output"),
    "RPG_CPU_ROLLOUT": (None, "a CPU run's rollout: hf or vllm [hf]"),
    "RPG_GPU_MEM_GIB": (None, "the GPU's memory in the memory plan [79.6]"),
    "RPG_HOST_MEM_GIB": (None, "a node's RAM in the memory plan [2000]"),
    "VERL_FILE_LOGGER_ROOT": (None, "verl's file logger's folder, to every Ray process [<checkout>/logs]"),
    "TENSORBOARD_DIR": (None, "TensorBoard's folder [<checkout>/tensorboard_log/<project>/<run>]"),
    "PYTHON": (None, "the Python of recipe/rpg/launch.sh [python3]"),
}
# The variables a resume command repeats when set (``rpg.override_lists.resume_command``)
RESUMED_VARS = tuple(k for k in VARIABLES if k != "DRY_RUN")
TASK_VARS = ("MODEL_PATH", "DATA_DIR", "TRAIN_FILE", "VAL_FILES")  # the run's model and data: a rehearsal has its own
# Log locations reach every Ray process through ray_kwargs.ray_init.runtime_env.env_vars; a Ray job must not also
# carry them (Ray refuses a job whose runtime env and the driver's ray.init one set the same variable)
LOG_ENV = ("VERL_FILE_LOGGER_ROOT", "TENSORBOARD_DIR")
DEFAULT_LOGGERS = ("console", "file")
GPUS_PER_NODE = 8  # the paper's nodes
CPU_TIMEOUT_S = 1800.0
DEFAULT_MAX_RESTARTS = 3  # torchrun's --max-restarts has 0; a paper run is days long, and each restart costs minutes
# Forwarded to a Ray job when set (never secrets: log in to W&B / HF on the nodes instead)
FORWARD_ENV = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "WANDB_MODE",
               "WANDB_ENTITY", "WANDB_DIR", "VLLM_USE_V1", "NCCL_DEBUG", *NETWORK_ENV)


class LaunchError(ValueError):
    """A bad environment value or launch request (one clear line)."""


def split_list(raw: str) -> list[str]:
    return [p for p in re.split(r"[,\s]+", raw.strip()) if p]


def flag(env: Mapping[str, str], key: str) -> bool:
    value = env.get(key, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise LaunchError(f"{key}={env[key]!r} is invalid; allowed values: 1, 0, true, false")


def env_int(env: Mapping[str, str], key: str, minimum: int = 1) -> int | None:
    """The integer variable ``key`` (ASCII digits: ``str.isdigit`` also takes '²', which ``int`` refuses), None when
    unset; one line (``LaunchError``) for anything else or a value under ``minimum``."""
    raw = env.get(key, "").strip()
    if not raw:
        return None
    if not re.fullmatch(r"[0-9]+", raw) or int(raw) < minimum:
        expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise LaunchError(f"{key}={raw!r} is invalid; expected {expected}")
    return int(raw)


def positive_int(env: Mapping[str, str], key: str) -> int | None:
    return env_int(env, key, 1)


def _seconds(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise LaunchError(f"{key}={raw!r} is invalid; expected a number of seconds > 0")
    return value


def _choice(env: Mapping[str, str], key: str, allowed: Sequence[str]) -> str:
    value = env.get(key, "").strip().lower() or allowed[0]
    if value not in allowed:
        raise LaunchError(f"{key}={env[key]!r} is invalid; allowed values: {', '.join(allowed)}")
    return value


def _run_name(env: Mapping[str, str], key: str) -> str | None:
    """PROJECT_NAME / EXP_NAME: a name that could leave its directory (checkpoints, logs), or make a file name
    longer than the file system allows, is refused."""
    if key not in env:
        return None
    value = env[key].strip()
    if (why := name_problem(key, value, experiment=key == "EXP_NAME")) is not None:
        raise LaunchError(why)
    return value


@dataclass(frozen=True)
class Request:
    """What the environment asks of a launch; the aliases of Hydra keys are read by ``env_overrides``."""

    env: Mapping[str, str]  # the environment itself: what the started process inherits
    cwd: Path
    run_root: Path  # root of every default path: this checkout, or RPG_CLUSTER_ROOT for a Ray job
    backend: str  # RPG_BACKEND
    cpu_model: str  # RPG_CPU_MODEL
    dry: bool  # DRY_RUN
    node_count: NodeCount | None  # NNODES as given
    n_gpus_per_node: int | None
    out_dir: Path | None  # OUT_DIR (a CPU rehearsal)
    timeout_s: float  # CPU_TIMEOUT
    echo: bool  # CPU_ECHO
    max_restarts: int = DEFAULT_MAX_RESTARTS  # RPG_MAX_RESTARTS (an elastic job)
    cluster: bool = False  # a job for a Ray cluster (rpg.cluster)

    @property
    def nnodes(self) -> int | None:
        """NNODES, or MAX of an elastic count (the run is planned and checked at MAX)."""
        return None if self.node_count is None else self.node_count.high

    @property
    def elastic(self) -> bool:
        return self.node_count is not None and self.node_count.elastic

    def path(self, key: str) -> str | None:
        """The variable's path, absolute (a relative one: where the user is); None when unset."""
        raw = self.env.get(key, "").strip()
        return user_path(raw, self.cwd) if raw else None

    @classmethod
    def read(cls, env: Mapping[str, str], cwd: Path, run_root: Path = CHECKOUT, cluster: bool = False) -> Request:
        count = None
        if raw := env.get("NNODES", "").strip():
            try:
                count = parse_nnodes(raw)
            except ValueError as e:
                raise LaunchError(str(e)) from None
            if count.elastic and not cluster:
                raise LaunchError(f"NNODES={raw} (elastic) needs a Ray cluster (RAY_ADDRESS): the supervisor that "
                                  "restarts the run lives there; a run on this machine has one node, NNODES=1")
        if (restarts := env.get("RPG_MAX_RESTARTS", "").strip()) and not (count is not None and count.elastic):
            raise LaunchError(f"RPG_MAX_RESTARTS={restarts} applies to an elastic run only (NNODES=MIN:MAX on a Ray "
                              "cluster); a run with a fixed NNODES stops at a node loss with its resume command")
        max_restarts = env_int(env, "RPG_MAX_RESTARTS", 0)
        for key in ("PROJECT_NAME", "EXP_NAME"):
            _run_name(env, key)
        out = env.get("OUT_DIR", "").strip()
        return cls(env=dict(env), cwd=cwd, run_root=run_root, backend=_choice(env, "RPG_BACKEND", BACKENDS),
                   cpu_model=_choice(env, "RPG_CPU_MODEL", CPU_MODELS), dry=flag(env, "DRY_RUN"), node_count=count,
                   n_gpus_per_node=positive_int(env, "N_GPUS_PER_NODE"),
                   out_dir=user_folder(out, cwd) if out else None,
                   timeout_s=_seconds(env, "CPU_TIMEOUT", CPU_TIMEOUT_S), echo=flag(env, "CPU_ECHO"),
                   max_restarts=DEFAULT_MAX_RESTARTS if max_restarts is None else max_restarts, cluster=cluster)

    def loggers(self) -> tuple[str, ...] | None:
        """LOGGER's names, None when unset; one that names none (``LOGGER=,``: no metrics logged) is refused."""
        raw = self.env.get("LOGGER", "").strip()
        if raw and not split_list(raw):
            raise LaunchError(f"LOGGER={raw!r} names no logger: the run would log no metrics; give verl's loggers, "
                              f"comma separated (unset: {','.join(DEFAULT_LOGGERS)})")
        return tuple(split_list(raw)) if raw else None


def _data_path(req: Request, given: str | None) -> str | None:
    """A data file of the experiment file: in DATA_DIR when it is set, else a relative one under the run root."""
    if given is None or "://" in given:
        return given
    if data_dir := req.path("DATA_DIR"):
        return str(Path(data_dir) / Path(given).name)
    return given if Path(given).is_absolute() else str(req.run_root / given)


def env_overrides(exp, req: Request, exp_name: str) -> list[str]:
    """The environment's overrides of the run ``exp`` (``rpg.launch.experiments.Experiment``): data files, model,
    cluster size, loggers, names, checkpoint folder, log folders (to every Ray process). ``exp_name``: the run's
    ``trainer.experiment_name``."""
    env, root = req.env, req.run_root
    project = _run_name(env, "PROJECT_NAME") or "rpg"
    train = req.path("TRAIN_FILE") or _data_path(req, exp.settings.get("data.train_files"))
    if raw := env.get("VAL_FILES", "").strip():
        val = [user_path(p, req.cwd) for p in split_list(raw)]
    else:
        val = [_data_path(req, p) for p in exp.settings.get("data.val_files") or []] or None
    model = env.get("MODEL_PATH", "").strip() or exp.settings.get("actor_rollout_ref.model.path")
    loggers, ckpts = req.loggers(), req.path("CKPTS_DIR") or str(root / "ckpts" / project / exp_name)
    log_env = {"VERL_FILE_LOGGER_ROOT": req.path("VERL_FILE_LOGGER_ROOT") or str(root / "logs"),
               "TENSORBOARD_DIR": req.path("TENSORBOARD_DIR") or str(root / "tensorboard_log" / project / exp_name)}
    ov = [*([f"data.train_files={hydra_value(train, 'TRAIN_FILE')}"] if train else []),
          *([f"data.val_files={hydra_list(val, 'VAL_FILES')}"] if val is not None else []),
          *([f"actor_rollout_ref.model.path={hydra_value(model, 'MODEL_PATH')}"] if model else []),
          f"trainer.nnodes={req.nnodes or 1}",
          f"trainer.n_gpus_per_node={req.n_gpus_per_node or GPUS_PER_NODE}",
          f"trainer.logger={hydra_list(DEFAULT_LOGGERS if loggers is None else loggers, 'LOGGER')}",
          f"trainer.project_name={hydra_value(project, 'PROJECT_NAME')}",
          f"trainer.experiment_name={hydra_value(exp_name, 'EXP_NAME')}",
          f"trainer.default_local_dir={hydra_value(ckpts, 'CKPTS_DIR')}"]
    return ov + forwarded_env_overrides(log_env, LOG_ENV)


def variables_table() -> str:
    """The docs' table of ``VARIABLES`` (docs/launch-scripts.md, section 4)."""
    rows = ["| variable | Hydra key | what [default] |", "|---|---|---|"]
    rows += [f"| `{name}` | {f'`{key}`' if key else '-'} | {what} |" for name, (key, what) in VARIABLES.items()]
    return "\n".join(rows)
