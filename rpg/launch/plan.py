"""A run's Hydra overrides, in the order Hydra applies them (a later one wins): the experiment file's, the
environment's, the backend's, the user's.

On a backend that rehearses (``TINY_TASK``: the CPU backend) the rehearsal's model and task replace the run's
model, data and sizes, its algorithm settings kept (``rpg.launch.rehearsal``). ``compose`` composes the result
with Hydra and runs the driver's checks on it (``rpg.verl.main.prepare_config``).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from rpg.backends.registry import backend
from rpg.backends.run_env import VLLM_LOG_ENV, forwarded_env_overrides, vllm_log_env
from rpg.paths.checkout import CHECKOUT, RECIPE_CONFIG_DIR, RECIPE_DIR, RECIPE_ENTRY
from rpg.override_lists import check_user_overrides, merge_overrides, override_key, values
from rpg.launch.environment import LaunchError, Request, env_overrides
from rpg.launch.experiments import CONFIG_NAME, Experiment, changed_name, name_changes

OVERLONG_LEN = "reward.reward_kwargs.overlong_buffer_cfg.len"


def experiment_name(exp: Experiment, req: Request, user: Sequence[str]) -> str:
    """The run's ``trainer.experiment_name`` (its checkpoint and log folders): ``EXP_NAME``; else the run name
    followed by the settings of its file that the user's overrides change (``rpg.launch.experiments.changed_name``),
    so the folders, logs and report labels say what runs, shortened with a digest when a file it names would pass
    the file system's limit (``rpg.verl.input_paths.fitted_name``). A user's ``trainer.experiment_name`` override
    wins."""
    from rpg.verl.input_paths import fitted_name

    if req.env.get("EXP_NAME", "").strip():
        return req.env["EXP_NAME"].strip()
    if "trainer.experiment_name" in values(list(user)):
        return exp.name
    return fitted_name(changed_name(exp, name_changes(exp, user)))


def finalize(overrides: list[str], user: Sequence[str]) -> list[str]:
    """Keep the overlong buffer at max_response_length/4 when the overrides set the length and the user did not
    set the buffer."""
    if any(override_key(o) == OVERLONG_LEN for o in user):
        return overrides
    resp = values(overrides).get("data.max_response_length")
    if resp is None:
        return overrides
    if not isinstance(resp, int) or isinstance(resp, bool) or resp < 1:
        raise LaunchError(f"data.max_response_length={resp!r} is not a positive integer; set {OVERLONG_LEN} explicitly")
    return merge_overrides(overrides, [f"{OVERLONG_LEN}={resp // 4}"])


def plan(exp: Experiment, req: Request, user: Sequence[str]) -> list[str]:
    """Every override of the run (experiment, environment, backend or rehearsal, user: later wins)."""
    from rpg.launch import rehearsal

    check_user_overrides(user)
    groups = [list(exp.overrides), env_overrides(exp, req, experiment_name(exp, req, user))]
    chosen = backend(req.backend)
    if chosen.TINY_TASK:
        groups = rehearsal.task_groups(groups, req, user)
    else:  # the driver runs the experiment: what its trainer mode needs on this backend, vLLM's start at INFO
        groups.append(chosen.mode_overrides(values(merge_overrides(*groups, list(user)))))
        groups.append(forwarded_env_overrides({**vllm_log_env(req.env), **req.env}, (VLLM_LOG_ENV,)))
    return finalize(merge_overrides(*groups, list(user)), user)


def compose(overrides: Sequence[str]):
    """The composed config of ``overrides`` (one line for an unknown key: ``rpg.launch.config_keys``) and its
    ``RPGSettings``, after the driver's checks before Ray (``prepare_config``) but for input paths and this node's
    (the caller reports those: ``rpg.verl.input_paths.input_path_problems``, the backend's problems)."""
    from rpg.launch.config_keys import compose_config

    cfg = compose_config(overrides, CHECKOUT / RECIPE_CONFIG_DIR, CONFIG_NAME)
    from rpg.verl.main import prepare_config  # after: its import warns of a GPU-less machine

    return cfg, prepare_config(cfg, check_paths=False, check_node=False)


def local_command(overrides: Sequence[str], root: Path = CHECKOUT, python: str | None = None) -> list[str]:
    return [python or sys.executable, str(root / RECIPE_ENTRY), *overrides]


def script_command(name: str, cwd: Path | None = None) -> str:
    """How a run is launched, for a line that shows where a variable goes or how to resume: its paper script
    (relative to the checkout, or with ``cwd`` a path that works from there), else main_rpg.py with the run."""
    scripts = sorted((CHECKOUT / RECIPE_DIR).glob(f"*/{name}.sh"))
    if not scripts:
        return shlex.join([sys.executable, str(CHECKOUT / RECIPE_ENTRY), f"+experiment={name}"])
    if cwd is None:
        return f"bash {scripts[0].relative_to(CHECKOUT)}"
    script, here = scripts[0].resolve(), cwd.resolve()
    return "bash " + shlex.quote(str(script.relative_to(here) if script.is_relative_to(here) else script))
