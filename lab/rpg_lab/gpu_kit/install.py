"""Install the GPU kit's carry offline: its wheels and this checkout into a target folder, then pip's check of
what the carried packages require against what the node has.

    python3 -m rpg_lab.gpu_kit.install [--carry .gpu_kit] [--site .gpu_kit_site] [--result FILE]

Steps: SITE is a new or empty folder or one this install made (it holds its state file; any other folder is refused
in one line, left as it is); the carry's sha256 against its manifest (a truncated transfer is named, not
installed); its wheels with ``pip install --no-index --no-deps --target SITE`` (SITE emptied first; skipped when SITE
already holds this carry); the project from the checkout (``--no-build-isolation``: setuptools from the node), so
that verl finds the ``verl.plugins`` entry point that registers the RPG losses; ``pip check`` with
``PYTHONPATH=CHECKOUT:CHECKOUT/lab:SITE``, its lines about carried packages sorted into expected (a requirement
the build excluded) and problems.
Exit 0, or 1 with one line per problem. A run uses ``PYTHONPATH=CHECKOUT:CHECKOUT/lab:SITE``
(``rpg_lab.gpu_kit.source_path``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from rpg.paths.checkout import CHECKOUT
from rpg_lab.gpu_kit import (CARRY_DIR, KIT_VLLM_ENV, MANIFEST, PIP_INSTALL, SITE_DIR, conclude, emptied, foreign,
                             install_wheels, source_path)
from rpg_lab.gpu_kit.build import canonical
from rpg_lab.gpu_kit.pack import sha256

STATE = ".rpg-gpu-kit.json"  # in SITE: the sha256 of the carry installed there
PROJECT = "rpg-verl"


def run_env(site: Path, checkout: Path = CHECKOUT) -> dict[str, str]:
    """The environment of everything run after the install: this checkout first, then the vLLM site once all its
    parts are in (``rpg_lab.gpu_kit.vllm_install``: before the carry, whose fastapi and transformers it replaces with
    the versions vLLM 0.24.0 takes, those of pyproject's ``gpu`` extra), then the carry, then the node's."""
    from rpg_lab.gpu_kit.vllm_install import ready_site

    env = dict(os.environ)
    vllm = ready_site()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*source_path(checkout), vllm and str(vllm), str(site),
                                                    env.get("PYTHONPATH")) if p)
    if vllm:
        env = {**KIT_VLLM_ENV, **env}  # a value already set wins
    return env


def _pip(python: str, args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([python, *args], capture_output=True, text=True, env=env)


def sort_pip_check(lines: list[str], carried: set[str], excluded: set[str]) -> tuple[list[str], list[str]]:
    """pip check's lines about a carried package, or about a node's package whose requirement a carried one breaks
    (the carry comes first on the path: it shadows the node's version) -> (expected: a requirement the build
    excluded, problems)."""
    expected, problems = [], []
    for line in lines:
        words = line.split()
        if len(words) < 4:
            continue
        if canonical(words[0]) not in carried:
            shadowing = re.search(r", but you have (\S+) ", line)
            if shadowing and canonical(shadowing.group(1)) in carried:
                problems.append(line)
            continue  # else the node's own packages among themselves: not this kit's business
        m = re.search(r" requires (\S+), which is not installed", line)
        if m and canonical(m.group(1)) in excluded:
            expected.append(line)
        else:
            problems.append(line)
    return expected, problems


def install_carry(archive: Path, site: Path, python: str = sys.executable) -> int | str:
    """The archive's wheels into ``site``, made or emptied (``rpg_lab.gpu_kit.emptied``: only a folder the kit made):
    their count, or the problem."""
    refused = emptied(site, STATE)
    if refused:
        return f"--site {refused}"
    (site / STATE).write_text('{"sha256": null}\n')  # the kit's from now on: an install killed mid-way is redone
    with tempfile.TemporaryDirectory(prefix="rpg-gpu-kit-") as tmp:
        with tarfile.open(archive, "r:xz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:  # an interpreter without extraction filters; the archive is the kit's own
                tar.extractall(tmp)
        wheels = sorted(Path(tmp).glob("*.whl"))
        failed = install_wheels(wheels, site, python)
    return f"the carry: {failed}" if failed else len(wheels)


# what install() reads of the manifest rpg_lab.gpu_kit.pack writes: {key: (its type(s), what it holds)}
MANIFEST_KEYS = {"carry": (dict, "an object with file, sha256 and bytes"), "wheels": (dict, "an object"),
                 "excluded": ((dict, list), "an object or a list"),
                 "only_needed_by_excluded": ((dict, list), "an object or a list")}
CARRY_KEYS = {"file": (str, "a file name"), "sha256": (str, "a sha256 digest"), "bytes": (int, "an integer")}


def manifest_problem(path: Path) -> tuple[dict, str | None]:
    """(the manifest, None), or ({}, one line naming ``path`` and what is wrong with it)."""
    again = f"build the carry again (python -m rpg_lab.gpu_kit.build) and carry {CARRY_DIR}"
    if not path.is_file():
        return {}, f"{path}: no such file; build the carry (python -m rpg_lab.gpu_kit.build) and carry {CARRY_DIR}"
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, OSError) as e:  # JSONDecodeError, UnicodeDecodeError, unreadable
        return {}, f"{path}: not a readable JSON file ({e}); {again}"
    if not isinstance(manifest, dict):
        return {}, f"{path}: a JSON {type(manifest).__name__}, not an object; {again}"
    for key, (kind, what) in MANIFEST_KEYS.items():
        if not isinstance(manifest.get(key), kind):
            wrong = f"no {key!r} key ({what})" if key not in manifest else f"{key!r} is not {what}"
            return {}, f"{path}: {wrong}; {again}"
    for key, (kind, what) in CARRY_KEYS.items():
        value = manifest["carry"].get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or value == "":
            wrong = f"no carry.{key} ({what})" if key not in manifest["carry"] else f"carry.{key} is not {what}"
            return {}, f"{path}: {wrong}; {again}"
    return manifest, None


def _installed_digest(state: Path) -> str | None:
    """The carry's sha256 that ``state`` records; None when there is none or it cannot be read (an interrupted write,
    a hand edit: the wheels are then installed again, which rewrites it)."""
    try:
        record = json.loads(state.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return record.get("sha256") if isinstance(record, dict) else None


def install(carry: Path, site: Path, python: str = sys.executable, checkout: Path = CHECKOUT) -> dict:
    """The whole install (module docstring): a result with ``problems`` (empty when it all went in) and ``line``."""
    t0 = time.time()
    refused = foreign(site, STATE)  # before the carry is read: nothing of a folder the kit did not make is touched
    if refused:
        return {"problems": [f"--site {refused}"]}
    manifest, problem = manifest_problem(carry / MANIFEST)
    if problem:
        return {"problems": [problem]}
    archive = carry / manifest["carry"]["file"]
    if not archive.is_file():
        return {"problems": [f"{archive}: no such file"]}
    digest = sha256(archive)
    if digest != manifest["carry"]["sha256"]:
        return {"problems": [f"{archive}: sha256 {digest} differs from the manifest's {manifest['carry']['sha256']} "
                             f"({archive.stat().st_size} of {manifest['carry']['bytes']} bytes): a truncated or "
                             f"stale carry"]}
    result: dict = {"site": str(site), "carry_bytes": manifest["carry"]["bytes"], "wheels": len(manifest["wheels"]),
                    "built_at": manifest.get("built_at"), "problems": []}
    state = site / STATE
    if _installed_digest(state) == digest:
        result["wheels_installed"] = "already there (same carry)"
    else:
        installed = install_carry(archive, site, python)
        if isinstance(installed, str):
            result["problems"].append(installed)
            return result
        state.write_text(json.dumps({"sha256": digest, "built_at": manifest.get("built_at")}) + "\n")
        result["wheels_installed"] = installed
    # --upgrade: the project's copy in the site replaced (a site that already holds this carry keeps its wheels)
    done = _pip(python, [*PIP_INSTALL, "--upgrade", "--no-build-isolation", "--target", str(site), str(checkout)])
    project = done.returncode == 0
    if not project:
        result["problems"].append(f"pip install of the project from {checkout} failed: {done.stderr.strip()[-1500:]}")
    check = _pip(python, ["-m", "pip", "check", "--disable-pip-version-check"], env=run_env(site, checkout))
    carried = set(manifest["wheels"]) | {PROJECT}
    excluded = set(manifest["excluded"]) | set(manifest["only_needed_by_excluded"])
    expected, problems = sort_pip_check(check.stdout.splitlines(), carried, excluded)
    result["pip_check_expected"] = expected
    result["problems"] += [f"pip check: {line}" for line in problems]
    result["seconds"] = round(time.time() - t0, 1)
    result["line"] = (f"{result['wheels_installed']} wheels into {site}; project "
                      f"{'installed' if project else 'NOT installed'}; pip check: "
                      f"{len(problems)} problem(s), {len(expected)} expected (excluded packages)")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--carry", type=Path, default=CHECKOUT / CARRY_DIR, help=f"the carry (default {CARRY_DIR})")
    ap.add_argument("--site", type=Path, default=CHECKOUT / SITE_DIR, help=f"target folder (default {SITE_DIR})")
    ap.add_argument("--result", type=Path, default=None, help="write the result as JSON here")
    args = ap.parse_args(argv)
    return conclude(install(args.carry.resolve(), args.site.resolve()), args.result, "rpg_lab.gpu_kit.install")


if __name__ == "__main__":
    sys.exit(main())
