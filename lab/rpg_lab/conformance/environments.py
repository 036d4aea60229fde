"""Where each framework's probe runs: in this process (the recipe's environment: RPG, verl) or as a subprocess in a
folder that lab/scripts/setup_conformance.sh made (``trl`` and ``openrlhf``: packages installed ``--no-deps`` over
the recipe's environment, on ``PYTHONPATH``, run by the interpreter the set-up names in ``base-python``; ``py312``: a
Python 3.12 virtual environment of its own).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import tempfile
from pathlib import Path

import torch

from rpg_lab.conformance.probes import protocol

LAB = Path(__file__).resolve().parents[2]  # the folder holding rpg_lab: on a foreign environment's PYTHONPATH
ENVS_VARIABLE = "RPG_CONFORMANCE_ENVS"
DEFAULT_ENVS = LAB.parent / ".venv-conformance"
SETUP = "bash lab/scripts/setup_conformance.sh"
FOLDERS = {"trl": "trl", "openrlhf": "openrlhf", "py312": "py312"}
PROBE_TIMEOUT_S = 900


def envs_folder() -> Path:
    return Path(os.environ.get(ENVS_VARIABLE) or DEFAULT_ENVS)


def probe_command(env: str, probe: str, envs: Path) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run ``probe`` in ``env``; ValueError naming the missing folder."""
    folder, base = envs / FOLDERS[env], envs / "base-python"
    if env == "py312":
        python = folder / "bin" / "python"
    else:
        python = Path(base.read_text().strip()) if base.is_file() else None
    if not folder.is_dir() or python is None or not python.exists():
        raise ValueError(f"{folder} is not set up: run `{SETUP} {envs}` (or set {ENVS_VARIABLE})")
    path = [str(LAB)] + ([] if env == "py312" else [str(folder)])
    quiet = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false",
             "HF_HUB_OFFLINE": "1", "RAY_DISABLE_IMPORT_WARNING": "1", "PYTHONWARNINGS": "ignore"}
    env_vars = {**os.environ, **quiet, "PYTHONPATH": os.pathsep.join(path)}
    return [str(python), "-m", f"rpg_lab.conformance.probes.{probe}"], env_vars


def run_probe(env: str, probe: str, batches: list[dict], envs: Path | None = None) -> dict:
    """{"version": str, "terms": [per batch: {key: terms}]} from ``probe`` run where ``env`` says."""
    if env == "recipe":
        module = importlib.import_module(f"rpg_lab.conformance.probes.{probe}")
        return {"version": protocol.version(module.DISTRIBUTION), "terms": module.compute(batches)}
    command, env_vars = probe_command(env, probe, envs or envs_folder())
    with tempfile.TemporaryDirectory(prefix="rpg-conformance-") as folder:
        request, response = Path(folder) / "request.pt", Path(folder) / "response.pt"
        torch.save(batches, request)
        done = subprocess.run([*command, str(request), str(response)], env=env_vars, capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, cwd=folder)
        if done.returncode != 0 or not response.exists():
            raise RuntimeError(f"{probe} in {env} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        return torch.load(response, weights_only=True)
