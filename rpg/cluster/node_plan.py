"""The node counts a Ray job may take, decided by the launcher before the job is queued.

``NNODES=N``: the counts 1..N that pass the driver's rules; the driver's stop line after a node loss then asks
for the largest of them the cluster can still hold. ``NNODES=MIN:MAX`` (elastic): the counts in [MIN, MAX] that
pass them, each at the same global batch (``rpg.node_counts.resized_values``); a count that does not (verl's
divisibility rules: 24 ranks do not split a mini-batch of 32 prompts x 16 responses evenly; a per-GPU
micro-batch that does not re-split) is skipped with one warning line, and none at all is refused. The job's
entrypoint is then the elastic supervisor (``rpg.cluster.elastic``) around the trainer's command.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf

from rpg.node_counts import GPUS_KEY, MICRO_SUFFIX, NNODES_KEY, NodeCount, resized_values
from rpg.override_lists import merge_overrides, values
from rpg.config import RPGConfigError, config_value
from rpg.launch.environment import LaunchError, Request
from rpg.verl.errors import NODE_PLAN_ENV


def _micro_keys(cfg: DictConfig) -> dict:
    """Every ``*_micro_batch_size_per_gpu`` key of a config with its (resolved) value."""
    def walk(node, prefix: str):
        for key, value in node.items():
            if isinstance(value, dict):
                yield from walk(value, f"{prefix}{key}.")
            elif str(key).endswith(MICRO_SUFFIX):
                yield f"{prefix}{key}"

    tree = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
    return {key: OmegaConf.select(cfg, key, default=None) for key in walk(tree, "")}


def _world_values(cfg: DictConfig) -> dict:
    return {NNODES_KEY: int(cfg.trainer.nnodes), GPUS_KEY: int(cfg.trainer.n_gpus_per_node), **_micro_keys(cfg)}


def size_problem(cfg: DictConfig, nnodes: int) -> str | None:
    """Why the run of ``cfg`` cannot run on ``nnodes`` nodes at its global batch (the driver's rules), or None."""
    from rpg.verl.verl_rules import check_verl_rules

    try:
        changed = resized_values(_world_values(cfg), nnodes)
    except ValueError as e:
        return str(e)
    resized = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    for key, value in changed.items():
        OmegaConf.update(resized, key, value, merge=False)
    try:
        check_verl_rules(resized)
    except RPGConfigError as e:
        return str(e)
    return None


def node_sizes(cfg: DictConfig, count: NodeCount) -> list[int]:
    """The counts of ``count``'s range (1..N for a fixed count) that pass ``size_problem``; for an elastic count, one
    warning line naming each one skipped, and ``LaunchError`` when none passes."""
    low = count.low if count.elastic else 1
    problems = {k: size_problem(cfg, k) for k in range(low, count.high + 1)}
    sizes = [k for k, why in problems.items() if why is None]
    if not count.elastic:
        return sizes
    skipped = {k: why for k, why in problems.items() if why is not None}
    if not sizes:
        raise LaunchError(f"NNODES={count}: no node count in it runs this run at its global batch "
                          f"({'; '.join(f'{k}: {why}' for k, why in skipped.items())})")
    for k, why in skipped.items():
        print(f"rpg.launch: warning: NNODES={count}: {k} node(s) skipped ({why})", file=sys.stderr, flush=True)
    return sizes


def check_elastic(cfg: DictConfig, req: Request, user: Sequence[str]) -> None:
    """What an elastic run needs beyond its sizes: checkpoints to restart from and NNODES as the one node count.
    Every trainer mode resumes (docs/verl-integration.md#resume-of-an-asynchronous-run); separate_async's standalone
    rollout pool is kept aside by the supervisor (``rollout_pool``, ``rpg.cluster.elastic.supervisor``)."""
    if NNODES_KEY in values(list(user)):
        raise LaunchError(f"NNODES={req.node_count} and the override {NNODES_KEY}=... both set the node count; an "
                          f"elastic run takes it from NNODES=MIN:MAX alone")
    if int(cfg.trainer.save_freq) <= 0:
        raise LaunchError(f"NNODES={req.node_count} (elastic) restarts from the last checkpoint, and "
                          f"trainer.save_freq={cfg.trainer.save_freq} saves none: set trainer.save_freq=N")


def check_reshardable(cfg: DictConfig, count: NodeCount) -> None:
    """An elastic run that may change its world size must resume at another one (``rpg.verl.resume_world_size``)."""
    from verl.trainer.ppo.utils import need_critic

    from rpg.verl.resume_world_size import reshard_problem

    strategy = str(OmegaConf.select(cfg, "actor_rollout_ref.actor.strategy", default="fsdp2"))
    with warnings.catch_warnings():  # need_critic warns when it disables a critic; the driver's checks say it once
        warnings.simplefilter("ignore")
        critic = need_critic(cfg)
    if (why := reshard_problem(strategy, critic)) is not None:
        raise LaunchError(f"NNODES={count} (elastic) restarts at another world size, which this run cannot: {why}; "
                          f"use NNODES=MIN:MAX with MIN = MAX")


def plan_nodes(overrides: Sequence[str], req: Request, user: Sequence[str]):
    """The job's node count and its allowed sizes, its overrides (an elastic run: at the largest allowed count, where
    it starts when the nodes are there), the composed and checked config (``rpg.launch.plan.compose``) and the job
    environment's ``NODE_PLAN_ENV`` (with separate_async's ``rollout_pool`` nodes). The sizes are judged on the config
    as composed, before the driver's checks, which then run at the size the job is submitted with."""
    from rpg.paths.checkout import CHECKOUT, RECIPE_CONFIG_DIR
    from rpg.launch.config_keys import compose_config
    from rpg.launch.plan import compose

    raw = compose_config(overrides, CHECKOUT / RECIPE_CONFIG_DIR)
    count = req.node_count or NodeCount(int(raw.trainer.nnodes), int(raw.trainer.nnodes), False)
    if count.elastic:
        check_elastic(raw, req, user)
    sizes = node_sizes(raw, count)
    if count.elastic and len(sizes) > 1:
        check_reshardable(raw, count)
    if count.elastic:
        changed = resized_values(_world_values(raw), max(sizes))
        overrides = merge_overrides(list(overrides), [f"{k}={v}" for k, v in changed.items()])
    composed = compose(overrides)
    plan = {"nnodes": str(count), "sizes": sizes}
    if (pool := rollout_pool(composed[0])[0]) > 0:
        plan["rollout_nnodes"] = pool
    return list(overrides), composed, count, sizes, {NODE_PLAN_ENV: json.dumps(plan)}


def rollout_pool(cfg) -> tuple[int, int]:
    """The standalone rollout pool of a checked config (``rpg.launch.plan.compose``): its nodes and GPUs per node,
    ``actor_rollout_ref.rollout.nnodes`` x ``.n_gpus_per_node`` (integers >= 1: ``rpg.verl.block_checks``), which
    verl places beside the trainer's in separate_async; ``(0, 0)`` in another mode (no pool)."""
    if config_value(cfg, "trainer.v1.trainer_mode", "sync") != "separate_async":
        return 0, 0
    return (int(config_value(cfg, "actor_rollout_ref.rollout.nnodes")),
            int(config_value(cfg, "actor_rollout_ref.rollout.n_gpus_per_node")))


def supervisor_prefix(python: str, count: NodeCount, sizes: Sequence[int], max_restarts: int,
                      pool: tuple[int, int] = (0, 0)) -> list[str]:
    """The elastic supervisor's command, to which the trainer's (PYTHON main_rpg.py OVERRIDES) is appended;
    ``pool``: ``rollout_pool``, the nodes the supervisor keeps aside for it."""
    kept = ["--rollout-nnodes", str(pool[0]), "--rollout-gpus-per-node", str(pool[1])] if pool[0] else []
    return [python, "-m", "rpg.cluster.elastic", "--nnodes", str(count), "--sizes", ",".join(map(str, sizes)),
            "--max-restarts", str(max_restarts), *kept, "--"]
