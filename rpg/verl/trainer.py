"""The RPG trainers: verl 0.9.1's v1 trainers with RPG's reference schedule, schedule-free switches and checkpoints.

``RPGTrainer``, ``RPGTrainerColocateAsync`` and ``RPGTrainerSeparateAsync`` are verl's ``PPOTrainerSync``,
``PPOTrainerColocateAsync`` and ``PPOTrainerSeparateAsync`` with ``RPGTrainerMixin``'s hooks, each an overridable
method of verl's v1 ``PPOTrainer`` (no verl file is patched), ``rpg.verl.sample_order_and_lag.RunOrderMixin``'s and
``rpg.verl.refill_limit.RefillLimitMixin``'s (DAPO's refills within ``max_num_gen_batches``). The
reference schedule: ``periodic`` copies actor -> reference when ``global_steps % K == 0``; ``kl_threshold`` keeps
ema = d·ema + (1 − d)·ref_kl, ref_kl the token-mean k3 estimate of KL(π_old‖π_ref), and copies (ema := 0) when
ema > κ. The metrics they log: docs/verl-integration.md#metrics-per-step-besides-verls-usual-ones.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil

import ray
import torch
import transfer_queue as tq

from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.debug import marked_timer

from rpg.math.behavior import behavior_weights
from rpg.math.formulas import k3
from rpg.metrics_log.history import STEP_RECORD, write_step_record
from rpg.verl.checkpoint_digests import REFERENCE_DIR, join_reports
from rpg.verl.checkpoints import recorded_settings, write_marker
from rpg.config import parse_rpg_settings
from rpg.verl.async_resume import AsyncResumeMixin
from rpg.verl.refill_limit import RefillLimitMixin
from rpg.verl.sample_order_and_lag import LAG_BOOK_FILE, RunOrderMixin
from rpg.verl.validation import SamplesPerSource, unscored_by_source, unscored_metrics, unscored_warnings
from rpg.verl.worker import RPGActorRolloutRefWorker, RPGDetachActorWorker

logger = logging.getLogger(__name__)

REFERENCE_STATE_FILE = "rpg_reference.json"
REFERENCE_WEIGHTS_DIR = REFERENCE_DIR
_ACTOR_ROLES = (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor, Role.RefPolicy)


def k3_token_kl_parts(old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, mask: torch.Tensor,
                      weights: torch.Tensor | None = None) -> tuple[float, float]:
    """(sum(m*k3), sum(m)) of the k3 estimate of KL(pi_old || pi_ref) (>= 0 per token), m the mask, times the
    weights b = pi_old/mu when given: the parts ``kl_of_parts`` turns into one estimate over several batches."""
    log_r = (ref_log_prob - old_log_prob).clamp(-20.0, 20.0)
    kl = k3(torch.exp(log_r), log_r)
    m = mask.to(kl.dtype)
    if weights is not None:
        m = m * weights.to(kl.dtype)
    return float((kl * m).sum()), float(m.sum())


def kl_of_parts(parts: list[tuple[float, float]]) -> float:
    """sum of the numerators / sum of the denominators (0 when no token counts)."""
    num, den = sum(p[0] for p in parts), sum(p[1] for p in parts)
    return num / den if den > 0 else 0.0


def k3_token_kl(old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, mask: torch.Tensor,
                weights: torch.Tensor | None = None) -> float:
    """Token-mean k3 estimate of KL(pi_old || pi_ref) from samples of pi_old, or, given ``weights`` b = pi_old/mu,
    from samples of a stale sampler mu: the b-weighted (self-normalised) mean sum(b*k3)/sum(b), an estimate under
    pi_old."""
    return kl_of_parts([k3_token_kl_parts(old_log_prob, ref_log_prob, mask, weights)])


class ReferenceSchedule:
    """Pure bookkeeping of the reference resets (unit-testable without Ray)."""

    def __init__(self, mode: str, update_every: int = 0, kl_threshold: float | None = None, kl_ema_decay: float = 0.9):
        self.mode, self.update_every = mode, update_every
        self.kl_threshold, self.kl_ema_decay = kl_threshold, kl_ema_decay
        self.last_reset_step, self.kl_ema, self.resets = 0, 0.0, 0

    def should_reset(self, step: int, ref_kl: float | None) -> bool:
        if self.mode == "periodic":
            return step % self.update_every == 0
        if self.mode == "kl_threshold":
            if ref_kl is None:
                raise ValueError("kl_threshold schedule needs the step's reference KL (no ref_log_prob computed)")
            self.kl_ema = self.kl_ema_decay * self.kl_ema + (1.0 - self.kl_ema_decay) * float(ref_kl)
            return self.kl_ema > self.kl_threshold
        return False

    def record_reset(self, step: int) -> None:
        self.last_reset_step, self.kl_ema, self.resets = step, 0.0, self.resets + 1

    def state_dict(self) -> dict:
        return {"mode": self.mode, "last_reset_step": self.last_reset_step, "kl_ema": self.kl_ema,
                "resets": self.resets}

    def load_state_dict(self, state: dict) -> None:
        if state.get("mode") != self.mode:
            raise ValueError(f"checkpoint reference state has mode {state.get('mode')!r}, config has {self.mode!r}")
        self.last_reset_step = int(state["last_reset_step"])
        self.kl_ema = float(state["kl_ema"])
        self.resets = int(state["resets"])


class RPGTrainerMixin(RefillLimitMixin, RunOrderMixin, AsyncResumeMixin):
    """RPG's schedules and hooks (the methods below), on top of one of verl's v1 trainers (``RPGTrainer``:
    sync, ``RPGTrainerColocateAsync``: colocate_async), ``RefillLimitMixin``'s (DAPO's refills of a training batch
    within ``max_num_gen_batches``) and ``RunOrderMixin``'s (the batch order, the lag and the behaviour weights' step
    statistics) and ``AsyncResumeMixin``'s (an asynchronous run's replay buffer on resume). Placed first in the
    bases, so each hook's ``super()`` call reaches that verl trainer's own hook."""

    def __init__(self, config):
        super().__init__(config)
        self.rpg = parse_rpg_settings(config.rpg)
        self.schedule_free = self.rpg.optimizer == "schedulefree"
        ref = self.rpg.reference
        self.ref_schedule = ReferenceSchedule(ref.mode, ref.update_every, ref.kl_threshold, ref.kl_ema_decay)
        self._ref_kl_parts: list[tuple[float, float]] = []  # this step's mini-batches (separate_async: several)
        self._rpg_pending_metrics: dict = {}  # logged with the next step's metrics

    # ------------------------------------------------------------------ workers
    worker_cls = RPGActorRolloutRefWorker  # the actor/rollout/ref worker of this trainer's mode

    def _init_resource_pool_mgr(self):
        """The mode's RPG worker in place of verl's actor/rollout/ref worker class (``RPGActorRolloutRefWorker``;
        ``RPGDetachActorWorker`` in separate_async, where verl swaps in its ``DetachActorWorker`` first)."""
        super()._init_resource_pool_mgr()
        for role in list(self.role_worker_mapping):
            if role in _ACTOR_ROLES:
                self.role_worker_mapping[role] = ray.remote(self.worker_cls)

    # ------------------------------------------------------------------ data
    def _init_dataloader(self):
        """verl's dataloaders; validation rows get ``__rollout_n__`` from rpg.validation.samples_per_problem."""
        super()._init_dataloader()  # runs inside verl's __init__, before self.rpg exists
        rule = dict(parse_rpg_settings(self.config.rpg).samples_per_problem)
        if rule:
            self.val_dataloader = SamplesPerSource(self.val_dataloader, rule,
                                                   self.config.actor_rollout_ref.rollout.val_kwargs.n)

    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
                            expected_acc_counts=None):
        """verl's validation metrics, plus the rows not scored per data source (``rpg.verl.validation``): a
        metric at every validation and a warning line when a row lost a sample."""
        metrics = super()._val_metrics_update(data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
                                              expected_acc_counts=expected_acc_counts)
        counts = unscored_by_source(expected_acc_counts or {}, data_sources, sample_uids,
                                    reward_extra_infos_dict.get("acc"))
        for line in unscored_warnings(counts, self.global_steps):
            print(line, flush=True)
        return {**metrics, **unscored_metrics(counts)}

    # ------------------------------------------------------------------ init / resume
    def _resumed_folder(self) -> str | None:
        if self.global_steps == 0:
            return None
        trainer = self.config.trainer
        if trainer.resume_mode == "resume_path":
            folder = trainer.resume_from_path
        else:
            folder = os.path.join(trainer.default_local_dir, f"global_step_{self.global_steps}")
        return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)

    def on_init_end(self):
        """Schedule-free back to train mode (y) after a resume, the reference restored from the checkpoint
        (docs/verl-integration.md#resume), then verl's rollout weight sync."""
        if self.schedule_free:
            # a resumed checkpoint holds eval (x) weights and eval-mode param groups; back to y
            self.actor_rollout_wg.sf_set_mode("train")
        if self.rpg.reference.resets:
            self._restore_reference()
        super().on_init_end()

    def _restore_reference(self) -> None:
        folder = self._resumed_folder()
        if folder is None:
            return  # fresh start: verl built the reference from the initial model = actor
        path = os.path.join(folder, REFERENCE_STATE_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"resuming rpg.reference.mode={self.rpg.reference.mode} from {folder}, which has no {REFERENCE_STATE_FILE}; "
                "the reference cannot be restored consistently (checkpoint from another mode or an older run)"
            )
        with open(path) as f:
            state = json.load(f)
        self.ref_schedule.load_state_dict(state)
        if state.get("weights_saved"):
            self.actor_rollout_wg.load_reference(os.path.join(folder, REFERENCE_WEIGHTS_DIR))
        else:  # the reference was reset at the checkpoint step: it equals the (train-mode) actor
            self.actor_rollout_wg.sync_ref_from_actor()
        logger.info(f"restored reference state {state} from {folder}")

    # ------------------------------------------------------------------ step
    def _compute_ref_log_prob(self, batch, metrics: dict):
        """Reference modes: after verl's computation, ``rpg/ref_kl`` = the token-mean k3 estimate of KL(π_old‖π_ref) on
        the batch; ``kl_threshold`` averages it over every mini-batch of the step (separate_async runs
        ``parameter_sync_step`` of them, each with its own reference log-probs)."""
        batch = super()._compute_ref_log_prob(batch, metrics)
        # a stale sampler (colocate_async): the tokens come from mu; weighted by pi_old/mu they estimate KL(pi_old || pi_ref)
        stale = self.trainer_mode != "sync"  # verl's attribute; the driver requires rollout log-probs then
        fields = ["old_log_probs", "ref_log_prob", "response_mask"] + (["rollout_log_probs"] if stale else [])
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields).to_padded_tensor()
        weights = None
        if stale:
            weights = behavior_weights(data["old_log_probs"].float(), data["rollout_log_probs"].float(),
                                       data["response_mask"])
        parts = k3_token_kl_parts(data["old_log_probs"].float(), data["ref_log_prob"].float(),
                                  data["response_mask"], weights)
        self._ref_kl_parts.append(parts)
        metrics["rpg/ref_kl"] = kl_of_parts([parts])
        return batch

    def step(self, metrics: dict, timing_raw: dict):
        """verl's step (rollout -> old/ref log-probs -> advantage -> actor update), then the reference schedule: a
        copy inside ``step``, before verl saves a checkpoint, makes the saved reference match the saved actor."""
        self._ref_kl_parts = []  # the schedule reads every mini-batch of this step (separate_async: several)
        batch = super().step(metrics, timing_raw)
        if self.rpg.reference.resets:
            with marked_timer("rpg_reference", timing_raw, color="purple"):
                metrics.update(self._reference_step())
        self._step_metrics = metrics  # kept with this step's checkpoint (_save_checkpoint)
        return batch

    def _reference_diffs(self, suffix: str) -> dict:
        """max |actor - ref| over the shards, and over the logits of a fixed probe sequence (what the
        reference computes); ``_pre`` also logs the reference's probe NLL (the reference of this step)."""
        wg = self.actor_rollout_wg
        probes = wg.ref_actor_probe()
        out = {f"rpg/ref_actor_weight_diff_{suffix}": max(wg.ref_actor_weight_diff()),
               f"rpg/ref_actor_logit_diff_{suffix}": max(p["logit_diff"] for p in probes)}
        if suffix == "pre":
            out["rpg/ref_probe_nll"] = probes[0]["ref_nll"]
        return out

    def _reference_step(self) -> dict:
        wg, sched, step = self.actor_rollout_wg, self.ref_schedule, self.global_steps
        out = {}
        if self.rpg.reference.log_weight_diff:
            out.update(self._reference_diffs("pre"))
        reset = sched.should_reset(step, kl_of_parts(self._ref_kl_parts) if self._ref_kl_parts else None)
        if self.rpg.reference.mode == "kl_threshold":
            out["rpg/ref_kl_ema"] = sched.kl_ema
        if reset:
            wg.sync_ref_from_actor()
            sched.record_reset(step)
            logger.info(f"rpg: reference reset at step {step} (mode={sched.mode})")
            if self.rpg.reference.log_weight_diff:
                out.update(self._reference_diffs("post"))
        out.update({"rpg/ref_reset": float(reset), "rpg/ref_resets_total": float(sched.resets),
                    "rpg/ref_steps_since_reset": float(step - sched.last_reset_step)})
        return out

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self):
        """verl's save with the schedule-free eval (x) weights, then back to train. Reference modes that reset also
        write ``rpg_reference.json`` (last reset step, EMA, count) and, unless the reference equals the saved actor,
        its shards; after verl's save the reference state of each checkpoint whose actor verl's retention
        (``trainer.max_actor_ckpt_to_keep``) deleted goes too; last the completion marker
        (``rpg.verl.checkpoints.MARKER``), each rank's files hashed by that rank (``rpg_checkpoint_digests``), the
        trainer's own here."""
        if self.rpg.reference.resets:
            self._save_reference_state()
        if not self.schedule_free:
            result = super()._save_checkpoint()
        else:
            self.actor_rollout_wg.sf_set_mode("eval")  # checkpoints hold the averaged (x) weights
            try:
                result = super()._save_checkpoint()
            finally:
                self.actor_rollout_wg.sf_set_mode("train")
        if self.rpg.reference.resets:
            self._prune_reference_state()
        # verl validates and logs a step after saving it: a run stopped in between would never log it; the
        # resume logs this copy instead (rpg.metrics_log.history.restore_step_record, before the marker's digests)
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        if os.path.isdir(folder):
            write_step_record(folder, self.global_steps, getattr(self, "_step_metrics", {}))
        self._prune_step_records()
        self._mark_complete()
        return result

    def _mark_complete(self) -> None:
        """Written last, after verl's save returned: the checkpoint is whole (``rpg.verl.checkpoints``).
        Not with ``actor.checkpoint.async_save``: verl returns before the files are written (and
        writes no tracker either), so such a checkpoint never counts as complete."""
        if self.config.actor_rollout_ref.actor.get("checkpoint", {}).get("async_save", False):
            return
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        # digests of every file, each computed by the rank that wrote it, on its node, at once (only the files this
        # process wrote are hashed here: rpg.verl.checkpoint_digests), and the run's RPG settings; both checked by
        # the driver before a resume
        known = join_reports(self.actor_rollout_wg.rpg_checkpoint_digests(folder))
        write_marker(folder, self.global_steps, recorded_settings(self.config), known=known,
                     last_step=self._last_step())

    def _last_step(self) -> int:
        """The run's last training step: verl's loop (``fit``) ends after ``total_training_steps`` or when the
        epochs run out (``steps_per_epoch x total_epochs``), whichever comes first."""
        return min(int(self.total_training_steps), int(self.steps_per_epoch) * int(self.config.trainer.total_epochs))

    def _save_reference_state(self) -> None:
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        os.makedirs(folder, exist_ok=True)
        state = self.ref_schedule.state_dict()
        state["weights_saved"] = self.ref_schedule.last_reset_step != self.global_steps
        if state["weights_saved"]:
            self.actor_rollout_wg.save_reference(os.path.join(folder, REFERENCE_WEIGHTS_DIR))
        with open(os.path.join(folder, REFERENCE_STATE_FILE), "w") as f:
            json.dump(state, f)

    def _folders_without_actor(self) -> list[str]:
        """The ``global_step_N`` folders (other than this step's) whose ``actor`` directory verl deleted
        (``trainer.max_actor_ckpt_to_keep``): what the recipe kept beside an actor checkpoint goes with it."""
        root = self.config.trainer.default_local_dir
        if not os.path.isdir(root):
            return []
        return [os.path.join(root, entry) for entry in sorted(os.listdir(root))
                if re.fullmatch(r"global_step_\d+", entry) and int(entry.split("_")[-1]) != self.global_steps
                and not os.path.isdir(os.path.join(root, entry, "actor"))]

    def _prune_step_records(self) -> None:
        """A step record (``write_step_record``) and the lag book (``rpg.verl.sample_order_and_lag``) go with their
        actor checkpoint, as the reference state does."""
        for folder in self._folders_without_actor():
            for name in (STEP_RECORD, LAG_BOOK_FILE):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(folder, name))

    def _prune_reference_state(self) -> list[str]:
        """Follow verl's checkpoint retention: a ``global_step_N`` whose ``actor`` directory verl
        deleted (``trainer.max_actor_ckpt_to_keep``) loses its reference state too.

        verl keeps ``global_step_N/`` itself (``data.pt``) and removes only ``actor/``; without this,
        every save of a resetting run would keep its fp32 reference shards forever. Decided from what
        is on disk, so verl's own policy (including checkpoints from before a resume, which verl
        keeps) is followed, never re-implemented. Returns the folders pruned.
        """
        pruned = []
        for folder in self._folders_without_actor():
            weights, state = os.path.join(folder, REFERENCE_WEIGHTS_DIR), os.path.join(folder, REFERENCE_STATE_FILE)
            if os.path.isdir(weights) or os.path.exists(state):
                shutil.rmtree(weights, ignore_errors=True)
                if os.path.exists(state):
                    os.remove(state)
                pruned.append(folder)
                logger.info(f"rpg: removed the reference state of {folder} (verl removed its actor checkpoint)")
        return pruned

    # ------------------------------------------------------------------ schedule-free around validation
    def _sf_switch(self, mode: str) -> None:
        self.checkpoint_manager.sleep_replicas()
        results = self.actor_rollout_wg.sf_set_mode(mode)
        self.checkpoint_manager.update_weights(self.global_steps)
        if any(r["mode"] != mode for r in results):
            raise RuntimeError(f"schedule-free switch to {mode} failed: {results}")
        # max |x - y| moved by the switch (0 before the first optimizer step)
        self._rpg_pending_metrics[f"rpg/sf_to_{mode}_max_abs_change"] = max(r["max_abs_change"] for r in results)

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        metrics.update(self._rpg_pending_metrics)
        self._rpg_pending_metrics = {}
        return super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)

    def on_validate_begin(self):
        """Schedule-free: validation generates with the eval (x) weights (replicas asleep, switched, re-synced)."""
        super().on_validate_begin()
        if self.schedule_free:
            self._sf_switch("eval")

    def on_validate_end(self):
        """Schedule-free: back to the train (y) weights."""
        if self.schedule_free:
            self._sf_switch("train")
        super().on_validate_end()


class RPGTrainer(RPGTrainerMixin, PPOTrainerSync):
    """verl's synchronous v1 trainer with RPG's schedules (``trainer.v1.trainer_mode=sync``)."""


class RPGTrainerColocateAsync(RPGTrainerMixin, PPOTrainerColocateAsync):
    """verl's colocate-async v1 trainer with RPG's schedules (``trainer.v1.trainer_mode=colocate_async``):
    verl's loop, replay buffer, warm-up batches and weight updates as they are; the stale sampler's
    weights pi_old/mu are applied in the actor loss (``rpg.verl.actor_loss``)."""


class RPGTrainerSeparateAsync(RPGTrainerMixin, PPOTrainerSeparateAsync):
    """verl's separate-async v1 trainer with RPG's schedules (``trainer.v1.trainer_mode=separate_async``): verl's
    standalone rollout pool, weight sync every ``parameter_sync_step`` updates and pi_old snapshots, on
    ``RPGDetachActorWorker`` (verl's ``DetachActorWorker`` with the RPG loss and a real pi_old copy); the weights
    pi_old/mu are applied in the actor loss, as in colocate_async."""

    worker_cls = RPGDetachActorWorker


# trainer.v1.trainer_mode -> the RPG trainer class (rpg.verl.main; the modes rpg.verl.block_checks.TRAINER_MODES allows)
RPG_TRAINERS = {"sync": RPGTrainer, "colocate_async": RPGTrainerColocateAsync,
                "separate_async": RPGTrainerSeparateAsync}
