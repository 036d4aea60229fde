"""A GPU kit step that runs out of time names where it was (rpg_lab.gpu_kit.stall; docs/gpu-smoke.md, "The GPU kit"): a
stand-in for the vLLM smoke run, with a child process and a Ray session folder like verl's, is stopped at its box;
its processes' stacks, the session's logs and vLLM's last start-up phase come back in the kit's output. And
``--installed`` keeps the kit's vLLM variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from messages import names

from rpg_lab.gpu_kit import KIT_VLLM_ENV, source_path, stall

ROOT = Path(__file__).resolve().parents[3]

# a driver that waits and a child named like a Ray worker of a session (its --session-dir), stuck "compiling"; the
# session's worker log shows vLLM's engine core up to torch.compile's start
STAND_IN = '''
import os, subprocess, sys, time
from pathlib import Path
work = Path(os.environ["RPG_GPU_KIT_WORK"])
logs = work / "rpgray1" / "session_2026-11-28_01-52-38_000000_1" / "logs"
logs.mkdir(parents=True, exist_ok=True)
(logs / "raylet.out").write_text("raylet started\\n")
(logs / "worker-ab12-01000000-77.out").write_text(
    "(EngineCore_DP0 pid=77) INFO 11-28 01:56:40 [core.py:90] Initializing a V1 LLM engine (v0.24.0)\\n"
    "(EngineCore_DP0 pid=77) INFO 11-28 01:56:52 [gpu_model_runner.py:3000] Model loading took 0.01 GiB and 1.2 s\\n"
    "(EngineCore_DP0 pid=77) INFO 11-28 01:56:58 [backends.py:500] Dynamo bytecode transform time: 3.1 s\\n")
(logs / "python-core-worker-ab12.log").write_text("not copied\\n")
CHILD = "import time\\ndef compiling_kernels_forever():\\n    time.sleep(120)\\ncompiling_kernels_forever()\\n"
child = subprocess.Popen([sys.executable, "-c", CHILD, f"--session-dir={logs.parent}"])
(work / "pids").write_text(f"{os.getpid()} {child.pid}")
def driver_waits():
    time.sleep(120)
print("[gpu-smoke] start-up  130s: waiting (actor and reference ready; starting the rollout server(s))", flush=True)
driver_waits()
'''


def kit(tmp_path: Path, stand_in: list[str], *args: str, env: dict | None = None) -> dict:
    stand_ins = tmp_path / "stand_ins.json"
    stand_ins.write_text(json.dumps({"smoke_vllm": stand_in}))
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "rpg_lab.gpu_kit.run", "--out", str(out), "--work", str(tmp_path / "work"),
                        "--installed", "--steps", "smoke_vllm", "--stand-ins", str(stand_ins), *args],
                       capture_output=True, text=True, cwd=ROOT, timeout=180,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(source_path(ROOT)), **(env or {})})
    summary = json.loads((out / "summary.json").read_text())
    return {**summary["steps"][0], "stdout": p.stdout + p.stderr, "run_id": summary["run_id"]}


def alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "\nState:\tZ" not in status.read_text()


def test_a_step_out_of_its_box_leaves_its_stacks_its_ray_logs_and_its_last_phase(tmp_path):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    step = kit(tmp_path, ["{python}", str(script)], "--box", "smoke_vllm=20")
    out, stem = tmp_path / "out", f"smoke_vllm.{step['run_id']}"
    assert step["status"] == "timed_out", step["stdout"]
    # the summary names the furthest phase the logs show, the worker log's torch.compile start
    names(step["reason"], "20 s box", "stopped", "last phase: compile started")  # the box, the outcome, the phase
    assert [p["phase"] for p in step["phases"]["reached"]] == ["engine spawned", "weights loaded", "compile started"]
    assert step["phases"]["reached"][1]["log"] == "worker-ab12-01000000-77.out"
    # both processes dumped every thread's stack before the kill: where each one was waiting
    driver, child = (int(x) for x in (tmp_path / "work" / "smoke_vllm" / "pids").read_text().split())
    assert step["stall"]["asked"] == step["stall"]["dumped"] == 2 and step["stall"]["stacks"] == f"{stem}.stacks.txt"
    stacks = (out / f"{stem}.stacks.txt").read_text()
    for pid, where in ((driver, "driver_waits"), (child, "compiling_kernels_forever")):
        block = stacks.split(f"===== pid {pid}: ", 1)[1].split("===== pid ", 1)[0]
        assert "(most recent call first):" in block and f" in {where}\n" in block, block
    # the Ray session the child named: its raylet and worker logs, not the core workers' own logs
    assert sorted(f.name for f in (out / f"{stem}.ray").iterdir()) == ["raylet.out", "worker-ab12-01000000-77.out"]
    assert step["stall"]["ray_logs"] == f"{stem}.ray" and step["stall"]["ray_logs_copied"] == 2
    assert not alive(driver) and not alive(child)
    assert "last phase: compile started" in step["stdout"]


def test_a_step_that_ends_in_time_is_not_signalled_and_names_the_phases_its_log_shows(tmp_path):
    lines = ["Model loading took 0.01 GiB and 1.2 seconds", "GPU KV cache size: 49,152 tokens",
             "init engine (profile, create kv cache, warmup model) took 9.1 seconds",
             "[gpu-smoke] validation before training: acc 0.358"]
    step = kit(tmp_path, ["{python}", "-c", f"print({chr(10).join(lines)!r})"])
    assert step["status"] != "timed_out" and "stall" not in step
    assert [p["phase"] for p in step["phases"]["reached"]] == ["weights loaded", "KV cache allocated", "engine ready",
                                                               "first request served"]
    assert step["phases"]["last"] == "first request served"


def test_the_h200s_stopped_vllm_start_reads_as_spawned_and_no_further():
    """The committed trainer-log lines of the H200's vLLM smoke run stopped by its box (2026-11-28, vLLM at WARN):
    its server began spawning the engine (151.9 s), nothing after it was logged."""
    found = stall.phases([ROOT / "docs" / "gpu-runs" / "20261128-015238.smoke_vllm.trainer-excerpt.log"])
    assert found["last"] == "engine spawned" and len(found["reached"]) == 1
    assert "151.9s" in found["reached"][0]["line"]


ENV_OF_STEP = ["{python}", "-c", "import json, os; json.dump({k: v for k, v in os.environ.items() if k.startswith("
               "('VLLM_', 'RPG_GPU_KIT_STACKS', 'PYTHONFAULTHANDLER'))}, open(os.path.join(os.environ["
               "'RPG_GPU_KIT_WORK'], 'env.json'), 'w'))"]


def test_installed_keeps_the_kits_vllm_variables_and_a_value_already_set(tmp_path):
    kit(tmp_path, ENV_OF_STEP)
    seen = json.loads((tmp_path / "work" / "smoke_vllm" / "env.json").read_text())
    assert {k: seen.get(k) for k in KIT_VLLM_ENV} == KIT_VLLM_ENV == {"VLLM_USE_FLASHINFER_SAMPLER": "0",
                                                                      "VLLM_LOGGING_LEVEL": "INFO"}
    assert seen["PYTHONFAULTHANDLER"] == "1" and Path(seen[stall.STACKS_ENV]).is_dir()
    kit(tmp_path, ENV_OF_STEP, env={"VLLM_LOGGING_LEVEL": "DEBUG"})
    seen = json.loads((tmp_path / "work" / "smoke_vllm" / "env.json").read_text())
    assert seen["VLLM_LOGGING_LEVEL"] == "DEBUG" and seen["VLLM_USE_FLASHINFER_SAMPLER"] == "0"


def test_a_process_that_does_not_catch_sigusr1_is_never_sent_it(tmp_path):
    """Signalled without a handler a process would end: only one that registered and still catches it is asked."""
    stacks = tmp_path / "stacks"
    env = stall.hook_env({**os.environ, "PYTHONPATH": os.pathsep.join(source_path(ROOT))}, stacks)
    code = "import signal, time; signal.signal(signal.SIGUSR1, signal.SIG_DFL); print('ready', flush=True); " \
           "time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready" and (stacks / f"{p.pid}.txt").is_file()
        found = stall.dump_stacks([p.pid], stacks, tmp_path / "stacks.txt", wait_s=0.5)
        assert found["asked"] == 0 and p.poll() is None
    finally:
        p.kill()
        p.wait()
