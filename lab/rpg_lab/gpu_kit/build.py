"""Build the GPU kit's carry: the wheels a GPU node without network lacks to run this project, for its Python
(3.12, CPython) and platform (x86_64 Linux), trimmed of what a run never loads and packed into one
``.gpu_kit/wheels.tar.xz`` that fits one device call beside the working tree.

    python -m rpg_lab.gpu_kit.build [--python PYTHON3.12] [--have FILE] [--out .gpu_kit] [--max-mib 60]

1. Resolve the project's dependencies (pyproject.toml) for the node with pip's ``install --dry-run --report
   --only-binary=:all: --python-version 3.12 --platform manylinux_2_N_x86_64 ...``, the versions the node has
   pinned (``--have``, default ``gpu_image.txt``: torch 2.11.0, ...). pip evaluates markers such as
   ``python_version < "3.12"`` with the interpreter running it, hence ``--python``: a Python 3.12.
2. Carry what the project's requirements reach (markers evaluated for the node) that the node lacks, except
   ``EXCLUDE`` (never imported by the kit's runs; a package only they need goes too) and plus ``CARRY_ANYWAY``
   (the node has a version outside a requirement's range).
3. Download each as pip resolved it (sha256 checked against the resolution's), build the source-only ones
   (``BUILT_HERE``), then trim and pack them (``rpg_lab.gpu_kit.pack``).
4. Write ``manifest.json`` (what was carried, excluded and why, the sizes) and print the device call.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rpg.paths.checkout import CHECKOUT
from rpg_lab.gpu_kit import (CARRY_DIR, CARRY_FILE, DEFAULT_BUDGET_S, MANIFEST, NODE_PYTHON, TARGET_PYTHON,
                             foreign_files, say)
from rpg_lab.gpu_kit.pack import CARRY_PATHS, sha256, write_carry

try:
    from packaging.requirements import Requirement
except ImportError:  # a bare interpreter: pip's own copy of packaging
    from pip._vendor.packaging.requirements import Requirement

PREFIX = "[gpu-kit build]"  # its progress lines
HAVE_FILE = Path(__file__).with_name("gpu_image.txt")
# pip matches platform tags literally: every manylinux tag a glibc 2.39 x86_64 node accepts
PLATFORMS = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"] + [
    f"manylinux_2_{n}_x86_64" for n in range(5, 40)]
# environment markers of the node (PEP 508), for the requirements' markers
TARGET_MARKERS = {"python_version": TARGET_PYTHON, "python_full_version": TARGET_PYTHON + ".3",
                  "implementation_name": "cpython", "platform_python_implementation": "CPython",
                  "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix"}
# the one device call carries at most 64 MiB: the carry and the working tree together
CALL_MIB = 64.0
MAX_MIB = 60.0

# Published as source only; built into a wheel here (pure Python).
BUILT_HERE = {"antlr4-python3-runtime==4.9.3": "hydra-core 1.3 and omegaconf 2.3 need 4.9.*, a source-only release"}
# Carried although the node has it: its version there is outside a requirement's range.
CARRY_ANYWAY = {
    "transformers": "verl 0.9.1 requires transformers>=5.5.3,<5.11 (the node has 5.17.0)",
    "tokenizers": "transformers 5.10 requires tokenizers>=0.22,<=0.23.0 (the node has 0.23.2)",
    # verl 0.9.1 takes tensordict >=0.8,<=0.10 (!=0.9.0); 0.9.1 and 0.10.0 require pyvers <0.2, whose only release
    # 0.1.0 requires packaging <26; 0.8.3 needs no pyvers but is not the tensordict the project's tests run with
    "packaging": "pyvers 0.1.0 (tensordict 0.10.0's) requires packaging>=25,<26 (the node has 26.3)",
}
# Required by a dependency but never imported by the kit's runs (the GPU tests, the loss benchmark, the smoke
# run with the console logger, the model step); a package only these need is left out with them.
EXCLUDE = {
    "wandb": "W&B logging; the kit's runs log to the console and files (trainer.logger)",
    "av": "verl's video decoding (verl-core extra); the runs are text only",
    "torchcodec": "verl's video decoding (verl-core extra); built for one torch, the runs are text only",
    "qwen-vl-utils": "verl's vision-language inputs; imported only for image or video data",
    "py-spy": "Ray dashboard's stack sampling (ray[default])",
    "virtualenv": "Ray's runtime_env virtualenv/pip (ray[default]); the runs set env_vars only",
    "pytest-rerunfailures": "verl-core's test extra; not used by this project's tests",
    "pytest-asyncio": "verl-core's test extra; no GPU test is a coroutine (a plugin pytest loads: one for another "
                      "pytest would stop the GPU tests)",
}


class BuildError(Exception):
    """A build that cannot go on (one line: what and why)."""


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_have(text: str) -> dict[str, str | None]:
    """``pip list --format=freeze`` text (``name==version``, ``name @ url``, or a bare name; # comments) ->
    {canonical name: version or None}."""
    have: dict[str, str | None] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        name, _, version = line.partition("==")
        have[canonical(name.split(" @ ")[0].strip())] = version.strip() or None
    return have


def project_requirements(root: Path = CHECKOUT) -> list[str]:
    """The project's runtime dependencies (pyproject.toml's [project] dependencies)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        from pip._vendor import tomli as tomllib
    return list(tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"])


def pip_target_args(python_version: str = TARGET_PYTHON) -> list[str]:
    """pip's options selecting the node's wheels."""
    return ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
            *[arg for platform in PLATFORMS for arg in ("--platform", platform)]]


def check_resolver(python: str) -> None:
    """``python`` must run and be the node's Python version (it evaluates the markers)."""
    try:
        out = subprocess.run([python, "-c", "import sys, pip; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise BuildError(f"--python {python}: cannot run it ({e})") from None
    version = out.stdout.strip()
    if out.returncode != 0 or version != TARGET_PYTHON:
        why = f"it is Python {version}" if out.returncode == 0 else f"it fails: {out.stderr.strip()[-300:]}"
        raise BuildError(f"--python {python}: the resolution needs a Python {TARGET_PYTHON} with pip (pip evaluates "
                         f"markers such as python_version<'3.12' with its own interpreter), but {why}")


def default_resolver() -> str:
    """This interpreter when it is the node's version, else ``python3.12`` on PATH."""
    if "%d.%d" % sys.version_info[:2] == TARGET_PYTHON:
        return sys.executable
    return shutil.which(f"python{TARGET_PYTHON}") or f"python{TARGET_PYTHON}"


def build_source_only(python: str, dest: Path) -> list[Path]:
    """Wheels of ``BUILT_HERE`` in ``dest`` (pure Python: any interpreter builds them)."""
    for spec in BUILT_HERE:
        done = subprocess.run([python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), spec],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"{spec}: could not build its wheel: {done.stderr.strip()[-1000:]}")
    return sorted(dest.glob("*.whl"))


def resolve(python: str, requirements: list[str], pins: list[str], find_links: Path, scratch: Path) -> list[dict]:
    """pip's resolution of ``requirements`` for the node with ``pins`` as constraints: the report's install list."""
    constraints = scratch / "constraints.txt"
    constraints.write_text("".join(f"{p}\n" for p in pins))
    report = scratch / "report.json"
    cmd = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
           "--target", str(scratch / "target"), *pip_target_args(), "--find-links", str(find_links),
           "-c", str(constraints), *requirements]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        raise BuildError("pip could not resolve the requirements for Python %s (torch %s): %s" % (
            TARGET_PYTHON, next((p.split("==")[1] for p in pins if p.startswith("torch==")), "?"),
            " ".join(errors)[-2000:] or done.stderr.strip()[-2000:]))
    return json.loads(report.read_text())["install"]


@dataclass
class Selection:
    carry: dict[str, dict] = field(default_factory=dict)  # canonical name -> report item
    have: list[str] = field(default_factory=list)  # reached, and the node has it
    excluded: dict[str, str] = field(default_factory=dict)  # reached, left out: why
    unreached: list[str] = field(default_factory=list)  # resolved, needed only through an excluded package


def _wanted(req: Requirement, extras: tuple[str, ...]) -> bool:
    return req.marker is None or any(req.marker.evaluate({**TARGET_MARKERS, "extra": e}) for e in ("", *extras))


def select(items: list[dict], roots: list[str], have: dict[str, str | None],
           exclude: dict[str, str] = EXCLUDE, carry_anyway: dict[str, str] = CARRY_ANYWAY) -> Selection:
    """What to carry: the packages ``roots`` reach through the resolved items' requirements (markers for the
    node, extras followed), not through an excluded one, that the node lacks (or ``carry_anyway``)."""
    by_name = {canonical(i["metadata"]["name"]): i for i in items}
    sel = Selection()
    seen: set[tuple[str, tuple[str, ...]]] = set()
    queue = [Requirement(r) for r in roots]
    queue = [(canonical(r.name), tuple(sorted(r.extras))) for r in queue if _wanted(r, ())]
    while queue:
        name, extras = queue.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        if name in exclude:
            sel.excluded[name] = exclude[name]
            continue
        if name not in by_name:
            raise BuildError(f"{name} is required but not in pip's resolution (a requirement with a marker pip "
                             f"evaluated otherwise?)")
        for text in by_name[name]["metadata"].get("requires_dist") or []:
            req = Requirement(text)
            if _wanted(req, extras):
                queue.append((canonical(req.name), tuple(sorted(req.extras))))
    reached = {name for name, _ in seen} - set(sel.excluded)
    for name in sorted(reached):
        if name in have and name not in carry_anyway:
            sel.have.append(name)
        else:
            sel.carry[name] = by_name[name]
    sel.unreached = sorted(set(by_name) - reached - set(sel.excluded))
    return sel


def unverified(sel: Selection, have: dict[str, str | None]) -> list[str]:
    """The carried packages' requirements (markers for the node) on a package the node has at a version the node
    list does not give: pip's resolution could not check them; the node's ``pip check`` does (``rpg_lab.gpu_kit.install``
    reports a broken one). One line each."""
    lines = []
    for name, item in sorted(sel.carry.items()):
        for text in item["metadata"].get("requires_dist") or []:
            req = Requirement(text)
            dep = canonical(req.name)
            if req.specifier and _wanted(req, ()) and dep in have and have[dep] is None and dep not in sel.carry:
                lines.append(f"{item['metadata']['name']} {item['metadata']['version']} requires {req.name}"
                             f"{req.specifier}; the node list gives no version of {req.name}")
    return lines


def download(python: str, items: dict[str, dict], find_links: Path, dest: Path) -> dict[str, Path]:
    """Each item's wheel as pip resolved it ({name: path}), its sha256 checked against the resolution's."""
    specs = [f"{i['metadata']['name']}=={i['metadata']['version']}" for i in items.values()]
    done = subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", *pip_target_args(), "--find-links",
                           str(find_links), "-d", str(dest), *specs], capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"pip download failed: {done.stderr.strip()[-2000:]}")
    wheels = {}
    for name, item in items.items():
        filename = item["download_info"]["url"].rsplit("/", 1)[-1]
        path = dest / filename
        if not path.exists():
            raise BuildError(f"{name}: pip resolved {filename} but downloaded another file")
        want = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
        if want and sha256(path) != want:
            raise BuildError(f"{filename}: sha256 {sha256(path)} differs from the resolution's {want}")
        wheels[name] = path
    return wheels


def travelling_tree_bytes(root: Path = CHECKOUT) -> int | None:
    """Bytes of what a device call sends besides the carry: tracked and untracked-not-ignored files (None
    outside a git checkout)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    total = 0
    for rel in out.stdout.decode().split("\0"):
        path = root / rel
        if rel and path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def device_call(out: Path) -> dict:
    """The device call that runs the kit (the lead's ``run`` tool: command, carry, timeout)."""

    rel = os.path.relpath(out, CHECKOUT)
    carry = [rel] if not rel.startswith("..") else []
    return {"command": f'{NODE_PYTHON} -m rpg_lab.gpu_kit.run --carry {rel} --out "$OUT"',
            "carry": carry, "timeout_s": DEFAULT_BUDGET_S + 30}


def check_inputs(out: Path, ours: tuple[str, ...], python: str, have: Path) -> None:
    """``BuildError`` before minutes of work: ``out`` holds files other than ``ours`` (a folder the user named), the
    resolver is not a Python it can use, or the node's package list ``have`` is missing."""
    if refused := foreign_files(out.resolve(), ours):
        raise BuildError(f"--out {refused}")
    check_resolver(python)
    if not have.is_file():
        raise BuildError(f"--have {have}: no such file")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=None, help=f"a Python {TARGET_PYTHON} with pip, for the resolution "
                    f"(default: this one if it is {TARGET_PYTHON}, else python{TARGET_PYTHON} on PATH)")
    ap.add_argument("--have", type=Path, default=HAVE_FILE, help="the node's packages, `pip list --format=freeze` "
                    "(default: the kit's node, lab/rpg_lab/gpu_kit/gpu_image.txt)")
    ap.add_argument("--out", type=Path, default=CHECKOUT / CARRY_DIR, help=f"the carry's folder (default {CARRY_DIR}"
                    " in the checkout; replaced: a new folder or a carry)")
    ap.add_argument("--max-mib", type=float, default=MAX_MIB, help=f"largest carry, MiB (default {MAX_MIB:g})")
    ap.add_argument("--preset", type=int, default=9, choices=range(10), metavar="0-9",
                    help="xz preset (default 9: the smallest carry, about 3 minutes of one core)")
    ap.add_argument("--resolve-only", action="store_true", help="resolve and print the selection; download nothing")
    args = ap.parse_args(argv)
    python = args.python or default_resolver()
    try:
        check_inputs(args.out, CARRY_PATHS, python, args.have)
        return build(python, args)
    except BuildError as e:
        print(f"rpg_lab.gpu_kit.build: {e}", file=sys.stderr)
        return 2


def build(python: str, args) -> int:
    started = time.time()
    have = read_have(args.have.read_text())
    pins = sorted(f"{n}=={v}" for n, v in have.items() if v and n not in CARRY_ANYWAY)
    requirements = project_requirements()
    out = args.out.resolve()
    with tempfile.TemporaryDirectory(prefix="rpg-gpu-kit-") as tmp:
        scratch = Path(tmp)
        local = scratch / "local"
        local.mkdir()
        say(PREFIX, f"building {', '.join(BUILT_HERE)} (source only)")
        build_source_only(python, local)
        say(PREFIX, f"resolving {len(requirements)} requirements for CPython {TARGET_PYTHON} x86_64 Linux, "
            f"{len(pins)} of the node's versions pinned ({', '.join(p for p in pins if p.startswith('torch=='))})")
        items = resolve(python, requirements, pins, local, scratch)
        sel = select(items, requirements, have)
        say(PREFIX, f"{len(items)} packages resolved: {len(sel.carry)} to carry, {len(sel.have)} on the node, "
            f"{len(sel.excluded)} excluded ({', '.join(sorted(sel.excluded))}), "
            f"{len(sel.unreached)} only needed by those ({', '.join(sel.unreached)})")
        for name, item in sel.carry.items():
            print(f"  {item['metadata']['name']}=={item['metadata']['version']}"
                  + (f"  (carried anyway: {CARRY_ANYWAY[name]})" if name in CARRY_ANYWAY else ""))
        unchecked = unverified(sel, have)
        if unchecked:
            names = sorted({canonical(line.rsplit(" of ", 1)[1]) for line in unchecked})
            say(PREFIX, f"{len(unchecked)} requirements of carried packages on node packages the node list gives no "
                f"version of (the node's pip check decides; manifest.json's unverified): {', '.join(names)}")
        if args.resolve_only:
            return 0
        dl = scratch / "wheels"
        dl.mkdir()
        say(PREFIX, f"downloading {len(sel.carry)} wheels")
        wheels = download(python, sel.carry, local, dl)
        versions = {name: item["metadata"]["version"] for name, item in sel.carry.items()}
        say(PREFIX, f"trimming, packing {len(wheels)} wheels with xz preset {args.preset}")
        manifest = write_carry(wheels, versions, out, {
            "requirements": requirements, "pins": pins, "have_file": str(args.have),
            "resolved": {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in items},
            "on_the_node": sel.have, "excluded": sel.excluded, "only_needed_by_excluded": sel.unreached,
            "unverified": unchecked,
        }, args.preset, carried_anyway=CARRY_ANYWAY)
    manifest["build_s"] = round(time.time() - started, 1)
    manifest["working_tree_bytes"] = travelling_tree_bytes()  # once the carry is in its ignored folder
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    size, tree, entries = manifest["carry"]["bytes"], manifest["working_tree_bytes"], manifest["wheels"]
    mib = size / 2**20
    say(PREFIX, f"carry {out / CARRY_FILE}: {mib:.1f} MiB ({len(entries)} wheels: "
        + ", ".join(f"{n} {e['stored_bytes'] / 2**20:.1f}" for n, e in sorted(
            entries.items(), key=lambda kv: -kv[1]["stored_bytes"])[:4]) + " MiB uncompressed, ...)")
    if tree is not None:
        say(PREFIX, f"with the working tree ({tree / 2**20:.1f} MiB) a device call sends {mib + tree / 2**20:.1f} MiB "
            f"of its {CALL_MIB:g}")
    problems = []
    if mib > args.max_mib:
        problems.append(f"the carry is {mib:.1f} MiB, over --max-mib {args.max_mib:g}")
    if tree is not None and mib + tree / 2**20 > CALL_MIB:
        problems.append(f"the carry and the working tree are {mib + tree / 2**20:.1f} MiB, over the {CALL_MIB:g} MiB "
                        f"a device call sends")
    if problems:
        for p in problems:
            print(f"rpg_lab.gpu_kit.build: {p}; exclude or trim more (EXCLUDE in lab/rpg_lab/gpu_kit/build.py, "
                  f"TRIM in lab/rpg_lab/gpu_kit/pack.py)", file=sys.stderr)
        return 1
    call = device_call(out)
    say(PREFIX, "the device call (docs/gpu-smoke.md#the-gpu-kit):")
    print(f"  command:   {call['command']}\n  carry:     {json.dumps(call['carry'])}\n  timeout_s: {call['timeout_s']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
