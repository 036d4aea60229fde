"""The harness's failure and clean-up paths, with stand-in entry scripts (no verl, no Ray)."""

import os
import textwrap

import psutil
import pytest

from rpg.trainer_process import TrainerRunError, run_trainer


def _script(tmp_path, body: str):
    path = tmp_path / "entry.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_failed_run_raises_with_the_log_tail(tmp_path):
    entry = _script(tmp_path, """
        import sys
        for i in range(100):
            print(f"line {i}")
        print("boom: the trainer failed", file=sys.stderr)
        sys.exit(3)
    """)
    with pytest.raises(TrainerRunError) as err:
        run_trainer([], output_dir=tmp_path / "out", entry=entry, timeout_s=60)
    msg = str(err.value)
    assert "exited with code 3" in msg and "boom: the trainer failed" in msg and "line 99" in msg
    assert "line 0\n" not in msg  # only the tail
    assert err.value.run.returncode == 3


def test_metrics_are_read_from_the_file_logger_path(tmp_path):
    entry = _script(tmp_path, """
        import json, os, sys
        assert os.environ["VERL_PLATFORM"] == "cpu"
        assert "trainer.device=cpu" in sys.argv and "trainer.logger=['console','file']" in sys.argv
        with open(os.environ["VERL_FILE_LOGGER_PATH"], "w") as f:
            f.write(json.dumps({"step": 0, "data": {"val": 0.5}}) + "\\n")
            f.write(json.dumps({"step": 1, "data": {"loss": 1.0}}) + "\\n")
    """)
    seen = []
    run = run_trainer([], output_dir=tmp_path / "out", entry=entry, timeout_s=60, on_metrics=lambda s, d: seen.append(s))
    assert run.metrics == {0: {"val": 0.5}, 1: {"loss": 1.0}} and seen == [0, 1]
    assert run.leftover_pids == []


def test_timeout_kills_the_run(tmp_path):
    entry = _script(tmp_path, "import time\ntime.sleep(600)\n")
    with pytest.raises(TrainerRunError, match="timed out"):
        run_trainer([], output_dir=tmp_path / "out", entry=entry, timeout_s=3)


def test_processes_left_behind_are_reported_and_terminated(tmp_path):
    # a child in its own session (out of reach of the process-group kill) that carries the run's
    # Ray temp dir on its command line, like a Ray daemon does
    entry = _script(tmp_path, """
        import subprocess, sys
        marker = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("+ray_kwargs.ray_init._temp_dir="))
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker], start_new_session=True)
    """)
    run = run_trainer([], output_dir=tmp_path / "out", entry=entry, timeout_s=60, reap_after_s=2)
    assert len(run.leftover_pids) == 1
    pid = run.leftover_pids[0]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert pid != os.getpid()


def test_stop_event_ends_the_run_from_another_thread(tmp_path):
    import threading
    import time

    entry = _script(tmp_path, """
        import os, time
        open(os.path.join(os.environ["VERL_FILE_LOGGER_PATH"] + ".started"), "w").close()
        time.sleep(600)
    """)
    t0 = time.time()
    err = _stopped_once_started(tmp_path, entry)
    assert err.value.run.stopped and not err.value.run.timed_out and time.time() - t0 < 60
    assert err.value.run.leftover_pids == []  # the process group was terminated, nothing outlived it
    stop_now = threading.Event()
    stop_now.set()  # already stopped (an interrupt between a run's scheduling and its start): nothing starts
    with pytest.raises(TrainerRunError, match="stopped by the caller before it started") as err:
        run_trainer([], output_dir=tmp_path / "out2", entry=entry, timeout_s=120, stop=stop_now)
    assert err.value.run.stopped and not (tmp_path / "out2" / "trainer.log").exists()


def _stopped_once_started(tmp_path, entry: str):
    """Run ``entry`` (which creates ``$VERL_FILE_LOGGER_PATH.started`` once it is running) under a stop event
    set from another thread as soon as that file exists; the ``TrainerRunError`` it raised (pytest's info)."""
    import threading

    stop = threading.Event()
    started = tmp_path / "out" / "metrics.jsonl.started"
    threading.Thread(target=lambda: (_wait_for(started), stop.set()), daemon=True).start()
    with pytest.raises(TrainerRunError, match="stopped by the caller") as err:
        run_trainer([], output_dir=tmp_path / "out", entry=entry, timeout_s=120, stop=stop)
    return err


def _wait_for(path, timeout_s: float = 60.0) -> None:
    import time

    deadline = time.time() + timeout_s
    while not path.exists() and time.time() < deadline:
        time.sleep(0.05)


def test_the_launcher_stays_torch_free_and_still_reads_the_drivers_refusal(tmp_path):
    """The harness (the tiny demo's and the variant launcher's path to the trainer) starts the trainer
    without importing torch: it did, through rpg.verl.input_paths, only to read the refusal line's prefix,
    which put 5-12 s of torch import on a 2-core machine before the trainer process started."""
    import subprocess
    import sys

    refusal = "rpg config error: rpg.loss.divergence='js' is invalid"  # the entry's own line, read back as it is
    entry = _script(tmp_path, f"""
        import sys
        print({refusal!r}, file=sys.stderr)
        sys.exit(2)
    """)
    code = ("import sys; from rpg.trainer_process import run_trainer; "
            f"r = run_trainer([], output_dir={str(tmp_path / 'out')!r}, entry={entry!r}, check=False, timeout_s=60); "
            "print(r.returncode, r.refusal(), 'torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == f"2 {refusal} False"  # its exit code, its refusal, no torch


def test_a_reused_pid_is_never_signalled(tmp_path, monkeypatch):
    """A process of the run ends and its pid is taken by an unrelated process (PIDs wrap): the clean-up
    must not signal that process. Before: the harness recorded bare pids and terminated whatever held one
    of them at the end (victim exit -15, its pid in ``leftover_pids``).

    The reuse is simulated: once the run's child has exited, psutil's view of its pid is an unrelated
    process that this test started (same pid, another start time), which is what the kernel shows after
    a reuse."""
    import subprocess
    import sys

    entry = _script(tmp_path, """
        import os, subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
        with open(os.environ["VERL_FILE_LOGGER_PATH"] + ".child", "w") as f:
            f.write(str(child.pid))
        child.wait()  # the child ends (and is reaped) while the trainer is still running
    """)
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    child_file = tmp_path / "out" / "metrics.jsonl.child"
    real = psutil.Process

    class Reused(real):
        """psutil.Process, except that the run's child's pid, once that child is gone, names the victim."""

        def __init__(self, pid=None):
            if pid is not None and child_file.exists() and pid == int(child_file.read_text() or -1) \
                    and not os.path.exists(f"/proc/{pid}"):
                pid = victim.pid
            super().__init__(pid)

    try:
        monkeypatch.setattr(psutil, "Process", Reused)
        run = run_trainer([], output_dir=tmp_path / "out", entry=entry, timeout_s=60, reap_after_s=2)
        monkeypatch.undo()
        assert int(child_file.read_text()) not in run.leftover_pids and run.leftover_pids == []
        assert victim.poll() is None  # the unrelated process was not signalled
    finally:
        victim.kill()
        victim.wait()


def test_a_full_disk_stops_the_run_with_the_stop_line(tmp_path, monkeypatch, capsys):
    """The trainer's log cannot be written (ENOSPC after 4 KiB, as on a full disk) while the trainer prints
    more than a pipe holds. Before: the harness's log pump died with the OSError, nothing drained the pipe,
    the trainer blocked, and the launcher waited its whole timeout before a raw traceback. Now the pump keeps
    draining, the run is stopped within the short clean-up time, and the launcher prints the one stop line
    (log, last complete checkpoint, resume command)."""
    import errno
    import io
    import time

    from rpg import trainer_process as harness
    from rpg.trainer_process import run as harness_run

    entry = _script(tmp_path, """
        import sys, time
        for i in range(20000):  # ~2 MB: far more than a pipe's 64 KiB
            print(f"line {i} " + "x" * 90)
        time.sleep(600)
    """)
    real_open = open

    class FullDisk(io.RawIOBase):
        def __init__(self, f):
            self.f, self.n = f, 0

        def writable(self):
            return True

        def write(self, b):
            if self.n + len(b) > 4096:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.n += len(b)
            return self.f.write(b)

        def close(self):
            self.f.close()
            super().close()

    def fake_open(path, mode="r", *a, **kw):
        f = real_open(path, mode, *a, **kw)
        return FullDisk(f) if str(path).endswith(harness.LOG_FILE) and "b" in mode else f

    monkeypatch.setattr(harness_run, "open", fake_open, raising=False)  # the module that opens trainer.log
    out = tmp_path / "out"
    t0 = time.time()
    with pytest.raises(TrainerRunError, match="its output could not be written") as err:
        run_trainer(["trainer.default_local_dir=ckpts"], output_dir=out, entry=entry, timeout_s=120)
    run = err.value.run
    assert time.time() - t0 < 60 and not run.timed_out  # stopped, not waited out
    assert "No space left on device" in run.output_error and run.discarded_lines > 0
    assert run.leftover_pids == []
    code = harness.report_failure(err.value, "[tiny]", "resume: python -m rpg_lab.demo.cpu --out OUT")
    lines = capsys.readouterr().err.splitlines()
    assert code == 1 and len(lines) == 1
    assert lines[0].startswith("[tiny] stopped because the output could not be written") and "lines of output " \
        "discarded" in lines[0] and f"log {out / 'trainer.log'}" in lines[0]
    assert f"last complete checkpoint none in {out / 'ckpts'}" in lines[0] and lines[0].endswith(
        "resume: python -m rpg_lab.demo.cpu --out OUT")


def test_vllm_socket_files_go_with_the_runs_private_directory(tmp_path):
    """vLLM names its ZMQ socket files after VLLM_RPC_BASE_PATH (default: the temp dir) and its processes are
    killed at the run's end: the harness points it at the run's private Ray temp dir, removed after the run,
    so no socket is left in TMPDIR; a user's own value is kept."""
    entry = _script(tmp_path, """
        import os, socket, sys, uuid
        base = os.environ["VLLM_RPC_BASE_PATH"]
        print("RAY_TMP", next(a.split("=", 1)[1] for a in sys.argv if a.startswith("+ray_kwargs.ray_init._temp_dir=")))
        path = os.path.join(base, str(uuid.uuid4()))
        s = socket.socket(socket.AF_UNIX); s.bind(path)  # as ZMQ's ipc:// bind does
        print("SOCKET", path, flush=True)
        os._exit(0)  # killed, as vLLM's processes are: nothing unlinks the file
    """)
    run = run_trainer([], output_dir=tmp_path / "out", entry=entry, timeout_s=60)
    printed = [line.split("] ", 1)[-1] for line in run.log.splitlines()]  # after the "[  t s] " stamp
    found = dict(line.split(" ", 1) for line in printed if line.startswith(("RAY_TMP ", "SOCKET ")))
    assert os.path.dirname(found["SOCKET"]) == found["RAY_TMP"]
    assert not os.path.exists(found["SOCKET"]) and not os.path.exists(found["RAY_TMP"])
    import shutil
    import tempfile
    from pathlib import Path

    mine = Path(tempfile.mkdtemp(prefix="rpc"))  # short: a socket's path has at most 107 bytes
    try:
        run_trainer([], output_dir=tmp_path / "out2", entry=entry, timeout_s=60, env={"VLLM_RPC_BASE_PATH": str(mine)})
        kept = list(mine.iterdir())
        assert len(kept) == 1 and kept[0].is_socket()  # the user's directory is the user's
    finally:
        shutil.rmtree(mine, ignore_errors=True)


def test_the_trainer_is_stopped_before_the_rest_of_its_process_group(tmp_path):
    """SIGTERM reaches the trainer alone first (the RPG driver then shuts its own Ray cluster down and prints
    its stop line): a child in its process group, standing in for Ray's raylet, is still running while the
    trainer's handler runs, and gets SIGTERM once the trainer has exited (nothing is left)."""
    import time

    entry = _script(tmp_path, """
        import os, signal, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # same process group
        def on_term(signum, frame):
            time.sleep(1.0)  # a SIGTERM to the whole group would have ended the child by now
            print("child running in the trainer's handler:", child.poll() is None, flush=True)
            os._exit(0)  # without reaping or stopping the child: the group's SIGTERM must end it
        signal.signal(signal.SIGTERM, on_term)
        print("CHILD", child.pid, flush=True)
        open(os.environ["VERL_FILE_LOGGER_PATH"] + ".started", "w").close()
        time.sleep(600)
    """)
    t0 = time.time()
    run = _stopped_once_started(tmp_path, entry).value.run
    assert "child running in the trainer's handler: True" in run.log, run.log[-2000:]
    child = int(next(line.split()[-1] for line in run.log.splitlines() if "] CHILD " in line))
    assert run.leftover_pids == [] and _ended(child)  # ended by the group's SIGTERM
    assert time.time() - t0 < 60


def _ended(pid: int) -> bool:
    """Gone, or a zombie that its new parent (init, or a sandbox's pid 1) has not reaped."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
