"""What the elastic supervisor was asked, and what each attempt of the trainer gets: its command at a node count,
its environment, the checkpoint folder made safe to save into again."""

from __future__ import annotations

import argparse
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rpg.node_counts import GPUS_KEY, parse_nnodes, resized_values
from rpg.override_lists import merge_overrides, values
from rpg.verl.errors import ELASTIC_STATUS_ENV

STATE_DIR = ".rpg_elastic"  # under the checkpoint folder: supervisor.json, attempt-N.json, wandb_run_id
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # ray._private.runtime_env.constants: the job's config for its drivers


@dataclass
class Plan:
    """The supervisor's command line."""

    low: int
    high: int
    sizes: list[int]
    max_restarts: int
    argv: list[str]  # the trainer's command: PYTHON main_rpg.py OVERRIDES
    # separate_async: the standalone rollout pool's nodes and GPUs per node (actor_rollout_ref.rollout.nnodes,
    # .n_gpus_per_node), which come beside the trainer's; 0 in another mode
    pool_nodes: int = 0
    pool_gpus: int = 0

    @property
    def overrides(self) -> list[str]:
        return self.argv[2:]

    @property
    def gpus_per_node(self) -> int:
        return int(values(self.overrides).get(GPUS_KEY, 1))

    @property
    def node_gpus(self) -> int:
        """The free GPUs a node must have to count (``rpg.cluster.elastic.supervisor``): a trainer rank group's or,
        with a rollout pool, the larger of that and a pool node's."""
        return max(self.gpus_per_node, self.pool_gpus)

    def pool_text(self) -> str:
        return (f"the rollout pool's {self.pool_nodes} node(s) x {self.pool_gpus} GPU(s) (actor_rollout_ref.rollout."
                f"nnodes={self.pool_nodes}, n_gpus_per_node={self.pool_gpus})")

    @property
    def folder(self) -> Path:
        return Path(os.path.abspath(str(values(self.overrides)["trainer.default_local_dir"])))

    @property
    def state(self) -> Path:
        return self.folder / STATE_DIR

    def command(self, nnodes: int, resume: bool) -> list[str]:
        """The trainer's command at ``nnodes`` nodes (global batch kept: ``resized_values``), resuming or not."""
        changed = resized_values(values(self.overrides), nnodes)
        extra = [f"{k}={v}" for k, v in changed.items()] + (["trainer.resume_mode=auto"] if resume else [])
        return [*self.argv[:2], *merge_overrides(self.overrides, extra)]


def parse_args(argv: Sequence[str]) -> Plan:
    p = argparse.ArgumentParser(prog="python -m rpg.cluster.elastic",
                                description="the elastic supervisor of a Ray job (rpg.cluster.elastic)")
    p.add_argument("--nnodes", required=True, help="MIN:MAX")
    p.add_argument("--sizes", required=True, help="the node counts in [MIN, MAX] the run may take, comma separated")
    p.add_argument("--max-restarts", type=int, required=True)
    p.add_argument("--rollout-nnodes", type=int, default=0, help="separate_async: the standalone rollout pool's nodes")
    p.add_argument("--rollout-gpus-per-node", type=int, default=0, help="and its GPUs per node")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- PYTHON main_rpg.py OVERRIDES")
    a = p.parse_args(list(argv))
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    try:
        count = parse_nnodes(a.nnodes, "--nnodes")
        sizes = sorted({int(s) for s in a.sizes.split(",") if s.strip()})
    except ValueError as e:
        p.error(str(e))
    if not sizes or not all(count.low <= k <= count.high for k in sizes) or a.max_restarts < 0 or len(command) < 2:
        p.error(f"--sizes {a.sizes!r} must lie in --nnodes {a.nnodes}, --max-restarts >= 0, and a trainer command "
                "follows --")
    if a.rollout_nnodes < 0 or a.rollout_gpus_per_node < 0 or (a.rollout_nnodes > 0) != (a.rollout_gpus_per_node > 0):
        p.error(f"--rollout-nnodes {a.rollout_nnodes} --rollout-gpus-per-node {a.rollout_gpus_per_node}: both >= 1 "
                "(a standalone rollout pool) or both 0 (none)")
    return Plan(count.low, count.high, sizes, a.max_restarts, command, a.rollout_nnodes, a.rollout_gpus_per_node)


def set_aside_incomplete(folder: Path, attempt: int) -> list[str]:
    """Step folders above the last complete checkpoint without its marker, renamed ``<name>.incomplete-a<attempt>``
    (never deleted); their new names."""
    from rpg.verl.checkpoints import MARKER, last_complete, step_dirs

    last = last_complete(folder)
    last_step = -1 if last is None else int(last.name.removeprefix("global_step_"))
    moved = []
    for n, path in step_dirs(folder):
        if n > last_step and not (path / MARKER).is_file():
            target = path.with_name(f"{path.name}.incomplete-a{attempt}")
            path.rename(target)
            moved.append(target.name)
    return moved


def wandb_run_id(plan: Plan, environ: Mapping[str, str]) -> str:
    """The W&B run every attempt logs to: the user's ``WANDB_RUN_ID``; else the id kept in the checkpoint folder
    while it holds a complete checkpoint to continue (a run resumed by a later job continues the same W&B run),
    a new one otherwise (a fresh run in a reused folder is a new W&B run)."""
    from rpg.verl.checkpoints import last_complete

    if environ.get("WANDB_RUN_ID"):
        return environ["WANDB_RUN_ID"]
    kept = plan.state / "wandb_run_id"
    if kept.is_file() and last_complete(plan.folder) is not None and (run_id := kept.read_text().strip()):
        return run_id
    run_id = secrets.token_hex(8)
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(run_id)
    return run_id


def attempt_env(environ: Mapping[str, str], attempt: int, status: Path, wandb_id: str) -> dict[str, str]:
    """The trainer's environment for ``attempt``: its status file, its own rendezvous file, the run's W&B id; the
    same variables in the job config Ray hands the trainer's workers."""
    env = dict(environ)
    extra = {"WANDB_RUN_ID": wandb_id, "WANDB_RESUME": env.get("WANDB_RESUME") or "allow"}
    if (method := env.get("DIST_INIT_METHOD", "")).startswith("file://"):
        extra["DIST_INIT_METHOD"] = f"{method}-a{attempt}"
    env.update(extra)
    env[ELASTIC_STATUS_ENV] = str(status)
    if JOB_CONFIG_ENV in env:
        job = json.loads(env[JOB_CONFIG_ENV])
        runtime = job.get("runtime_env") or {}
        runtime["env_vars"] = {**(runtime.get("env_vars") or {}), **extra}
        job["runtime_env"] = runtime
        env[JOB_CONFIG_ENV] = json.dumps(job)
    return env


def submission_id(environ: Mapping[str, str]) -> str | None:
    """The Ray job's submission id (the job config's metadata, ``job_submission_id``), or None outside a job."""
    try:
        return json.loads(environ[JOB_CONFIG_ENV]).get("metadata", {}).get("job_submission_id")
    except (KeyError, ValueError, AttributeError):
        return None


def write_json(path: Path, record: dict) -> Path:
    """``record`` written to ``path`` whole (a temporary file renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)
    return path
