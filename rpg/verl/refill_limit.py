"""DAPO's limit on generation, ``algorithm.filter_groups.max_num_gen_batches``, in the RPG trainers
(``RefillLimitMixin``, a base of ``rpg.verl.trainer.RPGTrainerMixin``).

verl 0.9.1's v1 replay buffer replaces every group DAPO's filter drops (all responses scored alike) with a fresh
prompt through the trainer's ``_add_prompts_to_generate`` (its ``refill_fn``, ``trainer_base.py:161``), without a
limit: it ignores the key with a warning (``trainer_base.py:205-211``), so a step whose groups all score alike
samples for ever (sync: ``replay_buffer.py:449-490``; colocate_async and separate_async: ``:572-584``).

* **A generation batch** is ``data.train_batch_size`` prompts (verl's unit for ``max_inflight_gen_batches`` too;
  verl dispatches DAPO's prompts one by one, ``data.gen_batch_size=1``).
* **The count**: the prompts ``_add_prompts_to_generate`` dispatches while ``step`` samples one training batch (in
  separate_async its ``parameter_sync_step`` mini-batches and the wait before them): the refills. The step's own
  batch (``prepare_step``) and the asynchronous modes' warm-up (``on_train_begin``) are not refills. Each ``step``
  starts at 0.
* **The limit**: the refills of one training batch may dispatch up to ``max_num_gen_batches`` generation batches;
  the refill that would go beyond raises ``RefillLimitReached`` instead (nothing more is dispatched) and the driver
  ends the run with one line (``rpg.verl.main``). 0 is no limit. DAPO's recipe counts its first generation batch
  too; here a step's own batch is not counted, since in the asynchronous modes earlier steps dispatched it.

verl's refill call carries a number of prompts, not why their groups went, so every refill counts: DAPO's, a
failed rollout's (sync: with ``trainer.v1.sampler.sync_refill_failed_groups``) and, in the asynchronous modes with
``max_off_policy_strategy=drop``, a stale group's. Per step metric, with the filter on:
``training/rpg/refill_gen_batches`` (the refilled prompts / ``data.train_batch_size``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rpg.config import config_value

FILTER = "algorithm.filter_groups"
LIMIT_KEY = f"{FILTER}.max_num_gen_batches"
METRIC = "training/rpg/refill_gen_batches"


class RefillLimitReached(RuntimeError):
    """The refills of a training batch reached ``max_num_gen_batches``; the message is the stop line's reason
    (``rpg: <message>; Ray shut down; ...``)."""


@dataclass
class RefillBook:
    """The refilled prompts of the training batch being sampled (``step``: None between steps)."""

    limit: int  # max_num_gen_batches: generation batches of refills per training batch; 0: no limit
    batch: int  # data.train_batch_size: the prompts of one generation batch
    metric: str = "acc"  # what DAPO's filter compares within a group (the stop line names it)
    stale_too: bool = False  # stale groups are refilled too (asynchronous mode, max_off_policy_strategy=drop)
    step: int | None = None
    prompts: int = 0

    def new_batch(self, step: int) -> None:
        self.step, self.prompts = step, 0

    def close(self) -> None:
        self.step = None

    def add(self, n: int) -> None:
        """Count a refill of ``n`` prompts, or raise ``RefillLimitReached`` if it would take the training batch's
        refills beyond ``limit`` x ``batch`` prompts. Outside a step (the warm-up): not a refill, not counted."""
        if self.step is None:
            return
        if self.limit > 0 and self.prompts + n > self.limit * self.batch:
            raise RefillLimitReached(self.reason(n))
        self.prompts += n

    @property
    def gen_batches(self) -> float:
        return self.prompts / self.batch

    def reason(self, asked: int) -> str:
        stale = (" (stale groups' refills count too: trainer.v1.sampler.max_off_policy_strategy=drop)"
                 if self.stale_too else "")
        count = f"{self.prompts} prompts refilled = {self.gen_batches:g} x {self.batch}, and {asked} more asked for"
        return (f"stopped at step {self.step}: DAPO's dynamic sampling needed more than {LIMIT_KEY}={self.limit} "
                f"generation batches of data.train_batch_size={self.batch} prompts to fill one training batch "
                f"({count}){stale}: "
                f"its filter drops a group whose responses all have the same {self.metric}, and nearly every group "
                "scored alike (the data is too hard or too easy for the policy, or the policy collapsed); raise "
                f"{LIMIT_KEY} or set it to 0 for no limit")


def refill_book(config) -> RefillBook | None:
    """The book of a run with DAPO's filter in verl's own replay buffer; None otherwise (the filter off, or a
    ``trainer.v1.sampler.custom_sampler``, which owns its filtering and refills: ``trainer_base.py:158-163``)."""
    sampler = "trainer.v1.sampler"
    if not config_value(config, f"{FILTER}.enable", False):
        return None
    custom = config_value(config, f"{sampler}.custom_sampler", None) or {}
    if custom.get("path") and custom.get("name"):
        return None
    stale_too = (config_value(config, "trainer.v1.trainer_mode", "sync") != "sync"
                 and config_value(config, f"{sampler}.max_off_policy_threshold") is not None
                 and config_value(config, f"{sampler}.max_off_policy_strategy", "drop") == "drop")
    return RefillBook(limit=int(config_value(config, LIMIT_KEY, 0)),
                      batch=int(config_value(config, "data.train_batch_size")),
                      metric=str(config_value(config, f"{FILTER}.metric", "reward")), stale_too=stale_too)


def refill_limit_reason(err: BaseException) -> str | None:
    """The reason of a ``RefillLimitReached`` in ``err``'s chain, else None. Ray's ``RayTaskError`` from the TaskRunner
    holds it as ``cause`` and is an instance of its class too, whose text is the remote traceback: the exception
    raised here is the one of exactly this class."""
    seen, hops = err, 0
    while seen is not None and hops < 10:
        if type(seen) is RefillLimitReached:
            return str(seen)
        seen, hops = getattr(seen, "cause", None) or seen.__cause__, hops + 1
    return None


class RefillLimitMixin:
    """Trainer hooks (module docstring): ``step`` opens the count of a training batch, ``_add_prompts_to_generate``
    (verl's ``refill_fn``) counts each refill before dispatching it."""

    _refills: RefillBook | None = None  # None: no filter in verl's replay buffer, nothing to count

    def __init__(self, config):
        super().__init__(config)
        self._refills = refill_book(config)

    def _add_prompts_to_generate(self, num_prompts: int) -> int:
        if self._refills is not None:
            self._refills.add(num_prompts)  # raises instead of dispatching beyond the limit
        return super()._add_prompts_to_generate(num_prompts)

    def step(self, metrics: dict, timing_raw: dict):
        book = self._refills
        if book is None:
            return super().step(metrics, timing_raw)
        book.new_batch(self.global_steps)
        try:
            batch = super().step(metrics, timing_raw)
        finally:
            book.close()
        metrics[METRIC] = book.gen_batches
        return batch
