"""Hydra overrides for the tiny demo task (model, data, sizes, schedule), on top of the CPU ones.

Defaults: verl's GRPO with a fixed reference and the k3 ("low_var_kl") KL loss, as in the
issue's first milestone. Validation samples at temperature 1 (``val_kwargs``), so the logged
``val-core/math_dapo/acc/mean@N`` is the policy's expected accuracy, not greedy accuracy.
"""

from __future__ import annotations

from rpg.tiny.build import TinyAssets


def tiny_overrides(
    assets: TinyAssets,
    steps: int = 2,
    test_freq: int = 1,
    train_batch_size: int = 8,
    n: int = 8,
    lr: float = 5e-4,
    val_n: int = 4,
) -> list[str]:
    """Overrides that train the tiny model on the tiny task for ``steps`` steps with verl's GRPO."""
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
        # GRPO: group-normalised advantage, fixed reference, k3 KL *loss* (no KL in reward)
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.01",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
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
        "reward.reward_manager.name=naive",
        "trainer.project_name=rpg_tiny",
        "trainer.experiment_name=tiny_grpo",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1000",
        "trainer.val_before_train=True",
        f"trainer.test_freq={test_freq}",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.log_val_generations=0",
    ]
