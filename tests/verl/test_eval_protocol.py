"""The paper's evaluation protocol in one run: AIME/AMC mean@32, MinervaMath / OlympiadBench one sample
per problem (Table 7: every value is k/272 or k/674, every AIME value k/960), via verl 0.9.1's per-row
``__rollout_n__`` set by ``rpg.verl.validation`` from ``rpg.validation.samples_per_problem``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from verl.trainer.ppo.metric_utils import process_validation_metrics

from rpg.data.prepare import prepare
from rpg.config import PAPER_SAMPLES_PER_PROBLEM, RPGConfigError, parse_rpg_settings
from rpg.verl.validation import ROLLOUT_N_KEY, SamplesPerSource, samples_for

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
PAPER = dict(PAPER_SAMPLES_PER_PROBLEM)


@pytest.mark.parametrize("ds, n", [("aime2024", 32), ("math_dapo", 32), ("amc_23", 32), ("minerva_math", 1),
                                   ("MinervaMath", 1), ("olympiadbench", 1), ("OlympiadBench", 1)])
def test_samples_per_problem_by_source(ds, n):
    assert samples_for(ds, PAPER, 32) == n


def test_longest_prefix_wins_and_rows_keep_their_order():
    assert samples_for("olympiad_hard", {"olympiad": 1, "olympiad_hard": 4}, 32) == 4
    batch = {"data_source": np.array(["aime2025", "minerva_math", "amc2023", "olympiadbench"], dtype=object),
             "raw_prompt": np.array(list("abcd"), dtype=object)}
    (out,) = list(SamplesPerSource([batch], PAPER, 32))
    assert list(out[ROLLOUT_N_KEY]) == [32, 1, 32, 1] and out[ROLLOUT_N_KEY].dtype == object
    assert list(out["raw_prompt"]) == list("abcd") and ROLLOUT_N_KEY not in batch
    with pytest.raises(KeyError, match="data_source"):
        list(SamplesPerSource([{"raw_prompt": batch["raw_prompt"]}], PAPER, 32))


def test_settings_default_is_the_paper_protocol_and_bad_values_are_one_line():
    assert parse_rpg_settings({}).samples_per_problem == (("minerva", 1), ("olympiad", 1))
    s = parse_rpg_settings({"validation": {"samples_per_problem": {"Minerva": 4}}})
    assert s.samples_per_problem == (("minerva", 4),)
    assert parse_rpg_settings({"validation": {"samples_per_problem": {}}}).samples_per_problem == ()
    for bad, msg in [({"minerva": 0}, "rpg.validation.samples_per_problem.minerva=0 is invalid"),
                     ({"minerva": 1.5}, "expected an integer >= 1"), ([1], "expected a mapping"),
                     ({"Minerva": 1, "minerva ": 4}, "names the data_source prefix 'minerva' twice")]:
        with pytest.raises(RPGConfigError, match=msg):
            parse_rpg_settings({"validation": {"samples_per_problem": bad}})
    with pytest.raises(RPGConfigError, match="rpg.validation.n is not a known key"):
        parse_rpg_settings({"validation": {"n": 1}})


def test_recipe_config_carries_the_paper_protocol():
    from recipe_config import apply

    cfg, settings = apply()
    assert settings.samples_per_problem == PAPER_SAMPLES_PER_PROBLEM
    _, off = apply("rpg.validation.samples_per_problem=null")  # ={} would merge with the default in Hydra
    assert off.samples_per_problem == ()


def test_one_validation_gives_mean_at_32_on_aime_and_mean_at_1_on_minerva(tmp_path):
    """verl's own grouping on what the wrapped loader makes it sample: AIME24 (the authors' file, 30
    problems) at n = 32 lands on the k/960 grid, a 272-problem Minerva set at n = 1 on the k/272 grid."""
    src = SHARED / "aime-2024.parquet"
    if not src.exists():
        pytest.skip(f"shared evaluation data not found at {src}")
    import pandas as pd

    prepare("aime2024", tmp_path / "aime2024.parquet", input_path=src)
    aime = pd.read_parquet(tmp_path / "aime2024.parquet")
    sources = np.array(list(aime["data_source"]) + ["minerva_math"] * 272, dtype=object)
    (batch,) = list(SamplesPerSource([{"data_source": sources}], PAPER, 32))

    rng = np.random.default_rng(0)
    skill = rng.uniform(size=len(sources))
    uids, ds_list, acc, expected = [], [], [], {}
    for i, (ds, n) in enumerate(zip(sources, batch[ROLLOUT_N_KEY])):  # what verl samples: n per row, one uid
        uids += [f"uid-{i}"] * n
        ds_list += [ds] * n
        acc += [float(a) for a in rng.uniform(size=n) < skill[i]]
        expected[(ds, f"uid-{i}")] = n
    metrics = process_validation_metrics(ds_list, uids, {"acc": acc}, expected_acc_counts=expected)
    aime24 = metrics["aime2024"]["acc"]
    minerva = metrics["minerva_math"]["acc"]
    assert "mean@32" in aime24 and "mean@1" in minerva and "mean@32" not in minerva
    assert len([s for s in ds_list if s == "aime2024"]) == 960 and ds_list.count("minerva_math") == 272
    assert abs(aime24["mean@32"] * 960 - round(aime24["mean@32"] * 960)) < 1e-9
    assert abs(minerva["mean@1"] * 272 - round(minerva["mean@1"] * 272)) < 1e-9


# The same protocol inside verl's real trainer (one validation with mean@4 and mean@1 sets, Math-Verify in the
# Ray reward worker): tests/e2e/test_launch_cpu_e2e.py.
