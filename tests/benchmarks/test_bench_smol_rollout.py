"""benchmarks/bench_smol_rollout.py: its reading of two runs' folders and its arithmetic, on stand-in metrics (no
model, no trainer); the smoke run of the benchmark itself, both rollouts, is in the vLLM-CPU environment (marked
``bench`` and ``vllm_cpu``: ``-m vllm_cpu --vllm-cpu --bench`` there; not in CI, two trainer launches)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks_module import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_smol_rollout")


def _encode(text):  # a stand-in tokenizer: one token per word
    return text.split()


def _run(out: Path, gen_s: float, tokens: int, phases: dict, testing_s: float, outputs: list[str], pss: float,
         threads: str = "1"):
    """A run's folder as the demo leaves it: FileLogger records, summary.json, verl's validation dump."""
    out.mkdir(parents=True)
    step = {"timing_s/gen": gen_s, "timing_per_token_ms/gen": gen_s * 1000 / tokens, "response_length/mean": tokens / 32,
            "response_length/clip_ratio": 0.25, **{f"timing_s/{k}": v for k, v in phases.items()}}
    records = [{"step": 0, "data": {"val-core/math_dapo/acc/mean@1": 0.2}},
               {"step": 1, "data": step},
               {"step": 2, "data": {**step, "timing_s/testing": testing_s, "val-core/math_dapo/acc/mean@1": 0.25}}]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (out / "summary.json").write_text(json.dumps({"val_acc_before": 0.2, "val_acc_after": 0.25, "peak_pss_gb": pss,
                                                  "peak_system_used_gb": pss + 1, "wall_time_s": 600.0,
                                                  "cpu_s": 900.0, "omp_num_threads": threads}))
    dump = out / "val_generations"
    dump.mkdir()
    (dump / "0.jsonl").write_text(json.dumps({"output": "never read"}) + "\n")  # the untimed validation before
    (dump / "2.jsonl").write_text("".join(json.dumps({"output": o, "step": 2}) + "\n" for o in outputs))


def test_validation_tokens_count_the_end_of_turn_of_every_response_that_ended(bench):
    # 3 words: ended, + its end-of-turn token; 5 words at a limit of 5: cut, nothing added; empty: ended at once
    assert bench.val_tokens(["a b c", "a b c d e", ""], _encode, 5) == 4 + 5 + 1


def test_figures_and_ratios_from_two_runs(bench, tmp_path):
    phases_hf = {"gen": 40.0, "old_log_prob": 30.0, "update_actor": 80.0, "update_weights": 1.0, "step": 160.0}
    phases_vllm = {"gen": 10.0, "old_log_prob": 30.0, "update_actor": 80.0, "update_weights": 4.0, "step": 130.0}
    _run(tmp_path / "hf", 40.0, 1200, phases_hf, testing_s=100.0, outputs=["x y", "x y z w"], pss=10.0, threads="2")
    _run(tmp_path / "vllm", 10.0, 1000, phases_vllm, testing_s=20.0, outputs=["x", "x y z w"], pss=8.0)
    hf = bench.arm_figures(tmp_path / "hf", _encode, max_response_length=4)
    vllm = bench.arm_figures(tmp_path / "vllm", _encode, max_response_length=4)
    assert sorted(hf["steps"]) == [1, 2]
    assert (hf["omp_num_threads"], vllm["omp_num_threads"]) == ("2", "1")  # each run's own, from its summary.json
    s = hf["steps"][2]
    assert s["gen_tok_s"] == pytest.approx(1200 / 40.0) and s["gen_tokens"] == 1200
    assert (s["gen"], s["old_log_prob"], s["update_actor"], s["step"]) == (40.0, 30.0, 80.0, 160.0)
    # the timed validation (step 2), not the one before training: 3 + 4 tokens in 100 s
    assert hf["val"] == {"step": 2, "responses": 2, "tokens": 7, "s": 100.0, "tok_s": pytest.approx(0.07)}
    assert vllm["val"]["tokens"] == 2 + 4 and vllm["val"]["tok_s"] == pytest.approx(6 / 20.0)
    r = bench.comparison(hf, vllm)
    assert r["steps"][2]["gen_tok_s"] == pytest.approx((1000 / 10.0) / (1200 / 40.0))
    assert r["steps"][2]["gen"] == pytest.approx(0.25) and r["steps"][1]["update_weights"] == pytest.approx(4.0)
    assert r["val_tok_s"] == pytest.approx(0.3 / 0.07) and r["val_s"] == pytest.approx(0.2)
    assert r["peak_pss_gb"] == pytest.approx(0.8) and r["wall_time_s"] == pytest.approx(1.0)
    lines = bench.table({"hf": hf, "vllm": vllm}, r)
    row = next(line for line in lines if line.startswith("step 2 gen tok/s"))
    assert row.split()[-3:] == ["30.0", "100.0", "3.33"]
    assert next(line for line in lines if line.startswith("peak PSS GiB")).split()[-3:] == ["10.00", "8.00", "0.80"]


def test_a_run_without_a_timed_validation_is_refused(bench, tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "metrics.jsonl").write_text(json.dumps({"step": 1, "data": {
        "timing_s/gen": 1.0, "timing_per_token_ms/gen": 10.0, "response_length/mean": 3.0,
        "response_length/clip_ratio": 0.0}}) + "\n")
    (out / "summary.json").write_text(json.dumps({}))
    with pytest.raises(ValueError, match="no timed validation"):
        bench.arm_figures(out, _encode, 4)


@pytest.mark.bench
@pytest.mark.vllm_cpu
@pytest.mark.e2e
def test_bench_smol_rollout_smoke(tmp_path):
    """Both rollouts for 1 step, 8 validation problems, responses of up to 16 tokens: its figures are read back."""
    report = tmp_path / "rollout.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_smol_rollout.py"), "--steps", "1",
                        "--val-problems", "8", "--out", str(tmp_path / "runs"), "--json", str(report),
                        "data.max_response_length=16"], capture_output=True, text=True, timeout=2400,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    figures = json.loads(report.read_text())
    for rollout in ("hf", "vllm"):
        f = figures["figures"][rollout]
        assert f["val"]["responses"] == 8 and 0 < f["val"]["tokens"] <= 8 * 16
        assert f["steps"]["1"]["gen_tok_s"] > 0 and 0 < f["steps"]["1"]["response_length_mean"] <= 16
        assert f["peak_pss_gb"] > 0
    assert figures["ratios"]["steps"]["1"]["gen_tok_s"] > 0
    assert "step 1 gen tok/s" in p.stdout and "vllm/hf" in p.stdout
