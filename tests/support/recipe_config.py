"""The recipe's config composed with Hydra against the installed verl (``compose_cfg``), then checked and
translated into verl keys as the driver does (``apply``); and the tiny separate-async settings the driver accepts on
the CPU backend (``SEPARATE_ASYNC_OK``), shared by the tests of several packages."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from rpg.backends.cpu.env_overrides import separate_async_overrides
from rpg.override_lists import values
from rpg.verl.block_to_verl import validate_and_apply

CONFIG_DIR = Path(__file__).resolve().parents[2] / "recipe" / "rpg" / "config"


def compose_cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="rpg_trainer", overrides=["actor_rollout_ref.model.path=dummy", *overrides])


def apply(*overrides):
    cfg = compose_cfg(*overrides)
    return cfg, validate_and_apply(cfg)


SEPARATE_ASYNC = "trainer.v1.trainer_mode=separate_async"
# what the CPU backend's launch sets for the mode, and its rollout's tensor parallel size (verl's default is 2)
SEPARATE_ASYNC_CPU = ["trainer.device=cpu", *separate_async_overrides(values([SEPARATE_ASYNC])),
                      "actor_rollout_ref.rollout.tensor_model_parallel_size=1"]
# the tiny task's sizes: 8 prompts = 4 mini-batches of 2, 8 responses each, log-probs per mini-batch
TINY_SIZES = ["trainer.n_gpus_per_node=1", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
              "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
              "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
              "actor_rollout_ref.rollout.calculate_log_probs=True"]
SEPARATE_ASYNC_OK = [SEPARATE_ASYNC, *SEPARATE_ASYNC_CPU, *TINY_SIZES]
