"""A launch's Hydra overrides: the variant's, the environment's, the backend's, the user's (later wins).

The variant's are ``+experiment=<run name>`` for a shipped script (its generated experiment config,
``rpg.launch.experiments``), else the run-name grammar's own overrides.

``plan(request, variant, user)`` returns every override of the run and the Ray job's environment. On a
backend that runs the tiny task (``TINY_TASK``: the CPU backend) the keys the backend sets are taken from it
rather than from the variant, the tiny model/task replaces the variant's model, data and sizes (its
algorithm settings stay), the world size is 1 x 1 unless asked for, and the checkpoints go under the run's
output directory (``rpg.launch.run_dir.default_checkpoint_dir``) unless ``CKPTS_DIR`` is set. ``compose`` composes the result with
Hydra and runs the driver's checks on it (``rpg.verl.main.prepare_config``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from rpg.backends.registry import backend
from rpg.common.override_lists import (check_user_overrides, hydra_list, hydra_value, merge_overrides, override_key,
                                       values)
from rpg.common.checkout import RECIPE_CONFIG_DIR
from rpg.common.run_env import forwarded_env_overrides
from rpg.launch.config_keys import RECIPE_CONFIG_NAME, compose_config
from rpg.launch.run_dir import default_checkpoint_dir
from rpg.launch.request import DEFAULT_LOGGERS, LaunchError, LaunchRequest, project_root
from rpg.launch.experiments import variant_overrides
from rpg.launch.name_changes import changed_name, name_changes
from rpg.launch.variants import TRAIN_SET, Variant

CONFIG_DIR, CONFIG_NAME = RECIPE_CONFIG_DIR, RECIPE_CONFIG_NAME
# Log locations reach every Ray process through ray_kwargs.ray_init.runtime_env.env_vars (Hydra
# overrides). They must NOT also be in the job's runtime env: Ray refuses a job whose runtime env
# and the driver's ray.init runtime env set the same variable.
LOG_ENV = ("VERL_FILE_LOGGER_ROOT", "TENSORBOARD_DIR")
OVERLONG_LEN = "reward.reward_kwargs.overlong_buffer_cfg.len"
TASK_VARS = ("MODEL_PATH", "DATA_DIR", "TRAIN_FILE", "VAL_FILES")  # the run's model and data (a tiny task has its own)
GPU_DEFAULT_GPUS_PER_NODE = 8  # the paper's nodes: 8 GPUs each


def experiment_name(v: Variant, req: LaunchRequest, user: Sequence[str]) -> str:
    """The run's ``trainer.experiment_name`` (and its checkpoint and TensorBoard folders): ``EXP_NAME``; else the
    run name followed by the settings the name says that the user's overrides change
    (``run_rpg_7b_ufkl1e-4+divergence=urkl,clip=false``: ``rpg.launch.name_changes``), so the folders, logs
    and report labels say what runs. A user's ``trainer.experiment_name`` override wins (the folders keep the name)."""
    if req.experiment:
        return req.experiment
    if "trainer.experiment_name" in values(user):
        return v.name
    return changed_name(v, name_changes(v, list(user)))


def env_overrides(v: Variant, req: LaunchRequest, user: Sequence[str] = ()) -> list[str]:
    """Overrides derived from the environment (paths, cluster, loggers, names: ``experiment_name``). Default paths
    are under ``req.run_root``: the checkout the driver runs from."""
    root = req.run_root
    project, exp = req.project or "rpg", experiment_name(v, req, user)
    data_dir = Path(req.data_dir) if req.data_dir else root / "data"
    train = req.train_file or str(data_dir / f"{TRAIN_SET}.parquet")
    val = list(req.val_files) if req.val_files is not None else [str(data_dir / f"{s}.parquet") for s in v.val_sets]
    ckpts = req.ckpts_dir or str(root / "ckpts" / project / exp)
    log_env = {  # verl's file logger -> logs/<project>/<exp>.jsonl; TensorBoard event files
        "VERL_FILE_LOGGER_ROOT": req.file_logger_root or str(root / "logs"),
        "TENSORBOARD_DIR": req.tensorboard_dir or str(root / "tensorboard_log" / project / exp),
    }
    ov = [
        f"data.train_files={hydra_value(train, 'TRAIN_FILE')}",
        f"data.val_files={hydra_list(val, 'VAL_FILES')}",
        f"actor_rollout_ref.model.path={hydra_value(req.model_path or v.model, 'MODEL_PATH')}",
        f"trainer.nnodes={req.nnodes or 1}",
        f"trainer.n_gpus_per_node={req.n_gpus_per_node or GPU_DEFAULT_GPUS_PER_NODE}",
        f"trainer.logger={hydra_list(DEFAULT_LOGGERS if req.loggers is None else req.loggers, 'LOGGER')}",
        f"trainer.project_name={hydra_value(project, 'PROJECT_NAME')}",
        f"trainer.experiment_name={hydra_value(exp, 'EXP_NAME')}",
        f"trainer.default_local_dir={hydra_value(ckpts, 'CKPTS_DIR')}",
    ]
    return ov + forwarded_env_overrides(log_env, LOG_ENV)  # to every Ray process, each value a quoted string


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


def tiny_launch_overrides(backend_name: str, steps: int = 2, world_size: int = 1,
                          trainer_mode: str | None = None) -> list[str]:
    """The tiny task's model/data/size/schedule overrides (rpg.tiny), without any algorithm keys, with
    micro-batches split over ``world_size`` ranks (``LaunchError`` when they cannot be); the assets' paths are
    where ``build_tiny_assets`` puts them (built later: the command line is checked first)."""
    from rpg.tiny.build import TinyAssets, builder_key, default_cache_root
    from rpg.tiny.overrides import check_world_size, tiny_task_overrides as task_overrides

    try:
        check_world_size(world_size)
    except ValueError as e:
        raise LaunchError(f"RPG_BACKEND={backend_name}: {e}") from None
    return task_overrides(TinyAssets.at(default_cache_root() / builder_key()), steps=steps, world_size=world_size,
                          trainer_mode=trainer_mode)


def tiny_world_overrides(req: LaunchRequest) -> list[str]:
    """The world size of a tiny-task run: 1 x 1 unless the environment sets ``NNODES`` / ``N_GPUS_PER_NODE``
    (the GPU default of 8 ranks per node is not the CPU backend's: a CPU run asks for ranks explicitly);
    the user's ``trainer.nnodes`` / ``trainer.n_gpus_per_node`` overrides win over both. An elastic ``NNODES=MIN:MAX``
    is planned at its largest count whose world the tiny task splits (the launcher then checks every count)."""
    nnodes = req.nnodes
    if req.elastic:
        from rpg.tiny.overrides import check_world_size

        gpus = req.n_gpus_per_node or 1
        for k in range(req.node_count.high, req.node_count.low - 1, -1):
            try:
                check_world_size(k * gpus)
            except ValueError:
                continue
            nnodes = k
            break
    ov = [f"trainer.nnodes={nnodes}"] if nnodes else []
    return ov + ([f"trainer.n_gpus_per_node={req.n_gpus_per_node}"] if req.n_gpus_per_node else [])


def plan(req: LaunchRequest, v: Variant, user: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """All overrides of a run (variant, environment, [tiny task], user: later wins) and the job env."""
    from rpg.config import world_size_of

    check_user_overrides(user)
    groups = [variant_overrides(v, user), env_overrides(v, req, user)]
    chosen = backend(req.backend)
    if chosen.TINY_TASK:
        owned = chosen.owned_keys()
        world = tiny_world_overrides(req)
        try:
            nnodes, gpus = world_size_of(values([*world, *user]))
        except ValueError as e:
            raise LaunchError(str(e)) from None
        groups = [[o for o in g if override_key(o) not in owned] for g in groups]
        mode = values([*groups[0], *groups[1], *user]).get("trainer.v1.trainer_mode")
        groups += [tiny_launch_overrides(req.backend, world_size=nnodes * gpus, trainer_mode=mode), world]
        if not req.ckpts_dir and not req.cluster:
            # relative: the harness runs the trainer in OUT_DIR (a cluster job keeps CKPTS_DIR's default)
            names = values(groups[1])
            ckpts = default_checkpoint_dir(names["trainer.project_name"], names["trainer.experiment_name"])
            groups.append([f"trainer.default_local_dir={hydra_value(ckpts, 'CKPTS_DIR')}"])
        # LOGGER's loggers are kept; the harness adds verl's file logger when missing (it reads its records)
    else:  # the recipe's entry runs the variant: what its trainer mode needs on this backend (the harness adds it)
        groups.append(chosen.mode_overrides(values(merge_overrides(*groups, list(user)))))
    return finalize(merge_overrides(*groups, list(user)), user), dict(req.job_env)


def plan_overrides(v: Variant, env: Mapping[str, str], user: Sequence[str], *, root: Path, cwd: Path,
                   backend: str | None = None) -> tuple[list[str], dict[str, str]]:
    """``plan`` for an environment read into its request here, for the callers that plan a run without
    launching it (the study, tests); ``backend``: in place of ``RPG_BACKEND``."""
    return plan(LaunchRequest.read({**env, **({"RPG_BACKEND": backend} if backend else {})}, root, cwd), v, user)


def compose(overrides: Sequence[str], root: Path | None = None):
    """Compose recipe/rpg/config/rpg_trainer.yaml with ``overrides`` (Hydra compose API) and run the
    driver-side checks (``rpg.verl.main.prepare_config``: rpg validation + verl's validate_config).

    Returns ``(cfg, settings)``; raises the checks' errors (``RPGConfigError`` for the rpg block).
    Input paths and the backend's driver checks are not made here (``rpg.verl.input_paths.input_path_problems``,
    the backend's ``config_problems`` and ``node_problems``).
    """
    root = root or project_root()
    cfg = compose_config(overrides, root / CONFIG_DIR, CONFIG_NAME)  # an unknown key: one line (rpg.launch.config_keys)
    from rpg.verl.main import prepare_config  # after: its import warns of a GPU-less machine

    settings = prepare_config(cfg, check_paths=False, check_node=False)  # the caller's warning or note
    return cfg, settings
