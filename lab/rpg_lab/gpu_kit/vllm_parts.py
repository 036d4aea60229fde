"""Build the vLLM parts: vLLM 0.24.0 (verl[vllm]==0.9.1's pin, pyproject's ``gpu`` extra) and what it needs beyond
the GPU node's packages and the kit's carry, cut into parts that each fit one device call beside the working tree;
``rpg_lab.gpu_kit.vllm_install`` installs them on the node, one call at a time (their sizes and times as measured:
docs/gpu-smoke.md#the-vllm-parts).

    python -m rpg_lab.gpu_kit.vllm_parts [--python PYTHON3.12] [--have FILE] [--base .gpu_kit] [--out .gpu_kit_vllm]
                                     [--part-mib 56] [--first-mib 0] [--preset 6] [--jobs 2] [--cache DIR]

1. pip resolves the project's requirements and ``verl[vllm]==0.9.1`` for the node (``rpg_lab.gpu_kit.build.resolve``)
   with the node's versions pinned but numpy's (``UNPINNED``: vLLM's requirements exclude the node's numpy 2.5.2,
   which the runs keep). Carried: what they reach that the node lacks, less ``VLLM_EXCLUDE``, less what the kit's
   carry holds at the same version (``--base``'s manifest.json; without one, resolved as ``rpg_lab.gpu_kit.build``
   would). The kit's packages that vLLM's resolution takes at another version (fastapi < 0.137, transformers
   5.9.0: pyproject's ``gpu`` extra) are carried too: the vLLM site comes before the kit's on the path.
2. Each wheel is downloaded as resolved (sha256 checked), trimmed (``VLLM_TRIM``) and stored
   (``rpg_lab.gpu_kit.pack.restore``), then xz-compressed on its own (in 32 MiB blocks, ``--jobs`` at a time: per
   wheel, so that each part's wheels install as soon as the part arrives); the compressed wheels, smallest first,
   are laid end to end and cut into ``part-NN.bin`` of at most ``--part-mib`` (a large wheel spans several parts
   as byte pieces; ``--first-mib`` makes part 1 small enough to ride along with the kit's carry).
3. ``OUT/manifest.json``: each part's bytes and sha256, each wheel's pieces (part, offset, bytes) and sha256s, the
   order; each part also in its own folder ``OUT/part-NN/`` with a copy of the manifest, so that a device call
   carries one path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import math
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rpg.paths.checkout import CHECKOUT
from rpg_lab.gpu_kit import CARRY_DIR, MANIFEST, NODE_PYTHON, PACK, SAMPLE_S, TARGET_PYTHON, foreign_files, say
from rpg_lab.gpu_kit.build import (CALL_MIB, CARRY_ANYWAY, EXCLUDE, HAVE_FILE, BuildError, build_source_only, canonical,
                               check_inputs, default_resolver, download, project_requirements, read_have, resolve,
                               select, travelling_tree_bytes)
from rpg_lab.gpu_kit.pack import restore, sha256
from rpg_lab.gpu_kit.vllm_install import KIND, PARTS_DIR

PREFIX = "[gpu-kit vllm]"  # its progress lines
VLLM_REQUIREMENT = "verl[vllm]==0.9.1"  # pyproject.toml's gpu extra
VLLM_VERSION = "0.24.0"  # verl 0.9.1's vllm extra pins it
PART_MIB = 56.0  # the largest part outside a checkout; in one, what fits beside its working tree (fitting_part_mib)
TREE_MARGIN_MIB = 0.5  # room for the tree to grow between the build and the lease
BLOCK_BYTES = 32 * 2**20  # xz blocks compressed side by side (a block far above xz's 8 MiB window loses nothing)
PART_NAME = "part-{:02d}"
# what the parts' folder holds (pack_parts): the manifest, and each part's folder with the part and its copy
PARTS_PATHS = rf"{re.escape(MANIFEST)}|part-\d+(/(part-\d+\.bin|{re.escape(MANIFEST)}))?"
# Required by vLLM, never loaded for a dense model with FlashAttention 2 (the smoke run's Qwen2 model): left out
# with what only they need. The reason names where vLLM 0.24.0 imports it (inside the function that needs it).
VLLM_EXCLUDE = {
    **EXCLUDE,
    "flashinfer-cubin": "FlashInfer's prebuilt kernels for its attention/MoE/GEMM backends (the run uses "
                        "FlashAttention 2); flashinfer-python itself is carried",
    "flashinfer-jit-cache": "FlashInfer's ahead-of-time kernel cache, as above",
    "tokenspeed-mla": "MLA attention (DeepSeek-style models): imported only by vLLM's tokenspeed MLA backends; its "
                      "tokenspeed-triton is 93 MiB",
    "tilelang": "DeepSeek-V4's mHC kernels (vllm/model_executor/kernels/mhc), imported inside them; with z3-solver",
    "humming-kernels": "quantization='humming' and its MoE kernels only",
    "nvidia-cutlass-dsl": "CUTLASS's CuTe DSL (105 MiB of xz with its libraries): imported only by vLLM's FA4, "
                          "Blackwell FMHA, DeepSeek-V4 and GDN kernels and FlashInfer's CuTe DSL kernels (FlashInfer's "
                          "__init__ goes on without it)",
    "quack-kernels": "CuTe DSL kernels (FA4, GDN): imported only there, and needs nvidia-cutlass-dsl",
    # the CUDA compilers of cuda-tile[tileiras] (FlashInfer's): about 100 MiB of xz with crt, for FlashInfer's cuTile
    # all-gather GEMM (several GPUs) and its JIT kernels; the kit's steps sample with PyTorch
    # (VLLM_USE_FLASHINFER_SAMPLER=0, rpg_lab.gpu_kit.install.run_env); cuda-tile itself is carried (flashinfer.comm
    # imports it)
    "nvidia-cuda-tileiras": "the cuTile compiler (FlashInfer's cuTile kernels); see the comment above",
    "nvidia-cuda-nvcc": "nvcc, for FlashInfer's JIT kernels and cuTile (with nvidia-cuda-crt)",
    "nvidia-nvvm": "NVVM, as nvcc",
}
# The node's pin left out of the resolution: the node's own version is used (not carried).
UNPINNED = {
    "numpy": "vLLM 0.24.0's mistral-common 1.13.1 requires numpy<2.4 on Python 3.12 and its numba 0.65.0 "
             "numpy<2.5; the node has 2.5.2, which the runs keep (not carried), as they keep the node's numba",
}
# Members of a wheel a run never loads (fnmatch on the path in the wheel), as rpg_lab.gpu_kit.pack.TRIM.
VLLM_TRIM = {
    "vllm": [
        "vllm/vllm_flash_attn/_vllm_fa3_C*",  # FlashAttention 3 (146 MiB): without it vLLM takes FA2 on Hopper
        "vllm/_moe_C*",  # mixture-of-experts kernels (43 MiB): dense models only
        "vllm/vllm-rs",  # the Rust frontend (35 MiB), run only with VLLM_RUST_FRONTEND_PATH
        "vllm/third_party/fmha_sm100/*",  # Blackwell attention in the CuTe DSL (left out above)
    ],
    "xgrammar": ["*/libxgrammar.a"],  # the static library, for building against it
}


def base_carry(base: Path, python: str, requirements: list[str], pins: list[str], have: dict, local: Path,
               scratch: Path) -> tuple[dict[str, str], str]:
    """The kit's carry {name: version} and where it was read: ``base``'s manifest, else resolved here as
    ``rpg_lab.gpu_kit.build`` would."""
    manifest = base / MANIFEST
    if manifest.is_file():
        wheels = json.loads(manifest.read_text()).get("wheels") or {}
        return {name: entry["version"] for name, entry in wheels.items()}, str(manifest)
    sub = scratch / "base"
    sub.mkdir()
    sel = select(resolve(python, requirements, pins, local, sub), requirements, have)
    return {name: item["metadata"]["version"] for name, item in sel.carry.items()}, "resolved (no base manifest)"


def vllm_selection(items: list[dict], roots: list[str], have: dict, base: dict[str, str],
                   exclude: dict[str, str] = VLLM_EXCLUDE) -> tuple[dict, dict, dict]:
    """(the items to carry: reached, not on the node, and not in the kit's carry at the same version; the kit's
    packages the vLLM resolution needs at another version {name: "kit -> vLLM"}; the selection's excluded)."""
    sel = select(items, roots, have, exclude=exclude, carry_anyway=CARRY_ANYWAY)
    resolved = {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in items}
    if resolved.get("vllm") != VLLM_VERSION:
        raise BuildError(f"pip resolved vllm {resolved.get('vllm')}, not {VLLM_VERSION} (verl 0.9.1's vllm extra)")
    carry = {n: i for n, i in sel.carry.items() if base.get(n) != resolved[n]}
    overrides = {n: f"{base[n]} -> {resolved[n]}" for n in carry if n in base}
    return carry, overrides, sel.excluded


def _compress_block(path: Path, offset: int, size: int, preset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return lzma.compress(f.read(size), preset=preset)  # lzma releases the GIL: threads run side by side


def compress(paths: list[Path], dest: Path, preset: int, jobs: int) -> dict[Path, Path]:
    """Each file xz-compressed into ``dest`` (``NAME.xz``: one xz stream per 32 MiB block, which xz reads as one
    file), ``jobs`` blocks at a time, all files' blocks queued at once (no core waits at a file's end)."""
    out = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        queued = {path: [pool.submit(_compress_block, path, o, min(BLOCK_BYTES, path.stat().st_size - o), preset)
                         for o in range(0, max(path.stat().st_size, 1), BLOCK_BYTES)] for path in paths}
        for path, blocks in queued.items():
            target = dest / (path.name + ".xz")
            with open(target, "wb") as f:
                for block in blocks:
                    f.write(block.result())
            out[path] = target
    return out


def plan_parts(sizes: list[tuple[str, int]], part_bytes: int, first_bytes: int = 0) -> list[list[tuple[str, int, int]]]:
    """``sizes`` (name, bytes), in order, laid end to end and cut into parts of at most ``part_bytes`` (the first
    at most ``first_bytes`` when given): each part's pieces (name, offset in the file, bytes)."""
    if part_bytes <= 0 or first_bytes < 0:
        raise BuildError(f"a part must hold at least one byte (part {part_bytes}, first {first_bytes} bytes)")
    parts: list[list[tuple[str, int, int]]] = [[]]
    room = first_bytes or part_bytes
    for name, size in sizes:
        done = 0
        while done < size:
            if room == 0:
                parts.append([])
                room = part_bytes
            take = min(room, size - done)
            parts[-1].append((name, done, take))
            done += take
            room -= take
    return [p for p in parts if p]


def write_parts(files: dict[str, Path], plan: list[list[tuple[str, int, int]]], out: Path) -> tuple[list[dict], dict]:
    """The parts in ``out`` (``part-NN/part-NN.bin``): their manifest entries, and each file's pieces."""
    entries, pieces = [], {name: [] for name in files}
    for n, part in enumerate(plan, 1):
        name = PART_NAME.format(n)
        folder = out / name
        folder.mkdir(parents=True)
        path = folder / f"{name}.bin"
        h = hashlib.sha256()
        at = 0
        with open(path, "wb") as f:
            for fname, offset, size in part:
                with open(files[fname], "rb") as src:
                    src.seek(offset)
                    data = src.read(size)
                f.write(data)
                h.update(data)
                pieces[fname].append({"part": path.name, "offset": at, "bytes": size})
                at += size
        entries.append({"file": path.name, "folder": name, "bytes": at, "sha256": h.hexdigest(),
                        "wheels": sorted({fname for fname, _, _ in part})})
    return entries, pieces


def pack_parts(wheels: dict[str, Path], versions: dict[str, str], out: Path, extra: dict, part_bytes: int,
               first_bytes: int = 0, preset: int = 6, jobs: int = 2, trim: dict[str, list[str]] = VLLM_TRIM) -> dict:
    """Trim, store, compress and cut ``wheels`` ({name: path}, rewritten in place) into ``out`` (replaced as a whole)
    with its manifest (``extra`` plus the parts and the wheels); returns the manifest. ``out`` is replaced only when
    it holds nothing but parts (``foreign_files``; else FileExistsError with its line, nothing touched)."""
    refused = foreign_files(out, PARTS_PATHS)
    if refused:
        raise FileExistsError(f"--out {refused}")
    entries: dict[str, dict] = {}
    for name, path in sorted(wheels.items()):
        size = path.stat().st_size
        removed = restore(path, trim.get(name, []))
        entries[name] = {"wheel": path.name, "version": versions[name], "wheel_bytes": size,
                         "stored_bytes": path.stat().st_size, "removed_members": len(removed), "sha256": sha256(path)}
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".gpu_kit_vllm.", dir=out.parent))
    try:
        t0 = time.time()
        xz = compress(list(wheels.values()), stage, preset, jobs)
        compress_s = round(time.time() - t0, 1)
        files = {name: xz[path] for name, path in wheels.items()}
        for name, path in files.items():
            entries[name].update(xz_bytes=path.stat().st_size, xz_sha256=sha256(path))
        order = sorted(files, key=lambda n: (entries[n]["xz_bytes"], n))
        plan = plan_parts([(n, entries[n]["xz_bytes"]) for n in order], part_bytes, first_bytes)
        parts, pieces = write_parts(files, plan, stage)
        for name in files:
            entries[name]["pieces"] = pieces[name]
            files[name].unlink()
        body = {"kind": KIND, "target": {"python": TARGET_PYTHON, "implementation": "cp",
                                         "platform": "manylinux x86_64"},
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra, "xz_preset": preset,
                "compress_s": compress_s, "part_bytes": part_bytes, "first_bytes": first_bytes, "order": order,
                "parts": parts, "wheels": entries, "trim": trim}
        body["build_id"] = hashlib.sha256(json.dumps([p["sha256"] for p in parts]).encode()).hexdigest()
        text = json.dumps(body, indent=1) + "\n"
        (stage / MANIFEST).write_text(text)
        for part in parts:
            (stage / part["folder"] / MANIFEST).write_text(text)
        if out.exists():
            shutil.rmtree(out)
        stage.chmod(0o755)
        stage.rename(out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return body


INSTALL_COMMAND = NODE_PYTHON + ' -m rpg_lab.gpu_kit.vllm_install --parts {parts}'
KIT_COMMAND = NODE_PYTHON + ' -m rpg_lab.gpu_kit.run --carry {carry} --out "$OUT"'
# the last call: the install's check, vllm_part (the vLLM wheel, import vllm), the eager smoke_vllm (its 420 s box and
# 45 s grace), the kit's own 30 s: within a device call's 600 (times: docs/gpu-smoke.md#call-order-on-a-gpu-machine)
LAST_BUDGET_S = 530
# A lease's worst case within its device time (docs/gpu-smoke.md#call-order-on-a-gpu-machine, with the times measured):
# the machine's start and the seconds between calls (the next call's transfer) count; each call at most its timeout
LEASE_S, START_S, BETWEEN_S = 900, 60, 10
# on the H200: the first call 17-19 s (the kit's install 12 s), a part's 0.3-5 s (2026-11-28, 2026-11-30)
FIRST_TIMEOUT_S, PART_TIMEOUT_S = 60, 40


def device_calls(manifest: dict, out: Path, tree_bytes: int | None, base_bytes: int | None) -> list[dict]:
    """The device calls that carry the parts, one part each, back to back on a warm node (a node given back loses
    the staged parts): the installer alone, which needs only the checkout; part 1 rides along with the kit's carry
    and its install (``--steps install``: the kit's default steps have run on a GPU, so vLLM, which has not, takes
    the lease first) when the kit's carry, the part and the tree fit one call; the last part's call runs
    the kit with ``--steps vllm_part,smoke_vllm`` (the kit's carry and site stay on the warm node from the first
    call: ignored folders a call does not name are kept there). Their timeouts, the machine's start and the seconds
    between calls fit ``LEASE_S`` (``worst_lease_s``)."""
    rel = os.path.relpath(out, CHECKOUT)
    install = INSTALL_COMMAND.format(parts=rel)
    kit = KIT_COMMAND.format(carry=CARRY_DIR)
    parts = manifest["parts"]
    calls = []
    for n, part in enumerate(parts, 1):
        carry, sends = [f"{rel}/{part['folder']}"], part["bytes"] + (tree_bytes or 0)
        if n == len(parts):
            # the lease's rest when the calls before run to their timeouts (more parts, less left), at most 530 s
            rest = LEASE_S - START_S - BETWEEN_S * (len(parts) - 1) - 30 - sum(c["timeout_s"] for c in calls)
            budget = min(LAST_BUDGET_S, rest)
            command = f"{kit} --steps vllm_part,smoke_vllm --budget {budget} --sample-stacks {SAMPLE_S}; {PACK}"
            timeout, last_budget = budget + 30, budget
        elif n == 1 and base_bytes is not None and sends + base_bytes <= CALL_MIB * 2**20:
            # with the kit's install; the installer's result on stdout
            carry, sends = [CARRY_DIR, *carry], sends + base_bytes
            command, timeout = f"{install}; {kit} --steps install", FIRST_TIMEOUT_S
        else:
            command, timeout = f'{install} --result "$OUT/vllm_install.json"', PART_TIMEOUT_S
        calls.append({"part": part["file"], "mib": round(part["bytes"] / 2**20, 1),
                      "sends_mib": round(sends / 2**20, 1), "command": command, "carry": carry, "timeout_s": timeout})
        if n == len(parts):
            calls[-1]["smoke_box_s"] = round(smoke_room_s(last_budget))
    return calls


def worst_lease_s(calls: list[dict]) -> int:
    """The device time of ``calls`` when each runs to its timeout: with the machine's start and the gaps."""
    return START_S + sum(c["timeout_s"] for c in calls) + BETWEEN_S * (len(calls) - 1)


def _smoke_vllm():
    from rpg_lab.gpu_kit.steps import STEPS

    return next(s for s in STEPS if s.name == "smoke_vllm")


def smoke_room_s(budget_s: float) -> float:
    """The box the last call's ``smoke_vllm`` gets from a kit ``--budget`` of ``budget_s``: after the install's check
    and ``vllm_part`` (5 and 20 s on the H200), less the step's grace and the kit's 5 s (a step gets min(its box,
    what is left - its grace - 5 s))."""
    return budget_s - 5 - 20 - _smoke_vllm().grace_s - 5


def fitting_part_mib(tree_bytes: int | None) -> float:
    """``--part-mib``'s default: the largest part that a call sends beside this working tree (the tree grows with
    the project: 6.8 MiB in 2026-11-28's build, 9.3 in 2026-11-30's), at most ``PART_MIB``."""
    if tree_bytes is None:
        return PART_MIB
    return min(PART_MIB, math.floor((CALL_MIB - tree_bytes / 2**20 - TREE_MARGIN_MIB) * 10) / 10)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=None, help=f"a Python {TARGET_PYTHON} with pip, for the resolution")
    ap.add_argument("--have", type=Path, default=HAVE_FILE, help="the node's packages (default gpu_image.txt)")
    ap.add_argument("--base", type=Path, default=CHECKOUT / CARRY_DIR, help=f"the kit's carry, whose wheels are not "
                    f"carried again (default {CARRY_DIR}; without its manifest, resolved here)")
    ap.add_argument("--out", type=Path, default=CHECKOUT / PARTS_DIR, help=f"the parts' folder (default {PARTS_DIR}; "
                    "replaced: a new folder or one holding parts)")
    ap.add_argument("--part-mib", type=float, default=None, help=f"largest part, MiB (default: what a call sends "
                    f"beside this working tree, at most {PART_MIB:g})")
    ap.add_argument("--first-mib", type=float, default=0.0, help="largest first part, MiB (default: --part-mib); "
                    "about 15 lets part 1 ride along with the kit's carry")
    ap.add_argument("--preset", type=int, default=6, choices=range(10), metavar="0-9", help="xz preset (default 6)")
    ap.add_argument("--jobs", type=int, default=2, help="xz blocks compressed side by side (default 2)")
    ap.add_argument("--cache", type=Path, default=None, help="keep the downloads here (a rebuild downloads nothing)")
    ap.add_argument("--include", default="", help="comma-separated names of VLLM_EXCLUDE to carry anyway")
    ap.add_argument("--resolve-only", action="store_true", help="resolve and print the selection; download nothing")
    ap.add_argument("--calls", action="store_true", help="print the device calls of the parts in --out (with this "
                    "working tree and --base's carry) and write them into their manifests; build nothing")
    args = ap.parse_args(argv)
    if args.calls:
        return calls_again(args.out.resolve(), args.base.resolve())
    python = args.python or default_resolver()
    if args.part_mib is None:
        args.part_mib = fitting_part_mib(travelling_tree_bytes())
    try:
        check_inputs(args.out, PARTS_PATHS, python, args.have)
        if args.part_mib <= 0 or args.part_mib > 60 or args.first_mib < 0:
            raise BuildError(f"--part-mib {args.part_mib:g}: a part is more than 0 and at most 60 MiB; "
                             f"--first-mib {args.first_mib:g}: 0 (as the others) or more")
        return build(python, args)
    except BuildError as e:
        print(f"rpg_lab.gpu_kit.vllm_parts: {e}", file=sys.stderr)
        return 2


def build(python: str, args) -> int:
    started = time.time()
    have = read_have(args.have.read_text())
    node_pins = [f"{n}=={v}" for n, v in sorted(have.items()) if v and n not in CARRY_ANYWAY]
    requirements = project_requirements()
    roots = requirements + [VLLM_REQUIREMENT]
    out = args.out.resolve()
    with tempfile.TemporaryDirectory(prefix="rpg-gpu-kit-vllm-") as tmp:
        scratch = Path(tmp)
        local = scratch / "local"
        local.mkdir()
        build_source_only(python, local)
        base, base_from = base_carry(args.base.resolve(), python, requirements, node_pins, have, local, scratch)
        say(PREFIX, f"the kit's carry: {len(base)} wheels ({base_from})")
        pins = [p for p in node_pins if p.split("==")[0] not in UNPINNED]
        say(PREFIX, f"resolving {VLLM_REQUIREMENT} and the project's {len(requirements)} requirements for CPython "
            f"{TARGET_PYTHON} x86_64 Linux, {len(pins)} of the node's versions pinned (not {', '.join(UNPINNED)})")
        items = resolve(python, roots, pins, local, scratch)
        include = {canonical(n) for n in args.include.split(",") if n.strip()}
        unknown = sorted(include - set(VLLM_EXCLUDE))
        if unknown:
            raise BuildError(f"--include {', '.join(unknown)}: not left out (VLLM_EXCLUDE: {', '.join(VLLM_EXCLUDE)})")
        exclude = {n: why for n, why in VLLM_EXCLUDE.items() if n not in include}
        carry, overrides, excluded = vllm_selection(items, roots, have, base, exclude)
        for name, item in carry.items():
            print(f"  {item['metadata']['name']}=={item['metadata']['version']}"
                  + (f"  (the kit carries {base[name]}: the vLLM site comes first on the path)" if name in overrides
                     else ""))
        say(PREFIX, f"{len(items)} packages resolved: {len(carry)} to carry beyond the node and the kit's carry "
            f"({len(overrides)} of them at another version than the kit's: "
            f"{', '.join(f'{n} {v}' for n, v in overrides.items())}); "
            f"excluded: {', '.join(sorted(n for n in excluded if n not in EXCLUDE))} (and the kit's exclusions)")
        if args.resolve_only:
            return 0
        cache = args.cache.resolve() if args.cache else scratch / "download"
        cache.mkdir(parents=True, exist_ok=True)
        say(PREFIX, f"downloading {len(carry)} wheels into {cache}")
        downloaded = download(python, carry, local, cache)
        work = scratch / "wheels"
        work.mkdir()
        wheels = {name: Path(shutil.copy(path, work / path.name)) for name, path in downloaded.items()}
        say(PREFIX, f"trimming, compressing (xz preset {args.preset}, {args.jobs} at a time) and cutting into parts of "
            f"{args.part_mib:g} MiB")
        manifest = pack_parts(wheels, {n: i["metadata"]["version"] for n, i in carry.items()}, out, {
            "requirements": roots, "pins": pins, "unpinned": UNPINNED, "base": base_from, "base_wheels": base,
            "overrides": overrides,
            "excluded": excluded, "have_file": str(args.have),
        }, int(args.part_mib * 2**20), int(args.first_mib * 2**20), args.preset, args.jobs)
    manifest["build_s"] = round(time.time() - started, 1)
    manifest = with_calls(manifest, out, args.base.resolve())
    return summarise(manifest, manifest["working_tree_bytes"])


def with_calls(manifest: dict, out: Path, base: Path) -> dict:
    """``manifest`` with its device calls for this working tree and ``base``'s carry, written into its copies."""
    tree = travelling_tree_bytes()
    base_bytes = json.loads((base / MANIFEST).read_text())["carry"]["bytes"] if (base / MANIFEST).is_file() else None
    manifest["working_tree_bytes"] = tree
    manifest["device_calls"] = device_calls(manifest, out, tree, base_bytes)
    text = json.dumps(manifest, indent=1) + "\n"
    for path in [out / MANIFEST, *(out / p["folder"] / MANIFEST for p in manifest["parts"])]:
        path.write_text(text)
    return manifest


def calls_again(out: Path, base: Path) -> int:
    """``--calls``: the parts already built, their device calls printed again."""
    if not (out / MANIFEST).is_file():
        print(f"rpg_lab.gpu_kit.vllm_parts: {out / MANIFEST}: no such file; build the parts first", file=sys.stderr)
        return 2
    manifest = with_calls(json.loads((out / MANIFEST).read_text()), out, base)
    return summarise(manifest, manifest["working_tree_bytes"])


def summarise(manifest: dict, tree: int | None) -> int:
    """The parts, their sizes and the device calls, printed; 1 when a part and the tree exceed a call."""
    wheels = manifest["wheels"]
    total = sum(p["bytes"] for p in manifest["parts"])
    say(PREFIX, f"{len(manifest['parts'])} parts, {total / 2**20:.1f} MiB ({len(wheels)} wheels: "
        f"{sum(w['wheel_bytes'] for w in wheels.values()) / 2**20:.1f} MiB downloaded, "
        f"{sum(w['stored_bytes'] for w in wheels.values()) / 2**20:.1f} MiB stored and trimmed) in "
        f"{manifest['build_s']:.0f} s (xz {manifest['compress_s']:.0f} s)")
    problems = []
    for call in manifest["device_calls"]:
        print(f"  {call['part']}: {call['mib']} MiB (the call sends {call['sends_mib']} MiB)\n    command: "
              f"{call['command']}\n    carry: {json.dumps(call['carry'])}  timeout_s: {call['timeout_s']}")
        box = _smoke_vllm().box_s
        if call.get("smoke_box_s", box) < box:
            problems.append(f"{call['part']}: the last call's budget leaves smoke_vllm {call['smoke_box_s']} s of its "
                            f"{box:g} s box (the parts' calls before it take the rest of the lease): build fewer, "
                            f"larger parts (a smaller working tree)")
        if tree is not None and call["sends_mib"] > CALL_MIB:
            problems.append(f"{call['part']} and the working tree are {call['sends_mib']} MiB, over the "
                            f"{CALL_MIB:g} MiB a device call sends; build with a smaller --part-mib")
    for p in problems:
        print(f"rpg_lab.gpu_kit.vllm_parts: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
