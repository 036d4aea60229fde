"""On a Ray cluster the driver joined, each node that will hold a rank group is checked where the ranks will run
(rpg.verl.node_checks.rank_nodes_problems): a task pinned to the node, holding the group's GPUs, runs the
backend's checks of a node; one line per problem naming the node. On this CPU machine the GPU part is a Ray
node with logical GPUs (no CUDA behind them): the GPU backend's check then names the node and CUDA's absence, which
is what a broken GPU worker node would show before any rank starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rpg.verl import node_checks

ROOT = Path(__file__).resolve().parents[2]


def _cfg(device: str = "cuda", gpus: int = 2):
    return OmegaConf.create({"trainer": {"device": device, "n_gpus_per_node": gpus, "nnodes": 2},
                             "actor_rollout_ref": {"rollout": {"name": "vllm"}}})


def test_each_node_holding_a_rank_group_is_asked_with_the_groups_gpus(monkeypatch):
    asked = {}

    def on_each_node(fn, nodes, *args, gpus=0, timeout_s=0):
        asked.update(nodes=[n["ip"] for n in nodes], gpus=gpus, fn=fn.__name__)
        return [([], []), (["CUDA is not available"], ["vllm 0.1 is installed"])]

    monkeypatch.setattr(node_checks, "on_each_node", on_each_node)
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    settings = type("S", (), {"loss_name": "rpg", "uses_rpg_actor_loss": True})()
    nodes = [{"id": "a" * 20, "ip": "10.0.0.1", "gpus": 2.0}, {"id": "b" * 20, "ip": "10.0.0.2", "gpus": 2.0},
             {"id": "c" * 20, "ip": "10.0.0.3", "gpus": 0.0}]  # a head without GPUs holds no rank group
    errors, warnings = node_checks.rank_nodes_problems(_cfg(), settings, nodes)
    assert asked == {"nodes": ["10.0.0.1", "10.0.0.2"], "gpus": 2, "fn": "rank_node_problems"}
    assert errors == [f"node 10.0.0.2 (id {'b' * 12}): CUDA is not available"]
    assert warnings == [f"node 10.0.0.2 (id {'b' * 12}): vllm 0.1 is installed"]
    # the CPU backend checks nothing per node
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert node_checks.rank_nodes_problems(_cfg("cpu"), settings, nodes) == ([], [])


PROBE = """
import json, ray
import pytest
from omegaconf import OmegaConf
from rpg.verl import node_checks
from rpg.verl.joined_cluster import alive_nodes
ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
cfg = OmegaConf.create({"trainer": {"device": "cuda", "n_gpus_per_node": 2, "nnodes": 1},
                        "actor_rollout_ref": {"rollout": {"name": "hf"}}})
settings = type("S", (), {"loss_name": "rpg", "uses_rpg_actor_loss": True})()
errors, warnings = node_checks.rank_nodes_problems(cfg, settings, alive_nodes(), timeout_s=120)
print("FOUND=" + json.dumps({"errors": errors, "node": alive_nodes()[0]["ip"]}))
"""


@pytest.mark.distributed  # a Ray of its own: the distributed stage's time
def test_a_gpu_node_without_cuda_is_named_before_any_rank_starts(tmp_path):
    """A real Ray node declaring 2 GPUs (logical: this machine has no CUDA): the task holding them runs the GPU
    backend's check there and the node's CUDA problem comes back as one line naming it."""
    from rpg.backends.run_env import RUN_ENV, ray_auth_env

    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    env.update(RUN_ENV, **ray_auth_env({}))
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    line = next((x for x in r.stdout.splitlines() if x.startswith("FOUND=")), None)
    assert line is not None, r.stderr[-3000:]
    found = json.loads(line[len("FOUND="):])
    assert found["errors"] and all(e.startswith(f"node {found['node']} (id ") for e in found["errors"]), found
    assert any("CUDA is not available" in e for e in found["errors"]), found
