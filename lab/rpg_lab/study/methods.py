"""The study's methods: a paper run (its experiment file) each, or one the study declares itself (``UNSHIPPED``, and
the loss comparison's arms, ``rpg_lab.study.loss_arms``);
the settings, clip and label the grid, the tables and the figures read of them."""

from __future__ import annotations

import functools

from rpg.launch.experiments import Experiment

# The unclipped RPG-REINFORCE-UFKL, which no paper script runs: the paper setup with the settings its name reads as
# (the overrides scripts/experiments.py gives the name: tests/lab/study/test_study.py checks), and the model and data a file
# would state. The overrides are the runs' identity (rpg_lab.study.identity): they stay as the study first ran them.
UNSHIPPED: dict[str, tuple[str, ...]] = {
    "run_rpg_7b_ufkl1e-4_rf": (
        "+paper=default", "data.max_prompt_length=2048", "data.max_response_length=2048",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=4096",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096",
        "actor_rollout_ref.rollout.max_num_batched_tokens=4096", "actor_rollout_ref.actor.optim.lr=5e-07",
        "reward.reward_kwargs.overlong_buffer_cfg.enable=True", "algorithm.filter_groups.enable=True",
        "rpg.loss.clip=False", "actor_rollout_ref.rollout.gpu_memory_utilization=0.6"),
}
UNSHIPPED_FILES = {"actor_rollout_ref.model.path": "Qwen/Qwen2.5-Math-7B",
                   "data.train_files": "data/dapo-math-17k-en.parquet",
                   "data.val_files": ["data/aime2024.parquet", "data/aime2025.parquet", "data/amc2023.parquet"]}


@functools.lru_cache(maxsize=None)
def method_run(name: str) -> Experiment:
    """A method's run: its experiment file (``ExperimentError`` naming the closest when none), ``UNSHIPPED``, or an
    arm of the loss comparison (``rpg_lab.study.loss_arms``)."""
    from rpg.launch import experiments
    from rpg.override_lists import parse_overrides
    from rpg_lab.study.loss_arms import arm_overrides

    if name in (arms := arm_overrides()):
        label, overrides = arms[name]
        settings = {**UNSHIPPED_FILES, **{p.key: p.value for p in parse_overrides(list(overrides[1:]))}}
        return Experiment(name, None, settings, overrides, (f"{name}: {label} [the loss comparison's arm]",))
    if name in UNSHIPPED:
        settings = {**UNSHIPPED_FILES, **{p.key: p.value for p in parse_overrides(list(UNSHIPPED[name][1:]))}}
        return Experiment(name, None, settings, UNSHIPPED[name], (f"{name}: RPG-REINFORCE-UFKL [not in the paper]",))
    return experiments.find(name)


def setting(name: str, key: str):
    """A method's value of ``key``: its run's, else the recipe's (``rpg_trainer.yaml`` and the paper setup)."""
    from rpg.launch.experiments import recipe_value

    settings = method_run(name).settings
    return settings[key] if key in settings else recipe_value(key)


def clipped(name: str) -> bool:
    """Whether the method clips (verl's own losses always do)."""
    return setting(name, "rpg.loss.name") != "rpg" or bool(setting(name, "rpg.loss.clip"))


def label_of(name: str) -> str:
    """Table row / legend name: the paper's method label, '(no clip)' for unclipped RPG-REINFORCE."""
    unclipped = setting(name, "rpg.loss.name") == "rpg" and setting(name, "rpg.loss.form") == "reinforce" \
        and not clipped(name)
    return method_run(name).row.split(" [")[0] + (" (no clip)" if unclipped else "")
