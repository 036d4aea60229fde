"""Disk of a run's checkpoints: one checkpoint as verl 0.9.1's FSDPCheckpointManager writes it, how many
the run saves (``trainer.save_freq``, ``trainer.total_training_steps``) and how many are on disk at once
(``trainer.max_actor_ckpt_to_keep``): ``estimate_disk(settings_from_config(cfg), arch)``. The sources are
in ``estimate_disk``'s docstring; sizes in GB (10**9 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from rpg.memory.architecture import Architecture
from rpg.memory.sizes import GB
from rpg.memory.run_settings import RunSettings

@dataclass(frozen=True)
class DiskEstimate:
    items: tuple[tuple[str, float], ...]   # (what, GB) of one checkpoint
    saves: int | None                      # checkpoints written over the run (None: total steps unknown)
    kept: int | None                       # on disk at the end
    peak_kept: int | None                  # on disk while the newest one is written

    @property
    def per_checkpoint_gb(self) -> float:
        return sum(gb for _, gb in self.items)

    @property
    def peak_gb(self) -> float | None:
        return None if self.peak_kept is None else self.peak_kept * self.per_checkpoint_gb


TOKENIZER_CONFIG_GB = 0.02  # huggingface/ config + tokenizer files written with every checkpoint (Qwen: ~11 MB)


def count_saves(save_freq: int, total_steps: int | None) -> int | None:
    """verl saves at every multiple of save_freq and at the last step (trainer/ppo/v1/trainer_base.py:480-485)."""
    if save_freq <= 0:
        return 0
    if total_steps is None:
        return None
    return total_steps // save_freq + (1 if total_steps % save_freq else 0)


def estimate_disk(s: RunSettings, arch: Architecture) -> DiskEstimate:
    """One checkpoint as verl 0.9.1's FSDPCheckpointManager writes it (utils/checkpoint/
    fsdp_checkpoint_manager.py:316-362 shards, :364-417 config/tokenizer, :422-462 hf_model), plus the
    RPG reference copy (rpg/verl/trainer.py ``_save_reference_state``); retention follows
    ``max_actor_ckpt_to_keep`` (utils/checkpoint/checkpoint_manager.py:166-194: with keep=1 the old
    checkpoint is deleted only after the new one is written, so two exist while saving)."""
    P, b = arch.params, s.param_bytes
    items = []
    if "model" in s.save_contents:
        items.append((f"actor model shards ({b * 8}-bit)", P * b / GB))
    if "optimizer" in s.save_contents:
        items.append((f"optimizer states ({s.optimizer_states} x {b * 8}-bit)", s.optimizer_states * P * b / GB))
    items.append(("config, tokenizer, lr scheduler, RNG, dataloader", TOKENIZER_CONFIG_GB))
    if "hf_model" in s.save_contents:
        items.append((f"Hugging Face model ({b * 8}-bit full state dict)", P * b / GB))
    if s.reference_resets:
        items.append((f"RPG reference copy rpg_reference/ ({s.ref_param_bytes * 8}-bit; not when reset at that step)",
                      P * s.ref_param_bytes / GB))
    saves = count_saves(s.save_freq, s.total_steps)
    if saves is None:
        kept = peak = None
    elif s.keep is None:
        kept = peak = saves
    else:
        kept, peak = min(s.keep, saves), min(max(s.keep, 2) if s.keep == 1 else s.keep, saves)
    return DiskEstimate(items=tuple(items), saves=saves, kept=kept, peak_kept=peak)
