"""The vLLM parts (rpg_lab.gpu_kit.vllm_parts, rpg_lab.gpu_kit.vllm_install; docs/gpu-smoke.md, "The vLLM parts") with
small stand-in wheels built here: the parts within their size, a wheel split across parts installed only once all
its pieces arrived, a corrupt part refused in one line, a part given twice not installed again, wheels sharing a
namespace package in different calls, and the kit's ``vllm_part`` step (its command, its result, the vLLM site on
the next step's path). No network: the resolution against the registry is the gpu_kit stage's
(tests/lab/gpu_kit/test_gpu_kit_stage.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from messages import names, one_line
from test_gpu_kit import make_wheel as wheel

from rpg_lab.gpu_kit import PACK, SAMPLE_S, install, source_path, vllm_install, vllm_parts
from rpg_lab.gpu_kit import steps as kit_steps
from rpg_lab.gpu_kit.build import BuildError

ROOT = Path(__file__).resolve().parents[3]
KIB = 1024


def noise(n: int, seed: int) -> bytes:
    """``n`` bytes xz cannot shrink (so that the parts' sizes are those of the data)."""
    import random

    return random.Random(seed).randbytes(n)


@pytest.fixture
def built(tmp_path):
    """Five stand-in wheels cut into parts of 64 KiB (the first 16 KiB): the large ``vllm`` one across several."""
    src = tmp_path / "wheels"
    src.mkdir()
    wheels = {
        "small": wheel(src, "small", {"small/__init__.py": b"A = 1\n"}),
        "ns-one": wheel(src, "ns_one", {"ns/one/__init__.py": b"ONE = 1\n"}),
        "ns-two": wheel(src, "ns_two", {"ns/two/__init__.py": b"TWO = 2\n", "ns/two/blob.bin": noise(40 * KIB, 2)}),
        "vllm": wheel(src, "vllm", {"vllm/__init__.py": b"__version__ = '0.24.0'\n",
                                    "vllm/_big.so": noise(150 * KIB, 1), "vllm/_moe_C.abi3.so": noise(30 * KIB, 3)}),
        "mid": wheel(src, "mid", {"mid/__init__.py": b"", "mid/data.bin": noise(50 * KIB, 4)}),
    }
    out = tmp_path / "parts"
    manifest = vllm_parts.pack_parts(wheels, {n: "1.0" for n in wheels}, out, {"requirements": ["x"]}, 64 * KIB,
                                     16 * KIB, preset=1, jobs=2, trim={"vllm": ["vllm/_moe_C*"]})
    return out, manifest


def send(call: Path, parts: Path, *names: str) -> Path:
    """A device call's carry: the named part folders (each with its copy of the manifest), nothing else."""
    if call.exists():
        shutil.rmtree(call)
    call.mkdir(parents=True)
    for name in names:
        shutil.copytree(parts / name, call / name)
    return call


def test_parts_are_cut_end_to_end_within_their_size():
    plan = vllm_parts.plan_parts([("a", 10), ("b", 250), ("c", 5)], part_bytes=100, first_bytes=30)
    assert [sum(p[2] for p in part) for part in plan] == [30, 100, 100, 35]
    assert plan[0] == [("a", 0, 10), ("b", 0, 20)] and plan[-1] == [("b", 220, 30), ("c", 0, 5)]
    pieces = [p for part in plan for p in part if p[0] == "b"]  # b's pieces in order, covering it exactly
    assert [p[1] for p in pieces] == [0, 20, 120, 220] and sum(p[2] for p in pieces) == 250
    with pytest.raises(BuildError, match="at least one byte"):
        vllm_parts.plan_parts([("a", 1)], part_bytes=0)


def test_the_build_writes_parts_within_the_limit_each_with_the_manifest(built):
    out, manifest = built
    parts = manifest["parts"]
    assert len(parts) >= 4 and parts[0]["bytes"] <= 16 * KIB and all(p["bytes"] <= 64 * KIB for p in parts)
    assert all(p["bytes"] == 64 * KIB for p in parts[1:-1])  # end to end: only the first and the last are short
    for part in parts:
        path = out / part["folder"] / part["file"]
        assert path.stat().st_size == part["bytes"] and vllm_install.sha256(path) == part["sha256"]
        assert json.loads((out / part["folder"] / "manifest.json").read_text())["build_id"] == manifest["build_id"]
    vllm = manifest["wheels"]["vllm"]
    assert len(vllm["pieces"]) >= 3 and vllm["removed_members"] == 1  # split; the trimmed member gone
    assert manifest["order"][-1] == "vllm" and manifest["order"][0] == "small"  # smallest first


def test_a_split_wheel_is_installed_only_once_all_its_pieces_arrived(built, tmp_path):
    out, manifest = built
    site, kit_site = tmp_path / "site", tmp_path / "kit_site"
    names = [p["folder"] for p in manifest["parts"]]
    installed = 0
    for n, name in enumerate(names, 1):
        result = vllm_install.install(send(tmp_path / "call", out, name), site, kit_site, checkout=ROOT)
        assert result["problems"] == [] and result["received_now"] == [f"{name}.bin"]
        assert result["parts_missing"] == [f"{m}.bin" for m in names[n:]]
        assert result["wheels_installed"] >= installed
        installed = result["wheels_installed"]
        last = n == len(names)
        assert (site / "vllm" / "__init__.py").is_file() == last  # its pieces span to the last part
        assert result["complete"] == last and (vllm_install.ready_site(site) == site) == last
        assert ("import_vllm" in result) == last
    assert result["wheels_installed"] == result["wheels_total"] == 5
    assert result["import_vllm"]["ok"] and result["import_vllm"]["version"] == "0.24.0"
    assert "vLLM complete, import ok: 0.24.0" in result["line"]
    # wheels sharing the namespace package ns, installed in different calls: both there
    assert (site / "ns" / "one" / "__init__.py").is_file() and (site / "ns" / "two" / "__init__.py").is_file()
    assert not (site / "vllm" / "_moe_C.abi3.so").exists()
    assert not list((site / vllm_install.STAGING).iterdir())  # the staged parts dropped once used


def test_a_corrupt_part_is_refused_in_one_line_and_a_part_given_twice_is_not_installed_again(built, tmp_path,
                                                                                              monkeypatch):
    out, manifest = built
    site = tmp_path / "site"
    first = manifest["parts"][0]["folder"]
    call = send(tmp_path / "call", out, first)
    part = call / first / f"{first}.bin"
    part.write_bytes(part.read_bytes()[:-100])  # a truncated transfer
    result = vllm_install.install(call, site, tmp_path / "kit", checkout=ROOT)
    (line,) = result["problems"]
    assert line.startswith(f"{first}.bin: sha256 ") and "a truncated or stale transfer, not installed" in line
    assert f"({part.stat().st_size} of {manifest['parts'][0]['bytes']} bytes)" in line and "\n" not in line
    assert result["parts_received"] == [] and result["wheels_installed"] == 0
    p = subprocess.run([sys.executable, "-m", "rpg_lab.gpu_kit.vllm_install", "--parts", str(call), "--site", str(site)],
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(source_path(ROOT))})
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "truncated or stale" in p.stderr
    good = vllm_install.install(send(tmp_path / "call", out, first), site, tmp_path / "kit", checkout=ROOT)
    assert good["problems"] == [] and good["installed_now"] and good["received_now"] == [f"{first}.bin"]
    calls = []
    monkeypatch.setattr(vllm_install, "install_wheels", lambda *a: calls.append(a))
    again = vllm_install.install(send(tmp_path / "call", out, first), site, tmp_path / "kit", checkout=ROOT)
    assert again["problems"] == [] and again["given_again"] == [f"{first}.bin"] and again["received_now"] == []
    assert again["installed_now"] == [] and calls == [] and again["wheels_installed"] == good["wheels_installed"]


def test_a_site_of_another_build_is_replaced_and_a_part_of_another_build_refused(built, tmp_path):
    out, manifest = built
    site = tmp_path / "site"
    first = manifest["parts"][0]["folder"]
    vllm_install.install(send(tmp_path / "call", out, first), site, tmp_path / "kit", checkout=ROOT)
    (site / "leftover.txt").write_text("x")
    other = json.loads((out / first / "manifest.json").read_text())
    other["build_id"] = "0" * 64
    call = send(tmp_path / "call", out, first)
    (call / first / "manifest.json").write_text(json.dumps(other))
    result = vllm_install.install(call, site, tmp_path / "kit", checkout=ROOT)
    assert result["build_id"] == "0" * 64 and not (site / "leftover.txt").exists()
    mixed = send(tmp_path / "mixed", out, first, manifest["parts"][1]["folder"])
    (mixed / first / "manifest.json").write_text(json.dumps(other))
    (line,) = vllm_install.install(mixed, site, tmp_path / "kit", checkout=ROOT)["problems"]
    assert "manifests of 2 different builds" in line
    (empty := tmp_path / "empty").mkdir()
    (line,) = vllm_install.install(empty, site, tmp_path / "kit", checkout=ROOT)["problems"]
    assert "no manifest.json" in line


def installer(parts: Path, site: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """``python -m rpg_lab.gpu_kit.vllm_install`` on a call's parts, as a device call runs it."""
    return subprocess.run([sys.executable, "-m", "rpg_lab.gpu_kit.vllm_install", "--parts", str(parts), "--site", str(site),
                           "--kit-site", str(tmp_path / "kit")], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(source_path(ROOT))}, timeout=120)


def test_a_site_the_installer_did_not_make_is_refused_in_one_line_and_its_files_kept(built, tmp_path):
    out, manifest = built
    site = tmp_path / "my project"
    site.mkdir()
    (site / "thesis.tex").write_text("a user's own work\n")
    p = installer(send(tmp_path / "call", out, manifest["parts"][0]["folder"]), site, tmp_path)
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert f"--site {site}: not empty and no {vllm_install.STATE} in it" in p.stderr
    assert [f.name for f in site.iterdir()] == ["thesis.tex"]
    assert (site / "thesis.tex").read_text() == "a user's own work\n"
    killed = tmp_path / "killed"  # an install killed before its first state was written: the empty state file it
    killed.mkdir()  # made first marks the site as the kit's
    (killed / vllm_install.STATE).touch()
    (killed / vllm_install.STAGING).mkdir()
    (killed / vllm_install.STAGING / ".part-01.bin.tmp").write_bytes(b"half")
    assert installer(tmp_path / "call", killed, tmp_path).returncode == 0
    assert vllm_install.read_state(killed)["received"] == [f"{manifest['parts'][0]['folder']}.bin"]


def test_a_staged_part_that_vanished_is_named_in_one_line_and_sending_it_again_repairs_it(built, tmp_path):
    out, manifest = built
    site = tmp_path / "site"
    pieces = [piece["part"] for piece in manifest["wheels"]["vllm"]["pieces"]]  # vllm's wheel spans several parts
    folder = {p["file"]: p["folder"] for p in manifest["parts"]}
    first, rest = pieces[0], pieces[1:]
    assert installer(send(tmp_path / "call", out, folder[first]), site, tmp_path).returncode == 0
    staged = site / vllm_install.STAGING / first
    assert staged.is_file()  # kept until the vllm wheel is in
    staged.unlink()  # gone while the state lists it as received
    p = installer(send(tmp_path / "call", out, *(folder[name] for name in rest)), site, tmp_path)
    assert p.returncode == 1 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr
    names(one_line(p.stderr), f"{staged}:", "gone", "send it again")  # the part, what happened to it, what to do
    assert not (site / "vllm").exists() and first not in vllm_install.read_state(site)["received"]
    p = installer(send(tmp_path / "call", out, folder[first]), site, tmp_path)  # sent again
    assert p.returncode == 0, p.stderr
    state = vllm_install.read_state(site)
    assert "vllm" in state["installed"] and (site / "vllm" / "__init__.py").is_file()
    assert {first, *rest} <= set(state["received"])


def test_a_second_install_into_a_site_is_refused_while_one_runs_and_a_killed_one_leaves_no_lock(built, tmp_path):
    """The first install is a real one held inside its pip step; the second is refused, naming its PID, and the
    parts the first received are kept; once the first is killed the second goes ahead and both calls' parts are
    in the state."""
    out, manifest = built
    site = tmp_path / "site"
    one, two = (p["folder"] for p in manifest["parts"][:2])
    held = ("import sys, time; import rpg_lab.gpu_kit.vllm_install as v\n"
            "v.install_wheels = lambda *a: (print('in pip', flush=True), time.sleep(60))\n"
            f"sys.exit(v.main(['--parts', {str(send(tmp_path / 'call1', out, one))!r}, '--site', {str(site)!r}]))")
    first = subprocess.Popen([sys.executable, "-c", held], cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(source_path(ROOT))},
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline() == "in pip\n"
        p = installer(send(tmp_path / "call2", out, two), site, tmp_path)
        assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stdout + p.stderr
        # the site, who holds it, its PID
        names(one_line(p.stderr), f"--site {site}:", "another rpg_lab.gpu_kit.vllm_install", f"(PID {first.pid})")
    finally:
        first.kill()
        first.wait()
    assert vllm_install.read_state(site)["received"] == [f"{one}.bin"]
    p = installer(tmp_path / "call2", site, tmp_path)
    assert p.returncode == 0, p.stderr
    state = vllm_install.read_state(site)
    assert sorted(state["received"]) == [f"{one}.bin", f"{two}.bin"] and "small" in state["installed"]


def ctx(tmp_path: Path, checkout: Path = ROOT) -> kit_steps.Context:
    return kit_steps.Context(out=tmp_path / "out", work=tmp_path / "work", carry=tmp_path / "carry",
                             site=tmp_path / "kit_site", installed=False, checkout=checkout)


def test_the_vllm_part_step_runs_the_installer_on_the_calls_part_and_the_site_joins_the_path(built, tmp_path,
                                                                                             monkeypatch):
    out, manifest = built
    site = tmp_path / "vllm_site"
    monkeypatch.setenv(vllm_install.SITE_ENV, str(site))
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    c = ctx(tmp_path, checkout)
    run = kit_steps.StepRun(kit_steps.STEPS[0], 60, tmp_path / "log", tmp_path / "w", tmp_path / "result.json")
    step = next(s for s in kit_steps.STEPS if s.name == "vllm_part")
    assert step.not_default and not step.skip_is_fine
    reason = step.command(c, run)
    assert isinstance(reason, str) and reason.startswith("no vLLM part in this call's carry (.gpu_kit_vllm/part-NN)")
    send(checkout / vllm_install.PARTS_DIR, out, *[p["folder"] for p in manifest["parts"]])
    argv = step.command(c, run)
    assert argv[1:3] == ["-m", "rpg_lab.gpu_kit.vllm_install"] and argv[argv.index("--site") + 1] == str(site)
    assert argv[argv.index("--kit-site") + 1] == str(c.site) and argv[-1] == str(run.result_file)
    assert not c.available("vllm") and isinstance(kit_steps._smoke("vllm")(c, run), str)
    assert str(site) not in install.run_env(c.site, ROOT)["PYTHONPATH"]
    p = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(source_path(ROOT))})
    assert p.returncode == 0, p.stderr
    result = step.parse(c, run)
    assert result["complete"] and result["problems"] == [] and len(result["parts_received"]) == len(manifest["parts"])
    assert c.available("vllm")  # smoke_vllm runs now, vLLM's site before the kit's on the steps' path
    assert isinstance(kit_steps._smoke("vllm")(c, run), list)
    env = install.run_env(c.site, ROOT)
    assert env["PYTHONPATH"].split(os.pathsep)[:4] == [str(ROOT), str(ROOT / "lab"), str(site), str(c.site)]
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and env["VLLM_LOGGING_LEVEL"] == "INFO"


def test_the_kit_installs_the_last_part_then_runs_smoke_vllm_with_vllm_on_its_path(built, tmp_path, monkeypatch):
    out, manifest = built
    site = tmp_path / "vllm_site"
    folders = [p["folder"] for p in manifest["parts"]]
    for name in folders[:-1]:  # the earlier calls, each with one part
        assert vllm_install.install(send(tmp_path / "call", out, name), site, tmp_path / "kit", checkout=ROOT)[
            "problems"] == []
    checkout = tmp_path / "checkout"  # the last call's checkout: the code and the last part
    shutil.copytree(ROOT / "rpg", checkout / "rpg", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "lab" / "rpg_lab", checkout / "lab" / "rpg_lab", ignore=shutil.ignore_patterns("__pycache__"))
    send(checkout / vllm_install.PARTS_DIR, out, folders[-1])
    stand_ins = tmp_path / "stand_ins.json"  # the install of the kit's carry, and a smoke run that imports vllm
    stand_ins.write_text(json.dumps({
        "install": ["{python}", "-c", "import json, os; json.dump({'problems': []}, "
                    "open(os.environ['RPG_GPU_KIT_RESULT'], 'w'))"],
        "smoke_vllm": ["{python}", "-c", "import json, os, vllm; json.dump({'failures': [], 'run 1': {'steps': [1], "
                       "'wall_time_s': 1.0}, 'vllm': vllm.__version__}, open(os.path.join(os.environ["
                       "'RPG_GPU_KIT_WORK'], 'summary.json'), 'w'))"]}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(source_path(checkout)), vllm_install.SITE_ENV: str(site)}
    p = subprocess.run([sys.executable, "-m", "rpg_lab.gpu_kit.run", "--out", str(tmp_path / "kit_out"), "--work",
                        str(tmp_path / "work"), "--steps", "vllm_part,smoke_vllm", "--stand-ins", str(stand_ins)],
                       capture_output=True, text=True, cwd=checkout, env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((tmp_path / "kit_out" / "summary.json").read_text())
    steps = {s["name"]: s for s in summary["steps"]}
    assert list(steps) == ["install", "vllm_part", "smoke_vllm"] and summary["all_passed"]
    assert steps["vllm_part"]["result"]["complete"] and steps["vllm_part"]["result"]["received_now"] == [
        f"{folders[-1]}.bin"]
    assert json.loads((tmp_path / "work" / "smoke_vllm" / "summary.json").read_text())["vllm"] == "0.24.0"


def test_a_wheel_compressed_in_blocks_side_by_side_decompresses_to_itself(tmp_path, monkeypatch):
    import lzma

    monkeypatch.setattr(vllm_parts, "BLOCK_BYTES", 10 * KIB)  # 5 blocks, compressed two at a time
    src = tmp_path / "a.whl"
    src.write_bytes(noise(25 * KIB, 5) + b"x" * 20 * KIB)
    (out := tmp_path / "out").mkdir()
    xz = vllm_parts.compress([src], out, preset=1, jobs=2)[src]
    assert xz.name == "a.whl.xz" and lzma.decompress(xz.read_bytes()) == src.read_bytes()


def test_the_device_calls_carry_one_part_each_the_first_beside_the_kit_the_last_runs_smoke_vllm(built):
    out, manifest = built
    n = len(manifest["parts"])
    calls = vllm_parts.device_calls(manifest, ROOT / ".gpu_kit_vllm", tree_bytes=6 * 2**20, base_bytes=37 * 2**20)
    first, *middle, last = calls
    assert first["carry"] == [".gpu_kit", ".gpu_kit_vllm/part-01"] and first["sends_mib"] <= 64
    assert first["command"].startswith("PYTHONPATH=lab PYTHONUNBUFFERED=1 python3 -m rpg_lab.gpu_kit.vllm_install --parts "
                                       ".gpu_kit_vllm; ")
    assert first["command"].endswith('rpg_lab.gpu_kit.run --carry .gpu_kit --out "$OUT" --steps install')
    assert first["timeout_s"] == vllm_parts.FIRST_TIMEOUT_S
    assert [c["carry"] for c in middle] == [[f".gpu_kit_vllm/part-{i:02d}"] for i in range(2, n)]
    assert all(c["command"].endswith('--result "$OUT/vllm_install.json"') for c in middle)
    assert last["carry"] == [f".gpu_kit_vllm/part-{n:02d}"] and "--steps vllm_part,smoke_vllm" in last["command"]
    assert last["timeout_s"] <= 600  # a device call's limit
    assert f"--sample-stacks {SAMPLE_S}; {PACK}" in last["command"] and len(last["command"]) <= 2000
    # the four parts of the build (15, 56, 56, 55.7 MiB), each call run to its timeout, with the machine's start and
    # the gaps: within one lease's 900 s
    four = {"parts": [{"file": f"part-{i:02d}.bin", "folder": f"part-{i:02d}", "bytes": mib * 2**20}
                      for i, mib in enumerate((15, 56, 56, 55.7), 1)]}
    four = vllm_parts.device_calls(four, ROOT / ".gpu_kit_vllm", tree_bytes=7 * 2**20, base_bytes=37 * 2**20)
    assert len(four[0]["carry"]) == 2 and vllm_parts.worst_lease_s(four) <= vllm_parts.LEASE_S == 900
    # after the install's check and vllm_part (5 and 20 s on the H200) the eager smoke gets its whole box (the kit
    # gives a step min(its box, what is left - its grace - 5 s))
    smoke = next(s for s in kit_steps.STEPS if s.name == "smoke_vllm")
    assert vllm_parts.smoke_room_s(vllm_parts.LAST_BUDGET_S) >= smoke.box_s
    # five parts (2026-11-30: a 9.3 MiB tree left 54 MiB a part): the last call's budget is the lease's rest, which
    # still gives the eager smoke its whole box
    five = {"parts": [{"file": f"part-{i:02d}.bin", "folder": f"part-{i:02d}", "bytes": mib * 2**20}
                      for i, mib in enumerate((15, 54, 54, 54, 5.7), 1)]}
    five = vllm_parts.device_calls(five, ROOT / ".gpu_kit_vllm", tree_bytes=9.3 * 2**20, base_bytes=37 * 2**20)
    assert len(five) == 5 and vllm_parts.worst_lease_s(five) <= vllm_parts.LEASE_S
    budget = int(five[-1]["command"].split("--budget ")[1].split()[0])
    assert budget == five[-1]["timeout_s"] - 30 and five[-1]["smoke_box_s"] == vllm_parts.smoke_room_s(budget)
    assert vllm_parts.smoke_room_s(budget) >= smoke.box_s
    # eight parts: the rest leaves the smoke less than its box, which the build names
    six = {"parts": [{"file": f"part-{i:02d}.bin", "folder": f"part-{i:02d}", "bytes": mib * 2**20}
                     for i, mib in enumerate((15, 28, 28, 28, 28, 28, 28, 0.7), 1)]}
    manifest6 = {**six, "device_calls": vllm_parts.device_calls(six, ROOT / ".gpu_kit_vllm", tree_bytes=9.3 * 2**20,
                                                                 base_bytes=37 * 2**20),
                 "wheels": {}, "build_s": 1, "compress_s": 1}
    assert manifest6["device_calls"][-1]["smoke_box_s"] < smoke.box_s
    assert vllm_parts.summarise(manifest6, 9 * 2**20) == 1
    alone = vllm_parts.device_calls(manifest, ROOT / ".gpu_kit_vllm", tree_bytes=6 * 2**20, base_bytes=60 * 2**20)
    assert alone[0]["carry"] == [".gpu_kit_vllm/part-01"]  # the kit's carry and part 1 would not fit one call


def test_a_part_fits_a_call_beside_the_working_tree_it_is_built_in():
    """--part-mib's default: a part and the tree (tracked and untracked-not-ignored files) within a call's 64 MiB."""
    for tree_mib in (0.0, 6.8, 9.3, 20.0):
        part = vllm_parts.fitting_part_mib(int(tree_mib * 2**20))
        assert part <= vllm_parts.PART_MIB and part + tree_mib <= vllm_parts.CALL_MIB
        assert part == vllm_parts.PART_MIB or part + tree_mib > vllm_parts.CALL_MIB - 1  # no more room left than 1 MiB
    assert vllm_parts.fitting_part_mib(None) == vllm_parts.PART_MIB  # outside a checkout


def test_pack_leaves_what_a_call_returns_and_unpacks_to_out_as_it_was(tmp_path):
    """PACK, after a kit run that left 12 files in OUT (a stopped step's Ray logs in a subfolder): the summary and
    pieces of at most 15 MiB, 8 files at most, the kit's exit code kept; the pieces joined give OUT back."""
    out = tmp_path / "out"
    (out / "smoke_vllm.1.ray").mkdir(parents=True)
    (out / "summary.json").write_text('{"all_passed": false}')
    files = {"summary.json": b'{"all_passed": false}', "smoke_vllm.1.log": b"log\n" * 1000}
    (out / "smoke_vllm.1.log").write_bytes(files["smoke_vllm.1.log"])
    for i in range(10):
        data = os.urandom(2 * 2**20) if i < 9 else b"raylet\n"  # 18 MiB that do not compress: two pieces
        (out / "smoke_vllm.1.ray" / f"worker-{i}.out").write_bytes(data)
        files[f"smoke_vllm.1.ray/worker-{i}.out"] = data
    p = subprocess.run(["bash", "-c", f"(exit 1); {PACK}"], env={**os.environ, "OUT": str(out)},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr  # the kit's exit code
    back = sorted(f.name for f in out.iterdir())
    assert back == ["out.tgz.aa", "out.tgz.ab", "summary.json"] and all(f.is_file() for f in out.iterdir())
    assert all((out / n).stat().st_size <= 15 * 2**20 for n in back)
    (unpacked := tmp_path / "unpacked").mkdir()
    subprocess.run(["bash", "-c", f"cat {out}/out.tgz.* | tar xzf - -C {unpacked}"], check=True, timeout=120)
    assert {str(f.relative_to(unpacked)): f.read_bytes() for f in unpacked.rglob("*") if f.is_file()} == files


def test_a_pack_that_fails_leaves_out_as_the_kit_wrote_it_and_an_unset_out_removes_nothing(tmp_path):
    out = tmp_path / "out"
    (out / "a.ray").mkdir(parents=True)
    (out / "summary.json").write_text("{}")
    (out / "a.ray" / "raylet.out").write_text("raylet\n")
    before = sorted(str(f.relative_to(out)) for f in out.rglob("*"))
    # no temporary folder to pack into (a full disk): nothing removed, one line, the kit's exit code
    p = subprocess.run(["bash", "-c", f"(exit 3); {PACK}"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "OUT": str(out), "TMPDIR": str(tmp_path / "gone")})
    assert p.returncode == 3 and "PACK failed" in p.stderr, p.stderr
    assert sorted(str(f.relative_to(out)) for f in out.rglob("*")) == before
    # OUT unset: the shell stops at its first use, before any removal (here, where removing ./* would show)
    (cwd := tmp_path / "cwd").mkdir()
    (cwd / "keep").write_text("x")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    p = subprocess.run(["bash", "-c", f"(exit 0); {PACK}"], capture_output=True, text=True, timeout=60, env=env,
                       cwd=cwd)
    assert p.returncode != 0 and "OUT: parameter null or not set" in p.stderr and (cwd / "keep").is_file(), p.stderr
