"""Samples per validation problem by data source (the paper's Table 7 protocol), and the rows left unscored.

The paper reports AIME24/AIME25/AMC23 as mean@32 but MinervaMath and OlympiadBench from one sample per problem (every
Table 7 value is a multiple of 1/272 or 1/674, every AIME value of 1/960 = 1/(30·32)); one run evaluates both.
``SamplesPerSource`` sets verl 0.9.1's per-row ``__rollout_n__`` from ``rpg.validation.samples_per_problem``
(``{prefix: n}``, the data source compared in lower case; other rows get ``val_kwargs.n``), so verl logs
``acc/mean@<n>`` per data source. A sample whose reward function raised or whose rollout failed never reaches verl's
metrics (its ``acc`` counts it as 0): ``unscored_by_source`` counts such rows and samples per data source, logged as
``val-aux/<data_source>/unscored_rows`` and ``.../unscored_samples`` with a warning line (``unscored_warnings``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

ROLLOUT_N_KEY = "__rollout_n__"  # verl 0.9.1's per-row sample count (v1 trainer + agent loop)


def samples_for(data_source: str, rule: Mapping[str, int], default_n: int) -> int:
    """Samples for one problem of ``data_source``: the first matching prefix of ``rule`` (longest first)."""
    ds = str(data_source).lower()
    for prefix in sorted(rule, key=len, reverse=True):
        if ds.startswith(prefix):
            return int(rule[prefix])
    return int(default_n)


class SamplesPerSource:
    """Iterable over the validation dataloader's batches with ``__rollout_n__`` set per row (verl's
    ``trainer_base._validate`` reads it for the expected sample counts, ``agent_loop_tq._run_prompt`` samples that
    many responses under the row's uid); sampling settings stay ``val_kwargs`` for every row (one set per validation
    in verl)."""

    def __init__(self, loader: Iterable[dict], rule: Mapping[str, int], default_n: int) -> None:
        self.loader, self.rule, self.default_n = loader, dict(rule), int(default_n)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[dict]:
        for batch in self.loader:
            sources = batch.get("data_source")
            if sources is None:
                raise KeyError("validation rows need a data_source column for rpg.validation.samples_per_problem")
            counts = [samples_for(ds, self.rule, self.default_n) for ds in sources]
            # object dtype, as verl's collate_fn stores non-tensor columns
            yield {**batch, ROLLOUT_N_KEY: np.array(counts, dtype=object)}


@dataclass(frozen=True)
class Unscored:
    """One data source's validation rows (problems) and samples, and how many of them were not scored: a row is
    unscored when fewer of its samples came back than it asked for. ``acc_logged``: some sample of the source
    came back with an ``acc`` (verl then counts the missing samples as acc 0)."""

    rows: int
    of_rows: int
    samples: int
    of_samples: int
    acc_logged: bool


def unscored_by_source(expected: Mapping[tuple[str, str], int], data_sources: Sequence, sample_uids: Sequence,
                       acc: Sequence | None = None) -> dict[str, Unscored]:
    """Per data source, the rows and samples not scored. ``expected``: ``{(data_source, uid): samples asked}`` for
    every row submitted (verl's ``expected_acc_counts``); ``data_sources``, ``sample_uids``: one entry per sample
    that came back; ``acc``: its ``acc`` (None where the reward function gave none), when any sample has one."""
    got = Counter(zip(map(str, data_sources), map(str, sample_uids)))
    with_acc = {str(ds) for ds, a in zip(data_sources, acc or ()) if a is not None}
    out: dict[str, list[int]] = {}
    for (ds, uid), n in expected.items():
        missing = max(int(n) - got[(str(ds), str(uid))], 0)
        counts = out.setdefault(str(ds), [0, 0, 0, 0])
        counts[0] += missing > 0
        counts[1] += 1
        counts[2] += missing
        counts[3] += int(n)
    return {ds: Unscored(*c, acc_logged=ds in with_acc) for ds, c in out.items()}


def unscored_metrics(counts: Mapping[str, Unscored]) -> dict[str, int]:
    """``val-aux/<data_source>/unscored_rows`` and ``.../unscored_samples`` for every data source validated."""
    metrics = {}
    for ds, u in counts.items():
        metrics[f"val-aux/{ds}/unscored_rows"] = u.rows
        metrics[f"val-aux/{ds}/unscored_samples"] = u.samples
    return metrics


def unscored_warnings(counts: Mapping[str, Unscored], step: int) -> list[str]:
    """One warning line per data source with a row not scored at the validation of ``step``."""
    lines = []
    for ds, u in counts.items():
        if not u.rows:
            continue
        effect = (f"verl's val-core/{ds}/acc counts the missing samples as wrong (acc 0) and averages its other "
                  "variables over the scored ones" if u.acc_logged else
                  f"verl's metrics of {ds} average the scored samples only" if u.samples < u.of_samples else
                  f"verl logs no metric of {ds}")
        lines.append(f"rpg: warning: validation at step {step}: {u.rows} of {u.of_rows} {ds} rows not scored "
                     f"({u.samples} of {u.of_samples} samples missing: their reward function raised or their "
                     f"rollout failed, tracebacks above); {effect}; logged as val-aux/{ds}/unscored_rows")
    return lines
