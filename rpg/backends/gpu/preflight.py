"""What a GPU run needs from this node, checked in the driver before Ray starts (``rpg.verl.main``).

Without these checks a GPU launch on a node where CUDA is unusable (a CPU login node, a driver
too old for the installed torch, no GPU visible) starts Ray and then waits without end for GPU
resources, and a missing vLLM or flash-attn surfaces only after Ray and the workers are up. Here
each problem is ONE line naming what is wrong and what is allowed; the driver prints every line
and exits 2 (``GpuCheckError``), ``DRY_RUN=1`` prints them as warnings (``rpg.launch``).

Two parts, so that every rule is tested on a CPU machine with simulated answers:

* ``GpuProbe``: the facts of this node (CUDA usable, GPUs visible, the CUDA of the driver and of
  torch's build, which optional modules are installed, installed versions). ``GpuProbe.of_this_node``
  gathers them without importing vLLM or flash-attn and without creating a CUDA context (flash-attn's CUDA
  extension is imported in a subprocess: a wheel built for another torch is found, then fails to load);
* ``GpuRequest`` + ``check``: pure rules on what the config asks for and what the probe found.

A failed CUDA initialisation with a driver present (torch warns "CUDA initialization: ... Error 802 ..."
and ``is_available()`` is False) is reported with torch's text, not as "no GPU". Triton's toolchain (a C
compiler and ``Python.h``, ``toolchain_problems``) is a node rule as well: the workers build Triton's
launcher at the first kernel launch.

The rules apply to the GPU backend only: ``trainer.device=cuda`` after verl's own device
selection (``verl.utils.device.auto_set_device``) and ``VERL_PLATFORM`` not ``cpu``. The CPU
backend (``RPG_BACKEND=cpu``, ``VERL_PLATFORM=cpu``) is not affected. The node rules (CUDA usable,
GPU count, driver) describe THIS node, so they apply only when the driver starts its own Ray
here; a driver that joins a running cluster (``RAY_ADDRESS`` set, as ``ray job submit`` does, or
``ray_kwargs.ray_init.address``) may run on a node without GPUs and skips them.

The driver's CUDA version comes from ``cuDriverGetVersion`` in ``libcuda.so.1`` (ctypes): the
newest CUDA the installed driver supports, read without ``cuInit``, a subprocess or a timeout
(``nvidia-smi`` reports the driver's own version number, which would need NVIDIA's table to
become a CUDA version). CUDA 11 and later run a build of CUDA X.y on any driver of the same major
X or newer (NVIDIA's minor-version compatibility), so a driver is too old exactly when its CUDA
major is below the major torch was built for; ``MIN_DRIVER`` names the driver branch each major
needs (NVIDIA's CUDA compatibility guide: CUDA 13.x >= 580, 12.x >= 525, 11.x >= 450).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rpg.backends import backend_of_run
from rpg.backends.versions import TESTED_VERSIONS, installed_version
from rpg.config import RPGConfigError, config_value, ulysses_sizes

PREFIX = "rpg gpu check"
ATTN_KEY = "actor_rollout_ref.model.override_config.attn_implementation"
FLASH_ATTN = "flash_attention_2"  # verl's default (workers/config/model.py HFModelConfig.__post_init__)
MIN_DRIVER = {11: "450", 12: "525", 13: "580"}  # CUDA major -> oldest NVIDIA driver branch that runs it
OPTIONAL_MODULES = ("vllm", "flash_attn")
# flash-attn 2's compiled CUDA extension, a top-level module its flash_attn/flash_attn_interface.py imports: a wheel
# built for another torch is found by find_spec and fails only here ("undefined symbol"), in every worker
FLASH_ATTN_EXTENSION = "flash_attn_2_cuda"
EXTENSION_TIMEOUT_S = 120.0  # a fresh interpreter importing torch: seconds; minutes on a loaded node
SETUP_HINT = "docs/gpu-setup.md#install"
SDPA_HINT = f"+{ATTN_KEY}=sdpa (more memory: docs/memory.md#how-the-estimate-is-computed)"



class GpuCheckError(RPGConfigError):
    """This node cannot run the requested GPU run; ``lines``: one line per problem."""

    prefix = PREFIX

    def __init__(self, lines: list[str]):
        super().__init__("; ".join(lines))
        self.lines = list(lines)


# ----------------------------------------------------------------------------- the probe


@dataclass(frozen=True)
class GpuProbe:
    """Facts of this node the rules need (tests build one by hand to simulate a node).

    ``torch_cuda``: the CUDA torch was built for (``torch.version.cuda``; None for a CPU build);
    ``driver_cuda``: the newest CUDA the NVIDIA driver supports (None: no driver library found);
    ``importable``: the ``OPTIONAL_MODULES`` that are installed; ``versions``: installed
    distribution versions of ``TESTED_VERSIONS``'s packages (None: not installed);
    ``cuda_visible_devices``: that environment variable, named when it hides every GPU;
    ``cuda_init_error``: what torch reported when initialising CUDA failed (``cuda_init_error_text``);
    ``c_compiler``: the C compiler Triton would use (``triton_c_compiler``; None: none found);
    ``python_headers``: whether ``Python.h`` of this interpreter is installed (``python_headers_found``);
    ``flash_attn_error``: why flash-attn's CUDA extension does not load (``extension_import_error``; None: it
    loads, or flash_attn is not installed).
    """

    cuda_available: bool
    visible_gpus: int
    torch_cuda: str | None
    driver_cuda: str | None
    importable: frozenset[str] = frozenset(OPTIONAL_MODULES)
    versions: Mapping[str, str | None] = field(default_factory=dict)
    cuda_visible_devices: str | None = None  # the environment variable, when set
    cuda_init_error: str | None = None
    c_compiler: str | None = "cc"
    python_headers: bool = True
    flash_attn_error: str | None = None

    @classmethod
    def of_this_node(cls) -> GpuProbe:
        """Ask torch, libcuda and the installed packages (no vLLM/flash-attn import here, no CUDA context; flash-attn's
        CUDA extension is imported in a subprocess, ``extension_import_error``)."""
        import torch

        with warnings.catch_warnings(record=True) as caught:  # torch warns (does not raise) when cuInit fails
            warnings.simplefilter("always")
            available = bool(torch.cuda.is_available())
        importable = frozenset(m for m in OPTIONAL_MODULES if importlib.util.find_spec(m) is not None)
        return cls(
            flash_attn_error=extension_import_error() if "flash_attn" in importable else None,
            cuda_init_error=None if available else cuda_init_error_text(str(w.message) for w in caught),
            c_compiler=triton_c_compiler(),
            python_headers=python_headers_found(),
            cuda_available=available,
            visible_gpus=int(torch.cuda.device_count()) if available else 0,
            torch_cuda=torch.version.cuda,
            driver_cuda=driver_cuda_version(),
            importable=importable,
            versions={name: installed_version(name) for name in TESTED_VERSIONS},
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        )


def driver_cuda_version(library: str = "libcuda.so.1") -> str | None:
    """'13.0' for a driver that supports CUDA up to 13.0; None when no NVIDIA driver library loads.

    ``cuDriverGetVersion`` answers without initialising the driver (no ``cuInit``), so it neither
    creates a context nor waits on a GPU."""
    try:
        lib = ctypes.CDLL(library)
        version = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value <= 0:
            return None
    except (OSError, AttributeError):
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


def extension_import_error(module: str = FLASH_ATTN_EXTENSION, timeout_s: float = EXTENSION_TIMEOUT_S) -> str | None:
    """None if ``import torch, <module>`` works in a fresh interpreter of this Python with this process's
    ``sys.path`` (what each worker does); else the error's last line (a wheel built for another torch:
    ``ImportError: ...: undefined symbol: ...``), or how the interpreter ended. In a subprocess: a loader crash
    or a CUDA initialisation stays there."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        done = subprocess.run([sys.executable, "-c", f"import torch, {module}"], capture_output=True, text=True,
                              timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return f"import torch, {module} did not finish within {timeout_s:.0f} s"
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"the interpreter ended with exit code {done.returncode}"


def cuda_init_error_text(messages) -> str | None:
    """torch's warning when CUDA's initialisation fails with a GPU present (``torch.cuda.is_available()``
    then returns False): "CUDA initialization: ... Error 802: system not yet initialized ..." (802: on an
    NVSwitch system, the fabric manager is not running). None when torch said nothing of the kind."""
    for text in messages:
        if "CUDA initialization" in text or "cudaGetDeviceCount" in text:
            return " ".join(text.split())
    return None


def triton_c_compiler(environ: Mapping[str, str] | None = None) -> str | None:
    """The C compiler Triton uses to build its launcher module at its first kernel launch (on Linux: ``CC``,
    else ``gcc``, else ``clang`` on PATH; triton/runtime/build.py); None when it would find none and stop
    with "Failed to find C compiler"."""
    environ = os.environ if environ is None else environ
    path = environ.get("PATH", os.defpath)
    cc = environ.get("CC", "").strip()
    if cc:
        return shutil.which(cc, path=path)
    return shutil.which("gcc", path=path) or shutil.which("clang", path=path)


def python_headers_found() -> bool:
    """``Python.h`` of this interpreter, where Triton's build looks for it (sysconfig's include path)."""
    scheme = sysconfig.get_default_scheme()
    scheme = "posix_prefix" if scheme == "posix_local" else scheme
    return os.path.isfile(os.path.join(sysconfig.get_paths(scheme=scheme)["include"], "Python.h"))


# ----------------------------------------------------------------------------- what the config asks for


@dataclass(frozen=True)
class GpuRequest:
    """What a run asks of the node, read from the composed config (``request_from_config``)."""

    nnodes: int = 1
    gpus_per_node: int = 1
    rollout: str = "vllm"
    attn_implementation: str = FLASH_ATTN
    ulysses: tuple[str, ...] = ()  # "key=size" for every Ulysses size > 1
    rpg_loss: str | None = "rpg"  # rpg.loss.name when an RPG actor loss is used, else None
    joins_cluster: bool = False  # the driver joins a running Ray cluster instead of starting one here
    # trainer.v1.trainer_mode=separate_async on one node: the standalone rollout pool's GPUs, which verl places on
    # the same node as the trainer's (actor_rollout_ref.rollout.nnodes=1); 0 otherwise
    rollout_gpus: int = 0


def request_from_config(cfg, settings, environ: Mapping[str, str] | None = None) -> GpuRequest:
    """The ``GpuRequest`` of a composed, validated config (``settings``: ``rpg.config.RPGSettings``)."""
    environ = os.environ if environ is None else environ
    ulysses = tuple(ulysses_sizes(cfg))
    return GpuRequest(
        nnodes=int(_get(cfg, "trainer.nnodes", 1)),
        gpus_per_node=int(_get(cfg, "trainer.n_gpus_per_node", 1)),
        rollout=str(_get(cfg, "actor_rollout_ref.rollout.name", "vllm")),
        attn_implementation=str(_get(cfg, ATTN_KEY, FLASH_ATTN)),
        ulysses=ulysses,
        rpg_loss=settings.loss_name if settings.uses_rpg_actor_loss else None,
        joins_cluster=bool(environ.get("RAY_ADDRESS", "").strip() or _get(cfg, "ray_kwargs.ray_init.address", None)),
        rollout_gpus=(int(_get(cfg, "actor_rollout_ref.rollout.n_gpus_per_node", 8))
                      if _get(cfg, "trainer.v1.trainer_mode", "sync") == "separate_async"
                      and int(_get(cfg, "actor_rollout_ref.rollout.nnodes", 0)) == 1 else 0),
    )


def _get(cfg, key: str, default: Any) -> Any:
    return config_value(cfg, key, default)


# ----------------------------------------------------------------------------- the rules


@dataclass(frozen=True)
class GpuReport:
    """``errors``: what the driver refuses (exit 2); ``warnings``: what it only mentions."""

    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def check(request: GpuRequest, probe: GpuProbe) -> GpuReport:
    """Every rule: refusals (one line each) and version warnings (one line each). A driver that joins a cluster
    runs no rank: the node rules and the software checks run on each GPU node instead (``rank_node_problems``, in a
    task the driver places there once Ray is up); what this node lacks of the software is a warning only (verl's
    TaskRunner may be placed on any node)."""
    if request.joins_cluster:
        software = [f"on the driver's node (the GPU nodes are checked once Ray is up): {line}"
                    for line in software_problems(request, probe)]
        return GpuReport(warnings=(*software, *version_warnings(probe.versions)))
    node = (*gpu_problems(request, probe), *toolchain_problems(probe))
    return GpuReport(errors=(*node, *software_problems(request, probe)), warnings=version_warnings(probe.versions))


def rank_node_problems(request: GpuRequest) -> tuple[list[str], list[str]]:
    """On a GPU node of a joined cluster, in a task holding one rank group's GPUs (Ray's CUDA_VISIBLE_DEVICES: the
    GPUs the ranks will get): this node's rules and software checks for that group, ``(errors, warnings)``."""
    from dataclasses import replace

    report = check(replace(request, joins_cluster=False, nnodes=1), GpuProbe.of_this_node())
    return list(report.errors), list(report.warnings)


def _major(version: str | None) -> int | None:
    try:
        return int(str(version).split(".", 1)[0])
    except ValueError:
        return None


def driver_problem(probe: GpuProbe) -> str | None:
    """The driver's CUDA major is below the one torch was built for (None: fine, or unknown)."""
    need, have = _major(probe.torch_cuda), _major(probe.driver_cuda)
    if need is None or have is None or have >= need:
        return None
    branch = f" (branch {MIN_DRIVER[need]} or newer)" if need in MIN_DRIVER else ""
    return (f"CUDA is not usable: the NVIDIA driver supports CUDA up to {probe.driver_cuda}, but {_torch(probe)} is "
            f"built for CUDA {probe.torch_cuda}, which needs a driver for CUDA {need}.x{branch}: update the driver, "
            f"or install a torch built for CUDA {have}.x")


def _torch(probe: GpuProbe) -> str:
    version = probe.versions.get("torch")
    return f"the installed torch {version}" if version else "the installed torch"


def cuda_problem(probe: GpuProbe) -> str | None:
    """CUDA cannot be used at all, or no GPU is visible (the driver's own line takes precedence)."""
    if probe.cuda_available and probe.visible_gpus > 0:
        return None
    if probe.torch_cuda is None:
        why = f"{_torch(probe)} is a CPU-only build (torch.version.cuda is None): install the gpu extra ({SETUP_HINT})"
    elif probe.driver_cuda is None:
        why = "no NVIDIA driver is found on this node (libcuda.so.1 does not load): run on a GPU node"
    elif probe.cuda_init_error:
        hint = (" (error 802 on an NVSwitch system: the NVIDIA fabric manager is not running; start it, e.g. "
                "systemctl start nvidia-fabricmanager)") if "802" in probe.cuda_init_error else ""
        return (f"CUDA initialisation failed on this node ({_torch(probe)}, CUDA {probe.torch_cuda}; the driver "
                f"supports CUDA {probe.driver_cuda}): {probe.cuda_init_error}{hint}")
    else:
        shown = "" if probe.cuda_visible_devices is None else f" with CUDA_VISIBLE_DEVICES={probe.cuda_visible_devices!r}"
        why = (f"{_torch(probe)} (CUDA {probe.torch_cuda}; the driver supports CUDA {probe.driver_cuda}) sees no "
               f"GPU{shown}: run on a node with a visible GPU")
    return f"trainer.device=cuda but CUDA is not available: {why}; or use the CPU backend (RPG_BACKEND=cpu)"


def gpu_problems(request: GpuRequest, probe: GpuProbe) -> list[str]:
    """This node: a usable driver, CUDA, and enough visible GPUs for a single-node run."""
    driver = driver_problem(probe)
    if driver:
        return [driver]
    cuda = cuda_problem(probe)
    if cuda:
        return [cuda]
    if request.nnodes == 1 and request.gpus_per_node > probe.visible_gpus:
        return [f"trainer.n_gpus_per_node={request.gpus_per_node} but {probe.visible_gpus} GPU(s) are visible on this "
                f"node (trainer.nnodes=1): allowed 1..{probe.visible_gpus}; set N_GPUS_PER_NODE (or "
                f"trainer.n_gpus_per_node), or make more GPUs visible (CUDA_VISIBLE_DEVICES)"]
    both = request.gpus_per_node + request.rollout_gpus
    if request.nnodes == 1 and request.rollout_gpus and both > probe.visible_gpus:
        return [f"trainer.n_gpus_per_node={request.gpus_per_node} + actor_rollout_ref.rollout.n_gpus_per_node="
                f"{request.rollout_gpus} (trainer.v1.trainer_mode=separate_async: a training and a rollout pool, one "
                f"node each) but {probe.visible_gpus} GPU(s) are visible on this node: the two pools must not exceed "
                f"{probe.visible_gpus}"]
    return []


def toolchain_problems(probe: GpuProbe) -> list[str]:
    """Triton compiles a small C launcher with a C compiler and this Python's headers at its first kernel launch,
    on every GPU node: verl's log-prob cross-entropy and compiled entropy and vLLM's compiled model launch
    Triton kernels at the first step. Missing either, the run stops there ("Failed to find C compiler",
    "Python.h: No such file or directory"); refused here in one line saying what to install."""
    missing = [what for what, ok in (("a C compiler (CC unset, no gcc or clang on PATH)", probe.c_compiler),
                                     ("the Python headers (Python.h)", probe.python_headers)) if not ok]
    if not missing:
        return []
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return [f"Triton, which the GPU run uses at its first step, needs {' and '.join(missing)}: install them, "
            f"e.g. apt-get install gcc python{version}-dev (or set CC to a C compiler)"]


def software_problems(request: GpuRequest, probe: GpuProbe) -> list[str]:
    """Packages the run will import on the workers, and settings not verified with the RPG losses."""
    out = []
    if request.rollout == "vllm" and "vllm" not in probe.importable:
        out.append("actor_rollout_ref.rollout.name=vllm but vllm is not installed: install the gpu extra, "
                   f"pip install -e \".[gpu]\" ({SETUP_HINT})")
    if request.attn_implementation == FLASH_ATTN and "flash_attn" not in probe.importable:
        out.append(f"{ATTN_KEY}={FLASH_ATTN} (verl's default) but flash_attn is not installed: install the prebuilt "
                   f"flash-attn wheel ({SETUP_HINT}), or pass {SDPA_HINT}")
    elif request.attn_implementation == FLASH_ATTN and probe.flash_attn_error:
        out.append(f"{ATTN_KEY}={FLASH_ATTN} (verl's default) but flash_attn's CUDA extension does not load with "
                   f"{_torch(probe)} (import torch, {FLASH_ATTN_EXTENSION}: {probe.flash_attn_error}): a flash-attn "
                   f"wheel built for another torch or CUDA; install the one built for this torch ({SETUP_HINT}), or "
                   f"pass {SDPA_HINT}")
    if request.ulysses and request.rpg_loss:
        out.append(f"{request.ulysses[0]} with rpg.loss.name={request.rpg_loss}: Ulysses sequence parallelism has not "
                   "been verified with the RPG losses; allowed: 1 (or rpg.loss.name=verl)")
    return out


def version_warnings(versions: Mapping[str, str | None]) -> tuple[str, ...]:
    """One line per installed package whose version is outside ``TESTED_VERSIONS`` (absent: none)."""
    return tuple(
        f"{name} {have} is installed; this project is tested with {name} {' or '.join(TESTED_VERSIONS[name])}"
        for name in TESTED_VERSIONS
        if (have := versions.get(name)) is not None and have not in TESTED_VERSIONS[name]
    )


def tested_versions_text() -> str:
    """The sentence docs/gpu-setup.md and docs/gpu-smoke.md carry (kept equal by a test)."""
    return "; ".join(f"{name} {' or '.join(TESTED_VERSIONS[name])}" for name in TESTED_VERSIONS)


# ----------------------------------------------------------------------------- entry points


def node_report(cfg, settings, environ: Mapping[str, str] | None = None,
                probe: GpuProbe | None = None) -> GpuReport | None:
    """The report for a composed config, or None when the run is not on the GPU backend."""
    if backend_of_run(cfg, environ) != "gpu":  # verl's CUDA platform (trainer.device after auto_set_device)
        return None
    return check(request_from_config(cfg, settings, environ), probe or GpuProbe.of_this_node())


def check_gpu_node(cfg, settings, environ: Mapping[str, str] | None = None, probe: GpuProbe | None = None) -> None:
    """The driver's check before Ray: print each warning line to stderr and raise ``GpuCheckError``
    with every refusal. Nothing on the CPU backend."""
    import sys

    report = node_report(cfg, settings, environ, probe)
    if report is None:
        return
    for line in report.warnings:
        print(f"{PREFIX}: warning: {line}", file=sys.stderr, flush=True)
    if report.errors:
        raise GpuCheckError(list(report.errors))
