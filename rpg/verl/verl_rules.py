"""verl 0.9.1's numeric and divisibility rules, applied in the driver before Ray (``rpg.verl.main``).

Each rule guards a value that verl's own checks let through before Ray: ``validate_config``, which verl's
``main_ppo`` runs before ``ray.init`` (it builds the actor's and critic's config dataclasses), and the config
dataclasses its TaskRunner and workers build after Ray (``worker_dataclasses``, built in the driver by
``check_verl_config``). Such a value fails in a worker a minute after Ray started (a NaN learning rate, a mini-batch
the workers cannot split), or runs silently wrong (no step, a batch padded with empty sequences);
``check_verl_rules`` refuses each with ONE line naming the key, its value and what is allowed (exit 2, ``DRY_RUN=1``
too), each rule citing the verl or torch line it restates. What verl's checks refuse themselves is left to them
(``check_verl_config`` prints their refusal as one line): tests/verl/test_verl_rules_needed.py holds both sides.
Sizes: a step trains on ``data.train_batch_size`` prompts x ``rollout.n`` responses in mini-batches of
``actor.ppo_mini_batch_size`` x ``rollout.n`` (``trainer/ppo/v1/trainer_base.py:1829-1830``), each divided over
``n_gpus / ulysses_sequence_parallel_size`` data-parallel ranks (``workers/engine/fsdp/transformer_impl.py:651-652``)
and into micro-batches of ``ppo_micro_batch_size_per_gpu`` unless ``use_dynamic_bsz``
(``workers/engine/utils.py:123-128``).
"""

from __future__ import annotations

import difflib
import functools
import math
from typing import Any

from rpg.config import RPGConfigError, config_value

A, R, F = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"


def _fail(key: str, value: Any, expected: str):
    raise RPGConfigError(f"{key}={value!r} is invalid: expected {expected}")


def _positive_int(cfg, key: str, *, allow_none: bool = False) -> int | None:
    value = config_value(cfg, key, None)
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        _fail(key, value, "an integer >= 1" + (" or null" if allow_none else ""))
    return value


def _finite(cfg, key: str, *, strict: bool) -> float:
    value = config_value(cfg, key, None)
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not ok or value < 0 or (strict and value == 0):
        _fail(key, value, f"a finite number {'>' if strict else '>='} 0")
    return float(value)


# verl's default of the actor key it never reads (verl/trainer/config/actor/dp_actor.yaml:29)
UNREAD_GRAD_CLIP_DEFAULT = 1.0


def check_unread_grad_clip(cfg) -> None:
    """``actor.grad_clip`` is a field of verl's FSDPActorConfig (verl/workers/config/actor.py:308) that
    nothing reads: the engine clips with ``actor.optim.clip_grad`` (verl/workers/engine/fsdp/
    transformer_impl.py:806-811). A value other than verl's default and other than ``clip_grad`` would
    change nothing, so it is refused, naming the key that clips."""
    value = config_value(cfg, f"{A}.grad_clip", None)
    clip = config_value(cfg, f"{A}.optim.clip_grad", None)
    if value is not None and value != UNREAD_GRAD_CLIP_DEFAULT and value != clip:
        raise RPGConfigError(f"{A}.grad_clip={value!r} is not read by verl 0.9.1: gradient clipping is "
                             f"{A}.optim.clip_grad (now {clip!r}); set {A}.optim.clip_grad={value!r} instead")


def verl_loggers() -> tuple[str, ...]:
    """The tracking backends verl's ``Tracking`` accepts: its own list (``verl/utils/tracking.py``
    ``Tracking.supported_backend``, asserted in ``Tracking.__init__``) and ``tracking``, its deprecated alias."""
    from verl.utils.tracking import Tracking

    return (*Tracking.supported_backend, "tracking")


def logger_problem(value, source: str = "trainer.logger") -> str | None:
    """None if every name in ``value`` (a list or one name) is a verl tracking backend; else the one line
    (``source``: the key or environment variable that set it)."""
    names = [value] if isinstance(value, str) else list(value or [])
    allowed = verl_loggers()
    if not names:  # verl's Tracking then logs nothing: a run without metrics
        return f"{source}={value!r} names no logger: the run would log no metrics; allowed: {', '.join(allowed)}"
    bad = [n for n in names if n not in allowed]
    if not bad:
        return None
    hints = []
    for n in bad:
        close = difflib.get_close_matches(str(n), allowed, n=1, cutoff=0.6)
        hints.append(f"{n!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return (f"{source}: {', '.join(hints)} {'is not a logger' if len(bad) == 1 else 'are not loggers'} verl knows; "
            f"allowed: {', '.join(allowed)}")


def _one_of(cfg, key: str, allowed: tuple[str, ...], default: str) -> str:
    """The value of ``key``, refused unless one of ``allowed`` (with the closest one as a hint)."""
    value = config_value(cfg, key, default)
    if value not in allowed:
        close = difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.6)
        _fail(key, value, f"one of {', '.join(allowed)}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return value


SAMPLER = "trainer.v1.sampler"
OFF_POLICY_STRATEGIES = ("drop", "wait")  # verl/trainer/ppo/v1/replay_buffer.py:175
FILTER = "algorithm.filter_groups"


def check_v1_trainer(cfg, batch: int) -> None:
    """verl's v1 trainer and its replay buffer (``trainer_base._build_replay_buffer``: built in every mode, sync too),
    each rule one that verl asserts after Ray, in the TaskRunner or a worker, 30-50 s into a run. A custom sampler
    (``trainer.v1.sampler.custom_sampler``) is the user's own class: its arguments are left to it. ``batch``:
    ``data.train_batch_size``, an integer >= 1."""
    mode = config_value(cfg, "trainer.v1.trainer_mode", "sync")
    custom = config_value(cfg, f"{SAMPLER}.custom_sampler.path") and config_value(cfg, f"{SAMPLER}.custom_sampler.name")
    dapo = bool(config_value(cfg, f"{FILTER}.enable", False))
    if not custom:
        # replay_buffer.py:165-169: an integer > 0 (versions a sample may span) or null (no staleness control)
        _positive_int(cfg, f"{SAMPLER}.max_off_policy_threshold", allow_none=True)
        _one_of(cfg, f"{SAMPLER}.max_off_policy_strategy", OFF_POLICY_STRATEGIES, "drop")
        if dapo:
            # trainer_base.py:194-196 (_resolve_filter_groups_metric): the reward metric the groups are filtered by
            if not config_value(cfg, f"{FILTER}.metric"):
                _fail(f"{FILTER}.metric", config_value(cfg, f"{FILTER}.metric"), f"a reward metric name (e.g. acc) "
                      f"with {FILTER}.enable=True")
            # trainer_base.py:198-203: the metric is needed when the group finishes, before the replay buffer samples
            if config_value(cfg, "reward.reward_model.enable", False) and not config_value(
                    cfg, "reward.reward_model.enable_resource_pool", False):
                _fail(f"{FILTER}.enable", True, "False with a colocated reward model (reward.reward_model.enable=True, "
                      "enable_resource_pool=False), which scores after the replay buffer samples; or set "
                      "reward.reward_model.enable_resource_pool=True")
            # replay_buffer.py:195-197: sync DAPO's bound on the prompt batches in flight
            if mode == "sync":
                _positive_int(cfg, f"{FILTER}.max_inflight_gen_batches")
            # verl ignores it (trainer_base.py:205-211); the RPG trainers honour it (rpg.verl.refill_limit)
            limit = config_value(cfg, f"{FILTER}.max_num_gen_batches", 0)
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
                _fail(f"{FILTER}.max_num_gen_batches", limit, "an integer >= 0: the generation batches of "
                      "data.train_batch_size prompts DAPO's refills may dispatch per training batch (0: no limit)")
            check_filter_metric(cfg)
    # trainer_base.py:727-738 sets data.gen_batch_size=1 in the asynchronous modes, with DAPO and with
    # sync_refill_failed_groups; otherwise a step fetches train_batch_size prompts in whole gen_batch_size
    # fetches (trainer_base.py:1479-1489: a ValueError otherwise)
    exact = mode != "sync" or dapo or config_value(cfg, f"{SAMPLER}.sync_refill_failed_groups", False)
    gen = _positive_int(cfg, "data.gen_batch_size", allow_none=True)
    if not exact and gen is not None and batch % gen:
        _fail("data.gen_batch_size", gen, f"a divisor of data.train_batch_size={batch} (each step fetches its "
              "prompts in whole gen_batch_size batches) or null")
    # trainer_base.py:822-827: a standalone reward model's pool
    if config_value(cfg, "reward.reward_model.enable_resource_pool", False):
        _positive_int(cfg, "reward.reward_model.nnodes")
        _positive_int(cfg, "reward.reward_model.n_gpus_per_node")
    # trainer_base.py:290-298: nsys profiling of the workers needs their nsight options
    if config_value(cfg, "global_profiler.steps") is not None and config_value(cfg, "global_profiler.tool") == "nsys":
        key = "global_profiler.global_tool_config.nsys.worker_nsight_options"
        if config_value(cfg, key) is None:
            _fail(key, None, "the workers' nsight options (a mapping) with global_profiler.tool=nsys and "
                  "global_profiler.steps set")
    # trainer_base.py:130 reads the mode's parameter_sync_step (1 when unset), :535 asserts it divides the batch
    # (separate_async: rpg.verl.block_checks.check_separate_async, train_batch_size = k x ppo_mini_batch_size)
    if mode != "separate_async" and config_value(cfg, f"trainer.v1.{mode}.parameter_sync_step") is not None:
        k = _positive_int(cfg, f"trainer.v1.{mode}.parameter_sync_step")
        if batch % k:
            _fail(f"trainer.v1.{mode}.parameter_sync_step", k, f"a divisor of data.train_batch_size={batch}")


def unbounded_refills(cfg) -> str | None:
    """The driver's warning (one line) when DAPO's filter runs in verl's replay buffer without a limit on its refills
    (``algorithm.filter_groups.max_num_gen_batches=0``, ``rpg.verl.refill_limit``); None otherwise."""
    from rpg.verl.refill_limit import LIMIT_KEY, refill_book

    book = refill_book(cfg)
    if book is None or book.limit > 0:
        return None
    return (f"{LIMIT_KEY}=0 with {FILTER}.enable=True: no limit on DAPO's refills, so a step whose groups all score "
            f"alike (data too hard or too easy for the policy, a collapsed policy) samples without end; set "
            f"{LIMIT_KEY}=<n> to stop the run after n generation batches of refills per training batch")


# rpg.reward.compute_score's numeric keys (rpg/reward/scorer.py), which verl's reward managers put in each row's
# reward_extra_info; "reward", verl's own (replay_buffer.py:32, FILTER_GROUPS_REWARD_METRIC: the summed reward)
RPG_REWARD_METRICS = ("reward", "score", "acc", "scorer_failed")
OVERLONG = "reward.reward_kwargs.overlong_buffer_cfg"


def check_filter_metric(cfg) -> None:
    """DAPO's ``algorithm.filter_groups.metric`` is read from each finished trajectory's ``reward_extra_info``
    (replay_buffer.py:295-307: a ``RuntimeError`` at the first finished group when a row lacks it). With the recipe's
    ``rpg.reward`` those keys are known (plus the DAPO manager's overlong ones when it logs them); a user's own
    function's keys are not."""
    from rpg.reward.scored_sources import is_rpg_reward

    fn = "reward.custom_reward_function"
    if not is_rpg_reward(config_value(cfg, f"{fn}.path"), config_value(cfg, f"{fn}.name")):
        return
    allowed = RPG_REWARD_METRICS
    if (config_value(cfg, "reward.reward_manager.name") == "dapo" and config_value(cfg, f"{OVERLONG}.enable", False)
            and config_value(cfg, f"{OVERLONG}.log", False)):
        allowed += ("overlong_reward", "overlong")  # verl/experimental/reward_loop/reward_manager/dapo.py:114-117
    _one_of(cfg, f"{FILTER}.metric", allowed, "acc")


def check_overlong_buffer(cfg) -> None:
    """verl's DAPO reward manager with the overlong penalty on (verl/experimental/reward_loop/reward_manager/
    dapo.py:39-50, when the reward loop starts after Ray): a buffer of 1 to ``max_resp_len`` tokens."""
    if config_value(cfg, "reward.reward_manager.name") != "dapo" or not config_value(cfg, f"{OVERLONG}.enable", False):
        return
    top = _positive_int(cfg, "reward.reward_kwargs.max_resp_len")
    length = _positive_int(cfg, f"{OVERLONG}.len")
    if length > top:
        _fail(f"{OVERLONG}.len", length, f"at most reward.reward_kwargs.max_resp_len={top} (the buffer ends at the "
              "longest response)")


def check_hybrid_rollout(cfg) -> None:
    """The rollout replicas built inside the trainer's ranks (every mode: the hybrid engine; ``separate_async`` keeps
    them beside its standalone pool): verl/workers/engine_workers.py:655-661 asserts that the trainer's world size
    splits into replicas of TP x DP x PP ranks, in each actor worker, after Ray and the model load."""
    n_gpus = _positive_int(cfg, "trainer.n_gpus_per_node") * _positive_int(cfg, "trainer.nnodes")
    sizes = {f"{R}.{k}": _positive_int(cfg, f"{R}.{k}") for k in
             ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")}
    replica = math.prod(sizes.values())
    if n_gpus % replica:
        split = " x ".join(f"{k.rsplit('.', 1)[1]}={v}" for k, v in sizes.items())
        key = next(k for k, v in sizes.items() if v > 1)
        _fail(key, sizes[key], f"sizes whose replica ({split} = {replica} ranks) divides the trainer's "
              f"{n_gpus} ranks (trainer.nnodes x trainer.n_gpus_per_node): verl builds the rollout replicas inside "
              "the trainer's ranks")


def check_engine_worker_batches(cfg) -> None:
    """What verl's v1 engine worker asserts when it builds the actor (verl/workers/engine_workers.py:616-637),
    beyond verl's validate_config, which accepts the deprecated global micro-batch keys these workers never read."""
    dynamic = config_value(cfg, f"{A}.use_dynamic_bsz", False)
    rollout_dynamic = config_value(cfg, f"{R}.log_prob_use_dynamic_bsz", False)
    if bool(dynamic) != bool(rollout_dynamic):  # :616, one engine computes the log-probs and trains
        _fail(f"{R}.log_prob_use_dynamic_bsz", rollout_dynamic, f"{A}.use_dynamic_bsz={dynamic!r} (the actor's engine "
              "computes the log-probs too)")
    if dynamic:  # :633-634
        _positive_int(cfg, f"{A}.ppo_max_token_len_per_gpu")
        _positive_int(cfg, f"{R}.log_prob_max_token_len_per_gpu")
    else:  # :636-637
        for key, legacy in ((f"{A}.ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size"),
                            (f"{R}.log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size")):
            value = config_value(cfg, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                _fail(key, value, f"an integer >= 1 without {A}.use_dynamic_bsz (verl's v1 engine worker reads it; "
                      f"the deprecated {legacy} is not read)")
    if not config_value(cfg, f"{R}.checkpoint_engine.custom_backend_module"):
        # :679-687: each actor worker builds the checkpoint engine named here (separate_async: its own rules,
        # rpg.verl.block_checks.check_separate_async); a backend no verl module registers fails there
        _one_of(cfg, f"{R}.checkpoint_engine.backend", verl_checkpoint_backends(), "naive")


@functools.lru_cache(maxsize=1)
def verl_checkpoint_backends() -> tuple[str, ...]:
    """The backends verl's checkpoint engines register (``@CheckpointEngineRegistry.register("...")`` in the
    modules of ``verl.checkpoint_engine``), read from the installed verl's code: importing them needs each one's own
    packages (cupy, mooncake, ...), which only the nodes that use it have."""
    import ast
    import importlib.util
    from pathlib import Path

    folder = Path(importlib.util.find_spec("verl.checkpoint_engine").origin).parent
    names: dict[str, None] = {}
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "CheckpointEngineRegistry"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                names[node.args[0].value] = None
    return tuple(sorted(names))


def check_verl_rules(cfg) -> None:
    """Every rule below, in this order; the first broken one raises ``RPGConfigError`` (one line). Among them, what
    verl's v1 trainer asserts 30-50 s into a run: its replay buffer's ``trainer.v1.sampler`` and DAPO settings
    (``check_v1_trainer``), the rollout replicas inside the trainer's ranks (``check_hybrid_rollout``), the engine
    worker's batch keys and checkpoint engine (``check_engine_worker_batches``); ``check_verl_config`` then builds the
    config dataclasses verl builds only after Ray. The sweep of verl's asserts: docs/verl-integration.md."""
    check_unread_grad_clip(cfg)
    # verl/utils/tracking.py Tracking.__init__ asserts each trainer.logger name, in the TaskRunner after Ray
    if (why := logger_problem(config_value(cfg, "trainer.logger"))) is not None:
        raise RPGConfigError(why)
    # torch/optim/adam.py:59 (AdamW's constructor, called by verl/workers/config/optimizer.py:298
    # build_optimizer on each actor worker): "Invalid learning rate" unless 0 <= lr, which NaN fails;
    # an infinite lr turns every weight into inf/NaN at the first step.
    _finite(cfg, f"{A}.optim.lr", strict=False)
    # verl/workers/engine/fsdp/transformer_impl.py:806-811: the max norm of every clip_grad_norm_ call;
    # <= 0 zeroes or flips each gradient.
    _finite(cfg, f"{A}.optim.clip_grad", strict=True)
    # verl/trainer/ppo/v1/trainer_base.py:769-771 takes total_training_steps (when set) as the number of
    # steps, and :467 runs steps while global_steps <= it: 0 or less trains nothing and exits 0.
    _positive_int(cfg, "trainer.total_training_steps", allow_none=True)
    _positive_int(cfg, "trainer.total_epochs")
    # trainer_base.py:1829-1830: the mini-batch is ppo_mini_batch_size * rollout.n responses (0 for n=0)
    n = _positive_int(cfg, f"{R}.n")
    batch = _positive_int(cfg, "data.train_batch_size")
    mini = _positive_int(cfg, f"{A}.ppo_mini_batch_size")
    _positive_int(cfg, f"{A}.ppo_epochs")
    # Not a multiple: verl's v1 trainer pads every batch with empty sequences up to one (trainer_base.py:582 ->
    # :1619-1621), so the last mini-batch of each step would be trained partly on padding. (verl's ActorConfig.validate,
    # verl/workers/config/actor.py:225, refuses only batch < mini, and only without use_dynamic_bsz.)
    if batch % mini:
        _fail("data.train_batch_size", batch, f"a multiple of {A}.ppo_mini_batch_size={mini} (each step is split "
              "into whole mini-batches)")
    # verl/trainer/ppo/v1/trainer_base.py:819 builds a resource pool of [n_gpus_per_node] * nnodes ranks
    n_gpus = _positive_int(cfg, "trainer.n_gpus_per_node") * _positive_int(cfg, "trainer.nnodes")
    sp = int(config_value(cfg, f"{A}.ulysses_sequence_parallel_size", 1))
    sp = max(sp, int(config_value(cfg, f"{A}.fsdp_config.ulysses_sequence_parallel_size", 1)))
    dp = max(n_gpus // max(sp, 1), 1)
    # verl/workers/engine_workers.py:267-269: each mini-batch is divided evenly over the data-parallel ranks
    if (mini * n) % dp:
        _fail(f"{A}.ppo_mini_batch_size", mini, f"a value whose mini-batch of {mini} x rollout.n={n} responses "
              f"divides over the {dp} data-parallel ranks (n_gpus {n_gpus} / Ulysses size {sp})")
    check_v1_trainer(cfg, batch)
    check_hybrid_rollout(cfg)
    check_engine_worker_batches(cfg)
    check_overlong_buffer(cfg)
    if config_value(cfg, f"{A}.use_dynamic_bsz", False):
        return
    # verl/workers/engine/utils.py:125: a rank's share of a mini-batch (update) or of the whole batch
    # (log-probs) is split into micro-batches of exactly micro_batch_size_per_gpu
    micro = _positive_int(cfg, f"{A}.ppo_micro_batch_size_per_gpu")
    if (mini * n // dp) % micro:
        _fail(f"{A}.ppo_micro_batch_size_per_gpu", micro, f"a divisor of the {mini * n // dp} responses of a "
              f"mini-batch per data-parallel rank (ppo_mini_batch_size {mini} x rollout.n {n} / {dp} ranks)")
    for side in (R, F):
        key = f"{side}.log_prob_micro_batch_size_per_gpu"
        size = _positive_int(cfg, key, allow_none=True)
        if size is not None and (batch * n // dp) % size:
            _fail(key, size, f"a divisor of the {batch * n // dp} responses per data-parallel rank of a step "
                  f"(data.train_batch_size {batch} x rollout.n {n} / {dp} ranks)")


NORM_MODE = "seq-mean-token-sum-norm"


def set_norm_scale_factor(cfg, use_critic: bool) -> list[str]:
    """``loss_agg_mode=seq-mean-token-sum-norm`` divides each sequence's token sum by ``loss_scale_factor``; unset,
    verl's ``agg_loss`` divides by ``loss_mask.shape[-1]`` (verl/trainer/ppo/core_algos.py:1189-1193), which in the
    v1 trainer is the longest response of each *micro-batch* (samples stay unpadded until a micro-batch is padded
    to its own longest row: verl/utils/padding.py:113-119), so the update would depend on how rows fall into
    micro-batches and data-parallel ranks (measured: up to 0.71 relative). verl's docstring says the default is
    the response length (verl/workers/config/actor.py:124-125): the driver makes that true, writing
    ``data.max_response_length`` into every unset ``loss_scale_factor`` of a side in this mode (the actor; the
    critic when one is built: verl/workers/utils/losses.py:196). Returns one line per key it set (the driver
    prints them); a set value that is not a finite number > 0 raises ``RPGConfigError``."""
    from omegaconf import OmegaConf, open_dict

    notes = []
    sides = ["actor_rollout_ref.actor"] + (["critic"] if use_critic else [])
    for side in sides:
        mode, key = config_value(cfg, f"{side}.loss_agg_mode", None), f"{side}.loss_scale_factor"
        value = config_value(cfg, key, None)
        if value is not None:
            if mode == NORM_MODE:
                _finite(cfg, key, strict=True)
            continue
        if mode != NORM_MODE:
            continue
        length = _positive_int(cfg, "data.max_response_length")
        node = OmegaConf.select(cfg, side)
        with open_dict(node):
            node.loss_scale_factor = length
        notes.append(f"{side}.loss_agg_mode={NORM_MODE} with {key} unset: set to data.max_response_length={length} "
                     "(verl would divide by each micro-batch's longest response, so the update would depend on the "
                     f"micro-batch and data-parallel split; set {key} to choose another constant)")
    return notes


def check_verl_config(cfg, use_reference_policy: bool, use_critic: bool) -> None:
    """verl's own driver check (``verl.utils.config.validate_config``), its refusal as one line: it raises
    ``AssertionError`` or ``ValueError`` with verl's message, or Hydra's ``InstantiationException`` when a
    config dataclass's ``__post_init__`` refuses (``omega_conf_to_dataclass``); the text may span lines. Then the
    config dataclasses verl builds only after Ray (``worker_dataclasses``), each built here the same way."""
    from hydra.errors import InstantiationException
    from omegaconf.errors import OmegaConfBaseException
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    try:
        validate_config(config=cfg, use_reference_policy=use_reference_policy, use_critic=use_critic)
    except (AssertionError, ValueError, InstantiationException) as e:
        text = " ".join(str(e).split()) or type(e).__name__
        raise RPGConfigError(f"verl's validate_config refused the config: {text}") from None
    for key, node in worker_dataclasses(cfg, use_reference_policy):
        try:
            omega_conf_to_dataclass(node)
        except (AssertionError, ValueError, TypeError, NotImplementedError, InstantiationException,
                OmegaConfBaseException) as e:
            text = " ".join(str(e).split("\n")[0].split()) if isinstance(e, OmegaConfBaseException) else \
                " ".join(str(e).split())
            text = text or type(e).__name__
            raise RPGConfigError(f"{key}: verl's config dataclass refused it (after Ray, otherwise): {text}") from None


def worker_dataclasses(cfg, use_reference_policy: bool) -> list[tuple[str, object]]:
    """(key, config node) of each config dataclass verl builds after Ray from keys a user sets, whose
    ``__post_init__`` checks values that ``validate_config`` never builds:

    * ``actor_rollout_ref.rollout`` (``RolloutConfig``: the agent loop, every rollout replica and actor worker,
      verl/workers/engine_workers.py:651), its ``checkpoint_engine`` (trainer_base.py:381, engine_workers.py:679);
    * ``actor_rollout_ref.ref`` with a reference model, after the worker's renames of its log-prob keys
      (engine_workers.py:531-538, then ``ActorConfig`` at :553);
    * ``trainer.v1.separate_async.hybrid_rollout`` in that mode (trainer_separate_async.py:86).

    ``actor_rollout_ref.model`` (``HFModelConfig``) is not built here: it loads the model's files
    (``rpg.verl.input_paths`` checks the path)."""
    from omegaconf import OmegaConf, open_dict

    nodes = [("actor_rollout_ref.rollout", OmegaConf.select(cfg, R)),
             ("actor_rollout_ref.rollout.checkpoint_engine", OmegaConf.select(cfg, f"{R}.checkpoint_engine"))]
    if use_reference_policy:
        ref = OmegaConf.create(OmegaConf.to_container(OmegaConf.select(cfg, F), resolve=True))
        with open_dict(ref):  # engine_workers.py:531-538, as the worker does it
            ref.ppo_mini_batch_size = config_value(cfg, f"{A}.ppo_mini_batch_size")
            ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
            ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
            ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
            ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
        nodes.append((F, ref))
    if config_value(cfg, "trainer.v1.trainer_mode", "sync") == "separate_async":
        nodes.append(("trainer.v1.separate_async.hybrid_rollout",
                      OmegaConf.select(cfg, "trainer.v1.separate_async.hybrid_rollout")))
    return [(key, node) for key, node in nodes if node is not None and "_target_" in node]
