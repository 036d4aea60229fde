"""Reference schedule bookkeeping (periodic, kl_threshold) and the KL trigger statistic."""

import pytest
import torch

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

    def load_reference(self, directory):
        self.calls.append(("load_reference", directory))

    def sync_ref_from_actor(self):
        self.calls.append(("sync_ref_from_actor",))
        return [1]


def _trainer(tmp_path, mode="periodic", global_steps=0, **ref):
    from omegaconf import OmegaConf

    from rpg.verl.settings import parse_rpg_settings
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
