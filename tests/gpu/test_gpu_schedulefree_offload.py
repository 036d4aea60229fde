"""Schedule-free AdamW on CUDA with verl's parameter and optimizer offload: the train/eval switch
done on offloaded tensors gives the weights the resident run gets, and a checkpoint saved in eval
mode resumes to the same training (tests/gpu/schedulefree_offload_ranks.py; one run per world
size). The CPU versions: tests/verl/test_offload_sync.py (the switch waits for offload copies) and the
schedule-free e2e run of tests/e2e/test_verl_e2e.py (eval-mode checkpoint)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gpu_marks import GPU, requires_gpus

pytestmark = GPU

SCRIPT = Path(__file__).with_name("schedulefree_offload_ranks.py")
# float32 weights reach the same values through CPU (offloaded) and CUDA (resident) elementwise
# kernels up to an ulp each; a few optimizer steps later the probe logits (|logit| ~ 1) agree to
# far better than 1e-4, while the eval/train switch moves them by > 1e-3 (asserted)
LOGIT_ATOL = 1e-4


def close(a, b) -> bool:
    return torch.allclose(torch.tensor(a), torch.tensor(b), rtol=0, atol=LOGIT_ATOL)


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=requires_gpus(2))])
def test_schedule_free_switch_with_offload_and_resume(world, tmp_path):
    out = tmp_path / "records.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(world), str(out)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for r in json.loads(out.read_text()):
        # the switches moved the weights: x != y, visible in what the model computes
        assert r["resident_to_eval"] > 0 and r["offloaded_to_eval"] > 0 and r["resumed_to_train"] > 0
        diff = (torch.tensor(r["resident_eval_logits_3"]) - torch.tensor(r["resident_train_logits_3"])).abs().max()
        assert diff > 1e-3, diff
        # offloaded == resident in train mode, eval mode, and after switching back and training on
        for key in ("train_logits_3", "eval_logits_3", "train_logits_5"):
            assert close(r[f"offloaded_{key}"], r[f"resident_{key}"]), key
        # the checkpoint holds eval-mode (x) weights and optimizer state; resuming continues the run
        assert r["checkpoint_train_mode"] and not any(r["checkpoint_train_mode"])
        assert close(r["resumed_eval_logits_3"], r["resident_eval_logits_3"])
        assert close(r["resumed_train_logits_5"], r["resident_train_logits_5"])
