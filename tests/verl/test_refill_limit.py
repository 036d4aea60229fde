"""DAPO's ``algorithm.filter_groups.max_num_gen_batches`` in the RPG trainers (``rpg.verl.refill_limit``), without
Ray: each RPG trainer class runs verl's own ``step`` (its ``prepare_step``, separate_async's wait for sampleable
groups) on verl's own replay buffer, built by verl's ``_build_replay_buffer`` (the trainer's
``_add_prompts_to_generate`` is its ``refill_fn``), over a stand-in TransferQueue in which a dispatched prompt's group
finishes at once, its responses scored alike (DAPO's filter drops it) or not. The model, the rollout and the update
are left out (``_step_once`` only samples). Without the limit verl samples for ever: the stand-in rollout then fails
the test after ``ENDLESS`` dispatches instead of hanging."""

from __future__ import annotations

import copy
import functools
import itertools
import sys
from types import SimpleNamespace

import pytest
from messages import names, one_line

from launching import recipe_main
from recipe_config import compose_cfg

from rpg.override_lists import values
from rpg.verl.refill_limit import METRIC, RefillBook, RefillLimitReached, refill_book, refill_limit_reason

BATCH, N = 4, 3  # data.train_batch_size, responses per group
ENDLESS = 100  # dispatches of one test: verl's loop without a limit
MODES = ["sync", "colocate_async", "separate_async"]
LIMIT = "algorithm.filter_groups.max_num_gen_batches"


@functools.lru_cache(maxsize=1)
def _composed():
    return compose_cfg(f"data.train_batch_size={BATCH}", "algorithm.filter_groups.enable=true",
                       "algorithm.filter_groups.metric=acc")


def config(*overrides):
    """The recipe's config (composed once: DAPO's filter on acc, batches of ``BATCH`` prompts) with ``overrides``."""
    from omegaconf import OmegaConf, open_dict

    cfg = copy.deepcopy(_composed())
    with open_dict(cfg):
        for key, value in values(list(overrides)).items():
            OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


class StandInQueue:
    """The TransferQueue calls of verl's replay buffer: ``kv_list``, ``kv_batch_get`` (the filter's metric),
    ``kv_clear``."""

    def __init__(self):
        self.tags: dict[str, dict[str, dict]] = {}
        self.acc: dict[str, float] = {}

    def kv_list(self, partition_id=None):
        return {p: dict(items) for p, items in self.tags.items() if partition_id in (None, p)}

    def kv_clear(self, keys, partition_id):
        for key in keys:
            self.tags.get(partition_id, {}).pop(key, None)
            self.acc.pop(key, None)

    def kv_batch_get(self, keys, partition_id, select_fields):
        assert select_fields == ["extra_fields"]
        return {"extra_fields": [{"reward_extra_info": {"acc": self.acc[k]}} for k in keys]}


class StandInRollout:
    """The trainer's ``_next_train_batch`` and ``_submit_batch_to_rollout``: each prompt's group of N responses
    finished at once, with a spread of rewards (one correct) when ``spread`` says so, else all wrong."""

    def __init__(self, queue: StandInQueue, trainer, spread):
        self.queue, self.trainer, self.spread = queue, trainer, iter(spread)
        self.dispatched: list[tuple[int, int]] = []  # (step, prompts) of each dispatch
        self.prompts = 0

    def next_batch(self, num_prompts=None):  # uids as the RPG trainer names its prompts (sample_order reads them)
        from rpg.verl.sample_order_and_lag import prompt_uid

        n = num_prompts or BATCH
        self.prompts += n
        return [prompt_uid(self.trainer.global_steps, self.prompts - n + i) for i in range(n)]

    def submit(self, uids):
        if len(self.dispatched) >= ENDLESS:
            raise AssertionError(f"{ENDLESS} dispatches: the replay buffer samples without end")
        step = self.trainer.global_steps
        self.dispatched.append((step, len(uids)))
        part = self.queue.tags.setdefault("train", {})
        for uid in uids:
            spread = next(self.spread)
            part[uid] = {"is_prompt": True, "status": "finished", "global_steps": step}
            for j in range(N):
                part[f"{uid}_{j}_0"] = {"status": "finished", "min_global_steps": step}
                self.queue.acc[f"{uid}_{j}_0"] = float(spread and j == 0)
        return len(uids)


def stand_in(mode: str, spread, monkeypatch, *overrides, sync_step: int = 1):
    """An RPG trainer of ``mode`` (no ``__init__``: what it sets for these calls is set here), its verl replay buffer
    over ``StandInQueue``, generation by ``StandInRollout``; returns (trainer, rollout, sampled batches)."""
    from verl.trainer.ppo.v1 import replay_buffer
    from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode

    from rpg.verl.sample_order_and_lag import LagBook
    from rpg.verl.trainer import RPG_TRAINERS

    cfg = config(f"trainer.v1.trainer_mode={mode}", *overrides)
    queue = StandInQueue()
    monkeypatch.setattr(replay_buffer, "tq", queue)
    t = object.__new__(RPG_TRAINERS[mode])
    t.config, t.trainer_mode, t.global_steps, t.parameter_sync_step = cfg, mode, 1, sync_step
    t._refills = refill_book(cfg)  # RefillLimitMixin.__init__
    t.replay_buffer = t._build_replay_buffer()  # verl's: refill_fn = t._add_prompts_to_generate
    t.replay_buffer.poll_interval = 0.01
    rollout = StandInRollout(queue, t, spread)
    t._next_train_batch, t._submit_batch_to_rollout = rollout.next_batch, rollout.submit
    t.rpg = SimpleNamespace(reference=SimpleNamespace(resets=False))  # RPGTrainerMixin.__init__: no reference
    t._lag_book = LagBook(0)  # RunOrderMixin.on_init_end
    sampled = []

    def step_once(metrics, timing_raw, size):  # verl's _step_once up to its sample: the rest needs the model
        batch, eviction_metrics = t.replay_buffer.sample(global_steps=t.global_steps, partition_id="train",
                                                         batch_size=size)
        metrics.update(eviction_metrics)
        queue.kv_clear(batch.keys, "train")  # as fit does after the step
        sampled.append(batch)
        return batch

    t._step_once = step_once
    if mode == "separate_async":  # the hybrid replicas lent to generation: prepare_step waits for BATCH groups
        t.current_mode, t._step_threshold, t.timing_raw = HybridEngineMode.ROLLOUT, BATCH, {}
        t._timed_switch_to_trainer = lambda: setattr(t, "current_mode", HybridEngineMode.TRAINER)
    return t, rollout, sampled


def sync_step(mode: str) -> int:
    """parameter_sync_step: separate_async's step samples 2 mini-batches of 2 prompts; the others one batch."""
    return 2 if mode == "separate_async" else 1


def run_step(t) -> dict:
    """One step as verl's ``fit`` runs it (the hooks around it left out)."""
    metrics: dict = {}
    t.step(metrics, {})
    t.global_steps += 1
    if t.trainer_mode == "separate_async":
        t.current_mode = type(t.current_mode).ROLLOUT  # lent to generation again for the next step
    return metrics


def refills(rollout, step: int) -> list[int]:
    """The prompts of each refill at ``step``: the dispatches after the step's own batch."""
    return [n for s, n in rollout.dispatched if s == step][1:]


def test_the_rpg_trainers_take_verls_refill_through_the_limits_hook():
    """The MRO: ``RefillLimitMixin``'s hooks before verl's trainer in every mode, and verl's replay buffer given the
    trainer's bound ``_add_prompts_to_generate`` (tests below: its ``refill_fn``)."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from rpg.verl.refill_limit import RefillLimitMixin
    from rpg.verl.trainer import RPG_TRAINERS

    for mode, cls in RPG_TRAINERS.items():
        mro = cls.__mro__
        assert RefillLimitMixin in mro and mro.index(RefillLimitMixin) < mro.index(PPOTrainer), mode
        assert cls._add_prompts_to_generate is RefillLimitMixin._add_prompts_to_generate, mode

    class Trainer:  # verl's trainer, for __init__: the book is made from the config
        def __init__(self, config):
            self.config = config

    made = type("T", (RefillLimitMixin, Trainer), {})(config(f"{LIMIT}=2"))._refills
    assert made == RefillBook(limit=2, batch=BATCH, metric="acc")


@pytest.mark.parametrize("mode", MODES)
def test_a_step_whose_groups_all_score_alike_stops_at_the_limit(mode, monkeypatch):
    """Every group scored alike: verl refills without end; with the limit 2 (generation batches of 4 prompts), the
    refills dispatch exactly 8 prompts and the next refill raises, naming the step, the count, the key, what it
    means and what to do."""
    t, rollout, sampled = stand_in(mode, itertools.repeat(False), monkeypatch, f"{LIMIT}=2", sync_step=sync_step(mode))
    with pytest.raises(RefillLimitReached) as err:
        run_step(t)
    assert sum(refills(rollout, 1)) == 2 * BATCH and not sampled  # no prompt dispatched beyond the limit
    line = str(err.value)
    assert one_line(line).startswith("stopped at step 1: "), line
    names(line, f"{LIMIT}=2", f"data.train_batch_size={BATCH}", f"8 prompts refilled = 2 x {BATCH}", f"{BATCH} more",
          "the same acc", f"raise {LIMIT}", "0 for no limit")
    assert t._refills.step is None  # closed: a refill outside a step is not counted


@pytest.mark.parametrize("mode", MODES)
def test_the_count_starts_again_with_each_training_batch(mode, monkeypatch):
    """Each step's batch and its first refill score alike, the second refill has a spread: 2 generation batches of
    refills per step, at the limit and not beyond, in every step (one count for all steps would pass the limit at
    step 2). separate_async: the wait before the step and its two mini-batches counted together."""
    spread = itertools.cycle([False] * 2 * BATCH + [True] * BATCH)
    t, rollout, sampled = stand_in(mode, spread, monkeypatch, f"{LIMIT}=2", sync_step=sync_step(mode))
    for step in (1, 2, 3):
        metrics = run_step(t)
        assert refills(rollout, step) == [BATCH, BATCH] and metrics[METRIC] == 2.0, (step, rollout.dispatched)
    assert sum(len({k.split("_")[0] for k in b.keys}) for b in sampled) == 3 * BATCH  # the groups with a spread
    spread = itertools.cycle([False] * 2 * BATCH + [True] * BATCH)
    t2, _, _ = stand_in(mode, spread, monkeypatch, f"{LIMIT}=1", sync_step=sync_step(mode))
    with pytest.raises(RefillLimitReached, match=r"^stopped at step 1: .*\(4 prompts refilled = 1 x 4, and 4 more"):
        run_step(t2)  # the same steps under a limit of one generation batch


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_the_warm_up_is_not_a_refill(mode, monkeypatch):
    """The asynchronous modes' warm-up (``on_train_begin``: ``_add_prompts_to_generate`` before the first step)
    dispatches 3 generation batches under a limit of 1; nothing is counted, and the step that samples them refills
    nothing."""
    t, rollout, _ = stand_in(mode, itertools.repeat(True), monkeypatch, f"{LIMIT}=1")
    t._add_prompts_to_generate(3 * BATCH)
    assert t._refills.prompts == 0
    assert run_step(t)[METRIC] == 0.0 and rollout.dispatched == [(1, 3 * BATCH), (1, BATCH)]  # the step's own batch


def test_no_limit_counts_and_never_stops(monkeypatch):
    """0: no limit (verl's "non-positive values mean no upper limit"): 3 generation batches of refills pass, counted."""
    t, rollout, _ = stand_in("sync", itertools.cycle([False] * 3 * BATCH + [True] * BATCH), monkeypatch, f"{LIMIT}=0")
    assert run_step(t)[METRIC] == 3.0 and sum(refills(rollout, 1)) == 3 * BATCH


def test_the_book_follows_the_filter_and_verls_replay_buffer():
    """Nothing is counted without the filter or with a custom sampler (its own refills); stale groups' refills are
    counted with the drop strategy in the asynchronous modes, and the stop line says so."""
    base = [f"{LIMIT}=3", "data.train_batch_size=8"]
    assert refill_book(config("algorithm.filter_groups.enable=false")) is None
    assert refill_book(config(*base, "trainer.v1.sampler.custom_sampler.path=x.py",
                              "trainer.v1.sampler.custom_sampler.name=S")) is None
    book = refill_book(config(*base))
    assert (book.limit, book.batch, book.metric, book.stale_too) == (3, 8, "acc", False)
    stale = ["trainer.v1.trainer_mode=colocate_async", "trainer.v1.sampler.max_off_policy_threshold=2",
             "trainer.v1.sampler.max_off_policy_strategy=drop"]
    assert refill_book(config(*base, *stale)).stale_too
    assert not refill_book(config(*base, *stale[:2], "trainer.v1.sampler.max_off_policy_strategy=wait")).stale_too
    assert not refill_book(config(*base, *stale[1:])).stale_too  # sync: no staleness drop
    book = RefillBook(limit=1, batch=2, stale_too=True)
    book.new_batch(7)
    book.add(2)
    with pytest.raises(RefillLimitReached, match=r"^stopped at step 7: .*\(stale groups' refills count too: "
                                                 r"trainer.v1.sampler.max_off_policy_strategy=drop\)"):
        book.add(1)


def test_the_driver_ends_the_run_with_one_line(monkeypatch, capsys, tmp_path):
    """The trainer's exception reaches the driver inside Ray's ``RayTaskError`` (whose text is the remote traceback):
    the driver shuts Ray down and prints one line, ``rpg: stopped at step ...; Ray shut down; ...``, exit code 1."""
    from ray.exceptions import RayTaskError

    import rpg.verl.main as driver

    reason = "stopped at step 3: DAPO's dynamic sampling needed more than ..."
    remote = RayTaskError("run", "Traceback (most recent call last):\n ...", RefillLimitReached(reason))
    assert refill_limit_reason(remote.as_instanceof_cause()) == reason and refill_limit_reason(ValueError()) is None

    def run_ppo(config, task_runner_class):
        raise remote.as_instanceof_cause()

    monkeypatch.setattr(driver, "prepare_config", lambda config: None)
    monkeypatch.setattr(driver, "run_ppo", run_ppo)
    monkeypatch.setattr(sys, "argv", ["main_rpg.py", "trainer.v1.trainer_mode=sync"])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as code:
        recipe_main(config("trainer.default_local_dir=ckpt"))
    err = capsys.readouterr().err.strip()
    assert code.value.code == 1 and "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"rpg: {reason}; Ray shut down; metrics log ") and "resume: " in err, err
