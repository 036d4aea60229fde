"""Hydra overrides of a CPU run on SmolLM2-135M-Instruct and its arithmetic task (the demo's ``--model smol``).

The tiny task's settings (``rpg.tiny.overrides.tiny_task_overrides``: data files, model, schedule, sampling at
temperature 1 in training and validation, one pass of several mini-batches per rollout batch) with this model's
sizes: rollout batches of ``TRAIN_BATCH_SIZE`` prompts x ``ROLLOUT_N`` responses, mini-batches of
``MINI_BATCH_SIZE`` prompts (``TRAIN_BATCH_SIZE / MINI_BATCH_SIZE`` optimizer steps per rollout batch: the
off-policy regime), one response per validation prompt, and micro-batching by token budget (``use_dynamic_bsz``;
``cpu_token_budgets`` below says why a whole mini-batch, and a whole rollout batch, per micro-batch on CPU).
"""

from __future__ import annotations

from rpg.override_lists import merge_overrides
from rpg.tiny.overrides import check_world_size as _check_world_size
from rpg.tiny.overrides import tiny_task_overrides

TRAIN_BATCH_SIZE = 8  # prompts per rollout batch
MINI_BATCH_SIZE = 2  # prompts per optimizer step: 4 updates per rollout batch
ROLLOUT_N = 4  # responses per prompt (a group)
VAL_N = 1  # responses per validation prompt
MAX_PROMPT_LENGTH = 224  # the task's longest prompt (the worked example's turns, the problem's) is 203 tokens (tested)
MAX_RESPONSE_LENGTH = 96  # the base model's answers: 40 tokens on average; "17 + 8 = 25.\nAnswer: 25" is 16
LR = 1e-5
# 10 steps with validations before training, after step 5 and after step 10: about 8 minutes on 2 cores, each
# validation (200 problems) about 40 s, a step about 25 s (docs/smol.md, Cost)
STEPS = 10
TEST_FREQ = 5
# The trainer's time limit, there to stop a hung run, not to bound a slow machine's (the tiny model's 30 minutes
# stopped an earlier 18-step default at step 6 on a loaded machine)
TIMEOUT_S = 4 * 3600.0
# The GPU smoke run's sizes (python -m rpg_lab.demo.gpu_smoke --model smol; docs/gpu-smoke.md), the prompt and response
# lengths above kept: 32 prompts x 8 responses per rollout batch (256 sequences for vLLM at once; the smoke run's 6
# steps read 192 of the 256 training problems, one pass), 4 mini-batches of 8 prompts (the CPU run's off-policy
# regime; 64 sequences, split by any GPU count dividing 64), and micro-batches of up to 16384 tokens: a mini-batch
# holds at most 64 x (203 + 96) = 19.1k tokens, about 15.6k with the base model's 40-token responses, so an update
# takes one or two, whose float32 logits over the 49k vocabulary (3.2 GB) fit any GPU the smoke run targets.
# (The CPU budgets' reason, the prefix tree, is the CPU engine's: on a GPU verl's packed forward with flash-attention's
# variable-length kernels computes each sequence whole.)
GPU_SIZES = {"train_batch_size": 32, "n": 8, "mini_batch_size": 8, "token_budget": 16384}


# Torch's threads per Ray process. The CPU backend gives every process one (OMP_NUM_THREADS=1,
# rpg.backends.cpu.env_overrides: several processes share the cores, and the tiny model's products are too small
# to split). In the sync trainer this model's phases run one after another (the rollout decodes while the actor
# waits, then the actor computes while the rollout waits), each a product big enough for every core: with one
# thread the rollout server and the actor each kept one of the 2 cores busy and the other idle (the first step 193
# s against 131 s with both cores; docs/smol.md, Cost). Elsewhere (colocate_async,
# separate_async: rollout and training overlap) or with several ranks, the cores are shared out.
def omp_threads(cores: int, trainer_mode: str | None = None, world_size: int = 1) -> int:
    """Torch's threads for each of a SmolLM2 run's processes on ``cores`` cores: all of a rank's share
    (``cores // world_size``) in the sync trainer, else 1."""
    if (trainer_mode or "sync") != "sync":
        return 1
    return max(1, cores // max(1, world_size))


# Tokens per micro-batch on CPU. The CPU backend's actor computes a micro-batch as a prefix tree
# (rpg.backends.cpu.tree_engine): each distinct prefix once, so a group's prompt once for its responses and the
# prompts' common 155-token opening once for all. The more of a batch one micro-batch holds, the less it computes: a
# mini-batch of 2 prompts x 4 responses (about 1,750 tokens) is about 460 distinct ones, a rollout batch (about 7,000)
# about 1,300. So the update takes a whole mini-batch per micro-batch and the log-prob passes a whole rollout batch
# (budgets counted in the sequences' own tokens, at their longest: prompt and response limits).
def cpu_token_budgets(train_batch_size: int, n: int, mini_batch_size: int, max_response_length: int,
                      world_size: int = 1) -> tuple[int, int]:
    """(update, log-prob) tokens per micro-batch per rank: a rank's share of a mini-batch and of a rollout batch."""
    longest = MAX_PROMPT_LENGTH + max_response_length
    per_rank = lambda prompts: -(-prompts * n // max(1, world_size)) * longest  # noqa: E731
    return per_rank(mini_batch_size), per_rank(train_batch_size)


def check_world_size(world_size: int) -> None:
    """ValueError (one line) unless ``world_size`` ranks split a mini-batch evenly."""
    _check_world_size(world_size, MINI_BATCH_SIZE, ROLLOUT_N)


def smol_task_overrides(assets, steps: int = STEPS, test_freq: int = TEST_FREQ, world_size: int = 1,
                        trainer_mode: str | None = None, max_response_length: int = MAX_RESPONSE_LENGTH,
                        train_batch_size: int = TRAIN_BATCH_SIZE, n: int = ROLLOUT_N,
                        mini_batch_size: int = MINI_BATCH_SIZE, token_budget: int | None = None) -> list[str]:
    """Model, data, sizes, sampling and schedule of the SmolLM2 task (no algorithm settings); ``assets`` a
    ``rpg.smol.build.SmolAssets``; the sizes default to the CPU run's (``GPU_SIZES``: the GPU smoke run's, whose
    ``token_budget`` serves every pass; None: ``cpu_token_budgets``)."""
    base = tiny_task_overrides(assets, steps, test_freq, train_batch_size, n, VAL_N, mini_batch_size,
                               world_size, trainer_mode)
    update, log_prob = ((token_budget, token_budget) if token_budget is not None else
                        cpu_token_budgets(train_batch_size, n, mini_batch_size, max_response_length, world_size))
    longest = MAX_PROMPT_LENGTH + max_response_length  # a micro-batch holds any one sequence
    update, log_prob = max(update, longest), max(log_prob, longest)
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    return merge_overrides(base, [
        f"data.max_prompt_length={MAX_PROMPT_LENGTH}",
        f"data.max_response_length={max_response_length}",
        f"{a}.use_dynamic_bsz=True",
        f"{a}.ppo_max_token_len_per_gpu={update}",
        f"{r}.log_prob_use_dynamic_bsz=True",
        f"{r}.log_prob_max_token_len_per_gpu={log_prob}",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
        f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={log_prob}",
    ])
