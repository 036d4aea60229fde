"""``RPGActorRolloutRefWorker``: verl's fused actor/rollout/ref worker plus what RPG needs on every rank.

Swapped in by ``RPGTrainer._init_resource_pool_mgr`` (as verl's separate-async trainer swaps in
``DetachActorWorker``). It installs the RPG actor loss (``rpg.verl.actor_loss``) and a checkpoint manager that loads
another world size's shards (``rpg.verl.reshard``); copies the actor's local shards into the reference's
(``sync_ref_from_actor``: same model, strategy, world size and FSDP layout, checked by the driver and here;
``rpg.verl.reference_copy``), measures the copy, saves and loads the reference's shards and hashes the checkpoint
files this rank wrote; switches the schedule-free optimizer between train (y) and eval (x) weights. The same on
verl's ``DetachActorWorker``: ``RPGDetachActorWorker`` (separate_async, a π_old snapshot that owns its memory).
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

from verl.experimental.separation.engine_workers import DetachActorWorker
from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker

from rpg.verl.checkpoint_digests import rank_entries, reference_file
from rpg.verl.reference_copy import (copy_actor_to_reference, local_shard, max_shard_diff, next_token_nll,
                                     paired_local_shards, probe_logits, probe_token_ids, wait_for_offload_copies)
from rpg.verl.reshard import ReshardingCheckpointManager, reference_shards, saved_shard
from rpg.verl.snapshot import owned_snapshot

logger = logging.getLogger(__name__)


def is_schedule_free(optimizer) -> bool:
    return optimizer is not None and callable(getattr(optimizer, "train", None)) and callable(
        getattr(optimizer, "eval", None)) and "ScheduleFree" in type(optimizer).__name__


class RPGActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's ``ActorRolloutRefWorker`` plus the RPG loss, the reference copy and the schedule-free switch."""

    # ------------------------------------------------------------------ model / loss
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        """verl's model, then: the resharding checkpoint manager; the actor loss of ``rpg.verl.actor_loss.rpg_loss_fn``
        on verl's actor config (``policy_loss.loss_mode`` rpg or grpo_corrected: ``rpg_actor_loss``, its
        ``RPGLossConfig`` built once, here; ``rpg.loss.name=verl`` with a KL loss on π_old:
        ``verl_loss_with_sampler_kl``; otherwise verl's ``ppo_loss``); a schedule-free optimizer in train mode (its
        ``step()`` refuses otherwise), where it stays but around validation and checkpoint saves."""
        super().init_model()
        if "actor" not in self.role:
            return
        # a checkpoint saved at another world size loads resharded (rpg.verl.reshard); verl's own load otherwise
        engine = self.actor.engine
        if hasattr(engine, "checkpoint_manager"):
            engine.checkpoint_manager = ReshardingCheckpointManager.like(engine.checkpoint_manager)
        from rpg.verl.actor_loss import rpg_loss_fn

        if (loss_fn := rpg_loss_fn(self.loss_fn.keywords["config"])) is not None:
            self.loss_fn = loss_fn
            self.actor.set_loss_fn(self.loss_fn)
        if is_schedule_free(self._optimizer()):
            self._optimizer().train()

    def _optimizer(self):
        return getattr(self.actor.engine, "optimizer", None)

    # ------------------------------------------------------------------ schedule-free
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @torch.no_grad()
    def sf_set_mode(self, mode: str) -> dict:
        """Put the schedule-free optimizer (and thus the module's weights) in ``train`` (y) or ``eval`` (x).

        Returns ``{"mode": <mode now>, "max_abs_change": max |p_new - p_old| over local shards}``:
        the switch moves p by ``c*(z - p)`` (c = 1 - 1/beta1 to eval, 1 - beta1 to train), so the
        change is measured from the optimizer state without copying the weights.
        """
        if mode not in ("train", "eval"):
            raise ValueError(f"sf_set_mode(mode={mode!r}); allowed: train, eval")
        opt = self._optimizer()
        if not is_schedule_free(opt):
            raise ValueError(f"sf_set_mode needs a schedule-free optimizer, found {type(opt).__name__}")
        wait_for_offload_copies()  # parameters and z may be offloaded: the switch works on them in place
        change = 0.0
        for group in opt.param_groups:
            if group["train_mode"] == (mode == "train"):
                continue
            beta1 = group["betas"][0]
            c = (1.0 - 1.0 / beta1) if mode == "eval" else (1.0 - beta1)
            for p in group["params"]:
                z = opt.state[p].get("z") if p in opt.state else None
                p_local = local_shard(p)
                if z is not None and p_local.numel():
                    change = max(change, abs(c) * float((local_shard(z).to(p_local.device) - p_local).abs().max()))
        getattr(opt, mode)()
        return {"mode": "train" if opt.param_groups[0]["train_mode"] else "eval", "max_abs_change": change}

    # ------------------------------------------------------------------ reference weights
    def _modules(self):
        if getattr(self, "ref", None) is None:
            raise ValueError("this worker has no reference model (rpg.reference.mode must be periodic or kl_threshold)")
        return self.actor.engine.module, self.ref.engine.module

    def _paired_params(self):
        return paired_local_shards(*self._modules())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_ref_from_actor(self) -> int:
        """reference <- actor (current module weights), shard by shard (FSDP1 flat parameters or FSDP2 DTensors'
        local tensors), after releasing the gathered parameters a forward left behind (``rpg.verl.reference_copy``).
        Returns #tensors copied."""
        return copy_actor_to_reference(*self._modules())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ref_actor_weight_diff(self) -> float:
        """max over local shards of |actor - reference| (compared in the reference's dtype)."""
        return max_shard_diff(*self._modules())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ref_actor_probe(self) -> dict:
        """What the reference computes, on a fixed probe sequence (every rank runs the full forward).

        ``logit_diff``: max |logit_actor - logit_ref|; ``ref_nll``: mean next-token NLL of the probe
        under the reference. Both forwards run inside verl's eval contexts (param offload, autocast).
        """
        from verl.utils.device import get_device_name

        actor, ref = self.actor.engine, self.ref.engine
        ids = probe_token_ids(int(actor.model_config.hf_config.vocab_size))
        logits = {}
        for name, engine in (("actor", actor), ("ref", ref)):
            with engine.eval_mode():
                logits[name] = probe_logits(engine.module, ids, get_device_name(),
                                            getattr(engine, "_autocast_dtype", None))
        return {"logit_diff": float((logits["actor"] - logits["ref"]).abs().max()),
                "ref_nll": next_token_nll(logits["ref"], ids)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @torch.no_grad()
    def save_reference(self, directory: str) -> None:
        """This rank's reference shards, ``reference_rank_<rank>.pt``: DTensors (FSDP2: the placement is
        saved with the shard, so another world size can reshard it) or the local tensors (FSDP1)."""
        rank = dist.get_rank() if dist.is_initialized() else 0
        os.makedirs(directory, exist_ok=True)
        params = dict(self._modules()[1].named_parameters())
        state = {name: saved_shard(params[name], r) for name, _, r in self._paired_params()}
        torch.save(state, os.path.join(directory, reference_file(rank)))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rpg_checkpoint_digests(self, folder: str) -> dict:
        """{relative path: {"size", "sha256"}} of the files of checkpoint ``folder`` this rank wrote (its shards, its
        reference shards; on rank 0 the rest of ``actor/``), hashed here, where they were written, after verl's
        save returned (``rpg.verl.checkpoint_digests``; no collective)."""
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        return rank_entries(folder, rank, world)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @torch.no_grad()
    def load_reference(self, directory: str) -> None:
        """The reference shards saved by ``save_reference``; saved at another world size (another number of
        rank files), each rank cuts its shard from the full tensors (``rpg.verl.reshard``)."""
        shards = {name: r for name, _, r in self._paired_params()}
        params = dict(self._modules()[1].named_parameters())
        for name, local in reference_shards(directory, params, list(shards)).items():
            r = shards[name]
            if local.shape != r.shape:
                raise ValueError(f"reference shard in {directory} does not match parameter {name}")
            r.copy_(local.to(device=r.device, dtype=r.dtype))
        if dist.is_initialized():
            dist.barrier()


class RPGDetachActorWorker(RPGActorRolloutRefWorker, DetachActorWorker):
    """``RPGActorRolloutRefWorker`` on verl's ``DetachActorWorker`` (pi_old snapshots for ``separate_async``), the
    snapshot a real copy of the weights it was taken from (``rpg.verl.snapshot.owned_snapshot``)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_model_to_cpu(self, n):
        if not hasattr(self, "cpu_saved_models"):
            self.cpu_saved_models = {}
        module = self.actor.engine.module
        self.cpu_saved_models[n] = owned_snapshot(self.copy_handler(module), module)
