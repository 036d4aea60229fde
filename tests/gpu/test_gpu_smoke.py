"""The GPU smoke run (recipe/rpg/tiny/run_tiny_gpu.sh, rpg_lab.demo.gpu_smoke) end to end: 4 steps
saved at step 4, resumed for 2, every check of rpg_lab.demo.smoke_checks passing; on one GPU with the
HF rollout on CUDA and with vLLM when it imports, and data parallel over 2 GPUs when visible; on SmolLM2 with
--smol. A few minutes each (start-up dominates)."""

from __future__ import annotations

import json

import pytest
from gpu_marks import GPU, REQUIRES_VLLM, requires_gpus

from rpg_lab.demo import gpu_smoke as smoke

pytestmark = GPU


def run(rollout: str, tmp_path, *extra: str) -> dict:
    """The smoke run; on a node without flash-attn with SDPA attention (its documented escape)."""
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        extra = (*extra, f"+{smoke.ATTN_KEY}=sdpa")
    rc = smoke.main(["--rollout", rollout, "--out", str(tmp_path), "--timeout", "1200", *extra])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert rc == 0 and summary["failures"] == [], summary
    assert summary["run 1"]["steps"] == [1, 2, 3, 4] and summary["run 2 (resumed)"]["steps"] == [5, 6]
    return summary


def test_smoke_run_with_the_hf_rollout(tmp_path):
    run("hf", tmp_path)


@REQUIRES_VLLM
def test_smoke_run_with_vllm(tmp_path):
    pytest.importorskip("vllm", reason="`import vllm` fails here")
    summary = run("vllm", tmp_path)
    assert summary["run 1"]["phases_s"]["weight sync"][2] == 4  # a weight sync after every step


@pytest.mark.smol
def test_smoke_run_on_smollm2(tmp_path):
    """``--model smol`` (with --smol: the model built from its wheel): SmolLM2-135M-Instruct in bf16, vLLM when it
    imports, the same checks (docs/gpu-smoke.md, "A real model")."""
    import importlib.util

    summary = run("vllm" if importlib.util.find_spec("vllm") else "hf", tmp_path, "--model", "smol")
    assert summary["model"] == "smol"


@requires_gpus(2)
def test_smoke_run_data_parallel_over_two_gpus(tmp_path):
    """2 FSDP ranks and 2 rollout replicas (vLLM when it imports, else HF), one per GPU."""
    import importlib.util

    run("vllm" if importlib.util.find_spec("vllm") else "hf", tmp_path, "--gpus", "2")
