"""What a run ran on: the model's weights, the code, the libraries, the CPU's kernels. A result that moves when one of
these moves must say which one; ``ran_on`` is what the demo's ``summary.json`` and a study's ``runs.csv`` record.

* ``weights_digest(model_dir)``: the sha256 of the model's weight files (``*.safetensors``; a folder of several
  shards: one sha256 over each file's name and sha256, in name order). Its first 12 hex digits name a build in lines.
* ``code_state()``: the commit and any uncommitted changes of the checkout.
* ``cpu_kernels()``: the kernel path torch's CPU operators take (``torch.backends.cpu.get_cpu_capability()``, which
  ``ATEN_CPU_CAPABILITY`` can lower), MKL's and oneDNN's instruction-set caps, the CPU model: on CPU a matrix
  product's last bits follow its summation order, which these choose.

Torch-free at import (torch is read only inside ``cpu_kernels`` and ``library_versions``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SHORT = 12  # hex digits of a digest shown in a line
WEIGHT_PATTERNS = ("*.safetensors",)
LIBRARIES = ("torch", "transformers", "tokenizers", "verl", "ray", "vllm")
# the variables that choose a CPU kernel path (torch's ATen, MKL's BLAS, oneDNN) or its threads
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS")
_BLOCK = 4 << 20


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    buf = bytearray(_BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def weight_files(model_dir: str | os.PathLike) -> list[Path]:
    """The model folder's weight files, in name order (none: not a model folder this module can digest)."""
    folder = Path(model_dir)
    return sorted({p for pattern in WEIGHT_PATTERNS for p in folder.glob(pattern) if p.is_file()})


def weights_digest(model_dir: str | os.PathLike) -> str | None:
    """sha256 of the model's weights (module docstring); None when the folder holds no weight file (a hub name, a
    remote path: nothing on this machine to digest)."""
    files = weight_files(model_dir)
    if not files:
        return None
    if len(files) == 1:
        return file_sha256(files[0])
    h = hashlib.sha256()
    for path in files:
        h.update(f"{path.name}\0{file_sha256(path)}\n".encode())
    return h.hexdigest()


def _git(*args: str) -> bytes | None:
    """``git args`` in the checkout (stdout), or None where there is no git or no commit."""
    import subprocess

    from rpg.paths.checkout import CHECKOUT

    try:
        done = subprocess.run(["git", *args], cwd=CHECKOUT, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _under(path: Path, folder: Path) -> str | None:
    try:
        return path.relative_to(folder).as_posix()
    except ValueError:
        return None


def code_state(outputs: tuple[Path, ...] = ()) -> dict[str, str | None]:
    """The code in the checkout now: ``code`` (``git describe``, ``+dirty`` with uncommitted changes), ``commit`` (the
    full hash) and ``changes`` (None when the checkout is clean, else the sha256 of ``git diff HEAD`` and of each
    untracked file's path and bytes: two dirty checkouts are the same code only with the same changes). Every value
    None where git cannot say. ``outputs``: folders of the caller's own output inside the checkout (a study's
    ``--out``, ``--report-dir``), left out of ``changes``: a report written into the checkout changes no code."""
    from rpg.paths.checkout import CHECKOUT

    root = CHECKOUT.resolve()
    spec = ["--", ".", *(f":(exclude){rel}" for rel in (_under(Path(o).resolve(), root) for o in outputs)
                         if rel not in (None, "."))]
    describe = _git("describe", "--always", "--dirty=+dirty")
    commit = _git("rev-parse", "HEAD")
    diff = _git("diff", "HEAD", "--binary", *spec)
    untracked = _git("ls-files", "--others", "--exclude-standard", "-z", *spec)
    if commit is None or diff is None or untracked is None:
        return {"code": describe.decode().strip() if describe else "unknown", "commit": None, "changes": None}
    h, dirty = hashlib.sha256(diff), bool(diff)
    for name in sorted(n for n in untracked.decode(errors="surrogateescape").split("\0") if n):
        dirty = True
        path = CHECKOUT / name
        h.update(name.encode(errors="surrogateescape") + b"\0")
        h.update((file_sha256(path) if path.is_file() and not path.is_symlink() else "").encode() + b"\0")
    return {"code": describe.decode().strip() if describe else commit.decode().strip()[:7],
            "commit": commit.decode().strip(), "changes": h.hexdigest() if dirty else None}


def library_versions() -> dict[str, str | None]:
    """The installed version of each of ``LIBRARIES`` (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in LIBRARIES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def _cpuinfo(field: str) -> str | None:
    """The first value of ``field`` in Linux's /proc/cpuinfo, None where it cannot be read."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str | None:
    """The CPU's model name, None where it cannot be read."""
    return _cpuinfo("model name")


def cpu_isa() -> str | None:
    """The widest vector instruction set this CPU offers of those torch's CPU kernels are built for (``avx512``,
    ``avx2``, ``default``): what decides its kernel path when nothing pins it. None where the flags cannot be read."""
    flags = _cpuinfo("flags")
    if flags is None:
        return None
    have = set(flags.split())
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= have:
        return "avx512"
    return "avx2" if {"avx2", "fma"} <= have else "default"


def cpu_kernels(environ: dict[str, str] | None = None) -> dict[str, str | None]:
    """The CPU kernel path of this process and of processes started with ``environ`` (module docstring)."""
    import torch

    env = os.environ if environ is None else environ
    return {"capability": torch.backends.cpu.get_cpu_capability(), "cpu": cpu_model(), "isa": cpu_isa(),
            "cores": str(len(os.sched_getaffinity(0))), "threads_here": str(torch.get_num_threads()),
            **{k: env.get(k) for k in KERNEL_ENV}}


def ran_on(model_dir: str | os.PathLike | None, environ: dict[str, str] | None = None) -> dict:
    """What a run of the model in ``model_dir`` with the environment ``environ`` runs on, besides its code
    (``code_state``, which a caller records beside it): the weights' digest, the libraries, the CPU's kernel path."""
    return {"weights_sha256": None if model_dir is None else weights_digest(model_dir),
            "libraries": library_versions(), "kernels": cpu_kernels(environ)}


def short(digest: str | None) -> str:
    """A digest as lines show it."""
    return digest[:SHORT] if digest else "none"


def describe(record: dict) -> str:
    """``ran_on``'s record in one line."""
    k = record["kernels"]
    libs = ", ".join(f"{n} {v}" for n, v in record["libraries"].items() if v)
    return (f"weights {short(record['weights_sha256'])}, {libs}, CPU kernels "
            f"{k['capability']}" + (f" (ATEN_CPU_CAPABILITY={k['ATEN_CPU_CAPABILITY']})" if k.get("ATEN_CPU_CAPABILITY")
                                    else ""))


# ----------------------------------------------------------------------------- the reference log

REFERENCE_LOG = "docs/reference-log.md"  # in the checkout: every change of a pinned model or a reference, and why
LOG_HEADER = ("# Reference log\n\nEvery change of what the project pins so that results hold still: the tiny model's "
              "shipped weights (`python -m rpg.tiny.regenerate`) and the runs' references (`python -m "
              "rpg_lab.demo.reference --regenerate`), one row each, appended by those commands. A study names the row "
              "its runs were made under.\n\n| date (UTC) | what | code | before | after | ran on | reason |\n"
              "|---|---|---|---|---|---|---|\n")


def log_change(what: str, before: str | None, after: str, reason: str, record: dict) -> Path:
    """Append one row to the checkout's reference log (``REFERENCE_LOG``): ``what`` changed from ``before`` to
    ``after`` (digests), ``record`` (``ran_on``) the machine it was made on, ``reason`` the user's words."""
    import time

    from rpg.paths.checkout import CHECKOUT

    path = CHECKOUT / REFERENCE_LOG
    if not path.exists():
        path.write_text(LOG_HEADER)
    cell = lambda text: " ".join(str(text).split()).replace("|", "\\|")  # noqa: E731 - one table cell
    k = record["kernels"]
    row = (f"| {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} | {cell(what)} | {cell(code_state()['code'])} | "
           f"{short(before)} | {short(after)} | {cell(k['capability'])} kernels, torch "
           f"{cell(record['libraries']['torch'])}, {cell(k['cores'])} cores | {cell(reason)} |\n")
    with open(path, "a") as f:
        f.write(row)
    return path
