"""rpg.verl.sample_order_and_lag: the batch order that does not follow rollout completion, validation metrics that do
not depend on the order samples arrived in, and the sampler's lag counted in versions and optimizer updates."""

from __future__ import annotations

import random

import pytest

from rpg.verl.sample_order_and_lag import (LagBook, canonical_validation, lag_metrics, prompt_uid, sample_order,
                                sorted_positions)


def test_prompt_uids_sort_by_fetch_order_whatever_the_completion_order():
    keys = [f"{prompt_uid(step, n)}_{s}_0" for step in (1, 2, 10) for n in (0, 1, 2, 11) for s in (0, 1, 7)]
    for seed in range(5):
        arrived = random.Random(seed).sample(keys, len(keys))
        assert [arrived[i] for i in sorted_positions(arrived)] == keys
    assert "_" not in prompt_uid(3, 4)  # verl splits trajectory keys {uid}_{sample}_{output} on "_"
    assert sample_order("p10-2_7_1") == (10, 2, 7, 1)  # numbers, not text: p10 after p9
    with pytest.raises(ValueError, match="RPG trainer"):
        sample_order("3f2a9c0e-1b2c-4d5e-8f90-a1b2c3d4e5f6_0_0")  # verl's random uid: no stable order


def _validation(seed: int, relabel: bool):
    """A validation's samples (2 data sources x 3 prompts x 4 samples) in a random arrival order, uids random."""
    rng = random.Random(seed)
    rows = []
    for src in ("a", "b"):
        for p in range(3):
            for s in range(4):
                acc = float((p * 7 + s * 3) % 5 < 2)
                rows.append((src, f"{src}{p}", {"acc": acc, "reward": 2 * acc - 1, "pred": str(p + s % 2)}, 2))
    rng.shuffle(rows)
    names = {uid: f"u{rng.random()}" if relabel else uid for uid in {r[1] for r in rows}}
    infos = {k: [r[2][k] for r in rows] for k in ("reward", "acc", "pred")}
    return [r[0] for r in rows], [names[r[1]] for r in rows], infos, [r[3] for r in rows]


def _verl_metrics(sources, uids, infos, turns):
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    out = process_validation_metrics(sources, uids, {k: list(v) for k, v in infos.items()})
    return {(s, v, m): x for s, vs in out.items() for v, ms in vs.items() for m, x in ms.items()}


def test_validation_metrics_are_equal_for_any_arrival_order_once_canonical():
    """verl's own metrics (mean@N, bootstrap best@N / maj@N) of the same samples, arrived in different orders under
    different random uids: equal to the last bit once put in canonical order; verl's order alone makes them differ
    (the negative control: the test can fail)."""
    runs = [_validation(seed, relabel=True) for seed in range(3)]
    canonical = [_verl_metrics(*canonical_validation(*run)) for run in runs]
    assert all(m == canonical[0] for m in canonical[1:])
    raw = [_verl_metrics(*run) for run in runs]
    assert any(m != raw[0] for m in raw[1:])
    assert set(raw[0]) == set(canonical[0])  # the same metrics, only the order of the samples changed
    for key in raw[0]:
        if key[2].startswith("mean@"):
            assert raw[0][key] == pytest.approx(canonical[0][key], abs=1e-12)


def test_canonical_validation_keeps_every_sample_with_its_fields():
    sources, uids, infos, turns = _validation(0, relabel=False)
    s2, u2, i2, t2 = canonical_validation(sources, uids, infos, turns)
    rows = sorted(zip(sources, uids, *infos.values(), turns))
    assert sorted(zip(s2, u2, *(i2[k] for k in infos), t2)) == rows
    # each prompt's samples together
    seen, last = set(), None
    for uid in u2:
        assert uid == last or uid not in seen
        seen.add(uid)
        last = uid
    with pytest.raises(ValueError, match="differ in length"):
        canonical_validation(sources, uids[:-1], infos, turns)


def test_lag_in_versions_and_updates_hand_counted():
    """Versions published at the end of each step; 4 updates in step 1, none in step 2 (e.g. a critic warm-up),
    6 in step 3. pi_old of step g is version g - 1."""
    book = LagBook(0)
    assert book.lags(1, [0, 0]) == ([0, 0], [0, 0])  # step 1 samples from the initial weights
    book.add_updates(4)
    book.publish(1)
    book.publish(2)
    book.add_updates(6)
    book.publish(3)
    # step 4 (pi_old = version 3): samples from versions 3, 2, 1, 0
    assert book.lags(4, [3, 2, 1, 0]) == ([0, 1, 2, 3], [0, 6, 6, 10])
    assert lag_metrics(*book.lags(4, [3, 2, 1, 0])) == {
        "training/rpg/lag_versions_mean": 1.5, "training/rpg/lag_versions_max": 3.0,
        "training/rpg/lag_updates_mean": 5.5, "training/rpg/lag_updates_max": 10.0}
    assert lag_metrics([], []) == {}
    with pytest.raises(ValueError, match=r"versions \[7\]"):
        book.lags(4, [7])


def test_lag_after_a_resume_counts_from_the_resumed_version():
    book = LagBook(5)  # resumed at step 5: the first trained step is 6, its pi_old version 5
    assert book.lags(6, [5]) == ([0], [0])
    book.add_updates(2)
    book.publish(6)
    assert book.lags(7, [5, 6]) == ([1, 0], [2, 0])
    with pytest.raises(ValueError, match=r"versions \[4\]"):
        book.lags(7, [4])  # generated before this process published anything


def test_the_batch_digest_names_the_samples_a_step_trained_on_whatever_their_order():
    from rpg.verl.sample_order_and_lag import batch_digest

    keys = [f"p3-{n}_{s}_0" for n in range(4) for s in range(8)]
    digest = batch_digest(keys)
    assert batch_digest(list(reversed(keys))) == digest  # the order rollouts finished in does not matter
    assert batch_digest(keys[:-1] + ["p3-4_7_0"]) != digest  # another prompt's sample in place of one
    assert batch_digest(keys[:-1]) != digest  # one sample fewer
    assert batch_digest([k.replace("p3-", "p4-") for k in keys]) != digest  # the prompts of another fetch
    assert digest == float(int(digest)) and 0 <= digest < 2 ** 48  # a float a metrics file holds exactly
