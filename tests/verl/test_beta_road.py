"""The road of ``rpg.loss.beta`` (docs/architecture.md#the-road-of-a-loss-setting): a value set on a paper run's
command line reaches the RPG loss's KL weight unchanged, through the launch's composition and the driver's
translation (``rpg.launch.entry``: what recipe/rpg/main_rpg.py runs before ``run_ppo``), verl's conversion of the
actor config on a worker (``omega_conf_to_dataclass``, as verl's engine worker does) and the actor loss the RPG worker
installs (``rpg.verl.actor_loss.rpg_loss_fn``); a worker builds its ``RPGLossConfig`` once, not per micro-batch; the
documented road names at most 6 files."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import pandas as pd
import pytest
from launching import env, launch
from test_verl_adapter import SPLITS, Batch, _actor_config

from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.losses import ppo_loss

import rpg.math.fused_terms
import rpg.verl.register  # noqa: F401  (the policy losses, as the entry point registers them on a worker)
from rpg.config import RPGLossConfig, parse_rpg_settings
from rpg.verl.actor_loss import rpg_loss_fn
from rpg.verl.block_to_verl import apply_to_verl_config
from rpg.verl.policy_loss import RPGPolicyLossConfig, rpg_policy_loss, worker_loss_config

ROOT = Path(__file__).resolve().parents[2]
NAME = "run_rpg_7b_ufkl1e-4"  # states rpg.loss.beta: 1.0e-4 in its experiment file
BETA = 0.000123


@pytest.fixture
def kl_weights(monkeypatch):
    """The beta each evaluation of the fused loss hands to ``formulas.kl_weight`` (its KL weight C = beta * ...)."""
    seen = []
    real = rpg.math.fused_terms.kl_weight

    def recording(divergence, beta, *args):
        seen.append(beta)
        return real(divergence, beta, *args)

    monkeypatch.setattr(rpg.math.fused_terms, "kl_weight", recording)
    return seen


@pytest.fixture
def constructions(monkeypatch):
    """Every ``RPGLossConfig`` built from here on (its ``__post_init__``, which checks the rules, runs once per
    construction)."""
    built = []
    real = RPGLossConfig.__post_init__

    def counting(self):
        real(self)
        built.append(self)

    monkeypatch.setattr(RPGLossConfig, "__post_init__", counting)
    return built


def _run(loss_fn, batch, splits):
    for idx in splits:
        model_output, data = batch.micro(idx)
        loss_fn(model_output=model_output, data=data)


def test_rpg_loss_beta_reaches_the_kl_weight(tmp_path, monkeypatch, kl_weights, capsys):
    import rpg.backends.gpu.backend as gpu
    from rpg.launch.experiments import find

    files = find(NAME).settings
    row = pd.DataFrame({"prompt": [[{"role": "user", "content": "1+1?"}]], "data_source": ["aime2024"],
                        "reward_model": [{"ground_truth": "2"}]})
    for name in (files["data.train_files"], *files["data.val_files"]):
        row.to_parquet(tmp_path / Path(name).name)
    monkeypatch.setattr(gpu, "check_driver", lambda *a, **k: None)  # this node's GPUs: tests/backends

    # the driver's side: the launch composes the run and makes the driver's checks (the rpg: block written into verl's
    # keys); main_rpg.py hands this config to verl's run_ppo
    prepared = launch([NAME, f"rpg.loss.beta={BETA}"], env(DATA_DIR=str(tmp_path), CKPTS_DIR=str(tmp_path / "ckpt")))
    assert not isinstance(prepared, (int, list)), capsys.readouterr().err
    assert prepared.settings.loss.beta == BETA
    assert prepared.config.actor_rollout_ref.actor.policy_loss.rpg_loss.beta == BETA

    # a worker's side: verl's actor config from the config Ray carries, and the loss the RPG worker installs on it
    actor = omega_conf_to_dataclass(prepared.config.actor_rollout_ref.actor)
    assert type(actor.policy_loss) is RPGPolicyLossConfig
    verl_loss = partial(ppo_loss, config=actor)  # what verl's worker installs before the RPG worker replaces it
    loss_fn = rpg_loss_fn(verl_loss.keywords["config"])
    _run(loss_fn, Batch(), SPLITS["two"])
    assert kl_weights and set(kl_weights) == {BETA}, kl_weights  # every micro-batch's loss, its KL weight


def test_a_worker_builds_its_loss_config_once(constructions, kl_weights):
    """Built when the worker installs its loss, then found by every micro-batch; another actor config (another
    worker, or a changed config: verl's configs are frozen, a change is a new object) gets its own."""
    a, b = _actor_config("token-mean", rpg_beta=BETA), _actor_config("token-mean", rpg_beta=0.0456)
    batch = Batch()
    loss_a = rpg_loss_fn(a)
    assert len(constructions) == 1  # at install, before any micro-batch
    _run(loss_a, batch, SPLITS["uneven"])  # three micro-batches
    assert len(constructions) == 1 and set(kl_weights) == {BETA}
    loss_b = rpg_loss_fn(b)
    _run(loss_b, batch, SPLITS["two"])
    assert len(constructions) == 2 and kl_weights[-1] == 0.0456
    _run(loss_a, batch, SPLITS["one"])  # the first worker's config is still its own
    assert len(constructions) == 2 and kl_weights[-1] == BETA
    assert [c.beta for c in constructions] == [BETA, 0.0456]


def test_a_mutable_config_is_refused_by_the_workers_build():
    """An OmegaConf node could change after the build: the worker's build takes verl's frozen configs only."""
    from recipe_config import apply

    cfg, _ = apply(f"rpg.loss.beta={BETA}")
    with pytest.raises(TypeError, match="needs verl's actor config"):
        worker_loss_config(cfg.actor_rollout_ref.actor)


ROAD = ROOT / "docs" / "architecture.md"


def _road() -> list[str]:
    text = ROAD.read_text(encoding="utf-8")
    table = text.split("<!-- road of rpg.loss.beta:", 1)[1].split("<!-- end of road -->", 1)[0]
    return [m.group(1) for m in re.finditer(r"^\| \d+ \| `([^`]+)` \|", table, re.M)]


def test_the_documented_road_is_at_most_six_files_and_names_the_code_it_takes():
    road = _road()
    assert 1 <= len(road) <= 6, road
    for path in road:
        assert list(ROOT.glob(path.replace("<run>", "*"))), f"{path}: no such file"
    assert road[0] == "recipe/rpg/config/experiment/<run>.yaml" and (ROOT / road[0].replace("<run>", NAME)).is_file()
    # the functions the value passes through (the tests above call them) live in the files the road names
    steps = (parse_rpg_settings, RPGLossConfig, apply_to_verl_config, RPGPolicyLossConfig, worker_loss_config,
             rpg_policy_loss)
    modules = {f.__module__.replace(".", "/") + ".py" for f in steps}
    assert modules <= set(road), sorted(modules - set(road))
