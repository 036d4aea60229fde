"""What makes a run repeat itself, and how far behind its sampler was: ``RunOrderMixin``, hooks of the RPG trainers.

verl names each prompt by a random ``uuid4`` and its replay buffer returns a batch in the order the rollouts
finished, so mini-batches, sums and validation metrics follow completion order. The mixin names the n-th prompt
fetched at a step ``prompt_uid(step, n)`` and orders a batch by (step, n, sample, output) (``sample_order``), and
hands verl's validation metrics their samples in a canonical order (``canonical_validation``): the same order, and
equal metrics for equal samples, in every run. ``LagBook`` counts how many weight versions and optimizer updates
each sample's weights were behind π_old: ``training/rpg/lag_{versions,updates}_{mean,max}`` (0 in sync), and with a
stale sampler ``actor/rpg/behavior_ess`` and ``actor/rpg/behavior_log_w_m2`` over the step's tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

import transfer_queue as tq
from tensordict import NonTensorStack

from rpg.math.behavior import add_step_sums, behavior_step_metrics, behavior_step_sums
from rpg.verl.checkpoints import LAG_BOOK_FILE

PROMPT_UID = re.compile(r"p(\d+)-(\d+)")


def prompt_uid(step: int, n: int) -> str:
    """The uid of the n-th prompt fetched at ``step`` (no ``_``: verl's keys are ``{uid}_{sample}_{output}``), in place
    of verl's random ``uuid4`` (``trainer_base.py:1476``): its replay buffer returns a batch in the order the
    rollouts finished (``replay_buffer.py:394-406``) and the mini-batches are consecutive slices of it
    (``engine_workers.py:271-277``)."""
    return f"p{step}-{n}"


def sample_order(key: str) -> tuple[int, int, int, int]:
    """Sort key of a trajectory key ``{uid}_{sample}_{output}`` whose uid is a ``prompt_uid``."""
    uid, sample, output = key.rsplit("_", 2)
    match = PROMPT_UID.fullmatch(uid)
    if match is None:
        raise ValueError(f"trajectory key {key!r}: its prompt uid is not one of the RPG trainer's (p<step>-<n>), so "
                         "the batch has no order independent of rollout completion")
    return int(match[1]), int(match[2]), int(sample), int(output)


def sorted_positions(keys: list[str]) -> list[int]:
    """Positions of ``keys`` in ``sample_order``."""
    return sorted(range(len(keys)), key=lambda i: sample_order(keys[i]))


def _value_key(value) -> tuple[str, str]:
    return type(value).__name__, repr(value)


def canonical_validation(data_sources: list, sample_uids: list, infos: dict[str, list], turns: list):
    """The arguments of verl's ``_val_metrics_update`` reordered: prompts (uids) by (data source, their sorted
    samples), each prompt's samples by their values (every field of ``infos``), so the order no longer depends
    on which rollout finished first. Uids are random per run (verl's ``_validate``), so they take no part in the
    order; prompts whose samples are equal give equal per-prompt metrics, whatever their relative order. (verl
    collects them in completion order, ``trainer_base.py:1076-1118``, and its bootstrap ``best@N``/``maj@N`` draw by
    position with a fixed seed, ``metric_utils.py:835-840``.)"""
    n = len(sample_uids)
    names = sorted(infos)
    if any(len(infos[k]) != n for k in names) or len(data_sources) != n or (turns and len(turns) != n):
        raise ValueError("validation samples: data sources, uids, reward fields and turns differ in length")

    def sample_key(i):
        return tuple(_value_key(infos[k][i]) for k in names) + ((_value_key(turns[i]),) if turns else ())

    groups: dict[tuple, list[int]] = {}
    for i in range(n):
        groups.setdefault((str(data_sources[i]), str(sample_uids[i])), []).append(i)
    ordered = sorted(((src, sorted(sample_key(i) for i in members)), sorted(members, key=sample_key))
                     for (src, _), members in groups.items())
    order = [i for _, members in ordered for i in members]
    pick = lambda seq: [seq[i] for i in order]  # noqa: E731
    return pick(data_sources), pick(sample_uids), {k: pick(v) for k, v in infos.items()}, pick(turns) if turns else []


class LagBook:
    """Optimizer updates done at each published weight version, and the lag of the samples a step trains on.

    Version v = the weights after step v, synced to the rollout at its end; a sample generated with version v and
    trained at step g, whose π_old is version g-1, is ``g-1-v`` versions and ``updates(g-1) - updates(v)`` optimizer
    updates behind π_old."""

    def __init__(self, version: int):
        self.updates = 0  # optimizer updates since ``version`` (the run's first weights in this process)
        self.at_version = {version: 0}

    def add_updates(self, n: int) -> None:
        self.updates += n

    def publish(self, version: int) -> None:
        """The weights after ``self.updates`` updates become ``version`` (the step's end)."""
        self.at_version[version] = self.updates

    def state_dict(self) -> dict:
        """What a checkpoint keeps (``LAG_BOOK_FILE``): a resumed run trains samples generated before the stop
        (an asynchronous run's replay buffer), whose versions this process never published."""
        return {"updates": self.updates, "at_version": {str(v): n for v, n in sorted(self.at_version.items())}}

    @classmethod
    def from_state(cls, state: dict, version: int) -> LagBook:
        """The book saved at ``version`` (the checkpoint's step); ValueError if it does not end there."""
        book = cls(version)
        book.updates = int(state["updates"])
        book.at_version = {int(v): int(n) for v, n in state["at_version"].items()}
        if max(book.at_version, default=None) != version or book.at_version[version] != book.updates:
            raise ValueError(f"{LAG_BOOK_FILE}: the weight versions end at {max(book.at_version, default=None)} with "
                             f"{book.at_version.get(version)} updates, not at the checkpoint's step {version} with "
                             f"{book.updates}")
        return book

    def lags(self, step: int, versions: list[int]) -> tuple[list[int], list[int]]:
        """(versions behind, updates behind) pi_old of samples generated with ``versions`` and trained at ``step``."""
        old = step - 1
        missing = sorted({v for v in versions if v not in self.at_version} | ({old} - set(self.at_version)))
        if missing:
            raise ValueError(f"step {step}: samples generated with weight versions {missing} this process never "
                             f"published (known: {sorted(self.at_version)}); their lag cannot be counted")
        return [old - v for v in versions], [self.at_version[old] - self.at_version[v] for v in versions]


BATCH_DIGEST_METRIC = "training/rpg/batch_digest"


def batch_digest(keys) -> float:
    """Which samples a step trained on, as a number two runs' metrics compare: the digest (``digest_metric``) of
    the step's sample keys in ``sample_order`` (each the n-th prompt fetched at a step, its sample and output). In
    the sync trainer the seed decides them; in the asynchronous modes timing does, and this records it."""
    from rpg.backends.weight_digest import digest_metric

    ordered = sorted(keys, key=sample_order)
    return digest_metric(hashlib.sha256("\n".join(ordered).encode()).hexdigest())


def lag_metrics(versions_behind, updates_behind) -> dict[str, float]:
    """``training/rpg/lag_{versions,updates}_{mean,max}`` over a step's samples (none: nothing): the mean over its
    equal-sized mini-batches of their mean lag, and the largest lag any mini-batch had."""
    if not versions_behind:
        return {}
    out = {}
    for name, values in (("versions", versions_behind), ("updates", updates_behind)):
        out[f"training/rpg/lag_{name}_mean"] = sum(values) / len(values)
        out[f"training/rpg/lag_{name}_max"] = float(max(values))
    return out


class RunOrderMixin:
    """The run order and the lag (module docstring); a base of ``rpg.verl.trainer.RPGTrainerMixin``, before verl's
    trainer."""

    _lag_book: LagBook | None = None  # set when the first weights are published (on_init_end)
    _uid_step, _uid_count = None, 0  # the step the last prompt was fetched at, prompts fetched at it so far
    _step_lags: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())  # this step's samples: versions, updates behind
    _step_behavior: dict | None = None  # this step's rpg.math.behavior.STEP_SUMS (a stale sampler only)

    def _fetch_one_gen_batch(self):
        """verl's fetch, with uids from the dataloader's order (``prompt_uid``) instead of random ones."""
        batch = super()._fetch_one_gen_batch()
        if self._uid_step != self.global_steps:
            self._uid_step, self._uid_count = self.global_steps, 0
        n = self._uid_count
        batch["uid"] = NonTensorStack(*(prompt_uid(self.global_steps, n + i) for i in range(len(batch))))
        self._uid_count += len(batch)
        return batch

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        """The sampled batch in ``sample_order``, not in the order its rollouts finished, before verl's balancing
        (deterministic given its input: ``get_seqlen_balanced_partitions`` sorts each partition)."""
        batch.reorder(sorted_positions(batch.keys))
        return super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)

    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
                            expected_acc_counts=None):
        """verl's validation metrics of the samples in ``canonical_validation``'s order."""
        data_sources, sample_uids, reward_extra_infos_dict, sample_turns = canonical_validation(
            data_sources, sample_uids, reward_extra_infos_dict, sample_turns)
        return super()._val_metrics_update(data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
                                           expected_acc_counts=expected_acc_counts)

    def on_init_end(self):
        """The book of the resumed checkpoint (``_resumed_folder``, ``rpg.verl.trainer``), or a new one at this
        version: verl's on_init_end publishes these weights as it. A checkpoint without the book (saved before
        it was kept) starts one at its step: enough in sync mode, where every sample comes from the newest
        weights; the driver refuses to resume an asynchronous run from such a checkpoint
        (``rpg.verl.checkpoints.async_problem``)."""
        folder = self._resumed_folder()
        path = None if folder is None else os.path.join(folder, LAG_BOOK_FILE)
        if path is not None and os.path.exists(path):
            with open(path) as f:
                self._lag_book = LagBook.from_state(json.load(f), self.global_steps)
        else:
            self._lag_book = LagBook(self.global_steps)
        super().on_init_end()

    def _save_checkpoint(self):
        """verl's save, then the lag book beside it (``LAG_BOOK_FILE``; before the completion marker, which
        ``rpg.verl.trainer`` writes after this returns, so its digest is checked like every file's), written to a
        temporary name and renamed: a save killed meanwhile leaves no partial book under its name."""
        result = super()._save_checkpoint()
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        if os.path.isdir(folder) and self._lag_book is not None:  # None: a trainer that never published weights
            final = os.path.join(folder, LAG_BOOK_FILE)
            with open(final + ".tmp", "w") as f:
                json.dump(self._lag_book.state_dict(), f)
            os.replace(final + ".tmp", final)
        return result

    def step(self, metrics: dict, timing_raw: dict):
        self._step_lags, self._step_behavior = ((), ()), None
        batch = super().step(metrics, timing_raw)
        metrics.update(lag_metrics(*self._step_lags))
        metrics[BATCH_DIGEST_METRIC] = batch_digest(batch.keys)  # the samples the step trained on
        if self._step_behavior is not None:
            metrics.update({f"actor/{k}": v for k, v in behavior_step_metrics(self._step_behavior).items()})
        self._lag_book.publish(self.global_steps)  # verl's on_step_end syncs these weights as this version
        return batch

    def _compute_old_log_prob(self, batch, metrics: dict):
        """verl's pi_old, then this mini-batch's lag (from the weight version each sample was generated with, verl's
        ``min_global_steps`` tag) and, with a stale sampler, its behaviour-weight sums."""
        batch = super()._compute_old_log_prob(batch, metrics)
        versions = [tag["min_global_steps"] for tag in batch.tags if not tag.get("is_padding", False)]
        behind = self._lag_book.lags(self.global_steps, versions)
        self._step_lags = (self._step_lags[0] + tuple(behind[0]), self._step_lags[1] + tuple(behind[1]))
        if self.trainer_mode != "sync":  # a stale sampler: the driver requires rollout log-probs then
            fields = ["old_log_probs", "rollout_log_probs", "response_mask"]
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                   select_fields=fields).to_padded_tensor()
            sums = behavior_step_sums(data["old_log_probs"], data["rollout_log_probs"], data["response_mask"],
                                      self.rpg.loss.log_ratio_guard)
            self._step_behavior = add_step_sums(self._step_behavior, sums)
        return batch

    def _update_actor(self, batch, metrics: dict):
        """verl's actor update, its optimizer updates counted as verl's loop runs them (``train_mini_batch``: the
        batch in slices of ``ppo_mini_batch_size`` x n sequences, ``ppo_epochs`` times)."""
        batch = super()._update_actor(batch, metrics)
        actor = self.config.actor_rollout_ref.actor
        self._lag_book.add_updates(len(batch) // (actor.ppo_mini_batch_size * self.config.actor_rollout_ref.rollout.n)
                                   * actor.ppo_epochs)
        return batch
