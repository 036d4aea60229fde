"""The command a launch runs: the recipe's entry on this machine, or ``ray job submit`` to a cluster.

A Ray job's runtime env carries environment variables only (no working-dir upload): every node has the
project installed at ``RPG_CLUSTER_ROOT`` (``LaunchRequest.run_root``). A tiny-task job on a cluster (the
rehearsal of a multi-node launch, docs/launch-scripts.md) adds the backend's job environment with
torch.distributed's rendezvous file in the run's checkpoint folder, which every node must see.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from rpg.common.checkout import RECIPE_DIR, RECIPE_ENTRY
from rpg.launch.request import STOP_WAIT_S, STOP_WAIT_VAR, LaunchError, LaunchRequest  # noqa: F401 (the stop wait's home)


def local_command(overrides: Sequence[str], root: Path, python: str | None = None) -> list[str]:
    return [python or sys.executable, str(root / RECIPE_ENTRY), *overrides]


def ray_executable(env: Mapping[str, str]) -> str:
    """The `ray` on PATH, else the one installed next to this Python."""
    return shutil.which("ray", path=env.get("PATH", "") + os.pathsep + str(Path(sys.executable).parent)) or "ray"




def ray_command(overrides: Sequence[str], req: LaunchRequest, job_env: Mapping[str, str],
                submission_id: str | None = None, supervisor: Sequence[str] = ()) -> list[str]:
    """``ray job submit`` of the trainer's command, run by ``supervisor`` (a command the trainer's is appended to:
    the elastic supervisor, ``rpg.launch.node_plan.supervisor_prefix``) when given."""
    runtime_env = {"env_vars": {"PYTHONUNBUFFERED": "1", STOP_WAIT_VAR: str(req.stop_wait_s), **job_env}}
    cmd = [ray_executable(req.env), "job", "submit", "--address", req.address, "--runtime-env-json",
           json.dumps(runtime_env)]
    if submission_id is not None:
        cmd += ["--submission-id", submission_id]
    if not req.job_wait:
        cmd.append("--no-wait")
    return [*cmd, "--", *supervisor, req.ray_python, str(req.run_root / RECIPE_ENTRY), *overrides]


def submission_env(cfg, req: LaunchRequest, submission: str) -> dict[str, str]:
    """The runtime environment's variables the backend adds to a tiny-task job on a running Ray cluster
    (``cluster_job_env`` of ``rpg.backends``), with torch.distributed's rendezvous file in the run's
    checkpoint folder, which every node must see (the driver checks it: ``rpg.verl.joined_cluster``)."""
    from rpg.backends.registry import backend

    ckpts = str(cfg.trainer.default_local_dir)
    if not ckpts.startswith("/"):
        raise LaunchError(f"trainer.default_local_dir={ckpts!r}: a {req.backend}-backend job on a Ray cluster needs an "
                          "absolute folder every node sees (CKPTS_DIR), its ranks meet through a file there")
    return backend(req.backend).cluster_job_env(req.env, f"file://{ckpts}/.rendezvous/{submission}")


def script_command(name: str, root: Path, cwd: Path | None = None) -> str:
    """How a run is launched, for a line that shows where an environment variable goes: its paper script
    (``bash recipe/rpg/4b/<name>.sh``, relative to the project root; with ``cwd``, a path that works from
    ``cwd``), else ``python -m rpg.launch <name>``."""
    scripts = sorted((root / RECIPE_DIR).glob(f"*/{name}.sh"))
    if not scripts:
        return f"python -m rpg.launch {name}"
    if cwd is None:
        return f"bash {scripts[0].relative_to(root)}"
    script = scripts[0].resolve()
    return "bash " + shlex.quote(str(script.relative_to(cwd.resolve()) if script.is_relative_to(cwd.resolve()) else script))
