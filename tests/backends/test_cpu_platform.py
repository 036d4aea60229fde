"""The CPU backend's registration: inert unless VERL_PLATFORM=cpu; complete when switched on.

Each check runs in a fresh interpreter, because verl resolves its platform once per process and
the registration happens inside ``import verl``.
"""

import json
import os
import subprocess
import sys
import textwrap

from rpg.backends.cpu.env_overrides import cpu_env


def _probe(code: str, env: dict) -> dict:
    full = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES")}
    full.update(env)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_without_the_switch_nothing_is_registered():
    # even with the registration module listed, VERL_PLATFORM unset => no-op
    res = _probe(
        """
        import json, sys, verl
        import rpg.backends.cpu.external_module as reg
        from verl.plugin.platform.platform_manager import PlatformRegistry
        from verl.workers.rollout import base
        from verl.workers.rollout.replica import RolloutReplicaRegistry
        import verl.utils.distributed as d
        print(json.dumps({
            "active": reg.ACTIVE,
            "cpu_platform": PlatformRegistry.get("cpu") is not None,
            "hf_adapter": ("hf", "async") in base._ROLLOUT_REGISTRY,
            "hf_replica": "hf" in RolloutReplicaRegistry._registry,
            "pg_patched": hasattr(d.initialize_global_process_group_ray, "__wrapped__"),
            "replay_poll_patched": hasattr(__import__("verl.trainer.ppo.v1.replay_buffer", fromlist=["x"]).ReplayBuffer.__init__, "__wrapped__"),
            "bootstrap_patched": hasattr(__import__("verl.trainer.ppo.metric_utils", fromlist=["x"]).bootstrap_metric, "__wrapped__"),
            "hooks": [type(f).__name__ for f in sys.meta_path if "PostImport" in type(f).__name__],
        }))
        """,
        {"VERL_USE_EXTERNAL_MODULES": "rpg.backends.cpu.external_module"},
    )
    assert res == {"active": False, "cpu_platform": False, "hf_adapter": False, "hf_replica": False,
                   "pg_patched": False, "replay_poll_patched": False, "bootstrap_patched": False, "hooks": []}


def test_with_the_switch_platform_engine_rollout_and_gloo_work():
    res = _probe(
        """
        import json, os, sys
        import torch, verl
        from verl.utils.device import get_device_name, get_nccl_backend, get_torch_device, get_device_id, get_resource_name
        engine_before = "verl.workers.engine" in sys.modules
        from verl.workers.engine import EngineRegistry
        from verl.workers.engine.fsdp import transformer_impl as ti
        from verl.workers.rollout.base import get_rollout_class
        from verl.workers.rollout.replica import get_rollout_replica_class
        from verl.workers import engine_workers
        import socket
        with socket.socket() as probe:  # a port free now: another checkout's run of this test may hold a fixed one
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
        engine_workers.initialize_global_process_group_ray(timeout_second=None)
        from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
        kw = dict(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
                  max_off_policy_strategy="drop", sampler_kwargs={})
        t = torch.ones(3)
        torch.distributed.all_reduce(t)
        print(json.dumps({
            "device": get_device_name(), "backend": get_nccl_backend(), "resource": get_resource_name(),
            "device_id": str(get_device_id()), "mem": get_torch_device().mem_get_info()[1] > 0,
            "engine_imported_by_verl_import": engine_before,
            "engine": EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__,
            "pin_memory": ti.CPUOffloadPolicy(pin_memory=True).pin_memory,
            "adapter": get_rollout_class("hf").__name__, "replica": get_rollout_replica_class("hf").__name__,
            "pg_backend": torch.distributed.get_backend(), "all_reduce": t.tolist(),
            "replay_poll_s": [ReplayBuffer(**kw).poll_interval, ReplayBuffer(**kw, poll_interval=3.0).poll_interval],
            "bootstrap_patched": hasattr(__import__("verl.trainer.ppo.metric_utils", fromlist=["x"]).bootstrap_metric, "__wrapped__"),
        }))
        """,
        cpu_env(base={}),
    )
    assert res == {
        "device": "cpu", "backend": "gloo", "resource": "GPU", "device_id": "cpu", "mem": True,
        "engine_imported_by_verl_import": False,  # the engine registration is deferred (post-import hook)
        "engine": "PrefixTreeEngine", "pin_memory": False,
        "adapter": "HFServerAdapter", "replica": "HFReplica", "pg_backend": "gloo", "all_reduce": [1.0, 1.0, 1.0],
        "replay_poll_s": [0.05, 3.0],  # the CPU default replaces verl's 2 s; an explicit value is kept
        "bootstrap_patched": True,  # validation's bootstrap reduced along an axis (tests/backends/test_cpu_patches.py)
    }
