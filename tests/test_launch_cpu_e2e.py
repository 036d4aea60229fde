"""A paper script really trains: recipe/rpg/7b/run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28.sh with
RPG_BACKEND=cpu (CPU backend + tiny model/task; the variant's algorithm settings unchanged) runs
verl's trainer through the same launcher path for 2 steps."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rpg.backends.cpu.harness import read_metrics
from rpg.losses import loss_defaults
from rpg.verl.settings import loss_fields

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "recipe" / "rpg" / "7b" / "run_rpg_7b_ufkl1e-4_rf_clip_ppo_0.2_0.28.sh"
RPG_KEYS = ("actor/rpg/kl_estimate", "actor/rpg/ratio_mean", "actor/rpg/clipfrac", "actor/rpg/reg_adv_mean",
            "actor/rpg/active_frac")


def worker_loss_settings(log: str) -> dict:
    """The ``rpg_loss`` mapping of the config the TaskRunner printed (pprint: sorted, wrapped over lines)."""
    body = re.sub(r"^\[[ \d.]+s\] (\x1b\[\d+m)?\(RPGTaskRunner pid=\d+\)(\x1b\[0m)?\s*", "", log, flags=re.M)
    found = re.search(r"'rpg_loss': (\{.*?\})", body, re.S)
    assert found, "the TaskRunner's config print lacks policy_loss.rpg_loss"
    return ast.literal_eval(found.group(1))


@pytest.mark.e2e
def test_script_trains_on_cpu_backend(tiny_assets, tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DRY_RUN", "MODEL_PATH", "LOGGER")}
    env.update(PYTHON=sys.executable, RPG_BACKEND="cpu", OUT_DIR=str(out), CPU_TIMEOUT="600")
    p = subprocess.run(["bash", str(SCRIPT), "trainer.total_training_steps=2"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=900)
    log = (out / "trainer.log").read_text(errors="replace") if (out / "trainer.log").exists() else ""
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:] + log[-3000:]
    assert "[cpu] done: 2 steps" in p.stdout

    metrics = read_metrics(out / "metrics.jsonl")
    assert max(metrics) == 2 and metrics[2]["training/global_step"] == 2
    for step in (1, 2):
        missing = [k for k in RPG_KEYS if k not in metrics[step]]
        assert not missing, f"step {step} lacks RPG metrics {missing}"
        assert metrics[step]["actor/lr"] > 0
    assert any(k.startswith("val-core/math_dapo/acc/mean@") for k in metrics[0])  # validation before training
    # the variant's wiring reached the workers: RPG-REINFORCE, RPG-Style Clip, beta 1e-4, lr 5e-7, sampler anchor
    expected = {**{k: loss_defaults()[k] for k in loss_fields()}, "divergence": "ufkl", "form": "reinforce",
                "beta": 1e-4, "clip": True}
    assert worker_loss_settings(log) == expected
    for needle in ("'lr': 5e-07", "'rpg_anchor': 'sampler'", "'device': 'cpu'"):
        assert needle in log, needle
    assert "rpg: loss=rpg divergence=ufkl form=reinforce beta=0.0001 clip=True" in log
