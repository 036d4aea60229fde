"""verl 0.9.1's numeric and divisibility rules, applied in the driver before Ray (``rpg.verl.main``).

verl's own driver check (``verl.utils.config.validate_config``, which ``prepare_config`` calls after this)
builds the actor's config dataclass and checks the micro-batch settings, but several values that cannot
run reach the workers unchecked and fail there, a minute after Ray started (a NaN learning rate in
torch's optimizer, a mini-batch the workers cannot split), or run silently wrong (no step at all, a batch
padded with empty sequences). ``check_verl_rules`` refuses each with ONE line naming the key, its value
and what is allowed (``RPGConfigError``: exit 2, ``DRY_RUN=1`` too). Each rule cites the verl (or torch)
source line it restates; verl's own checks are not repeated here.

Sizes (verl 0.9.1, v1 trainer and engine workers):

* a step trains on ``data.train_batch_size`` prompts x ``rollout.n`` responses, split into mini-batches of
  ``actor.ppo_mini_batch_size`` x ``rollout.n`` responses (``trainer/ppo/v1/trainer_base.py:1829-1830``);
* each mini-batch is divided over the actor's data-parallel ranks, ``n_gpus / ulysses_sequence_parallel_size``
  (``workers/engine/fsdp/transformer_impl.py:651-652``), and each rank's share into micro-batches of
  ``ppo_micro_batch_size_per_gpu`` unless ``use_dynamic_bsz`` (``workers/engine/utils.py:123-128``).
"""

from __future__ import annotations

import difflib
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
    bad = [n for n in names if n not in allowed]
    if not bad:
        return None
    hints = []
    for n in bad:
        close = difflib.get_close_matches(str(n), allowed, n=1, cutoff=0.6)
        hints.append(f"{n!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return (f"{source}: {', '.join(hints)} {'is not a logger' if len(bad) == 1 else 'are not loggers'} verl knows; "
            f"allowed: {', '.join(allowed)}")


def check_verl_rules(cfg) -> None:
    """Every rule below, in this order; the first broken one raises ``RPGConfigError`` (one line)."""
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
    # verl/workers/config/actor.py:225 (applied there only without use_dynamic_bsz, but dynamic batch sizes
    # change only the micro-batches): a step holds at least one mini-batch. Not a multiple: verl's v1
    # trainer pads every batch with empty sequences up to one (trainer_base.py:582 -> :1619-1621), so the
    # last mini-batch of each step would be trained partly on padding.
    if batch < mini or batch % mini:
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
    if config_value(cfg, f"{A}.use_dynamic_bsz", False):
        _positive_int(cfg, f"{A}.ppo_max_token_len_per_gpu")
        _positive_int(cfg, f"{R}.log_prob_max_token_len_per_gpu", allow_none=True)
        return
    # verl/workers/engine/utils.py:125: a rank's share of a mini-batch (update) or of the whole batch
    # (log-probs) is split into micro-batches of exactly micro_batch_size_per_gpu
    micro = _positive_int(cfg, f"{A}.ppo_micro_batch_size_per_gpu", allow_none=True)
    if micro is not None and (mini * n // dp) % micro:
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
    config dataclass's ``__post_init__`` refuses (``omega_conf_to_dataclass``); the text may span lines."""
    from hydra.errors import InstantiationException
    from verl.utils.config import validate_config

    try:
        validate_config(config=cfg, use_reference_policy=use_reference_policy, use_critic=use_critic)
    except (AssertionError, ValueError, InstantiationException) as e:
        text = " ".join(str(e).split()) or type(e).__name__
        raise RPGConfigError(f"verl's validate_config refused the config: {text}") from None
