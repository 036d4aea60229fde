"""The vLLM parts' resolution against the package registry (the ``gpu_kit`` stage, docs/testing.md): vLLM 0.24.0
for CPython 3.12 on x86_64 Linux with the node's torch 2.11.0, what is left out, and the kit's packages it takes at
another version. Resolve only (about a minute): the parts themselves are 183 MiB of xz from 378 MiB of downloads
(2026-11-28); their cutting, install and the kit's step are tests/lab/gpu_kit/test_vllm_parts.py's, with stand-ins."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_gpu_kit_stage import python312

pytestmark = pytest.mark.gpu_kit

ROOT = Path(__file__).resolve().parents[3]


def test_the_vllm_parts_resolve_vllm_0_24_for_the_node_beside_the_kits_carry(tmp_path):
    base = tmp_path / "base"  # a stand-in of the kit's carry: two of its packages at the kit's versions
    base.mkdir()
    (base / "manifest.json").write_text(json.dumps({"wheels": {"transformers": {"version": "5.10.4"},
                                                               "verl": {"version": "0.9.1"}}}))
    p = subprocess.run([sys.executable, "-m", "rpg_lab.gpu_kit.vllm_parts", "--python", python312(), "--base", str(base),
                        "--out", str(tmp_path / "parts"), "--resolve-only"],
                       capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    carried = {line.split()[0] for line in p.stdout.splitlines() if line.startswith("  ")}
    assert "vllm==0.24.0" in carried and "flashinfer-python==0.6.12" in carried
    assert "verl==0.9.1" not in carried  # the kit carries it at the same version
    # vLLM 0.24.0's world takes transformers 5.9.0 (the kit's 5.10.4 is replaced: its site comes first)
    assert "transformers==5.9.0" in carried and "transformers 5.10.4 -> 5.9.0" in p.stdout
    assert not [c for c in carried if c.split("==")[0] in ("torch", "numpy", "numba", "tokenspeed-mla", "tilelang",
                                                            "humming-kernels", "flashinfer-cubin",
                                                            "nvidia-cutlass-dsl", "nvidia-cuda-nvcc",
                                                            "nvidia-nvvm", "nvidia-cuda-tileiras")]
    assert not (tmp_path / "parts").exists()
