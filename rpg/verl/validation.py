"""Samples per validation problem, chosen by data source (the paper's Table 7 protocol).

The paper reports AIME24/AIME25/AMC23 as mean@32 but MinervaMath / OlympiadBench (Table 7) from
**one sample per problem**: every Table 7 value is a multiple of 1/272 (Minerva) or 1/674
(OlympiadBench), while every AIME value is a multiple of 1/960 = 1/(30·32). One 4K run evaluates
both, so the number of samples must depend on the row's data source.

verl 0.9.1's v1 trainer has the hook: a validation batch may carry a per-row ``__rollout_n__``
(``trainer_base._validate`` reads it for the expected sample counts and ``agent_loop_tq._run_prompt``
samples that many responses for the row, all under the row's uid, so verl's
``process_validation_metrics`` logs ``acc/mean@<n>`` per data source). :class:`SamplesPerSource`
wraps the validation dataloader and adds that column from ``rpg.validation.samples_per_problem``:
``{prefix: n}`` with the data source compared in lower case (as ``rpg.reward`` routes it); rows of
other sources get ``actor_rollout_ref.rollout.val_kwargs.n``. Sampling settings (temperature, top_p,
top_k) stay ``val_kwargs`` for every row: verl has one set per validation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

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
    """Iterable over the validation dataloader's batches with ``__rollout_n__`` set per row."""

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
