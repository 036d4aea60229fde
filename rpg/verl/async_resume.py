"""What an asynchronous run (colocate_async, separate_async) takes back from its checkpoint's replay buffer:
``AsyncResumeMixin``, a base of ``rpg.verl.trainer.RPGTrainerMixin``.

verl saves TransferQueue with each checkpoint of an asynchronous run and loads it on resume
(``trainer_base.py:900-908,1004-1008``). Its training partition then holds, by the prompt tags
(``replay_buffer.py``, "GRPO group sampling control"):

* finished groups (dispatched, generated, not yet trained): kept as they are, each sample with its behaviour
  log-probs μ (``rollout_log_probs``), the weight version that generated it (``min_global_steps``) and its prompt's
  dispatch step (``global_steps``, which the staleness bound ``max_off_policy_threshold`` counts from); the RPG
  loss weights them by π_old/μ like any stale sample;
* prompts in flight (``pending``, ``running``): verl re-issues them at the resumed step, its first
  (``_reissue_inflight_prompts``, ``trainer_base.py:910-946``): their partial samples are discarded and regenerated
  with the resumed weights, and they count as dispatched then;
* the samples of the checkpoint's own step: verl saves a step's checkpoint before it clears the step's batch from
  TransferQueue (``fit``, ``trainer_base.py:480-508``), after ``sample`` removed their prompt keys
  (``_materialize_batch``): trained already, never sampled again (no prompt key), they would stay in memory for the
  whole run. ``_load_checkpoint`` clears them.

Every resume of an asynchronous run prints one line (``resume_line``) with these counts.

Two switches for the resume tests (tests/e2e/test_async_kill_resume_e2e.py), off unless their variable is set, so that
where a run stops and what its checkpoint holds follow from the run, not from the machine's speed:

* ``RPG_TEST_HOLD_AT_GENERATION=<step>:<file>``: at that step's first sampling (its prompts dispatched, the trainer
  about to wait on their generation, the previous step's checkpoint written) the trainer writes ``file`` and waits
  for ever: the test kills the driver then;
* ``RPG_TEST_SAVE_FINISHED=1``: before each checkpoint the trainer waits until no prompt group is in flight, so that
  every group dispatched before the save is kept across a resume (the HF rollout generates through the save);
* ``RPG_TEST_HOLD_IN_SAVE=<step>:<file>`` (tests/e2e/test_killed_save_e2e.py): in that step's save, once verl's own
  save has returned (its tracker names the step) and before the recipe's files and marker, the trainer writes ``file``
  and waits for ever: the test kills the driver inside the save.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field

import transfer_queue as tq

PARTITION = "train"
IN_FLIGHT = ("pending", "running")
HOLD_ENV, FINISHED_ENV, SAVE_HOLD_ENV = "RPG_TEST_HOLD_AT_GENERATION", "RPG_TEST_SAVE_FINISHED", "RPG_TEST_HOLD_IN_SAVE"


@dataclass
class QueueCensus:
    """The training partition after a restore, counted from its tags (``census``)."""

    finished: set[str] = field(default_factory=set)  # prompt uids whose groups are complete, not yet trained
    in_flight: set[str] = field(default_factory=set)  # prompt uids pending or running (verl re-issues them)
    samples: dict[str, int] = field(default_factory=dict)  # finished uid -> its samples kept
    versions: set[int] = field(default_factory=set)  # min_global_steps of the samples kept
    dispatched: set[int] = field(default_factory=set)  # global_steps of the finished prompts
    trained: list[str] = field(default_factory=list)  # trajectory keys without a prompt key: trained before the save


def census(items: dict[str, dict]) -> QueueCensus:
    """Count one partition's ``{key: tag}`` (``tq.kv_list(PARTITION)[PARTITION]``): prompt keys carry
    ``is_prompt``, trajectory keys are ``{uid}_{session}_{index}``."""
    out = QueueCensus()
    prompts = {key: tag for key, tag in items.items() if tag.get("is_prompt", False)}
    for uid, tag in prompts.items():
        if tag.get("status") in IN_FLIGHT:
            out.in_flight.add(uid)
        else:  # finished or failure: sampleable (or evicted) as before the stop
            out.finished.add(uid)
            out.dispatched.add(int(tag["global_steps"]))
    for key, tag in items.items():
        if key in prompts:
            continue
        uid = key.split("_", 1)[0]
        if uid not in prompts:
            out.trained.append(key)
        elif uid in out.finished:
            out.samples[uid] = out.samples.get(uid, 0) + 1
            if "min_global_steps" in tag:
                out.versions.add(int(tag["min_global_steps"]))
    return out


def hold_point(value: str, name: str = HOLD_ENV) -> tuple[int, str] | None:
    """``HOLD_ENV``'s (or ``name``'s) ``<step>:<file>`` (None when unset)."""
    if not value.strip():
        return None
    step, sep, marker = value.partition(":")
    if not (sep and step.strip().isdigit() and int(step) > 0 and marker.strip()):
        raise ValueError(f"{name}={value!r}: expected <step>:<file>, step a positive integer")
    return int(step), marker.strip()


def _hold(marker: str, step: int, where: str) -> None:
    with open(marker, "w") as f:
        json.dump({"step": step, "pid": os.getpid()}, f)
    print(f"rpg: test switch: holding step {step} {where}", flush=True)
    threading.Event().wait()  # until the test's kill ends the run


def resume_line(folder: str, step: int, c: QueueCensus) -> str:
    """The one line a resumed asynchronous run prints (``rpg: `` before it)."""
    kept = sum(c.samples.values())
    return (f"resumed the replay buffer of {folder}: {len(c.finished)} finished prompt groups kept ({kept} samples "
            f"with their behaviour log-probs mu, generated with weight versions {sorted(c.versions)}, dispatched at "
            f"steps {sorted(c.dispatched)}); {len(c.in_flight)} prompts in flight re-issued at step {step + 1} "
            f"(their partial samples discarded and regenerated with the resumed weights); {len(c.trained)} samples "
            f"of step {step}'s batch, trained before the save, cleared")


class AsyncResumeMixin:
    """``_load_checkpoint``: verl's, then, in an asynchronous mode that resumed, the samples trained before the save
    cleared from TransferQueue and ``resume_line`` printed (module docstring)."""

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        if self.trainer_mode == "sync" or self.global_steps == 0:
            return result
        items = (tq.kv_list(PARTITION) or {}).get(PARTITION, {})
        found = census(items)
        if found.trained:
            tq.kv_clear(keys=found.trained, partition_id=PARTITION)
        print(f"rpg: {resume_line(self._resumed_folder(), self.global_steps, found)}", flush=True)
        return result

    def on_sample_begin(self):
        super().on_sample_begin()
        point = hold_point(os.environ.get(HOLD_ENV, ""))
        if point is not None and point[0] == self.global_steps and getattr(self, "local_trigger_step", 0) == 0:
            _hold(point[1], self.global_steps, f"before its sampling ({HOLD_ENV})")

    def _save_checkpoint(self):
        if os.environ.get(FINISHED_ENV, "") == "1" and self.trainer_mode != "sync":
            while census((tq.kv_list(PARTITION) or {}).get(PARTITION, {})).in_flight:
                time.sleep(0.2)  # a poll of the replay buffer: the rollout finishes the groups meanwhile
        result = super()._save_checkpoint()  # verl's: its tracker written last
        point = hold_point(os.environ.get(SAVE_HOLD_ENV, ""), SAVE_HOLD_ENV)
        if point is not None and point[0] == self.global_steps:
            _hold(point[1], self.global_steps, f"inside its save, after verl's tracker ({SAVE_HOLD_ENV})")
        return result
