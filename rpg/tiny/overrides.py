"""Hydra overrides for the tiny task on CPU, in two groups that callers combine:

* ``tiny_task_overrides``: what makes a run *the tiny task* (model, data, batch sizes, sampling,
  schedule). The variant launcher (``RPG_BACKEND=cpu``) takes only this group, so a paper
  variant keeps its own algorithm settings and only the model/task/sizes change.
* ``TINY_ALGORITHMS[name]``: the demo's algorithm (trainer entry + overrides), with the demo's
  learning rate for a model this small:
  ``rpg`` (default of run_tiny_cpu.sh): RPG-REINFORCE-UFKL with RPG-Style Clip through the recipe;
  ``grpo``: verl's stock GRPO (fixed reference, k3 "low_var_kl" KL loss) through verl's main_ppo.

Validation samples at temperature 1 (``val_kwargs``), so the logged
``val-core/math_dapo/acc/mean@N`` is the policy's expected accuracy, not greedy accuracy.
"""

from __future__ import annotations

from rpg.tiny.build import TinyAssets

RECIPE_ENTRY = "recipe/rpg/main_rpg.py"  # relative to the project root (the harness resolves it)
VERL_ENTRY = "verl.trainer.main_ppo"

_DEMO = [  # both demo algorithms: no warm-up, no weight decay, plain reward manager, names
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.optim.weight_decay=0.0",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
    "reward.reward_manager.name=naive",
    "trainer.project_name=rpg_tiny",
]

TINY_ALGORITHMS: dict[str, tuple[str, list[str]]] = {
    "rpg": (RECIPE_ENTRY, [
        # R - group mean (no std); anchor = pi_old of each step, so no reference model is built
        "algorithm.adv_estimator=rpg",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "rpg.loss.name=rpg", "rpg.loss.form=reinforce", "rpg.loss.divergence=ufkl", "rpg.loss.clip=True",
        "rpg.loss.beta=1e-4", "rpg.reference.mode=sampler",
        "trainer.experiment_name=tiny_rpg_reinforce_ufkl",
    ]),
    "grpo": (VERL_ENTRY, [
        # group-normalised advantage, fixed reference, k3 KL *loss* (no KL in reward)
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.01",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "trainer.experiment_name=tiny_grpo",
    ]),
}


def tiny_task_overrides(
    assets: TinyAssets, steps: int = 2, test_freq: int = 1, train_batch_size: int = 8, n: int = 8, val_n: int = 4
) -> list[str]:
    """Model, data, sizes, sampling and schedule of the tiny task (no algorithm settings)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    mini = train_batch_size
    return [
        f"data.train_files={assets.train_file}",
        f"data.val_files={assets.val_file}",
        f"data.train_batch_size={train_batch_size}",
        "data.max_prompt_length=64",
        "data.max_response_length=16",
        "data.filter_overlong_prompts=False",
        "data.truncation=error",
        "data.shuffle=True",
        f"actor_rollout_ref.model.path={assets.model_dir}",
        "actor_rollout_ref.model.use_remove_padding=True",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={mini * n}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={mini * n}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={mini * n}",
        f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.top_k=-1",
        f"actor_rollout_ref.rollout.val_kwargs.n={val_n}",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1000",
        "trainer.val_before_train=True",
        f"trainer.test_freq={test_freq}",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.log_val_generations=0",
    ]


def tiny_algorithm(algo: str, lr: float = 5e-4) -> tuple[str, list[str]]:
    """(trainer entry, overrides) of a demo algorithm; ValueError names the allowed values."""
    if algo not in TINY_ALGORITHMS:
        raise ValueError(f"tiny demo algo={algo!r} is invalid: expected one of {tuple(TINY_ALGORITHMS)}")
    entry, overrides = TINY_ALGORITHMS[algo]
    return entry, [*_DEMO, f"actor_rollout_ref.actor.optim.lr={lr}", *overrides]


def tiny_overrides(
    assets: TinyAssets,
    steps: int = 2,
    test_freq: int = 1,
    train_batch_size: int = 8,
    n: int = 8,
    lr: float = 5e-4,
    val_n: int = 4,
    algo: str = "grpo",
) -> list[str]:
    """Task + algorithm overrides (``algo`` of TINY_ALGORITHMS; pair them with its entry)."""
    return [*tiny_task_overrides(assets, steps, test_freq, train_batch_size, n, val_n), *tiny_algorithm(algo, lr)[1]]
