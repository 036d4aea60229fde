"""The folders the GPU kit writes into (rpg_lab.gpu_kit.install, rpg_lab.gpu_kit.run; docs/gpu-smoke.md, "The GPU kit"),
each through the real command in a subprocess: a ``--site`` the kit did not make is refused in one line and its files
kept, another run writing into the same ``--out`` is refused while it runs (and not after it was killed), a full disk
ends the summary with the failure named (or one line when even the summary cannot be written), an ``--out`` that
cannot be made is one line. The vLLM site's: tests/lab/gpu_kit/test_vllm_parts.py."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from messages import names, one_line
from test_gpu_kit import make_wheel

from rpg_lab.gpu_kit import install, pack, source_path

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(source_path(ROOT))}
PASSES = ["{python}", "-c", "import json, os; json.dump({'line': 'ok', 'problems': []}, "
          "open(os.environ['RPG_GPU_KIT_RESULT'], 'w'))"]  # a step that passes


def kit(*args: str, preexec_fn=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT, env=ENV,
                          timeout=timeout, preexec_fn=preexec_fn)


def carry(tmp_path: Path) -> Path:
    """A whole carry of one stand-in wheel, as rpg_lab.gpu_kit.build leaves it (its sha256 matches its manifest)."""
    wheels = {"kitpkg": make_wheel(tmp_path, "kitpkg", {"kitpkg/__init__.py": b"X = 1\n"})}
    pack.write_carry(wheels, {"kitpkg": "1.0"}, tmp_path / "carry", {"excluded": {}, "only_needed_by_excluded": []},
                     preset=1)
    return tmp_path / "carry"


def users_folder(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True)
    (folder / name).write_text("a user's own work\n")
    return folder / name


def test_the_install_refuses_a_site_it_did_not_make_and_keeps_its_files(tmp_path):
    thesis = users_folder(tmp_path / "my project", "thesis.tex")
    p = kit("rpg_lab.gpu_kit.install", "--carry", str(carry(tmp_path)), "--site", str(thesis.parent))
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert f"--site {thesis.parent}: not empty and no {install.STATE} in it" in p.stderr
    assert "give a new or empty folder, or one the kit made" in p.stderr
    assert thesis.read_text() == "a user's own work\n" and sorted(thesis.parent.iterdir()) == [thesis]
    p = kit("rpg_lab.gpu_kit.install", "--carry", str(carry(tmp_path)), "--site", str(thesis))  # a file: not a folder
    assert p.returncode == 1 and f"--site {thesis}: not a folder" in p.stderr and thesis.is_file()
    from rpg_lab.gpu_kit import foreign  # what the kit may empty: no folder, an empty one, one holding its state file

    (tmp_path / "empty").mkdir()
    (tmp_path / "made").mkdir()
    (tmp_path / "made" / install.STATE).write_text("{}")
    (tmp_path / "made" / "wheel_file.py").write_text("")
    assert [foreign(tmp_path / f, install.STATE) for f in ("none", "empty", "made")] == [None, None, None]


def test_the_kit_refuses_a_site_it_did_not_make_before_any_step(tmp_path):
    todo = users_folder(tmp_path / "notes", "todo.txt")
    out = tmp_path / "out"
    p = kit("rpg_lab.gpu_kit.run", "--out", str(out), "--work", str(tmp_path / "work"), "--carry", str(carry(tmp_path)),
            "--site", str(todo.parent), "--steps", "install")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stdout + p.stderr
    assert f"--site {todo.parent}: not empty and no {install.STATE} in it" in p.stderr
    assert todo.read_text() == "a user's own work\n" and not out.exists()


def poll(ready, what: str, seconds: float = 60.0) -> None:
    end = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < end, f"not {what} after {seconds} s"
        time.sleep(0.1)


def test_a_second_run_into_the_same_out_is_refused_while_the_first_runs_and_not_after_it_was_killed(tmp_path):
    out, stand_ins = tmp_path / "out", tmp_path / "stand_ins.json"
    stand_ins.write_text(json.dumps({"gpu_tests": ["{python}", "-c", "import time; time.sleep(60)"],
                                     "model_step": PASSES}))
    args = ["rpg_lab.gpu_kit.run", "--out", str(out), "--work", str(tmp_path / "work"), "--installed", "--stand-ins",
            str(stand_ins)]
    first = subprocess.Popen([sys.executable, "-m", *args, "--steps", "gpu_tests"], cwd=ROOT, env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    summary = out / "summary.json"
    try:
        poll(lambda: summary.is_file() and json.loads(summary.read_text())["steps"][0]["status"] == "running",
             "running")
        before = json.loads(summary.read_text())
        second = kit(*args, "--steps", "model_step")
        assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stdout + second.stderr
        assert f"--out {out}: another run of the kit is writing there (PID {first.pid})" in second.stderr
        assert json.loads(summary.read_text()) == before  # the first run's summary untouched
        first.send_signal(signal.SIGKILL)  # a killed run holds no lock: the next one goes ahead
        first.wait(timeout=30)
    finally:
        first.kill()
        first.wait()
        step = json.loads(summary.read_text())["steps"][0].get("pid")
        if step:  # the killed kit's step, in its own process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(step, signal.SIGKILL)
    third = kit(*args, "--steps", "model_step")
    assert third.returncode == 0, third.stdout + third.stderr
    now = json.loads(summary.read_text())
    assert now["steps"][0]["name"] == "model_step" and now["steps"][0]["status"] == "passed"
    assert json.loads((out / now["previous_summary"]).read_text())["run_id"] == before["run_id"]


def fsize_limit(n: int):
    """A file-size limit for the kit and its steps: a write past ``n`` bytes fails as on a full disk (OSError; Python
    ignores the SIGXFSZ that comes with it)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))


def test_a_full_disk_ends_the_summary_with_the_failure_named_or_is_one_line(tmp_path):
    stand_ins = tmp_path / "stand_ins.json"  # a failing step whose 30 lines (its summary entry's tail) pass the limit
    stand_ins.write_text(json.dumps({"model_step": ["{python}", "-c", "[print('x' * 79) for _ in range(30)]; exit(1)"],
                                     "gpu_tests": ["{python}", "-c", "print('= 1 passed in 0.01s =')"]}))
    args = ["rpg_lab.gpu_kit.run", "--work", str(tmp_path / "work"), "--installed", "--steps", "model_step,gpu_tests",
            "--stand-ins", str(stand_ins)]
    out = tmp_path / "out"
    p = kit(*args, "--out", str(out), preexec_fn=fsize_limit(4000))
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stdout + p.stderr
    summary = json.loads((out / "summary.json").read_text())
    failure = f"the kit stopped on an OS error: {out / 'summary.json'}: File too large"
    assert summary["finished"] and not summary["all_passed"] and summary["failure"] == failure
    steps = {s["name"]: s for s in summary["steps"]}
    assert steps["model_step"]["status"] == "failed" and "x" * 79 in (out / steps["model_step"]["log"]).read_text()
    assert steps["gpu_tests"] == {**steps["gpu_tests"], "status": "skipped", "reason": f"not started: {failure}"}
    assert failure in p.stdout and not list(out.glob(".*.tmp"))
    small = tmp_path / "small"  # not even the first summary fits: one line
    p = kit(*args, "--out", str(small), preexec_fn=fsize_limit(600))
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stdout + p.stderr
    # the file, the OS's reason, where the kit stopped
    names(one_line(p.stderr), f"[gpu-kit] {small / 'summary.json'}:", "File too large", "before its first step")
    assert list(small.iterdir()) == []


def test_an_out_or_work_folder_that_cannot_be_made_is_one_line(tmp_path):
    (afile := tmp_path / "afile").write_text("")
    stand_ins = tmp_path / "stand_ins.json"
    stand_ins.write_text(json.dumps({"model_step": PASSES}))
    args = ["rpg_lab.gpu_kit.run", "--installed", "--steps", "model_step", "--stand-ins", str(stand_ins)]
    for out, why in ((afile, "File exists"), (afile / "out", "Not a directory")):
        p = kit(*args, "--out", str(out), "--work", str(tmp_path / "work"))
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert p.stderr.startswith(f"[gpu-kit] --out {out}: cannot be made ({why})"), p.stderr
    p = kit(*args, "--out", str(tmp_path / "out"), "--work", str(afile / "work"))
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["failure"] == f"the kit stopped on an OS error: {afile / 'work'}: Not a directory"
    assert summary["steps"][0]["status"] == "skipped" and summary["steps"][0]["reason"].startswith("not started")


def test_the_builds_replace_only_a_folder_of_their_own(tmp_path):
    """``rpg_lab.gpu_kit.build --out`` and ``rpg_lab.gpu_kit.vllm_parts --out`` replace their folder as a whole: one that
    holds anything else is refused in one line before any work, its files kept; their own is replaced."""
    from rpg_lab.gpu_kit import vllm_parts

    made = carry(tmp_path)  # the carry's own folder: replaced by the next build
    wheels = {"kitpkg": make_wheel(tmp_path, "kitpkg", {"kitpkg/__init__.py": b"X = 2\n"})}
    pack.write_carry(wheels, {"kitpkg": "2.0"}, made, {"excluded": {}, "only_needed_by_excluded": []}, preset=1)
    assert json.loads((made / "manifest.json").read_text())["wheels"]["kitpkg"]["version"] == "2.0"
    parts = tmp_path / "parts"  # the parts' own folder, as a build left it: replaced by the next one
    for version in ("1", "2"):
        vllm_parts.pack_parts(wheels, {"kitpkg": version}, parts, {}, 2**20, preset=1)
    assert json.loads((parts / "manifest.json").read_text())["wheels"]["kitpkg"]["version"] == "2"
    notes = users_folder(tmp_path / "direct", "notes.md")
    for write in (lambda: pack.write_carry(wheels, {"kitpkg": "2.0"}, notes.parent, {}, preset=1),
                  lambda: vllm_parts.pack_parts(wheels, {"kitpkg": "2.0"}, notes.parent, {}, 2**20, preset=1)):
        with pytest.raises(FileExistsError, match="holds notes.md"):
            write()
        assert notes.read_text() == "a user's own work\n"
    for module in ("rpg_lab.gpu_kit.build", "rpg_lab.gpu_kit.vllm_parts"):
        notes = users_folder(tmp_path / module / "my work", "notes.md")
        p = kit(module, "--out", str(notes.parent), "--python", sys.executable)  # refused before --python's check
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        names(one_line(p.stderr), f"{module}: --out {notes.parent}:", "notes.md")  # the folder, the file in it
        assert notes.read_text() == "a user's own work\n"
