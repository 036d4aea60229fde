"""The node as the kit's runs see it: the GPU (name, memory, driver, CUDA), Python, the versions and folders of
the packages a run imports, and that verl loads this project's plugin (the RPG losses registered); and what a vLLM
start depends on (``node``): nvcc, /dev/shm's size, the ``VLLM_*``/``CUDA_*``/``NCCL_*`` variables, the driver's
version and CUDA, torch's CUDA and NCCL, each "absent" when absent.

    python3 -m rpg_lab.gpu_kit.probe [--result FILE]

Exit 1 with one line per problem: no CUDA device, a package that does not import, or the RPG losses missing
from verl's registry.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from rpg_lab.gpu_kit import conclude

# distribution -> module a run imports (None: reported, not required)
PACKAGES = {
    "torch": "torch", "triton": "triton", "verl": "verl", "ray": "ray", "transformers": "transformers",
    "tokenizers": "tokenizers", "hydra-core": "hydra", "omegaconf": "omegaconf", "schedulefree": "schedulefree",
    "math-verify": "math_verify", "TransferQueue": "transfer_queue", "tensordict": "tensordict",
    "numpy": "numpy", "pandas": "pandas", "pyarrow": "pyarrow", "rpg-verl": "rpg",
    "vllm": None, "flash-attn": None,
}


def _folder(module) -> str:
    return str(Path(getattr(module, "__file__", "") or "?").parent)


def gpu() -> dict:
    import torch

    info: dict = {"torch": torch.__version__, "cuda_build": torch.version.cuda,
                  "cuda_available": torch.cuda.is_available()}
    if info["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        info.update(devices=torch.cuda.device_count(), name=props.name, capability=f"{props.major}.{props.minor}",
                    memory_gib=round(props.total_memory / 2**30, 1), multiprocessors=props.multi_processor_count)
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        info["nvidia_smi"] = out.stdout.strip().splitlines()
    return info


ABSENT = "absent"
ENV_PREFIXES = ("VLLM_", "CUDA_", "NCCL_")


def _or_absent(read) -> object:
    """``read()``, or "absent" when it finds nothing or fails (with why: one line, never a traceback)."""
    try:
        value = read()
    except Exception as e:  # noqa: BLE001 - a fact the node lacks is a finding, not the probe's failure
        return f"{ABSENT} ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]})"
    return ABSENT if value in (None, "", {}, []) else value


def _nvcc() -> dict | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    exe = shutil.which("nvcc") or os.path.join(home, "bin", "nvcc")
    if not os.access(exe, os.X_OK):
        return None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    release = next((line.strip() for line in out.splitlines() if "release" in line), out.strip()[-200:])
    return {"path": exe, "version": release}


def _shm() -> dict:
    st = os.statvfs("/dev/shm")
    return {"size_gib": round(st.f_blocks * st.f_frsize / 2**30, 2),
            "free_gib": round(st.f_bavail * st.f_frsize / 2**30, 2)}


def _smi(*args: str) -> str | None:
    smi = shutil.which("nvidia-smi")
    return None if smi is None else subprocess.run([smi, *args], capture_output=True, text=True, timeout=30).stdout


def _driver() -> str | None:
    out = _smi("--query-gpu=driver_version", "--format=csv,noheader")
    return out.strip().splitlines()[0] if out and out.strip() else None


def _driver_cuda() -> str | None:
    from rpg.backends.gpu.preflight import driver_cuda_version

    return driver_cuda_version() or ((m := re.search(r"CUDA Version:\s*([\d.]+)", _smi() or "")) and m.group(1))


def _nccl() -> str | None:
    import torch

    if not torch.cuda.is_available() and not torch.version.cuda:
        return None
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def node() -> dict:
    """What a vLLM start depends on, each "absent" when absent."""
    def cuda_build():
        import torch

        return torch.version.cuda

    return {"nvcc": _or_absent(_nvcc), "dev_shm": _or_absent(_shm),
            "env": _or_absent(lambda: {k: os.environ[k] for k in sorted(os.environ) if k.startswith(ENV_PREFIXES)}),
            "driver": _or_absent(_driver), "driver_cuda": _or_absent(_driver_cuda),
            "torch_cuda": _or_absent(cuda_build), "nccl": _or_absent(_nccl)}


def probe() -> dict:
    result: dict = {"python": sys.version.split()[0], "executable": sys.executable, "platform": platform.platform(),
                    "packages": {}, "problems": []}
    for dist, module in PACKAGES.items():
        try:
            version = md.version(dist)
        except md.PackageNotFoundError:
            version = None
        entry: dict = {"version": version}
        if module is not None or version is not None:
            try:
                entry["from"] = _folder(importlib.import_module(module or dist.replace("-", "_")))
            except Exception as e:  # noqa: BLE001 - reported: a package that does not import is the finding
                entry["import_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                if module is not None:
                    result["problems"].append(f"import {module} ({dist} {version}): {entry['import_error']}")
        result["packages"][dist] = entry
    try:
        result["gpu"] = gpu()
        if not result["gpu"]["cuda_available"]:
            result["problems"].append(f"torch {result['gpu']['torch']} sees no CUDA device")
    except Exception as e:  # noqa: BLE001
        result["problems"].append(f"the GPU query failed: {type(e).__name__}: {e}")
    try:
        from verl.trainer.ppo import core_algos

        import rpg.verl.policy_loss as ours

        for mode in ("rpg", "grpo_corrected"):
            if core_algos.get_policy_loss_fn(mode) is not ours.rpg_policy_loss:
                result["problems"].append(f"verl's policy loss {mode!r} is not this project's")
    except Exception as e:  # noqa: BLE001
        result["problems"].append(f"verl's registry has no RPG loss (plugin entry point not loaded?): "
                                  f"{type(e).__name__}: {e}")
    result["node"] = nd = node()
    g = result.get("gpu", {})
    pk = result["packages"]
    result["line"] = (f"{g.get('name', 'no GPU')}, {g.get('memory_gib', '?')} GiB; torch {g.get('torch')} "
                      f"(CUDA {g.get('cuda_build')}); Python {result['python']}; verl {pk['verl']['version']}, "
                      f"ray {pk['ray']['version']}, transformers {pk['transformers']['version']}, "
                      f"vllm {pk['vllm']['version']}, flash-attn {pk['flash-attn']['version']}; driver {nd['driver']} "
                      f"(CUDA {nd['driver_cuda']}), NCCL {nd['nccl']}, nvcc "
                      f"{ABSENT if nd['nvcc'] == ABSENT else 'present'}")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result", type=Path, default=None, help="write the result as JSON here")
    args = ap.parse_args(argv)
    return conclude(probe(), args.result, "rpg_lab.gpu_kit.probe", whole=True)


if __name__ == "__main__":
    sys.exit(main())
