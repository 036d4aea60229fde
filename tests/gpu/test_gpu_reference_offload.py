"""Reference <- actor copies on CUDA with the reference's parameters kept on the CPU as verl 0.9.1 keeps
them (FSDP2's pinned CPUOffloadPolicy for the forward-only reference; the actor's offloaded after its update
by verl's functions in one case), checked by what the reference computes:
its logits on a probe sequence equal the actor's after each copy (the CPU version:
tests/verl/test_verl_reference_fsdp.py). One run of tests/gpu/reference_offload_ranks.py per world size
(1 GPU; 2 GPUs = data parallel, when visible)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fsdp_reference_ranks import CASES
from gpu_marks import GPU, requires_gpus

pytestmark = GPU

SCRIPT = Path(__file__).with_name("reference_offload_ranks.py")
OFFLOAD_CASES = ["fsdp2_ref_offloaded", "fsdp2_ref_and_actor_offloaded"]
ALL_CASES = [c[0] for c in CASES] + OFFLOAD_CASES


def run_ranks(world: int, tmp_path: Path) -> list[list[dict]]:
    out = tmp_path / "records.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(world), str(out)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    per_rank = json.loads(out.read_text())
    assert len(per_rank) == world and [r["case"] for r in per_rank[0]] == ALL_CASES
    return per_rank


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=requires_gpus(2))])
def test_offloaded_reference_computes_what_the_actor_computes_after_each_copy(world, tmp_path):
    for rank_records in run_ranks(world, tmp_path):
        for rec in rank_records:
            assert "error" not in rec, rec
            for round_ in (1, 2):
                assert rec[f"logit_diff_before_copy_{round_}"] > 0.1, rec  # the comparison can fail
                assert rec[f"shard_diff_after_copy_{round_}"] == 0.0, rec
                # same weights, same kernels, same bf16 casts: the same logits, exactly
                assert rec[f"logit_diff_after_copy_{round_}"] == 0.0, rec
            if rec["case"] in OFFLOAD_CASES:  # the copy really went into offloaded parameters
                assert rec["ref_on_cpu_at_copy"] == [True, True], rec
                assert rec["actor_on_cpu_at_copy"] == [rec["case"].endswith("actor_offloaded")] * 2, rec
