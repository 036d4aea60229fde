"""The road of ``rpg.loss.beta`` (docs/architecture.md#the-road-of-a-loss-setting), followed through the code: a value
set in an experiment file reaches the loss a worker computes unchanged, the worker builds its ``RPGLossConfig``
once, and the files whose code hands the value on between the file and the loss are at most 6 (the experiment file
among them), counted by following the value (``tests/support/value_road.py``), not read from a table in the docs; a
hand-on layer planted in another module is counted."""

from __future__ import annotations

import re
import runpy
import sys
from functools import partial
from pathlib import Path

import pandas as pd
import pytest
from launching import CLEAN_ENV_KEYS
from test_verl_adapter import SPLITS, Batch, _actor_config
from value_road import ValueRoad

import verl.trainer.main_ppo
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.losses import ppo_loss

import rpg.math.fused
import rpg.math.fused_terms
import rpg.verl.main
import rpg.verl.register  # noqa: F401  (the policy losses, as the entry point registers them on a worker)
from rpg.config import RPGLossConfig
from rpg.launch.experiments import find
from rpg.verl.actor_loss import rpg_loss_fn
from rpg.verl.policy_loss import worker_loss_config
from rpg.verl.worker import RPGActorRolloutRefWorker

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = "run_rpg_7b_ufkl1e-4"  # states rpg.loss.beta: 1.0e-4 in its experiment file
NAME = "run_rpg_7b_ufkl_road"
BETA = 0.000123
MAX_FILES = 6  # from the experiment file to the loss, the loss's own file (rpg/math/fused.py) not counted
LOSS = "the loss receives its config"  # the end of the road: rpg.math.fused's entry point
THE_LOSS = "rpg/math/fused.py"


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


class _Actor:
    """The engine actor of verl's worker, as far as the RPG worker's ``init_model`` uses it."""

    engine = object()

    def set_loss_fn(self, loss_fn):
        self.loss_fn = loss_fn


def _handed_to_verl(config, task_runner_class=None):
    """verl's ``run_ppo`` in this process: what the driver hands to Ray, kept for the worker below."""
    _handed_to_verl.config = config


def _road(tmp_path, monkeypatch, kl_weights, capsys, detour=None) -> dict[str, set[str]]:
    """Launch the run as a paper script does (recipe/rpg/main_rpg.py +experiment=<run>, in this process, verl's
    ``run_ppo`` taking the config), then as verl and the RPG worker do on an actor worker: the config Ray carries,
    resolved by verl's TaskRunner, converted to verl's ``ActorConfig``, the RPG worker's ``init_model`` installing its
    loss, and two micro-batches of it. Returns the files on the value's road (``ValueRoad``)."""
    from omegaconf import OmegaConf

    import rpg.backends.gpu.backend as gpu

    # the experiment file: the shipped run with beta = BETA, in a folder of hydra.searchpath
    text = find(SHIPPED).path.read_text()
    text, n = re.subn(r"(\n    beta: )1\.0e-4", rf"\g<1>{BETA}", text)
    assert n == 1
    (tmp_path / "experiment").mkdir(parents=True)
    experiment = tmp_path / "experiment" / f"{NAME}.yaml"
    experiment.write_text(text)
    files = find(SHIPPED).settings
    row = pd.DataFrame({"prompt": [[{"role": "user", "content": "1+1?"}]], "data_source": ["aime2024"],
                        "reward_model": [{"ground_truth": "2"}]})
    for name in (files["data.train_files"], *files["data.val_files"]):
        row.to_parquet(tmp_path / Path(name).name)
    for key in CLEAN_ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CKPTS_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setattr(gpu, "check_driver", lambda *a, **k: None)  # this node's GPUs: tests/backends
    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo", _handed_to_verl)
    monkeypatch.setattr(rpg.verl.main, "run_ppo", _handed_to_verl, raising=False)
    monkeypatch.setattr(ActorRolloutRefWorker, "init_model", lambda self: None)  # verl's model: not needed here
    if detour is not None:
        detour(monkeypatch)
    entry = ROOT / "recipe" / "rpg" / "main_rpg.py"
    monkeypatch.setattr(sys, "argv", [str(entry), f"+experiment={NAME}",
                                      f"hydra.searchpath=[pkg://verl.trainer.config,file://{tmp_path}]"])
    _handed_to_verl.config = None
    sinks = {_handed_to_verl.__code__: "handed to verl's run_ppo",
             RPGLossConfig.__post_init__.__code__: "built the RPGLossConfig the loss receives",
             rpg.math.fused.rpg_policy_loss.__code__: LOSS}
    with ValueRoad(BETA, [ROOT / "rpg", ROOT / "recipe"], sinks, LOSS) as road:
        with pytest.raises(SystemExit) as e:
            runpy.run_path(str(entry), run_name="__main__")
        assert e.value.code == 0, f"the launch exited {e.value.code}: {capsys.readouterr().err[-2000:]}"
        config = _handed_to_verl.config
        assert config is not None, capsys.readouterr().err[-2000:]
        assert config.rpg.loss.beta == BETA
        # no code copies the value on the driver: verl's policy-loss config holds the rpg.loss block by reference
        rpg_loss = config.actor_rollout_ref.actor.policy_loss._get_node("rpg_loss")
        assert rpg_loss._is_interpolation() and rpg_loss._dereference_node() is config.rpg._get_node("loss")
        # an actor worker: verl's TaskRunner resolves the config; verl's worker converts the actor's part and
        # installs ppo_loss on it; the RPG worker's init_model replaces it
        OmegaConf.resolve(config)
        actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
        worker = RPGActorRolloutRefWorker.__new__(RPGActorRolloutRefWorker)
        worker.role, worker.actor = "actor", _Actor()
        worker.loss_fn = partial(ppo_loss, config=actor)
        worker.init_model()
        _run(worker.actor.loss_fn, Batch(), SPLITS["two"])
    assert kl_weights and set(kl_weights) == {BETA}, kl_weights  # every micro-batch's loss, its KL weight
    assert {moment for moment, _, _ in road.events} == set(sinks.values()), road.events
    found = {str(Path(f).relative_to(ROOT)): why for f, why in road.road().items()}
    return {"<the experiment file>": {"states it"}, **found}


def _shown(road) -> str:
    return "; ".join(f"{f} ({', '.join(sorted(why))})" for f, why in sorted(road.items()))


def test_rpg_loss_beta_reaches_the_loss_through_at_most_six_files(tmp_path, monkeypatch, kl_weights, capsys):
    road = _road(tmp_path, monkeypatch, kl_weights, capsys)
    assert road.pop(THE_LOSS) == {LOSS}, _shown(road)  # the end: the loss receives its config, and no more
    assert "rpg/verl/policy_loss.py" in road, _shown(road)  # the follower sees the worker's side
    assert "rpg/launch/entry.py" in road, _shown(road)  # and the driver's (the launcher main_rpg.py hands it to)
    assert len(road) <= MAX_FILES, f"{len(road)} files on the road of rpg.loss.beta to {THE_LOSS}: {_shown(road)}"


def _planted(monkeypatch):
    """A hand-on layer in another project module: the actor loss installed through a function of rpg/verl/errors.py
    that only passes verl's actor config on."""
    import rpg.verl.actor_loss

    namespace = {"real": rpg.verl.actor_loss.rpg_loss_fn}
    exec(compile("def hand_on(actor_config):\n    return real(actor_config)\n", str(ROOT / "rpg/verl/errors.py"),
                 "exec"), namespace)
    monkeypatch.setattr(rpg.verl.actor_loss, "rpg_loss_fn", namespace["hand_on"])


def test_a_planted_hand_on_layer_lengthens_the_road(tmp_path, monkeypatch, kl_weights, capsys):
    plain = _road(tmp_path / "a", monkeypatch, kl_weights, capsys)
    kl_weights.clear()
    detoured = _road(tmp_path / "b", monkeypatch, kl_weights, capsys, detour=_planted)
    assert set(detoured) - set(plain) == {"rpg/verl/errors.py"}, _shown(detoured)
    assert len(plain) - 1 <= MAX_FILES < len(detoured) - 1  # the check above fails on the longer road


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
