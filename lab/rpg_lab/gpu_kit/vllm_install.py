"""Install the vLLM parts on a GPU node, one device call at a time: vLLM and what it needs beyond the node and the
kit's carry are too large for one call (``rpg_lab.gpu_kit.vllm_parts`` cuts them into parts of at most 56 MiB).

    python3 -m rpg_lab.gpu_kit.vllm_install [--parts .gpu_kit_vllm] [--site TMPDIR/rpg-gpu-kit-vllm]
                                        [--kit-site .gpu_kit_site] [--result FILE]

Each call: every part present under ``--parts`` (``part-NN.bin``, beside or below a copy of the build's
``manifest.json``) is checked against the manifest (its sha256 and bytes: a truncated transfer is named, not
installed) and kept in the site's staging folder, outside the checkout, whose copy on the node the next call may
replace; each wheel whose pieces have all arrived is joined (its sha256 checked), decompressed and installed
(``pip install --no-index --no-deps --target``, into a fresh folder merged into the site: wheels sharing a
namespace package, such as opentelemetry's, are installed in different calls); the site's state file records the
parts received and the wheels installed, so a part given twice is not installed again; a received part gone from
the staging folder (or cut short there) before its wheels are in is named in one line and received again when a call
carries it. The site is a new or empty folder or one the installer made (it holds the state file; any other is
refused in one line, left as it is); one install at a time holds it (a second is refused in one line naming the
first's PID; the lock ends with its holder). Once every wheel is in, ``import vllm`` runs with
``PYTHONPATH=CHECKOUT:CHECKOUT/lab:SITE:KIT_SITE``, and the kit's steps get the site on their path
(``rpg_lab.gpu_kit.install.run_env``, ``ready_site``; before the kit's: its fastapi and transformers replace the
kit's). The result (JSON): the parts received (of N), the ones missing, the wheels installed, whether vLLM is
complete. Exit 0, or 1 with one line per problem.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rpg.paths.checkout import CHECKOUT
from rpg_lab.gpu_kit import (MANIFEST, SITE_DIR, conclude, emptied, foreign, install_wheels, lock_folder,
                             source_path)
from rpg_lab.gpu_kit.pack import sha256

PARTS_DIR = ".gpu_kit_vllm"  # the parts' folder in the checkout (ignored by git; a device call carries one part)
# outside the checkout, in the node's temporary folder: files there survive between the calls of a warm node, the
# checkout's copy may not
DEFAULT_SITE = str(Path(tempfile.gettempdir()) / "rpg-gpu-kit-vllm")
SITE_ENV = "RPG_GPU_KIT_VLLM_SITE"  # another site (the tests' stand-in)
STATE = ".rpg-gpu-kit-vllm.json"  # in the site: the build, the parts received, the wheels installed
STAGING = ".rpg-staging"  # in the site: the parts received, until their wheels are installed
KIND = "rpg-gpu-kit-vllm-parts"  # the manifest's kind
IMPORT_TIMEOUT_S = 75  # within the kit step's box (vllm_part: 120 s) after the install


def vllm_site() -> Path:
    """Where the vLLM parts are installed on this node (``$RPG_GPU_KIT_VLLM_SITE``, else ``DEFAULT_SITE``)."""
    return Path(os.environ.get(SITE_ENV) or DEFAULT_SITE)


def read_state(site: Path) -> dict:
    """The site's state ({} when there is none, or it cannot be read: the parts are then received again)."""
    try:
        state = json.loads((site / STATE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def ready_site(site: Path | None = None) -> Path | None:
    """The vLLM site when every wheel of its build is installed there, else None."""
    site = vllm_site() if site is None else site
    return site if read_state(site).get("complete") is True else None


def write_state(site: Path, state: dict) -> None:
    """Atomically (a kill mid-way leaves the old state: its parts are received again)."""
    tmp = site / f".{STATE}.tmp"
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    os.replace(tmp, site / STATE)


def find_manifest(parts: Path) -> tuple[dict, str | None]:
    """The build's manifest: ``PARTS/manifest.json`` or a copy in a part's folder; (manifest, None) or ({}, the
    problem in one line)."""
    found = [parts / MANIFEST] + sorted(parts.glob(f"*/{MANIFEST}"))
    manifests = []
    for path in found:
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except (OSError, UnicodeDecodeError, ValueError) as e:
                return {}, (f"{path}: not a readable JSON file ({e}); build the parts again "
                            f"(python -m rpg_lab.gpu_kit.vllm_parts)")
            if not (isinstance(data, dict) and data.get("kind") == KIND and isinstance(data.get("parts"), list)
                    and isinstance(data.get("wheels"), dict) and isinstance(data.get("build_id"), str)):
                return {}, f"{path}: not a manifest of the vLLM parts (python -m rpg_lab.gpu_kit.vllm_parts writes one)"
            manifests.append(data)
    if not manifests:
        return {}, (f"{parts}: no {MANIFEST} (the vLLM parts' manifest); carry {PARTS_DIR}/part-NN (the part and "
                    f"its copy)")
    ids = sorted({m["build_id"] for m in manifests})
    if len(ids) > 1:
        return {}, (f"{parts}: manifests of {len(ids)} different builds ({', '.join(i[:12] for i in ids)}); carry "
                    f"parts of one build")
    return manifests[0], None


def part_problem(path: Path, entry: dict) -> str | None:
    """None when ``path`` is the part the manifest describes, else one line: a truncated or stale transfer."""
    size = path.stat().st_size
    digest = sha256(path)
    if size == entry["bytes"] and digest == entry["sha256"]:
        return None
    return (f"{entry['file']}: sha256 {digest[:16]}... ({size} of {entry['bytes']} bytes) differs from the manifest's "
            f"{entry['sha256'][:16]}...: a truncated or stale transfer, not installed; send it again")


def receive(parts: Path, manifest: dict, staging: Path, state: dict) -> tuple[list[str], list[str], list[str]]:
    """The parts under ``parts`` that are not received yet, checked and copied into ``staging`` (the state updated):
    (received now, given again, problems)."""
    entries = {p["file"]: p for p in manifest["parts"]}
    now, again, problems = [], [], []
    present = sorted({p.name: p for p in [*parts.glob("part-*.bin"), *parts.glob("*/part-*.bin")]}.items())
    for name, path in present:
        if name not in entries:
            problems.append(f"{path}: not a part of this build (its manifest lists {len(entries)} parts); not "
                            f"installed")
        elif name in state["received"]:
            again.append(name)
        elif (problem := part_problem(path, entries[name])) is not None:
            problems.append(problem)
        else:
            tmp = staging / f".{name}.tmp"
            shutil.copyfile(path, tmp)
            os.replace(tmp, staging / name)
            state["received"].append(name)
            now.append(name)
    return now, again, problems


def join_wheel(entry: dict, staging: Path, dest: Path) -> Path | str:
    """The wheel ``entry`` describes, from its pieces in the staged parts, in ``dest``; or the problem."""
    compressed = dest / (entry["wheel"] + ".xz")
    with open(compressed, "wb") as out:
        for piece in entry["pieces"]:
            with open(staging / piece["part"], "rb") as f:
                f.seek(piece["offset"])
                out.write(f.read(piece["bytes"]))
    if sha256(compressed) != entry["xz_sha256"]:
        return f"{entry['wheel']}: its joined pieces differ from the manifest's sha256"
    wheel = dest / entry["wheel"]
    with lzma.open(compressed) as src, open(wheel, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    compressed.unlink()
    if sha256(wheel) != entry["sha256"]:
        return f"{entry['wheel']}: decompressed, it differs from the manifest's sha256"
    return wheel


def import_check(site: Path, kit_site: Path, checkout: Path, python: str) -> dict:
    """``import vllm`` with the kit's path (``rpg_lab.gpu_kit.install.run_env``: the vLLM site before the kit's): its
    version, or the error's last lines."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*source_path(checkout), str(site), str(kit_site),
                                                    env.get("PYTHONPATH")) if p)
    t0 = time.time()
    try:
        done = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True,
                              env=env, cwd=checkout, timeout=IMPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"still importing after {IMPORT_TIMEOUT_S} s"}
    check = {"ok": done.returncode == 0, "seconds": round(time.time() - t0, 1)}
    if check["ok"]:
        check["version"] = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    else:
        check["error"] = "\n".join(done.stderr.strip().splitlines()[-12:])
    return check


def fresh_state(site: Path, manifest: dict) -> dict | str:
    """The site's state for this build; a site of another build is emptied first (``rpg_lab.gpu_kit.emptied``: only a
    folder the kit made). Or the problem."""
    state = read_state(site)
    if state.get("build_id") == manifest["build_id"]:
        state.setdefault("received", [])
        state.setdefault("installed", [])
        return state
    refused = emptied(site, STATE)
    if refused:
        return f"--site {refused}"
    (site / STATE).touch()  # the kit's from now on, before its state is written (atomically, not at once)
    return {"build_id": manifest["build_id"], "built_at": manifest.get("built_at"), "received": [], "installed": [],
            "complete": False}


def vanished(manifest: dict, state: dict, staging: Path) -> dict[str, str]:
    """The parts the state lists as received that a wheel not yet installed needs but that are gone from
    ``staging`` or not of their size there: taken off the state's list (the next call that carries one receives it
    again): {part: its line}."""
    entries = {p["file"]: p for p in manifest["parts"]}
    needed = {piece["part"] for name, w in manifest["wheels"].items() if name not in state["installed"]
              for piece in w["pieces"]}
    lines = {}
    for name in [n for n in state["received"] if n in needed]:
        path = staging / name
        size = path.stat().st_size if path.is_file() else None
        if size != entries[name]["bytes"]:
            state["received"].remove(name)
            now = "gone" if size is None else f"{size} of {entries[name]['bytes']} bytes"
            lines[name] = f"{path}: received earlier, now {now}; its wheels are not installed yet: send it again"
    return lines


def install(parts: Path, site: Path, kit_site: Path, checkout: Path = CHECKOUT, python: str = sys.executable) -> dict:
    """One call's install (module docstring): a result with ``problems`` (empty when all went well) and ``line``.
    One install at a time into a site (``rpg_lab.gpu_kit.lock_folder`` on it): another is refused in one line."""
    manifest, problem = find_manifest(parts)
    if problem:
        return {"problems": [problem]}
    refused = foreign(site, STATE)
    if refused:
        return {"problems": [f"--site {refused}"]}
    try:
        site.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return {"problems": [f"--site {site}: cannot be made ({e.strerror})"]}
    lock = lock_folder(site)
    if lock is None:
        pid = read_state(site).get("pid", "unknown")
        return {"problems": [f"--site {site}: another rpg_lab.gpu_kit.vllm_install is installing into it (PID {pid}); "
                             f"run one install at a time into a site"]}
    try:
        return locked_install(parts, manifest, site, kit_site, checkout, python)
    finally:
        os.close(lock)


def locked_install(parts: Path, manifest: dict, site: Path, kit_site: Path, checkout: Path, python: str) -> dict:
    """``install`` holding the site's lock."""
    t0 = time.time()
    state = fresh_state(site, manifest)
    if isinstance(state, str):
        return {"problems": [state]}
    state["pid"] = os.getpid()  # named to an install refused meanwhile
    write_state(site, state)  # the site is the kit's from now on (a new or emptied one had no state)
    staging = site / STAGING
    staging.mkdir(parents=True, exist_ok=True)
    gone = vanished(manifest, state, staging)
    now, again, problems = receive(parts, manifest, staging, state)
    problems += [line for name, line in gone.items() if name not in now]  # sent again: repaired
    write_state(site, state)
    ready = [name for name in manifest["order"] if name not in state["installed"]
             and all(piece["part"] in state["received"] for piece in manifest["wheels"][name]["pieces"])]
    installed_now = []
    if ready:
        with tempfile.TemporaryDirectory(prefix=".join-", dir=site) as tmp:
            joined = {name: join_wheel(manifest["wheels"][name], staging, Path(tmp)) for name in ready}
            problems += [w for w in joined.values() if isinstance(w, str)]
            wheels = {name: w for name, w in joined.items() if isinstance(w, Path)}
            if wheels:
                failed = install_wheels(list(wheels.values()), site, python)
                if failed:
                    problems.append(failed)
                else:
                    installed_now = list(wheels)
                    state["installed"] += installed_now
    state["complete"] = len(state["installed"]) == len(manifest["wheels"])
    write_state(site, state)
    drop_used_parts(manifest, state, staging)
    total = len(manifest["parts"])
    missing = [p["file"] for p in manifest["parts"] if p["file"] not in state["received"]]
    result: dict = {
        "site": str(site), "build_id": manifest["build_id"], "built_at": manifest.get("built_at"),
        "parts_total": total, "parts_received": sorted(state["received"]), "received_now": now,
        "given_again": again, "parts_missing": missing, "wheels_total": len(manifest["wheels"]),
        "wheels_installed": len(state["installed"]), "installed_now": installed_now,
        "complete": state["complete"], "problems": problems,
    }
    if state["complete"]:
        check = import_check(site, kit_site, checkout, python)
        result["import_vllm"] = check
        if not check["ok"]:
            problems.append(f"import vllm failed with PYTHONPATH={checkout}:{site}:{kit_site}: "
                            f"{check['error'].splitlines()[-1] if check.get('error') else 'no error text'}")
    result["seconds"] = round(time.time() - t0, 1)
    if state["complete"]:
        check = result["import_vllm"]
        end = f"vLLM complete, import {'ok: ' + check.get('version', '') if check['ok'] else 'FAILED'}"
    else:
        end = f"missing: {', '.join(missing) or 'none'}"
    result["line"] = (f"parts {len(state['received'])}/{total} received ({', '.join(now) or 'none'} now); "
                      f"wheels {len(state['installed'])}/{len(manifest['wheels'])} installed; {end}")
    return result


def drop_used_parts(manifest: dict, state: dict, staging: Path) -> None:
    """Remove a staged part once every wheel with a piece in it is installed (the node's disk is not the limit,
    but a complete site needs no staging)."""
    needed = {piece["part"] for name, w in manifest["wheels"].items() if name not in state["installed"]
              for piece in w["pieces"]}
    for path in staging.glob("part-*.bin"):
        if path.name not in needed:
            path.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", type=Path, default=CHECKOUT / PARTS_DIR, help=f"the parts this call carries (default "
                    f"{PARTS_DIR}: part-NN.bin and manifest.json, or part-NN/ folders holding both)")
    ap.add_argument("--site", type=Path, default=None, help=f"the vLLM site (default ${SITE_ENV}, else {DEFAULT_SITE})")
    ap.add_argument("--kit-site", type=Path, default=CHECKOUT / SITE_DIR, help=f"the kit's site, for the import check "
                    f"(default {SITE_DIR})")
    ap.add_argument("--result", type=Path, default=None, help="write the result as JSON here")
    args = ap.parse_args(argv)
    site = (args.site or vllm_site()).resolve()
    return conclude(install(args.parts.resolve(), site, args.kit_site.resolve()), args.result,
                    "rpg_lab.gpu_kit.vllm_install")


if __name__ == "__main__":
    sys.exit(main())
