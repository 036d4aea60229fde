"""Reference schedule bookkeeping (periodic, kl_threshold) and the KL trigger statistic."""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rpg.verl.sample_order_and_lag import LagBook
from rpg.verl.trainer import ReferenceSchedule, k3_token_kl


def test_periodic_resets_every_k_steps():
    s = ReferenceSchedule("periodic", update_every=3)
    resets = []
    for step in range(1, 10):
        if s.should_reset(step, None):
            s.record_reset(step)
            resets.append(step)
    assert resets == [3, 6, 9] and s.resets == 3 and s.last_reset_step == 9


def test_kl_threshold_uses_ema_and_restarts_it_after_a_reset():
    s = ReferenceSchedule("kl_threshold", kl_threshold=0.05, kl_ema_decay=0.5)
    kls = [0.04, 0.08, 0.08, 0.01, 0.2]
    fired = []
    for step, kl in enumerate(kls, start=1):
        if s.should_reset(step, kl):
            fired.append((step, s.kl_ema))
            s.record_reset(step)
    # ema: 0.02, 0.05 (not > 0.05), 0.065 -> reset; then 0.005, 0.1025 -> reset
    assert [f[0] for f in fired] == [3, 5]
    assert fired[0][1] == pytest.approx(0.065) and fired[1][1] == pytest.approx(0.1025)
    assert s.kl_ema == 0.0 and s.resets == 2


def test_kl_threshold_without_kl_is_an_error_and_state_round_trips():
    s = ReferenceSchedule("kl_threshold", kl_threshold=0.1)
    with pytest.raises(ValueError, match="reference KL"):
        s.should_reset(1, None)
    s.record_reset(4)
    t = ReferenceSchedule("kl_threshold", kl_threshold=0.1)
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == s.state_dict()
    with pytest.raises(ValueError, match="mode"):
        ReferenceSchedule("periodic", update_every=2).load_state_dict(s.state_dict())


def test_k3_token_kl_is_zero_at_equality_positive_otherwise_and_masked():
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.3, 0.3]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert k3_token_kl(old, old, mask) == 0.0
    ref = old + torch.tensor([[0.1, -0.2, 50.0], [0.3, 9.0, 9.0]])  # masked entries must not matter
    r = torch.tensor([0.1, -0.2, 0.3])
    want = float((torch.exp(r) - r - 1).mean())
    assert k3_token_kl(old, ref, mask) == pytest.approx(want)


# ----------------------------------------------------------------------------- checkpoint / resume


class FakeWorkerGroup:
    """Stands in for the actor worker group: records the reference calls."""

    def __init__(self):
        self.calls = []

    def save_reference(self, directory):
        self.calls.append(("save_reference", directory))
        os.makedirs(directory, exist_ok=True)
        (Path(directory) / "reference_rank_0.pt").write_bytes(b"shard")

    def load_reference(self, directory):
        self.calls.append(("load_reference", directory))

    def sync_ref_from_actor(self):
        self.calls.append(("sync_ref_from_actor",))
        return [1]

    def rpg_checkpoint_digests(self, folder):
        """The one rank's report (RPGActorRolloutRefWorker.rpg_checkpoint_digests at world size 1)."""
        from rpg.verl.checkpoint_digests import rank_entries

        return [rank_entries(folder, 0, 1)]


def _trainer(tmp_path, mode="periodic", global_steps=0, **ref):
    from omegaconf import OmegaConf

    from rpg.config import parse_rpg_settings
    from rpg.verl.trainer import RPGTrainer

    t = RPGTrainer.__new__(RPGTrainer)  # no Ray: only the reference bookkeeping is exercised
    t.config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path), "resume_mode": "auto"}})
    t.rpg = parse_rpg_settings({"reference": {"mode": mode, **ref}})
    t.ref_schedule = ReferenceSchedule(mode, t.rpg.reference.update_every, t.rpg.reference.kl_threshold)
    t.actor_rollout_wg = FakeWorkerGroup()
    t.global_steps = global_steps
    return t


def test_checkpoint_at_a_reset_step_resyncs_from_actor_on_resume(tmp_path):
    t = _trainer(tmp_path, update_every=2, global_steps=4)
    t.ref_schedule.record_reset(4)
    t._save_reference_state()
    assert t.actor_rollout_wg.calls == []  # reference == saved actor: no extra weights written
    r = _trainer(tmp_path, update_every=2, global_steps=4)
    r._restore_reference()
    assert r.actor_rollout_wg.calls == [("sync_ref_from_actor",)]
    assert r.ref_schedule.state_dict() == t.ref_schedule.state_dict()


def test_checkpoint_between_resets_saves_and_restores_reference_weights(tmp_path):
    t = _trainer(tmp_path, mode="kl_threshold", kl_threshold=0.1, global_steps=5)
    t.ref_schedule.record_reset(3)
    t.ref_schedule.kl_ema = 0.04
    t._save_reference_state()
    ref_dir = str(tmp_path / "global_step_5" / "rpg_reference")
    assert t.actor_rollout_wg.calls == [("save_reference", ref_dir)]
    r = _trainer(tmp_path, mode="kl_threshold", kl_threshold=0.1, global_steps=5)
    r._restore_reference()
    assert r.actor_rollout_wg.calls == [("load_reference", ref_dir)]
    assert r.ref_schedule.kl_ema == 0.04 and r.ref_schedule.last_reset_step == 3


def test_resume_without_reference_state_is_a_clear_error(tmp_path):
    (tmp_path / "global_step_2").mkdir()
    r = _trainer(tmp_path, update_every=2, global_steps=2)
    with pytest.raises(FileNotFoundError, match="rpg_reference.json"):
        r._restore_reference()
    fresh = _trainer(tmp_path, update_every=2, global_steps=0)
    fresh._restore_reference()  # fresh start: the reference is the initial model
    assert fresh.actor_rollout_wg.calls == []


# ----------------------------------------------------------------------------- checkpoint retention


class RetainingWorkerGroup(FakeWorkerGroup):
    """Saves actor checkpoints with verl's own retention (``BaseCheckpointManager``, as the FSDP
    checkpoint manager does on rank 0: make room before the save, register and trim after it)."""

    def __init__(self):
        super().__init__()
        from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager

        self.manager = BaseCheckpointManager.__new__(BaseCheckpointManager)  # only the retention state
        self.manager.previous_saved_paths = []

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        self.manager.ensure_checkpoint_capacity(max_ckpt_to_keep)
        os.makedirs(local_path, exist_ok=True)
        (Path(local_path) / "model_world_size_1_rank_0.pt").write_bytes(b"actor")
        self.manager.register_checkpoint(local_path, max_ckpt_to_keep)


def _saving_trainer(tmp_path, keep):
    """A bare RPGTrainer whose ``_save_checkpoint`` runs verl's real one (trainer_base) end to end."""
    from omegaconf import OmegaConf

    t = _trainer(tmp_path, update_every=3)
    t.config = OmegaConf.create({
        "trainer": {"default_local_dir": str(tmp_path), "resume_mode": "auto", "default_hdfs_dir": None,
                    "max_actor_ckpt_to_keep": keep, "total_epochs": 2},
        "actor_rollout_ref": {"actor": {"checkpoint": {}}},
    })
    t.total_training_steps, t.steps_per_epoch = 5, 2  # as verl's _create_dataloader sets them: the epochs end at 4
    t.actor_rollout_wg = RetainingWorkerGroup()
    t.use_critic, t.trainer_mode, t.schedule_free = False, "sync", False
    t.train_dataloader = SimpleNamespace(state_dict=lambda: {})
    t.checkpoint_callback = SimpleNamespace(on_save=lambda **kwargs: None)
    t._lag_book = LagBook(0)  # RunOrderMixin.on_init_end; saved as rpg_lag_book.json beside each checkpoint
    return t


def _save_steps(t, steps):
    for step in steps:
        t.global_steps = step
        if t.ref_schedule.should_reset(step, None):
            t.ref_schedule.record_reset(step)
        t._save_checkpoint()


def _listing(root):
    """Files of the checkpoints, without verl's tracker and the completion markers (tests/verl/test_resume.py)."""
    from rpg.verl.checkpoints import MARKER

    return {p.relative_to(root).as_posix() for p in Path(root).rglob("*") if p.is_file()
            and p.name not in ("latest_checkpointed_iteration.txt", MARKER)}


def test_reference_checkpoints_follow_verls_retention(tmp_path):
    """periodic K=3, a save every step, trainer.max_actor_ckpt_to_keep=2: verl deletes the actor of
    steps 1-4; their reference shards (written at 1, 2, 4) and state files must go with them."""
    t = _saving_trainer(tmp_path, keep=2)
    _save_steps(t, range(1, 7))
    kept = {f"global_step_{s}/{f}" for s in (5, 6) for f in ("actor/model_world_size_1_rank_0.pt", "rpg_reference.json",
                                                               "rpg_step_metrics.json", "rpg_lag_book.json")}
    kept.add("global_step_5/rpg_reference/reference_rank_0.pt")  # reset at 6 (and 3): no shards there
    kept |= {f"global_step_{s}/data.pt" for s in range(1, 7)}  # verl's own leftovers, not ours to delete
    assert _listing(tmp_path) == kept


def test_reference_checkpoints_of_an_earlier_run_stay_as_long_as_verl_keeps_their_actor(tmp_path):
    """After a resume verl's checkpoint manager starts empty and never deletes older checkpoints;
    their reference state must stay (a resume from them needs it)."""
    first = _saving_trainer(tmp_path, keep=2)
    _save_steps(first, range(1, 5))
    resumed = _saving_trainer(tmp_path, keep=2)
    resumed.ref_schedule.load_state_dict(first.ref_schedule.state_dict())
    _save_steps(resumed, range(5, 8))
    files = _listing(tmp_path)
    for step in (3, 4, 6, 7):  # actors verl kept: 3, 4 (earlier run) and 6, 7
        assert f"global_step_{step}/actor/model_world_size_1_rank_0.pt" in files
        assert f"global_step_{step}/rpg_reference.json" in files
        assert f"global_step_{step}/rpg_step_metrics.json" in files
        assert f"global_step_{step}/rpg_lag_book.json" in files
    assert "global_step_4/rpg_reference/reference_rank_0.pt" in files
    for step in (1, 2, 5):
        assert not any(f.startswith(f"global_step_{step}/actor") or f.startswith(f"global_step_{step}/rpg_")
                       for f in files), files


# ----------------------------------------------------------------------------- driver validation of the copy's layout

CONFIG_DIR = Path(__file__).resolve().parents[2] / "recipe" / "rpg" / "config"
PERIODIC = ["rpg.reference.mode=periodic", "rpg.reference.update_every=2"]
A, R = "actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config"
FSDP1 = ["actor_rollout_ref.actor.strategy=fsdp", f"{A}.strategy=fsdp", f"{R}.strategy=fsdp"]


def _validate(*overrides):
    from hydra import compose, initialize_config_dir

    from rpg.verl.block_to_verl import validate_and_apply

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="rpg_trainer", overrides=["actor_rollout_ref.model.path=dummy", *overrides])
    return validate_and_apply(cfg)


LAYOUT_MISMATCHES = [
    ([*PERIODIC, "trainer.n_gpus_per_node=8", f"{R}.fsdp_size=4"],
     f"{A}.fsdp_size=-1 and {R}.fsdp_size=4 shard over 8 and 4 of 8 ranks; set them equal"),
    ([*PERIODIC, *FSDP1, "trainer.n_gpus_per_node=8", f"{A}.fsdp_size=2"],
     f"{A}.fsdp_size=2 and {R}.fsdp_size=-1 shard over 2 and 8 of 8 ranks"),
    ([*PERIODIC, *FSDP1, f"{R}.use_orig_params=true"], f"{A}.use_orig_params=False and {R}.use_orig_params=True"),
    ([*PERIODIC, *FSDP1, f"+{R}.wrap_policy.transformer_layer_cls_to_wrap=[Qwen2DecoderLayer]"],
     f"{R}.wrap_policy={{'min_num_params': 0, 'transformer_layer_cls_to_wrap': ['Qwen2DecoderLayer']}} must be equal"),
    (["rpg.reference.mode=kl_threshold", "rpg.reference.kl_threshold=0.1", "trainer.nnodes=2", f"{A}.fsdp_size=8"],
     f"{A}.fsdp_size=8 and {R}.fsdp_size=-1 shard over 8 and 16 of 16 ranks"),
]


@pytest.mark.parametrize("overrides,message", LAYOUT_MISMATCHES, ids=[o[-1] for o, _ in LAYOUT_MISMATCHES])
def test_reference_shard_layout_mismatch_fails_before_ray_with_one_line(overrides, message):
    from rpg.config import RPGConfigError

    with pytest.raises(RPGConfigError) as err:
        _validate(*overrides)
    text = str(err.value)
    assert message in text and "\n" not in text and text.startswith("rpg.reference.mode=")


@pytest.mark.parametrize("overrides", [
    [*PERIODIC, "trainer.n_gpus_per_node=8", f"{R}.fsdp_size=8"],  # 8 of 8 ranks == -1: same shard group
    [*PERIODIC, "trainer.n_gpus_per_node=8", f"{A}.fsdp_size=4", f"{R}.fsdp_size=4"],
    [*PERIODIC, f"{R}.reshard_after_forward=false"],  # the copy releases gathered parameters first
    [*PERIODIC, *FSDP1, f"{R}.reshard_after_forward=false", f"{R}.model_dtype=bf16", f"{R}.param_offload=true"],
    [*PERIODIC, f"{R}.use_orig_params=true"],  # FSDP2: no flat parameters
    ["rpg.reference.mode=fixed", "trainer.n_gpus_per_node=8", f"{R}.fsdp_size=4"],  # no copy, no constraint
])
def test_reference_layouts_the_copy_handles_are_accepted(overrides):
    _validate(*overrides)
