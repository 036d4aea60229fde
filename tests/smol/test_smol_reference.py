"""SmolLM2's first RPG step against its committed reference (``rpg_lab.demo.reference --model smol``, the ``smol`` stage):
the real model's weights, the responses the project's sampler draws, the loss, its gradient and the update, to the
bit with the CPU kernels pinned; a planted change of the computation (the temperature applied twice) fails in one
line naming what moved."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# a change of the computation, planted in the first step's process only: the sampler divides by the temperature twice
PLANT = '''
import rpg.backends.hf_rollout.sampling as sampling
from transformers.generation.logits_process import TemperatureLogitsWarper

_init = sampling.RowSampler.__init__


def _twice(self, temperature, top_k, top_p):
    _init(self, temperature, top_k, top_p)
    self.warpers.insert(0, TemperatureLogitsWarper(temperature))


sampling.RowSampler.__init__ = _twice
'''


@pytest.fixture(scope="module")
def smol():
    from rpg.smol import build_smol_assets

    return build_smol_assets()


def _check(out: Path, plant: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if plant is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(plant), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "rpg_lab.demo.reference", "--check", "--model", "smol", "--out",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)


@pytest.mark.smol
def test_smols_first_step_holds_its_reference(smol, tmp_path):
    done = _check(tmp_path / "run")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "the smol reference holds" in done.stdout


@pytest.mark.smol
def test_a_planted_change_of_the_computation_fails_in_one_line(smol, tmp_path):
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "sitecustomize.py").write_text(PLANT)
    done = _check(tmp_path / "run", plant)
    assert done.returncode == 1, (done.stdout + done.stderr)[-3000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("[reference]")]
    assert len(lines) == 1 and "the smol reference moved" in lines[0] and "responses sha256" in lines[0]
    assert "--regenerate --model smol --reason" in lines[0]
