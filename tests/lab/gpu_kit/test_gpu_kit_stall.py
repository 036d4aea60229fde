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


def test_the_h200s_compiled_vllm_start_reads_as_every_phase_in_order(tmp_path):
    """The committed trainer-log lines of the compiled vLLM smoke run that passed on the H200 (2026-11-30, vLLM 0.24 at
    INFO): every phase of a compiled start, each at its second of the run, in vLLM's order (the validation's result,
    the last phase, is in the smoke run's own log, not in these lines)."""
    excerpt = ROOT / "docs" / "gpu-runs" / "20261130-184916.smoke_vllm_compiled.trainer-excerpt.log"
    log = tmp_path / "trainer.log"  # the trainer log's lines as they were: grep -n's line numbers taken off
    log.write_text("".join(line.split(":", 1)[1] for line in excerpt.read_text().splitlines(keepends=True)[1:]))
    found = stall.phases([log])
    at = {p["phase"]: p["at_s"] for p in found["reached"]}
    assert list(at) == [name for name, _ in stall.PHASES][:-1] and found["last"] == "engine ready"
    assert (at["engine spawned"], at["weights loaded"], at["compile started"], at["compile ended"],
            at["KV cache allocated"], at["graphs captured"], at["engine ready"]) == (
        112.6, 148.3, 150.2, 157.7, 164.5, 166.0, 166.4)
    assert list(at.values()) == sorted(at.values())


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


# a step that passes its box after a slow phase: a driver and a child each busy in a named function for 6 s
SLOW = '''
import subprocess, sys, time
CHILD = "import time\\ndef generating_the_first_batch():\\n    time.sleep(6)\\ngenerating_the_first_batch()\\n"
child = subprocess.Popen([sys.executable, "-c", CHILD])
def driver_validates():
    time.sleep(6)
driver_validates()
child.wait()
'''


def test_sampled_stacks_say_where_a_step_that_ended_in_its_box_spent_its_time(tmp_path):
    """--sample-stacks: every second each process of the step is asked for its stacks; when the step ends (here by
    itself, well inside its box), the samples are gathered into OUT, each after its time mark."""
    script = tmp_path / "slow.py"
    script.write_text(SLOW)
    step = kit(tmp_path, ["{python}", str(script)], "--box", "smoke_vllm=60", "--sample-stacks", "1")
    assert step["status"] != "timed_out" and step["seconds"] < 30, step["stdout"]
    assert "stall" not in step  # not stopped: no end-of-box dump
    samples = step["samples"]
    assert samples["every_s"] == 1 and samples["taken"] >= 2 and samples["processes"] == 2, samples
    text = (tmp_path / "out" / samples["file"]).read_text()
    for where in ("driver_validates", "generating_the_first_batch"):
        block = next(b for b in text.split("===== pid ")[1:] if f" in {where}\n" in b)
        marks = [line for line in block.splitlines() if line.startswith(stall.SAMPLE_MARK)]
        assert len(marks) >= 2 and block.count("(most recent call first):") >= 2, block
    # without the flag: no samples, no file
    (tmp_path / "plain").mkdir()
    plain = kit(tmp_path / "plain", ["{python}", str(script)], "--box", "smoke_vllm=60")
    assert "samples" not in plain and not list((tmp_path / "plain" / "out").glob("*.samples.txt"))
    # more often than once a second: refused in one line before any step
    p = subprocess.run([sys.executable, "-m", "rpg_lab.gpu_kit.run", "--out", str(tmp_path / "fast"), "--installed",
                        "--steps", "smoke_vllm", "--sample-stacks", "0.5"], capture_output=True, text=True, cwd=ROOT,
                       timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(source_path(ROOT))})
    assert p.returncode == 2 and "--sample-stacks" in p.stderr and "at least 1 s" in p.stderr, p.stderr
    assert not (tmp_path / "fast" / "summary.json").exists()
