"""The GPU kit's cheap parts (rpg_lab.gpu_kit; docs/gpu-smoke.md, "The GPU kit"): which resolved packages it
carries, a wheel trimmed and stored, pip check's lines sorted, and ``run`` walked with a stand-in for each step
(the order, the time box that kills a step and its children, the summary rewritten after each step, a failing
step followed by the next, a step the budget leaves no time for). The build against the package registry, the
offline install and the steps' real outputs: the gpu_kit stage (tests/lab/gpu_kit/test_gpu_kit_stage.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from messages import names

from rpg_lab.gpu_kit import build, install, pack, run, source_path
from rpg_lab.gpu_kit import steps as kit_steps

ROOT = Path(__file__).resolve().parents[3]


def item(name: str, version: str, *requires: str) -> dict:
    """One entry of pip's installation report."""
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)},
            "download_info": {"url": f"https://example.invalid/{name}-{version}-py3-none-any.whl"}}


def test_the_carry_is_what_the_roots_reach_for_the_node_less_what_it_has_or_is_excluded():
    items = [
        item("app", "1", "lib[fast]>=1", "old-shim; python_version < '3.12'", "winonly; sys_platform == 'win32'",
             "logger"),
        item("lib", "2", "speedup; extra == 'fast'", "docs; extra == 'docs'", "numpy"),
        item("speedup", "1"), item("docs", "1"), item("old-shim", "1"), item("winonly", "1"),
        item("logger", "3", "logger-helper", "shared"), item("logger-helper", "1"), item("shared", "1"),
        item("numpy", "2"), item("Transformers", "5.10.4", "numpy"),
    ]
    sel = build.select(items, ["app", "transformers"], have={"numpy": "2", "transformers": "5.17.0"},
                       exclude={"logger": "never imported"}, carry_anyway={"transformers": "outside a range"})
    # the extra asked for is followed, the other not; markers are the node's (3.12, Linux)
    assert sorted(sel.carry) == ["app", "lib", "speedup", "transformers"]
    assert sel.have == ["numpy"] and sel.excluded == {"logger": "never imported"}
    # resolved, but needed only through the excluded package (or through markers false on the node)
    assert sel.unreached == ["docs", "logger-helper", "old-shim", "shared", "winonly"]
    assert sel.carry["transformers"]["metadata"]["version"] == "5.10.4"


def test_a_requirement_missing_from_the_resolution_is_refused():
    with pytest.raises(build.BuildError, match="lib is required but not in pip's resolution"):
        build.select([item("app", "1", "lib")], ["app"], have={})


def test_the_node_list_reads_pip_freeze():
    have = build.read_have("# comment\nTorch==2.11.0\nhuggingface_hub==1.33.0\nsix\n"
                           "mypkg @ file:///x/mypkg.whl\n-e git+https://example.invalid/x\n")
    assert have == {"torch": "2.11.0", "huggingface-hub": "1.33.0", "six": None, "mypkg": None}
    shipped = build.read_have(build.HAVE_FILE.read_text())
    assert shipped["torch"] == "2.11.0" and "verl" not in shipped and "ray" not in shipped


def make_wheel(folder: Path, name: str, files: dict[str, bytes], modes: dict[str, int] | None = None) -> Path:
    """A minimal valid wheel (py3-none-any) holding ``files``, with its RECORD."""
    dist = f"{name}-1.0.dist-info"
    members = {**files, f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
               f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},,\n" for path in members) + f"{dist}/RECORD,,\n"
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for member, data in {**members, f"{dist}/RECORD": record.encode()}.items():
            info = zipfile.ZipInfo(member)
            info.external_attr = ((modes or {}).get(member, 0o644) | 0o100000) << 16
            z.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    return path


def test_a_trimmed_wheel_is_stored_without_its_dropped_members_and_keeps_its_mode_bits(tmp_path):
    w = make_wheel(tmp_path, "kitpkg", {"kitpkg/__init__.py": b"X = 1\n", "kitpkg/jars/big.jar": b"0" * 5000,
                                        "kitpkg/bin/server": b"#!/bin/sh\n"}, modes={"kitpkg/bin/server": 0o755})
    removed = pack.restore(w, ["kitpkg/jars/*"])
    assert removed == ["kitpkg/jars/big.jar"]
    with zipfile.ZipFile(w) as z:
        names = z.namelist()
        assert "kitpkg/jars/big.jar" not in names and "kitpkg/__init__.py" in names
        assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
        assert (z.getinfo("kitpkg/bin/server").external_attr >> 16) & 0o777 == 0o755
        record = z.read("kitpkg-1.0.dist-info/RECORD").decode()
    assert "jars/big.jar" not in record and "kitpkg/__init__.py" in record


def test_the_carry_installs_into_its_site_whole_with_its_mode_bits_and_replaces_what_was_there(tmp_path):
    """The carry's wheels (stand-ins, packed as the build packs them) through pip into the site the kit made; a second
    carry replaces the first's packages (the site emptied first)."""
    site = tmp_path / "site"
    for n, names in enumerate((("kitpkg", "other"), ("newpkg",))):
        (wheels := tmp_path / f"w{n}").mkdir()
        made = [make_wheel(wheels, name, {f"{name}/__init__.py": b"X = 1\n", f"{name}/bin/server": b"#!/bin/sh\n"},
                           modes={f"{name}/bin/server": 0o755}) for name in names]
        pack.pack(made, archive := tmp_path / f"carry{n}.tar.xz", preset=1)
        assert install.install_carry(archive, site) == len(names)
        assert sorted(p.name for p in site.iterdir() if not p.name.endswith(".dist-info")) == sorted(
            [*names, install.STATE])
        assert all(os.access(site / name / "bin" / "server", os.X_OK) for name in names)


def test_pip_check_lines_about_carried_packages_are_sorted_into_expected_and_problems():
    lines = ["verl 0.9.1 requires wandb, which is not installed.",
             "verl 0.9.1 has requirement transformers<5.11,>=5.5.3, but you have transformers 5.17.0.",
             "ray 2.60.0 requires py-spy, which is not installed.",
             "botorch 0.18.1 requires gpytorch, which is not installed.",  # the node's own: not the kit's
             "lightning 2.6 has requirement numpy<2.6, but you have numpy 2.6.0.",  # the node's own as well
             # a node's package broken by the carry's version, which shadows the node's
             "pytest 9.1.1 has requirement packaging>=26, but you have packaging 25.0."]
    expected, problems = install.sort_pip_check(lines, carried={"verl", "ray", "packaging"},
                                                excluded={"wandb", "py-spy"})
    assert expected == [lines[0], lines[2]] and problems == [lines[1], lines[5]]


def test_the_build_names_requirements_on_a_node_package_whose_version_it_does_not_know():
    items = [item("tensordict", "0.10.0", "pyvers<0.2.0,>=0.1.0", "packaging", "numpy"),
             item("pyvers", "0.1.0", "packaging<26.0,>=25.0"), item("packaging", "25.0"), item("numpy", "2"),
             item("old", "1", "six>=2; python_version < '3.8'"), item("six", "1")]
    sel = build.select(items, ["tensordict", "old"], have={"packaging": None, "numpy": None, "six": None},
                       carry_anyway={})
    # packaging without a version on the node: pyvers' range cannot be checked by the resolution
    (line,) = build.unverified(sel, {"packaging": None, "numpy": None, "six": None})
    names(line, "pyvers 0.1.0", "packaging<26.0,>=25.0", "version of packaging")  # the package, its range, the gap
    # with the node's version listed, nothing is left unverified (pip's resolution used it as a constraint)
    sel = build.select(items, ["tensordict"], have={"packaging": "26.3", "numpy": None}, carry_anyway={})
    assert build.unverified(sel, {"packaging": "26.3", "numpy": None}) == []


def test_the_node_list_gives_packagings_version_and_the_carry_its_own():
    """The node's packaging 26.3 is outside pyvers 0.1.0's range (tensordict 0.10.0 <- verl 0.9.1): the build carries
    packaging (25.x, the CPU environment's), which comes first on the run's path."""
    assert build.read_have(build.HAVE_FILE.read_text())["packaging"] == "26.3"
    assert "packaging" in build.CARRY_ANYWAY


STAND_INS = {
    "install": ["{python}", "-c", "import json, os; json.dump({'line': 'stand-in', 'problems': []}, "
                "open(os.environ['RPG_GPU_KIT_RESULT'], 'w'))"],
    "environment": ["{python}", "-c", "import sys; print('no GPU here', file=sys.stderr); sys.exit(3)"],
    # sees the summary as the kit wrote it before this step: the earlier steps' results
    "gpu_tests": ["{python}", "-c", "import os, shutil; shutil.copy(os.path.join(os.environ['KIT_OUT'], "
                  "'summary.json'), os.path.join(os.environ['RPG_GPU_KIT_WORK'], 'seen.json')); "
                  "print('=' * 10, '5 passed, 2 skipped in 1.00s', '=' * 10)"],
    # past its box: killed with the child it started
    "bench_losses": ["{python}", "-c", "import os, subprocess, sys, time; "
                     "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
                     "open(os.path.join(os.environ['RPG_GPU_KIT_WORK'], 'child'), 'w').write(str(p.pid)); "
                     "print('started', flush=True); time.sleep(120)"],
    "smoke_hf": ["{python}", "-c", "import json, os; json.dump({'failures': [], 'run 1': {'steps': [1, 2, 3, 4], "
                 "'wall_time_s': 50.0}, 'run 2 (resumed)': {'steps': [5, 6], 'wall_time_s': 30.0}, "
                 "'device_peak_mib': {'0': 2048.0}}, open(os.path.join(os.environ['RPG_GPU_KIT_WORK'], "
                 "'summary.json'), 'w'))"],
    "model_step": ["{python}", "-c", "import json, os; json.dump({'line': 'step', 'problems': ['loss nan']}, "
                   "open(os.environ['RPG_GPU_KIT_RESULT'], 'w'))"],
    "memory_probe": ["{python}", "-c", "import json, os; json.dump({'line': '20 measurements', 'problems': []}, "
                     "open(os.environ['RPG_GPU_KIT_RESULT'], 'w'))"],
}


def test_a_plain_call_runs_the_first_calls_steps_and_says_why_not_the_others(tmp_path):
    """The kit's default steps (docs/gpu-smoke.md's call order: the probe, the model step, the smoke run); the checks
    that have run, the resume and the vLLM parts' steps are listed with why."""
    ok = ["{python}", "-c", "import json, os; json.dump({'line': 'ok', 'problems': []}, "
          "open(os.environ['RPG_GPU_KIT_RESULT'], 'w'))"]
    stand_ins = tmp_path / "stand_ins.json"
    stand_ins.write_text(json.dumps({"install": ok, "environment": ok, "memory_probe": ok, "model_step": ok,
                                     "smoke_hf": STAND_INS["smoke_hf"]}))
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "rpg_lab.gpu_kit.run", "--out", str(out), "--work", str(tmp_path / "work"),
                        "--stand-ins", str(stand_ins)], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(source_path(ROOT))}, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert [s["name"] for s in summary["steps"]] == ["install", "environment", "memory_probe", "model_step",
                                                     "smoke_hf"]
    why = {n["name"]: n["reason"] for n in summary["not_run"]}
    assert list(why) == ["gpu_tests", "bench_losses", "smoke_resume", "vllm_part", "smoke_vllm", "smoke_vllm_resume",
                         "smoke_vllm_qwen3", "smoke_vllm_compiled"]
    assert why["smoke_vllm"].startswith("not a default step: its box (450 s)")
    assert why["smoke_vllm_compiled"].startswith("not a default step:")
    names(why["smoke_vllm_compiled"], "smoke_vllm passed", "--steps smoke_vllm_compiled")  # when, and the flag
    assert why["gpu_tests"] == why["bench_losses"] and why["gpu_tests"].startswith("not a default step: it ran")
    assert why["smoke_resume"].startswith("not a default step: its run")
    assert why["vllm_part"].startswith("not a default step: it installs")
    names(why["smoke_vllm_resume"], "smoke_vllm passed", "--steps smoke_vllm_resume")


def test_run_walks_every_step_with_stand_ins(tmp_path):
    out, stand_ins = tmp_path / "out", tmp_path / "stand_ins.json"
    stand_ins.write_text(json.dumps(STAND_INS))
    env = {**os.environ, "KIT_OUT": str(out), "PYTHONPATH": os.pathsep.join(source_path(ROOT))}
    p = subprocess.run([sys.executable, "-m", "rpg_lab.gpu_kit.run", "--out", str(out), "--work", str(tmp_path / "work"),
                        "--stand-ins", str(stand_ins), "--box", "bench_losses=6", "--budget", "300", "--steps",
                        "environment,memory_probe,model_step,smoke_hf,gpu_tests,bench_losses,smoke_vllm"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    summary = json.loads((out / "summary.json").read_text())
    steps = {s["name"]: s for s in summary["steps"]}
    unasked = ("smoke_resume", "vllm_part", "smoke_vllm_resume", "smoke_vllm_qwen3", "smoke_vllm_compiled")
    assert list(steps) == [s.name for s in kit_steps.STEPS if s.name not in unasked]
    assert summary["finished"] and not summary["all_passed"]
    assert {n["name"]: n["reason"] for n in summary["not_run"]} == {name: "not in --steps" for name in unasked}
    assert "not run: smoke_resume: not in --steps" in p.stdout
    status = {name: s["status"] for name, s in steps.items()}
    assert status == {"install": "passed", "environment": "failed", "memory_probe": "passed", "model_step": "failed",
                      "smoke_hf": "passed", "gpu_tests": "passed", "bench_losses": "timed_out",
                      "smoke_vllm": "skipped"}
    assert steps["memory_probe"]["result"]["line"] == "20 measurements"
    assert steps["environment"]["reason"].startswith("exit code 3") and "no GPU here" in steps["environment"]["tail"]
    assert steps["gpu_tests"]["result"]["counts"] == {"passed": 5, "skipped": 2}
    # stopped at its box's end, whose last seconds (half of this short box) are for its stacks
    assert steps["bench_losses"]["box_s"] == 6 and 3 <= steps["bench_losses"]["seconds"] < 20
    child = Path("/proc", (tmp_path / "work" / "bench_losses" / "child").read_text(), "status")
    # the step's process group was killed, its child too (gone, or a zombie its new parent has not reaped)
    assert not child.exists() or "\nState:\tZ" in child.read_text()
    assert steps["smoke_hf"]["result"]["line"].startswith("run 1: 4 steps in 50.0 s; run 2 (resumed): 2 steps")
    assert steps["model_step"]["reason"] == "loss nan"
    assert "vLLM is not installed" in steps["smoke_vllm"]["reason"] and steps["smoke_vllm"]["fine"]
    seen = json.loads((tmp_path / "work" / "gpu_tests" / "seen.json").read_text())["steps"]
    seen = {s["name"]: s["status"] for s in seen}
    assert seen == {"install": "passed", "environment": "failed", "memory_probe": "passed", "model_step": "failed",
                    "smoke_hf": "passed", "gpu_tests": "running", "bench_losses": "pending", "smoke_vllm": "pending"}
    rid = summary["run_id"]  # each step's output in a file of this run's own
    # and the stacks of the timed-out step's two processes (tests/lab/gpu_kit/test_gpu_kit_stall.py)
    assert sorted(f.name for f in out.iterdir()) == sorted(["summary.json", f"bench_losses.{rid}.stacks.txt"]
                                                           + [f"{n}.{rid}.log" for n in status if n != "smoke_vllm"])
    assert steps["bench_losses"]["stall"]["dumped"] == steps["bench_losses"]["stall"]["asked"] >= 1
    assert steps["gpu_tests"]["log"] == f"gpu_tests.{rid}.log" and summary["previous_summary"] is None
    assert "bench_losses: TIMED_OUT" in p.stdout and "NOT all steps passed" in p.stdout


def smoke_folder(folder: Path, steps: list[int], failures: list[str]) -> Path:
    """A smoke run's output as rpg_lab.demo.gpu_smoke leaves it: summary.json and run 1's last checkpoint."""
    (folder / "ckpt" / f"global_step_{steps[-1]}").mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"run 1": {"steps": steps}, "failures": failures}))
    return folder / "ckpt" / f"global_step_{steps[-1]}"


def test_smoke_resume_resumes_the_newest_passed_run_1_and_says_when_there_is_none(tmp_path):
    checkout = tmp_path / "checkout"
    ctx = kit_steps.Context(out=tmp_path / "out", work=checkout / "outputs" / "gpu_kit" / "20261126-150000",
                            carry=tmp_path, site=tmp_path / "site", installed=True, checkout=checkout)
    step = next(s for s in kit_steps.STEPS if s.name == "smoke_resume")
    r = kit_steps.StepRun(step, 240, tmp_path / "log", tmp_path / "work", tmp_path / "result.json")
    assert step.command(ctx, r).startswith("no checkpoint of a passed smoke_hf run 1 on this node")
    older = smoke_folder(checkout / "outputs" / "gpu_kit" / "20261126-140000" / "smoke_hf", [1, 2, 3, 4], [])
    smoke_folder(checkout / "outputs" / "gpu_kit" / "20261126-141000" / "smoke_hf", [1, 2, 3, 4], ["step 3: nan"])
    argv = step.command(ctx, r)  # an earlier call's (the newest whose run 1 passed)
    assert argv[argv.index("--resume-from") + 1] == str(older) and "--resume-steps" not in argv
    here = smoke_folder(ctx.work / "smoke_hf", [1, 2, 3, 4], [])
    argv = step.command(ctx, r)  # this call's own
    assert argv[argv.index("--resume-from") + 1] == str(here)
    hf = next(s for s in kit_steps.STEPS if s.name == "smoke_hf").command(ctx, r)
    assert hf[hf.index("--resume-steps") + 1] == "0"  # run 1 alone


def test_the_vllm_resume_resumes_smoke_vllms_run_1_eager_and_never_smoke_hfs(tmp_path, monkeypatch):
    monkeypatch.setattr(kit_steps.Context, "available", lambda self, module: module == "vllm")
    checkout = tmp_path / "checkout"
    ctx = kit_steps.Context(out=tmp_path / "out", work=checkout / "outputs" / "gpu_kit" / "20261130-190000",
                            carry=tmp_path, site=tmp_path / "site", installed=True, checkout=checkout)
    step = next(s for s in kit_steps.STEPS if s.name == "smoke_vllm_resume")
    r = kit_steps.StepRun(step, 360, tmp_path / "log", tmp_path / "work", tmp_path / "result.json")
    smoke_folder(ctx.work / "smoke_hf", [1, 2, 3, 4], [])  # an HF run 1 is no checkpoint for a vLLM resume
    assert step.command(ctx, r).startswith("no checkpoint of a passed smoke_vllm run 1 on this node")
    smoke_folder(ctx.work / "smoke_vllm", [1, 2, 3], ["step 3: nan"])
    assert step.command(ctx, r).startswith("no checkpoint of a passed smoke_vllm run 1 on this node")
    earlier = smoke_folder(checkout / "outputs" / "gpu_kit" / "20261130-184226" / "smoke_vllm", [1, 2, 3, 4], [])
    argv = step.command(ctx, r)
    assert argv[argv.index("--resume-from") + 1] == str(earlier) and "--resume-steps" not in argv
    assert argv[argv.index("--rollout") + 1] == "vllm" and "actor_rollout_ref.rollout.enforce_eager=True" in argv
    assert not step.skip_is_fine  # asked for and skipped: the call does not pass


def test_the_first_vllm_smoke_is_eager_and_the_compiled_one_runs_only_once_it_passed(tmp_path, monkeypatch):
    monkeypatch.setattr(kit_steps.Context, "available", lambda self, module: module == "vllm")
    checkout = tmp_path / "checkout"
    ctx = kit_steps.Context(out=tmp_path / "out", work=checkout / "outputs" / "gpu_kit" / "20261129-100000",
                            carry=tmp_path, site=tmp_path / "site", installed=True, checkout=checkout)
    eager, compiled = (next(s for s in kit_steps.STEPS if s.name == name)
                       for name in ("smoke_vllm", "smoke_vllm_compiled"))
    r = kit_steps.StepRun(eager, 420, tmp_path / "log", tmp_path / "work", tmp_path / "result.json")
    argv = eager.command(ctx, r)
    assert argv[argv.index("--rollout") + 1] == "vllm" and "actor_rollout_ref.rollout.enforce_eager=True" in argv
    assert compiled.command(ctx, r).startswith("no passed smoke_vllm run 1 on this node")
    qwen3 = next(s for s in kit_steps.STEPS if s.name == "smoke_vllm_qwen3").command(ctx, r)  # the second model
    assert "--qwen3" in qwen3 and "actor_rollout_ref.rollout.enforce_eager=True" in qwen3
    smoke_folder(checkout / "outputs" / "gpu_kit" / "20261129-090000" / "smoke_vllm", [1, 2, 3, 4], ["step 2: nan"])
    assert isinstance(compiled.command(ctx, r), str)  # the earlier eager run failed
    smoke_folder(ctx.work / "smoke_vllm", [1, 2, 3, 4], [])  # this call's passed
    argv = compiled.command(ctx, r)
    assert argv[argv.index("--rollout") + 1] == "vllm" and not any("enforce_eager" in a for a in argv)
    assert compiled.box_s + compiled.grace_s + 30 <= 600 and not compiled.skip_is_fine


def test_the_smoke_runs_trainer_logs_come_back_with_the_kits_output(tmp_path):
    (tmp_path / "work" / "first").mkdir(parents=True)
    (tmp_path / "work" / "first" / "trainer.log").write_text("Started a local Ray instance.\n")
    (tmp_path / "work" / "summary.json").write_text(json.dumps({"run 1": {"steps": [1], "wall_time_s": 9.0},
                                                                "failures": []}))
    (tmp_path / "out").mkdir()
    ctx = kit_steps.Context(out=tmp_path / "out", work=tmp_path, carry=tmp_path, site=tmp_path, installed=True)
    step = next(s for s in kit_steps.STEPS if s.name == "smoke_hf")
    r = kit_steps.StepRun(step, 270, tmp_path / "out" / "smoke_hf.R1.log", tmp_path / "work", tmp_path / "r.json")
    result = kit_steps.parse_smoke(ctx, r)
    assert result["problems"] == [] and result["line"].startswith("run 1: 1 steps in 9.0 s")
    assert (tmp_path / "out" / "smoke_hf.R1.first.trainer.log").read_text() == "Started a local Ray instance.\n"


def test_a_step_the_budget_leaves_too_little_time_for_is_skipped_with_that_reason(tmp_path, monkeypatch):
    # the sleeper gets its whole box while the kit's start took under 1.5 s (13 - 0.5 - 5 - 6), and 3.5 s to spare;
    # after its 2.5 s at most 13 - 2.5 - 0.5 - 5 = 5 s could be a box: under MIN_BOX_S, so "late" never starts
    monkeypatch.setattr(run, "MIN_BOX_S", 6.0)
    sleeper = kit_steps.Step("sleeper", 6.0, "sleeps",
                             lambda ctx, r: [sys.executable, "-c", "import time; time.sleep(2.5)"],
                             lambda ctx, r: {}, grace_s=0.5)
    late = kit_steps.Step("late", 30.0, "never starts", lambda ctx, r: [sys.executable, "-c", "pass"],
                          lambda ctx, r: {}, grace_s=0.5)
    ctx = kit_steps.Context(out=tmp_path / "out", work=tmp_path / "work", carry=tmp_path, site=tmp_path / "site",
                            installed=True)
    assert run.run_kit(ctx, [sleeper, late], budget_s=13.0) == 1
    steps = json.loads((tmp_path / "out" / "summary.json").read_text())["steps"]
    assert steps[0]["status"] == "passed" and steps[0]["box_s"] == 6
    assert steps[1]["status"] == "skipped" and steps[1]["reason"].startswith("not started: ")
    assert steps[1]["reason"].endswith("s of the 13 s budget left") and steps[1]["fine"] is False


def test_run_refuses_an_unknown_step_or_box(tmp_path):
    for args, line in ((["--steps", "gpu_tests,nope"], "--steps: unknown step(s) nope"),
                       (["--box", "nope=3"], "--box nope=3: a step name"), (["--box", "smoke_hf=x"], "--box")):
        p = subprocess.run([sys.executable, "-m", "rpg_lab.gpu_kit.run", "--out", str(tmp_path), *args],
                           capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(source_path(ROOT))})
        assert p.returncode == 2 and line in p.stderr, p.stderr


def test_a_subset_of_steps_runs_after_the_install(tmp_path):
    stand_ins = tmp_path / "stand_ins.json"
    stand_ins.write_text(json.dumps({name: STAND_INS[name] for name in ("install", "model_step")}))
    for extra, names in (([], ["install", "model_step"]), (["--installed"], ["model_step"])):
        out = tmp_path / f"out{len(extra)}"
        subprocess.run([sys.executable, "-m", "rpg_lab.gpu_kit.run", "--out", str(out), "--work", str(tmp_path / "work"),
                        "--steps", "model_step", "--stand-ins", str(stand_ins), *extra], capture_output=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(source_path(ROOT))}, timeout=120)
        assert [s["name"] for s in json.loads((out / "summary.json").read_text())["steps"]] == names


def test_installed_without_the_stack_is_one_line(tmp_path, monkeypatch):
    # a node's own python without the carry's packages: one line naming them, not a traceback in each step
    assert run.missing_stack() == []  # this venv has the stack: the real check passes here
    monkeypatch.setattr(run, "missing_stack", lambda: ["verl", "hydra"])
    with pytest.raises(SystemExit) as stop:
        run.main(["--out", str(tmp_path / "out"), "--installed", "--steps", "smoke_resume"])
    assert stop.value.code == 2 and not (tmp_path / "out").exists()


def bench_stand_in(ratio: str) -> list[str]:
    """benchmarks/bench_losses.py's table with one eager RPG row whose time ratio is ``ratio``."""
    table = ["64 x 8192 tokens, float32", "loss  ops  ops ratio  time ms  time ratio  peak MiB  mem ratio",
             "vanilla  10  1.00  2.00  1.00  3.0  1.00", f"rpg ufkl  10  1.00  2.00  {ratio}  3.0  0.80"]
    return ["{python}", "-c", f"print({chr(10).join(table)!r})"]


def test_a_rerun_into_the_same_out_reports_its_own_output(tmp_path, capsys):
    """The docs' rerun of a failed step into the same --out: the second summary is the second run's (9.99, no
    failure), each run's logs and summary kept."""
    out, summaries = tmp_path / "out", []
    failed = ["FAILED tests/gpu/test_x.py::test_a - boom", "= 1 failed, 4 passed in 1.00s ="]
    for ratio, pytest_lines in (("1.50", failed), ("9.99", ["= 5 passed in 1.00s ="])):
        stand_ins = tmp_path / f"stand_ins_{ratio}.json"
        stand_ins.write_text(json.dumps({"gpu_tests": ["{python}", "-c", f"print({chr(10).join(pytest_lines)!r})"],
                                         "bench_losses": bench_stand_in(ratio)}))
        run.main(["--out", str(out), "--work", str(tmp_path / "work"), "--installed", "--steps",
                  "gpu_tests,bench_losses", "--stand-ins", str(stand_ins)])
        summaries.append(json.loads((out / "summary.json").read_text()))
    first, second = ({s["name"]: s for s in summary["steps"]} for summary in summaries)
    assert first["bench_losses"]["result"]["line"] == "eager RPG time 1.50-1.50 x vanilla"
    assert first["gpu_tests"]["result"]["failures"] == ["FAILED tests/gpu/test_x.py::test_a - boom"]
    assert second["bench_losses"]["result"]["line"] == "eager RPG time 9.99-9.99 x vanilla"
    assert second["gpu_tests"]["status"] == "passed" and second["gpu_tests"]["result"]["failures"] == []
    # the summary names its run and the logs it read; the first run's logs and summary are kept
    (id1, id2), names = (s["run_id"] for s in summaries), {f.name for f in out.iterdir()}
    assert id1 != id2 and second["bench_losses"]["log"] == f"bench_losses.{id2}.log"
    assert summaries[1]["previous_summary"] == f"summary.{id1}.json"
    assert json.loads((out / f"summary.{id1}.json").read_text()) == summaries[0]
    assert names == {"summary.json", f"summary.{id1}.json"} | {f"{n}.{i}.log" for n in ("gpu_tests", "bench_losses")
                                                               for i in (id1, id2)}
    assert "1.50" in (out / f"bench_losses.{id1}.log").read_text()


def live_members(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` that are not zombies (/proc/<pid>/stat: state, ppid, pgrp)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # ended meanwhile
            continue
        state, _, pgrp = text[text.rindex(")") + 2:].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            found.append(int(stat.parent.name))
    return found


def poll(ready, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline, f"{what}: not within {seconds:.0f} s"
        time.sleep(0.05)


# the step and a child of it, in the step's process group; their pids written once both run
SLEEPER = ["{python}", "-c", "import os, subprocess, sys, time; "
           "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
           "w = os.environ['RPG_GPU_KIT_WORK']; open(os.path.join(w, 'pids.tmp'), 'w').write("
           "f'{os.getpid()} {os.getpgrp()} {p.pid}'); os.replace(os.path.join(w, 'pids.tmp'), "
           "os.path.join(w, 'pids')); time.sleep(60)"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_ends_the_running_steps_process_group_and_says_so(tmp_path, sig):
    out, stand_ins = tmp_path / "out", tmp_path / "stand_ins.json"
    stand_ins.write_text(json.dumps({"gpu_tests": SLEEPER, "bench_losses": ["{python}", "-c", "pass"]}))
    pids = tmp_path / "work" / "gpu_tests" / "pids"
    with open(tmp_path / "kit.log", "wb") as log:
        kit = subprocess.Popen([sys.executable, "-m", "rpg_lab.gpu_kit.run", "--out", str(out), "--work",
                                str(tmp_path / "work"), "--installed", "--steps", "gpu_tests,bench_losses",
                                "--stand-ins", str(stand_ins)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(source_path(ROOT))})
    step = None
    try:
        poll(lambda: pids.exists() or kit.poll() is not None, "the step's start")
        step, pgid, child = (int(x) for x in pids.read_text().split())
        assert pgid == step and child in live_members(step)
        kit.send_signal(sig)
        assert kit.wait(timeout=60) == 128 + sig, (tmp_path / "kit.log").read_text()
        poll(lambda: not live_members(step), "the step's process group's end")  # the child gets its signal last
    finally:
        if kit.poll() is None:
            kit.kill()
            kit.wait()
        if step is not None and live_members(step):  # without the fix: the step we started lives on
            os.killpg(step, signal.SIGKILL)
    summary = json.loads((out / "summary.json").read_text())
    steps = {s["name"]: s for s in summary["steps"]}
    assert summary["finished"] and summary["stopped_by"] == sig.name and summary["all_passed"] is False
    assert steps["gpu_tests"]["status"] == "stopped" and steps["gpu_tests"]["pid"] == step
    assert steps["gpu_tests"]["reason"] == f"the kit got {sig.name}: the step's process group was stopped"
    assert steps["bench_losses"] == {**steps["bench_losses"], "status": "skipped",
                                     "reason": f"not started: the kit got {sig.name}"}
    assert f"stopped by {sig.name}" in (tmp_path / "kit.log").read_text()


def test_a_budget_or_box_that_is_not_a_finite_positive_number_is_refused_before_any_step(tmp_path, capsys):
    stand_ins = tmp_path / "stand_ins.json"
    stand_ins.write_text(json.dumps({"model_step": ["{python}", "-c", "pass"]}))
    for args, option in ((["--budget", "nan"], "argument --budget: 'nan'"), (["--budget", "inf"], "--budget: 'inf'"),
                         (["--box", "model_step=nan"], "--box model_step=nan: SECONDS 'nan'"),
                         (["--box", "model_step=inf"], "--box model_step=inf: SECONDS 'inf'")):
        with pytest.raises(SystemExit) as stop:
            run.main(["--out", str(tmp_path / "out"), "--installed", "--steps", "model_step", "--stand-ins",
                      str(stand_ins), *args])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1 and option in err, err
        assert "expected a finite number of seconds > 0" in err and not (tmp_path / "out").exists()


def test_a_malformed_carry_manifest_is_one_line_naming_it(tmp_path, capsys):
    carry = tmp_path / "carry"
    carry.mkdir()
    for text, wrong in (("{", "not a readable JSON file (Expecting property name"),
                        ('{"wheels": {}}', "no 'carry' key (an object with file, sha256 and bytes)"),
                        ('{"carry": {"file": "w.tar.xz"}, "wheels": {}, "excluded": {}, "only_needed_by_excluded": []}',
                         "no carry.sha256")):
        (carry / "manifest.json").write_text(text)
        (problem,) = install.install(carry, tmp_path / "site")["problems"]
        assert problem.startswith(f"{carry / 'manifest.json'}: {wrong}") and problem.endswith("carry .gpu_kit")
        assert install.main(["--carry", str(carry), "--site", str(tmp_path / "site")]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"rpg_lab.gpu_kit.install: {carry / 'manifest.json'}: {wrong}")
    assert not (tmp_path / "site").exists()


def test_an_unreadable_install_state_installs_the_wheels_again(tmp_path, monkeypatch):
    """The site's state file (the carry's sha256 installed there) cut short or hand-edited is no install: the wheels
    go in again, never a traceback."""
    import hashlib
    import json

    carry, site = tmp_path / "carry", tmp_path / "site"
    carry.mkdir()
    site.mkdir()
    (carry / "w.tar.xz").write_bytes(b"wheels")
    digest = hashlib.sha256(b"wheels").hexdigest()
    (carry / "manifest.json").write_text(json.dumps({"carry": {"file": "w.tar.xz", "sha256": digest, "bytes": 6},
                                                     "wheels": {}, "excluded": {}, "only_needed_by_excluded": []}))
    calls = []
    monkeypatch.setattr(install, "install_carry", lambda *a: calls.append(a) or "stopped here by the test")
    for text in ("{", "[]", '{"sha256": 3}', "\udcff"):
        (site / install.STATE).write_text(text, errors="surrogateescape")
        assert install.install(carry, site)["problems"] == ["stopped here by the test"], text
    assert len(calls) == 4
    (site / install.STATE).write_text(json.dumps({"sha256": digest}))
    monkeypatch.setattr(install, "_pip", lambda *a, **k: __import__("subprocess").CompletedProcess([], 0, "", ""))
    assert install.install(carry, site)["wheels_installed"] == "already there (same carry)" and len(calls) == 4


# ----------------------------------------------------------------------------- the memory probe's arithmetic

def test_the_probes_fit_recovers_a_line_and_refuses_one_depth():
    from rpg_lab.gpu_kit.memory_terms import fit

    assert fit({1: 5.5, 2: 7.0}) == pytest.approx((4.0, 1.5))
    assert fit({1: 3.0, 2: 5.0, 4: 9.0}) == pytest.approx((1.0, 2.0))
    with pytest.raises(ValueError, match="two depths or more"):
        fit({2: 1.0})


@pytest.mark.parametrize("model, tokens", [("Qwen/Qwen2.5-7B-Instruct", 4096), ("Qwen/Qwen2.5-7B-Instruct", 16384),
                                           ("Qwen/Qwen3-4B", 32768)])
@pytest.mark.parametrize("gradients_at_peak", [False, True])
def test_a_probe_that_measured_known_terms_restates_them(model, tokens, gradients_at_peak):
    """Log-prob peaks built from the plan's own terms at 1 and 2 layers on one GPU restate, at full depth on 8 GPUs,
    exactly the plan's log-prob phase (its terms beyond the state do not grow with depth). Forward + backward built
    from known terms c + d * L beyond parameters and optimizer states, with no gradient at the peak (early in the
    backward) or every gradient (at its end), restates as every gradient sharded + c + d * L; the optimizer step, r
    state shards beyond parameters, gradients and optimizer states, as state / 8 + r * shard / 8."""
    from rpg_lab.gpu_kit.memory_terms import restate, script_settings, state_gib, truncated
    from rpg.memory import architecture_for, estimate
    from rpg.memory.gpu import RUNTIME_OVERHEAD_GIB
    from rpg.memory.sizes import GIB

    arch = architecture_for(model)
    c, d, r = 9.5, 0.125, 1.03

    def as_measured(layers: int) -> dict[str, float]:
        small = truncated(arch, layers)
        (lp,) = [p.gib for p in estimate(script_settings(tokens, 1, "sdpa"), small).phases
                 if p.name == "log-prob forward"]
        return {"log-prob": lp - RUNTIME_OVERHEAD_GIB,
                "forward+backward": state_gib(small, gradients_at_peak) + c + d * layers,
                "optimizer step": state_gib(small, True) + r * small.params * 4 / GIB}

    out = restate(arch, tokens, {1: as_measured(1), 2: as_measured(2)}, 0.6)
    assert out["restated_gib"]["log-prob"] == pytest.approx(out["planned_gib"]["sdpa"]["log-prob forward"], rel=1e-9)
    fb = arch.params * 16 / 8 / GIB + c + d * arch.layers + RUNTIME_OVERHEAD_GIB
    step = arch.params * 16 / 8 / GIB + r * arch.params * 4 / 8 / GIB + RUNTIME_OVERHEAD_GIB
    assert out["restated_gib"]["forward+backward"] == pytest.approx(fb, rel=1e-9)
    assert out["restated_gib"]["optimizer step"] == pytest.approx(step, rel=1e-9)
    assert out["restated_gib"]["update"] == max(out["restated_gib"]["forward+backward"],
                                                out["restated_gib"]["optimizer step"])
    fitted = out["fitted"]["forward+backward"]
    assert (fitted["fixed_gib"], fitted["per_layer_gib"]) == pytest.approx((c, d))
    assert fitted["peak"] == ("end of the backward" if gradients_at_peak else "early in the backward")
    assert out["fitted"]["optimizer step / one state shard"] == pytest.approx(r)
    assert out["layers"] == arch.layers and out["gpus"] == 8
    assert out["peak_gib"] >= max(out["restated_gib"].values()) and out["fits"] == (out["headroom_gib"] >= 7.96)


@pytest.mark.parametrize("tokens", [16384, 32768, 65536, 131072])
def test_the_early_or_late_backward_peak_is_told_by_the_nearer_slope_at_any_budget(tokens):
    """Peaks whose growth per layer is the checkpointed layer input (T * H * 2) are early-backward peaks at any token
    budget, also where that exceeds half a layer's gradient (Qwen3-4B from about 39k tokens); peaks growing by a
    layer's gradient more are end-of-backward peaks: neither restated below the state and gradients sharded."""
    from rpg_lab.gpu_kit.memory_terms import restate, state_gib, truncated
    from rpg.memory import architecture_for
    from rpg.memory.sizes import GIB

    arch = architecture_for("Qwen/Qwen3-4B")
    kept, gradient = tokens * arch.hidden * 2 / GIB, arch.layer_params * 4 / GIB
    for at_end, slope in ((False, kept), (True, kept + gradient)):
        measured = {L: {"log-prob": state_gib(truncated(arch, L), False) + 1.0,
                        "forward+backward": state_gib(truncated(arch, L), False) + 5.0 + slope * L,
                        "optimizer step": state_gib(truncated(arch, L), True) + truncated(arch, L).params * 4 / GIB}
                    for L in (1, 2)}
        out = restate(arch, tokens, measured, 0.7)
        fitted = out["fitted"]["forward+backward"]
        assert fitted["peak"] == ("end of the backward" if at_end else "early in the backward")
        assert fitted["per_layer_gib"] == pytest.approx(kept)
        assert out["restated_gib"]["forward+backward"] >= state_gib(arch, True, 8) + kept * arch.layers


def test_a_script_the_probe_did_not_measure_is_named_with_why():
    import dataclasses

    from rpg_lab.gpu_kit.memory_terms import script_settings, uncovered
    from rpg.memory import architecture_for

    math7b, qwen3 = architecture_for("Qwen/Qwen2.5-Math-7B"), architecture_for("Qwen/Qwen3-4B-Base")
    s = script_settings(16384, 8, "flash_attention_2")
    assert uncovered(s, math7b) is None and uncovered(script_settings(32768, 8, "sdpa", 0.7), qwen3) is None
    assert "rollout_util=0.6 (probed 0.7)" in uncovered(script_settings(32768, 8, "sdpa"), qwen3)
    assert "probed: (4096, 16384)" in uncovered(dataclasses.replace(s, train_tokens=8192, logprob_tokens=8192,
                                                                    ref_tokens=8192), math7b)
    assert "log-prob 4096" in uncovered(dataclasses.replace(s, logprob_tokens=4096), math7b)
    assert uncovered(dataclasses.replace(s, param_offload=True), math7b).endswith("param_offload=True (probed False)")
    assert uncovered(s, dataclasses.replace(qwen3, hidden=2048)) == "Qwen/Qwen3-4B-Base: no probe has its widths"


def test_the_docs_memory_tables_are_rebuilt_from_the_committed_gpu_run():
    """docs/gpu-smoke.md's memory-probe tables are `--render` of the committed summary.json they cite."""
    from rpg_lab.gpu_kit.memory_terms import probe_result, render

    doc = (ROOT / "docs" / "gpu-smoke.md").read_text()
    begin, end = "<!-- memory-probe tables: begin -->\n", "<!-- memory-probe tables: end -->"
    shown = doc[doc.index(begin) + len(begin):doc.index(end)]
    cited = re.search(r"--render\s+(docs/gpu-runs/\S+\.summary\.json)", doc).group(1)
    assert shown == render(probe_result(ROOT / cited))


def test_the_probe_refuses_bad_depths_and_renders_only_a_run_that_has_it(tmp_path, capsys):
    from rpg_lab.gpu_kit import memory_probe

    for depths, why in (("1,x", "comma-separated whole numbers"), ("0,1", "each >= 1")):
        with pytest.raises(SystemExit) as e:
            memory_probe.main(["--device", "cpu", "--depths", depths])
        assert e.value.code == 2 and why in capsys.readouterr().err
    kit = tmp_path / "summary.json"
    kit.write_text(json.dumps({"steps": [{"name": "model_step", "result": {"line": "x"}}]}))
    assert memory_probe.main(["--render", str(kit)]) == 2
    assert "the kit's summary has no memory_probe result" in capsys.readouterr().err
    # one depth measured: nothing is restated (a fit needs two), the tables say what was measured
    committed = json.loads((ROOT / "docs/gpu-runs/20261128-011958.summary.json").read_text())
    (probe,) = [s["result"] for s in committed["steps"] if s["name"] == "memory_probe"]
    for entry in probe["shapes"].values():
        entry["runs"] = [r for r in entry["runs"] if r["layers"] == 1]
    one = tmp_path / "one.json"
    one.write_text(json.dumps(probe))
    assert memory_probe.main(["--render", str(one)]) == 0
    tables = capsys.readouterr().out
    assert "| Qwen3-4B, 1 | 32768 |" in tables and "36 layers" not in tables


def test_the_node_commands_find_the_kit_in_the_checkouts_lab(tmp_path):
    """The device calls' commands (the build's, the vLLM parts'), run in a copy of the checkout by an interpreter
    without site-packages (a node has no install of the project): the kit's modules load from the copy's
    ``lab/``, its ``rpg`` from the copy; without the commands' ``PYTHONPATH`` the lab is not found."""
    from rpg_lab.gpu_kit import vllm_parts

    checkout = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "rpg", checkout / "rpg", ignore=ignore)
    shutil.copytree(ROOT / "lab" / "rpg_lab", checkout / "lab" / "rpg_lab", ignore=ignore)
    (shim := tmp_path / "bin" / "python3").parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -S -c "import runpy, sys, rpg, rpg_lab; '
                    f'print(rpg.__file__, rpg_lab.__file__); runpy.run_module(sys.argv[2], run_name=\'__main__\')" '
                    '"$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PATH=f"{shim.parent}{os.pathsep}{env['PATH']}", OUT=str(tmp_path / "out"))
    parts = {"parts": [{"file": f"part-0{i}.bin", "folder": f"part-0{i}", "bytes": 2**20} for i in (1, 2)]}
    install_then_kit = vllm_parts.device_calls(parts, ROOT / ".gpu_kit_vllm", 6 * 2**20, 37 * 2**20)[0]["command"]
    commands = [build.device_call(ROOT / ".gpu_kit")["command"], *install_then_kit.split("; ")]
    assert [c.split(" -m ")[1].split()[0] for c in commands] == [
        "rpg_lab.gpu_kit.run", "rpg_lab.gpu_kit.vllm_install", "rpg_lab.gpu_kit.run"]
    for command in commands:
        done = subprocess.run(["bash", "-c", f"{command} --help"], cwd=checkout, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0 and "usage:" in done.stdout, (command, done.stderr[-2000:])
        assert done.stdout.split("\n")[0] == f"{checkout}/rpg/__init__.py {checkout}/lab/rpg_lab/__init__.py", command
        bare = command.replace("PYTHONPATH=lab ", "")
        done = subprocess.run(["bash", "-c", f"{bare} --help"], cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode != 0 and "No module named 'rpg_lab'" in done.stderr, (bare, done.stderr[-2000:])
