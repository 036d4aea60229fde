"""mean@32 as the paper reports it (Sec. 5; T30 in docs/math.md#testable-identities), through verl 0.9.1's own validation grouping:
deduplicated problems (rpg.data) sampled val_kwargs.n = 32 times share one uid per problem."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from verl.trainer.ppo.metric_utils import process_validation_metrics

from rpg.data.prepare import prepare

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def test_t30_mean_at_32_of_aime24_is_a_multiple_of_one_960th(tmp_path):
    src = SHARED / "aime-2024.parquet"
    if not src.exists():
        pytest.skip(f"shared evaluation data not found at {src}")
    out = tmp_path / "aime2024.parquet"
    prepare("aime2024", out, input_path=src)
    problems = pd.read_parquet(out)
    assert len(problems) == 30

    n = 32
    rng = np.random.default_rng(0)
    skill = rng.uniform(0, 1, size=len(problems))
    uids, sources, acc = [], [], []
    for i, row in problems.iterrows():  # what verl does with val_kwargs.n = 32: one uid per dataset row
        uids += [f"uid-{i}"] * n
        sources += [row["data_source"]] * n
        acc += list(rng.uniform(size=n) < skill[i])
    metrics = process_validation_metrics(sources, uids, {"acc": [float(a) for a in acc]})
    (source,) = metrics
    value = metrics[source]["acc"]["mean@32"]
    assert value == pytest.approx(np.mean(acc), abs=1e-12)
    assert abs(value * 960 - round(value * 960)) < 1e-9, "T30: mean@32 over 30 problems is k/960"
    assert "best@32/mean" in metrics[source]["acc"]
