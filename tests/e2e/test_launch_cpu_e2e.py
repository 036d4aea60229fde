"""A shipped script really trains: recipe/rpg/7b/run_rpg_7b_urkl1e-4_rf_clip_ppo_0.2_0.28_schedulefree.sh
(RPG-REINFORCE-URKL with RPG-Style Clip, beta 1e-4, schedule-free AdamW) with RPG_BACKEND=cpu (CPU backend
+ tiny model/task; the variant's algorithm settings unchanged but for the user overrides below) runs
verl's trainer through the same launcher path for 2 steps. The one run also checks:

* the variant's wiring in the workers, and user overrides winning over the script's values;
* a fixed reference (``rpg.reference.mode=fixed``, the ``_noiterref`` setting, given here as an
  override): a reference model is built and never reset; at step 1 it is the policy that sampled, at
  step 2 pi_old has moved on and the reference has not;
* schedule-free AdamW in verl's trainer: old log-probs are computed with the weights the rollout sampled
  with (y, not the eval x of the validation before), validation switches to the averaged x weights and
  back, and the checkpoint holds eval-mode (x) optimizer state;
* RPG-Style Clip binds (a narrower band than the paper's (0.2, 0.28), so that a 5 % ratio move is
  enough: tests/support/e2e_recipe.py), split into its three kinds;
* the paper's evaluation protocol (Table 7): validation rows of MinervaMath get one sample each
  (``rpg.validation.samples_per_problem``, logged as mean@1, scored by Math-Verify inside the Ray reward
  worker) while the other rows get ``val_kwargs.n`` samples (mean@4 here), in the same validation.

* the launcher's terminal: the driver's resume decision; ``LOGGER=console,wandb`` with ``WANDB_MODE=offline``
  writes a W&B run folder under the run's output folder (wandb as the user asked; no account needed).

User overrides (they win over the script's values, as for every launch): the mixed validation file
(validated before training and after step 2), lr 5e-4 without warm-up (the script's 5e-7 would not move
the tiny model measurably in 2 steps), the clip band, the fixed reference and a checkpoint at step 2.
(One launch checks all of this: each trainer launch costs the suite a minute or more on 2 cores.)
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from e2e_recipe import NARROW_CLIP, NARROW_CLIP_OVERRIDES, RPG_LOSS_KEYS, assert_off_policy, at

from rpg.trainer_process import read_metrics
from rpg.config import loss_defaults, loss_fields

pytestmark = [pytest.mark.e2e, pytest.mark.trainer_e2e]  # a CI stage: README's suite runs no trainer launch

ROOT = Path(__file__).resolve().parents[2]
NAME = "run_rpg_7b_urkl1e-4_rf_clip_ppo_0.2_0.28_schedulefree"
SCRIPT = ROOT / "recipe" / "rpg" / "7b" / f"{NAME}.sh"


class _Run:
    """What the assertion helpers of e2e_recipe read: metrics and the trainer's log."""

    def __init__(self, metrics: dict, log: str):
        self.metrics, self.log = metrics, log


def worker_loss_settings(log: str) -> dict:
    """The ``rpg_loss`` mapping of the config the TaskRunner printed (pprint: sorted, wrapped over lines)."""
    body = re.sub(r"^\[[ \d.]+s\] (\x1b\[\d+m)?\(RPGTaskRunner pid=\d+\)(\x1b\[0m)?\s*", "", log, flags=re.M)
    found = re.search(r"'rpg_loss': (\{.*?\})", body, re.S)
    assert found, "the TaskRunner's config print lacks policy_loss.rpg_loss"
    return ast.literal_eval(found.group(1))


def mixed_validation_file(tiny_val: Path, out: Path) -> tuple[Path, int, int]:
    """The tiny task's validation rows, every other one relabelled ``minerva_math``."""
    table = pq.read_table(tiny_val)
    sources = ["minerva_math" if i % 2 else s for i, s in enumerate(table.column("data_source").to_pylist())]
    pq.write_table(table.set_column(table.schema.get_field_index("data_source"), "data_source", pa.array(sources)), out)
    return out, sources.count("math_dapo"), sources.count("minerva_math")


@pytest.mark.e2e
def test_script_trains_on_cpu_backend(tiny_assets, tmp_path):
    out = tmp_path / "run"
    val, n_dapo, n_minerva = mixed_validation_file(tiny_assets.val_file, tmp_path / "val_mixed.parquet")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "DRY_RUN", "MODEL_PATH", "LOGGER")}
    # the launcher's rpg may come from another tree (an editable install elsewhere): reuse this session's
    # tiny build whatever its project root (a cold build there cost 12 of 14 minutes on a loaded machine)
    env.update(PYTHON=sys.executable, RPG_BACKEND="cpu", OUT_DIR=str(out), CPU_TIMEOUT="600",
               RPG_TINY_CACHE=str(tiny_assets.root.parent), CKPTS_DIR=str(tmp_path / "ckpt"),
               LOGGER="console,wandb", WANDB_MODE="offline")  # W&B as asked; offline: no account
    env.pop("WANDB_DIR", None)
    p = subprocess.run(["bash", str(SCRIPT), "trainer.total_training_steps=2", "trainer.test_freq=2", f"data.val_files=[{val}]",
                        "trainer.save_freq=2", "rpg.reference.mode=fixed", *NARROW_CLIP_OVERRIDES,
                        "actor_rollout_ref.actor.optim.lr=5e-4", "actor_rollout_ref.actor.optim.lr_warmup_steps=0"],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    log = (out / "trainer.log").read_text(errors="replace") if (out / "trainer.log").exists() else ""
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:] + log[-3000:]
    assert "[cpu] done: 2 steps" in p.stdout
    # the driver's resume decision on the terminal (it was in trainer.log only)
    assert re.search(rf"^\[cpu\] fresh start \(step 0\) because .*{re.escape(str(tmp_path / 'ckpt'))}", p.stdout, re.M), p.stdout
    # LOGGER=console,wandb on the CPU backend: kept (the harness adds its file logger), and WANDB_MODE=offline
    # honoured: a W&B run folder under the run's output folder (it was WANDB_MODE=disabled: none anywhere)
    wandb_runs = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(wandb_runs) == 1 and wandb_runs[0].stat().st_size > 0, sorted(out.rglob("*"))[:50]

    metrics = read_metrics(out / "metrics.jsonl")
    run = _Run(metrics, log)
    assert max(metrics) == 2 and metrics[2]["training/global_step"] == 2
    for step in (1, 2):
        for key in RPG_LOSS_KEYS:
            at(run, step, key)
        assert metrics[step]["actor/lr"] > 0
    # every step's guarantees with the clip band in force, some ratio off 1, some token clipped
    assert_off_policy(run, (1, 2), clip=NARROW_CLIP)

    # the variant's wiring reached the workers: RPG-REINFORCE-URKL, RPG-Style Clip, beta 1e-4, schedule-free;
    # and the user's overrides won over the script's values (lr, the fixed reference, the clip band)
    assert "rpg: loss=rpg divergence=urkl form=reinforce beta=0.0001 clip=True; anchor=reference mode=fixed" in log
    assert "optimizer=schedulefree" in log
    expected = {"name": "rpg", **{k: loss_defaults()[k] for k in loss_fields()}, "divergence": "urkl",
                "form": "reinforce", "beta": 1e-4, "clip": True}
    assert worker_loss_settings(log) == expected
    for needle in ("'lr': 0.0005", "'rpg_anchor': 'reference'", "'device': 'cpu'",
                   f"'clip_ratio_low': {NARROW_CLIP[0]}", f"'clip_ratio_high': {NARROW_CLIP[1]}"):
        assert needle in log, needle

    # fixed reference: built, never reset; step 1: reference = initial model = sampler; step 2: pi_old
    # moved on (step 1's update had a non-zero gradient), the reference did not
    all_keys = {k for d in metrics.values() for k in d}
    assert "timing_s/ref" in all_keys and "rpg/ref_reset" not in all_keys
    assert "actor/kl_loss" not in all_keys  # the RPG loss carries the KL, not verl's term
    assert at(run, 1, "actor/rpg/ref_old_logp_absdiff_max") < 1e-4 < at(run, 2, "actor/rpg/ref_old_logp_absdiff_max")
    assert at(run, 1, "rpg/ref_kl") < 1e-6 < at(run, 2, "rpg/ref_kl")

    # schedule-free: old_log_prob is computed with the weights the rollout sampled with (y, not the eval x
    # of the validation before): verl's comparison of the two log-probs of the same tokens agrees
    for step in (1, 2):
        assert at(run, step, "training/rollout_probs_diff_max") < 1e-3
    # validation after step 2 switched to the averaged x weights and back (x != y after the second SF step)
    assert at(run, 2, "rpg/sf_to_eval_max_abs_change") > 0
    assert at(run, 2, "rpg/sf_to_train_max_abs_change") > 0
    assert "val-core/math_dapo/acc/mean@4" in metrics[2]
    # the checkpoint holds eval-mode (x) optimizer state
    optim_files = sorted((tmp_path / "ckpt" / "global_step_2" / "actor").glob("optim*.pt"))
    assert optim_files, list((tmp_path / "ckpt").rglob("*"))
    state = torch.load(optim_files[0], map_location="cpu", weights_only=False)
    groups = state["param_groups"] if "param_groups" in state else state["optimizer"]["param_groups"]
    assert all(g["train_mode"] is False for g in groups)

    # evaluation protocol, in the validation before training (step 0)
    val0 = {k: v for k, v in metrics[0].items() if k.startswith("val-")}
    dapo, minerva = val0["val-core/math_dapo/acc/mean@4"], val0["val-core/minerva_math/acc/mean@1"]
    assert not any(k.startswith("val-core/minerva_math/acc/mean@4") for k in val0), sorted(val0)
    assert abs(dapo * 4 * n_dapo - round(dapo * 4 * n_dapo)) < 1e-6  # a mean over 4 samples of each row
    assert abs(minerva * n_minerva - round(minerva * n_minerva)) < 1e-6  # one sample per row
    assert val0["val-aux/minerva_math/scorer_failed/mean@1"] == 0.0  # Math-Verify answered every row
