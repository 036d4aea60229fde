"""The node as the kit's runs see it: the GPU (name, memory, driver, CUDA), Python, the versions and folders of
the packages a run imports, and that verl loads this project's plugin (the RPG losses registered).

    python3 -m rpg.gpu_kit.probe [--result FILE]

Exit 1 with one line per problem: no CUDA device, a package that does not import, or the RPG losses missing
from verl's registry.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from rpg.gpu_kit import report

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
    g = result.get("gpu", {})
    pk = result["packages"]
    result["line"] = (f"{g.get('name', 'no GPU')}, {g.get('memory_gib', '?')} GiB; torch {g.get('torch')} "
                      f"(CUDA {g.get('cuda_build')}); Python {result['python']}; verl {pk['verl']['version']}, "
                      f"ray {pk['ray']['version']}, transformers {pk['transformers']['version']}, "
                      f"vllm {pk['vllm']['version']}, flash-attn {pk['flash-attn']['version']}")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result", type=Path, default=None, help="write the result as JSON here")
    args = ap.parse_args(argv)
    return report(probe(), args.result, "rpg.gpu_kit.probe")


if __name__ == "__main__":
    sys.exit(main())
