"""Hydra overrides for the tiny task on CPU: what makes a run the tiny task, and the demo's algorithms.

Two groups that callers combine:

* ``tiny_task_overrides``: what makes a run *the tiny task* (model, data, batch sizes, sampling,
  schedule). The variant launcher (``RPG_BACKEND=cpu``) takes only this group, so a paper
  variant keeps its own algorithm settings and only the model/task/sizes change.
* ``TINY_ALGORITHMS[name]``: the demo's algorithm (trainer entry + overrides), with the demo's
  learning rate for a model this small:
  ``rpg`` (default of run_tiny_cpu.sh): RPG-REINFORCE-UFKL with RPG-Style Clip through the recipe;
  ``grpo``: verl's stock GRPO (its own PPO loss and group-normalised advantage, fixed reference,
  k3 "low_var_kl" KL loss) through the recipe with ``rpg.loss.name=verl``: the path of the paper's
  GRPO scripts.

Validation samples at temperature 1 (``val_kwargs``), so the logged
``val-core/math_dapo/acc/mean@N`` is the policy's expected accuracy, not greedy accuracy.

Off-policy by default: each rollout batch of ``train_batch_size`` prompts is split into
mini-batches of ``MINI_BATCH_SIZE`` prompts (``train_batch_size / MINI_BATCH_SIZE`` optimizer
steps per batch, one pass), as in the paper (512 prompts, mini-batches of 32: 16 steps). Only the
first mini-batch is on-policy; from the second on the importance ratio pi_theta / pi_old leaves 1,
the KL against the sampling policy and its gradient are non-zero and RPG-Style Clip can bind. With
one mini-batch per step (the earlier default) all of that was identically 1 / 0 and RPG reduced to
REINFORCE with a group-mean baseline. Why 4 mini-batches of 2 prompts (16 sequences): measured on
the demo (RPG-REINFORCE-UFKL + clip, lr 5e-4, 8 steps), the per-token ratio spans about [0.1, 4.7],
the KL estimate is 3e-3..4e-2 and 1-7 % of tokens are clipped, so all three are clearly visible,
while each mini-batch still holds two whole groups (a mini-batch of 1 prompt would be one group of
8, a noisier update) and validation accuracy still climbs.
"""

from __future__ import annotations

from rpg.paths.checkout import RECIPE_ENTRY as RECIPE_PATH
from rpg.override_lists import hydra_value, override_key, values
from rpg.config import RPGSettings
from rpg.tiny.build import TinyAssets

RECIPE_ENTRY = RECIPE_PATH.as_posix()  # relative to the project root (rpg_lab.demo.cpu resolves it)
TRAIN_BATCH_SIZE = 8  # prompts per rollout batch
MINI_BATCH_SIZE = 2  # prompts per optimizer step: 4 off-policy-weighted updates per rollout batch
ROLLOUT_N = 8  # responses per prompt (a group)

_DEMO = [  # both demo algorithms: no warm-up, no weight decay, plain reward manager
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.optim.weight_decay=0.0",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
    "reward.reward_manager.name=naive",
]

TINY_ALGORITHMS: dict[str, tuple[str, list[str]]] = {
    "rpg": (RECIPE_ENTRY, [
        # R - group mean (no std); anchor = pi_old of each step, so no reference model is built
        "algorithm.adv_estimator=rpg",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "rpg.loss.name=rpg", "rpg.loss.form=reinforce", "rpg.loss.divergence=ufkl", "rpg.loss.clip=True",
        "rpg.loss.beta=1e-4", "rpg.reference.mode=sampler",
    ]),
    "grpo": (RECIPE_ENTRY, [
        # verl's own actor loss; group-normalised advantage, fixed reference, k3 KL *loss* (no KL in reward)
        "rpg.loss.name=verl", "rpg.reference.mode=fixed",
        "algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=True",
        "algorithm.use_kl_in_reward=False",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.01",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    ]),
}


def check_world_size(world_size: int, mini_batch_size: int = MINI_BATCH_SIZE, n: int = ROLLOUT_N) -> None:
    """ValueError (one line) unless ``world_size`` ranks split a mini-batch of ``mini_batch_size * n`` evenly."""
    responses = mini_batch_size * n
    if world_size < 1 or responses % world_size:
        sizes = [d for d in range(1, responses + 1) if responses % d == 0]
        raise ValueError(f"world size {world_size} (trainer.nnodes x trainer.n_gpus_per_node) cannot split the tiny "
                         f"task's mini-batch of {mini_batch_size} prompts x {n} responses evenly over its ranks: "
                         f"allowed {', '.join(map(str, sizes))}")


def tiny_task_overrides(
    assets: TinyAssets,
    steps: int = 2,
    test_freq: int = 1,
    train_batch_size: int = TRAIN_BATCH_SIZE,
    n: int = ROLLOUT_N,
    val_n: int = 4,
    mini_batch_size: int = MINI_BATCH_SIZE,
    world_size: int = 1,
    trainer_mode: str | None = None,
) -> list[str]:
    """Model, data, sizes, sampling and schedule of the tiny task (no algorithm settings).

    One micro-batch per mini-batch and rank (``mini_batch_size * n / world_size`` sequences); the
    old-policy and reference log-probs of each rank's share of the batch in one forward
    (``train_batch_size * n / world_size``), of its mini-batch with ``trainer_mode="separate_async"`` (whose step
    computes them per mini-batch). ``world_size`` (``trainer.nnodes`` x
    ``trainer.n_gpus_per_node``, set by the caller) must divide ``mini_batch_size * n``: 1, 2, 4, 8
    or 16 with the defaults.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not 1 <= mini_batch_size <= train_batch_size or train_batch_size % mini_batch_size:
        raise ValueError(
            f"mini_batch_size={mini_batch_size} is invalid: expected a divisor of train_batch_size={train_batch_size}"
        )
    check_world_size(world_size, mini_batch_size, n)
    mini, batch = mini_batch_size, train_batch_size
    log_prob_rows = (mini if trainer_mode == "separate_async" else batch) * n // world_size
    return [
        f"data.train_files={hydra_value(str(assets.train_file), 'data.train_files')}",
        f"data.val_files={hydra_value(str(assets.val_file), 'data.val_files')}",
        f"data.train_batch_size={batch}",
        "data.max_prompt_length=64",
        "data.max_response_length=16",
        "data.filter_overlong_prompts=False",
        "data.truncation=error",
        "data.shuffle=True",
        f"actor_rollout_ref.model.path={hydra_value(str(assets.model_dir), 'actor_rollout_ref.model.path')}",
        "actor_rollout_ref.model.use_remove_padding=True",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={mini * n // world_size}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={log_prob_rows}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={log_prob_rows}",
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


def tiny_algorithm(algo: str, lr: float = 5e-4, model: str = "tiny") -> tuple[str, list[str]]:
    """(trainer entry, overrides) of a demo algorithm, named for ``model`` (``trainer.project_name=rpg_<model>``,
    ``experiment_name``); ValueError names the allowed values."""
    if algo not in TINY_ALGORITHMS:
        raise ValueError(f"{model} demo algo={algo!r} is invalid: expected one of {tuple(TINY_ALGORITHMS)}")
    entry, overrides = TINY_ALGORITHMS[algo]
    return entry, with_experiment_name([*_DEMO, f"trainer.project_name=rpg_{model}",
                                        f"actor_rollout_ref.actor.optim.lr={lr}", *overrides], model=model)


def experiment_name(overrides: list[str], model: str = "tiny") -> str:
    """The run's name, from what it runs (the final overrides) and its ``model``: ``tiny_rpg_<form>_<divergence>``
    for the RPG loss (``tiny_rpg_reinforce_ufkl``: the demo's default), ``tiny_<adv_estimator>`` for verl's own
    loss (``tiny_grpo``), else ``tiny_<loss name>`` (``smol_...`` on SmolLM2). It names the checkpoint folder
    ``checkpoints/rpg_<model>/<name>``: a variant never writes into another variant's folder."""
    v = values(overrides)
    loss = str(v.get("rpg.loss.name", RPGSettings().loss_name))
    if loss == "rpg":
        return "_".join([f"{model}_rpg", *(str(v[k]) for k in ("rpg.loss.form", "rpg.loss.divergence") if k in v)])
    if loss == "verl":
        return f"{model}_{v.get('algorithm.adv_estimator', 'verl')}"
    return f"{model}_{loss}"


def with_experiment_name(overrides: list[str], user: list[str] = (), model: str = "tiny") -> list[str]:
    """``overrides`` with ``trainer.experiment_name`` derived from them (``experiment_name``; replacing an
    earlier derived one), unless the ``user``'s overrides set it (a name the user chose wins)."""
    if "trainer.experiment_name" in values(list(user)):
        return list(overrides)
    rest = [o for o in overrides if override_key(o) != "trainer.experiment_name"]  # the others as written
    return [*rest, f"trainer.experiment_name={experiment_name(overrides, model)}"]


def tiny_overrides(
    assets: TinyAssets,
    steps: int = 2,
    test_freq: int = 1,
    train_batch_size: int = TRAIN_BATCH_SIZE,
    n: int = ROLLOUT_N,
    lr: float = 5e-4,
    val_n: int = 4,
    algo: str = "grpo",
    mini_batch_size: int = MINI_BATCH_SIZE,
    world_size: int = 1,
    trainer_mode: str | None = None,
) -> list[str]:
    """Task + algorithm overrides (``algo`` of TINY_ALGORITHMS; pair them with its entry)."""
    task = tiny_task_overrides(assets, steps, test_freq, train_batch_size, n, val_n, mini_batch_size, world_size,
                               trainer_mode)
    return [*task, *tiny_algorithm(algo, lr)[1]]
