"""A validation row that is not scored (its reward function raised, its rollout failed) is counted and said, never
left out in silence: ``val-aux/<data_source>/unscored_rows`` and ``unscored_samples`` at every validation and one
warning line per data source (``rpg.verl.validation``, through verl's ``_val_metrics_update`` hook)."""

from __future__ import annotations

import inspect

import pytest
from messages import names, one_line

from rpg.verl.validation import Unscored, unscored_by_source, unscored_metrics, unscored_warnings


def _samples(rows: dict[tuple[str, str], int]) -> tuple[list, list, list]:
    """(data_sources, uids, acc) of the samples that came back: ``rows`` maps (source, uid) to how many."""
    data_sources, uids = [], []
    for (ds, uid), n in rows.items():
        data_sources += [ds] * n
        uids += [uid] * n
    return data_sources, uids, [1.0 if i % 2 else 0.0 for i in range(len(uids))]


EXPECTED = {("aime2025", "a"): 4, ("aime2025", "b"): 4, ("aime2025", "c"): 4, ("minerva_math", "m1"): 1,
            ("minerva_math", "m2"): 1}
# row b lost one sample, row c all four (its reward raised on each), minerva's m2 its only one
CAME_BACK = {("aime2025", "a"): 4, ("aime2025", "b"): 3, ("minerva_math", "m1"): 1}


def test_rows_with_a_missing_sample_are_counted_per_source():
    ds, uids, acc = _samples(CAME_BACK)
    counts = unscored_by_source(EXPECTED, ds, uids, acc)
    assert counts == {"aime2025": Unscored(rows=2, of_rows=3, samples=5, of_samples=12, acc_logged=True),
                      "minerva_math": Unscored(rows=1, of_rows=2, samples=1, of_samples=2, acc_logged=True)}
    assert unscored_metrics(counts) == {"val-aux/aime2025/unscored_rows": 2, "val-aux/aime2025/unscored_samples": 5,
                                        "val-aux/minerva_math/unscored_rows": 1,
                                        "val-aux/minerva_math/unscored_samples": 1}


def test_every_source_is_logged_and_only_a_loss_is_warned():
    ds, uids, acc = _samples({k: n for k, n in EXPECTED.items()})
    counts = unscored_by_source(EXPECTED, ds, uids, acc)
    assert unscored_metrics(counts) == {"val-aux/aime2025/unscored_rows": 0, "val-aux/aime2025/unscored_samples": 0,
                                        "val-aux/minerva_math/unscored_rows": 0,
                                        "val-aux/minerva_math/unscored_samples": 0}
    assert unscored_warnings(counts, 3) == []


def test_the_warning_names_the_source_the_counts_and_what_verl_made_of_them():
    counts = {"aime2025": Unscored(10, 30, 40, 120, acc_logged=True),
              "gsm8k": Unscored(1, 2, 1, 2, acc_logged=False), "olympiad": Unscored(3, 3, 3, 3, acc_logged=False)}
    aime, gsm8k, olympiad = unscored_warnings(counts, 0)
    assert all(one_line(x).startswith("rpg: warning: validation at step 0: ") for x in (aime, gsm8k, olympiad))
    # verl's acc counts a missing sample as wrong where it logs acc; elsewhere it averages the scored ones, or logs none
    names(aime, "10 of 30 aime2025 rows", "40 of 120 samples", "val-core/aime2025/acc", "acc 0",
          "val-aux/aime2025/unscored_rows")
    names(gsm8k, "1 of 2 gsm8k rows", "1 of 2 samples", "scored", "val-aux/gsm8k/unscored_rows")
    names(olympiad, "3 of 3 olympiad rows", "3 of 3 samples", "no metric", "val-aux/olympiad/unscored_rows")
    assert "acc 0" not in gsm8k + olympiad


def test_the_trainer_adds_them_to_verls_own_validation_metrics(capsys):
    """Through verl's hook as its ``_validate`` calls it (verl's ``_val_metrics_update`` runs unchanged): as the red
    team's file (a third of the AIME rows with a null answer, on which rpg.reward raised for each of 4 samples)."""
    from rpg.verl.trainer import RPGTrainer

    expected = {("aime2025", f"u{i}"): 4 for i in range(6)}
    came = {k: 4 for i, k in enumerate(expected) if i % 3}
    ds, uids, acc = _samples(came)
    infos = {"reward": [1.0 if a else -1.0 for a in acc], "acc": acc}
    trainer = object.__new__(RPGTrainer)
    trainer.global_steps = 2
    metrics = trainer._val_metrics_update(ds, uids, infos, [1] * len(uids), expected_acc_counts=expected)
    assert metrics["val-aux/aime2025/unscored_rows"] == 2 and metrics["val-aux/aime2025/unscored_samples"] == 8
    assert metrics["val-core/aime2025/acc/mean@4"] == pytest.approx(sum(acc) / 24)  # verl's: missing as 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("rpg: warning: validation at step 2: ")
    names(line, "2 of 6 aime2025 rows", "8 of 24 samples")


def test_verl_validate_hands_the_rows_asked_to_the_hook():
    """The hook sees every row asked for because verl's ``_validate`` passes ``expected_acc_counts`` (verl 0.9.1);
    a verl that stops doing so fails here rather than counting nothing."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    source = inspect.getsource(PPOTrainer._validate)
    assert "self._val_metrics_update(" in source and "expected_acc_counts=expected_acc_counts" in source
    assert "expected_acc_counts[(str(data_source), str(uid))] = rollout_n" in source
