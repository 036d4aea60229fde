"""Map verl validation metric keys to the paper's benchmarks.

verl 0.9.1 logs validation as ``val-core/{data_source}/acc/mean@N`` (and ``val-aux/...``), one key
per data source. The benchmark of a data source is found by name (``math_dapo``, the authors' AIME24 file's, and
``aime24*`` -> AIME24, ``amc*`` -> AMC23, ...: ``rpg.data.hub_datasets.benchmark_named``, which ``rpg.data prepare``
keeps for its inputs too). ``source_map`` ({data_source: benchmark}) overrides or extends this; the value
``ignore`` (or ``-``) drops a data source.
"""

from __future__ import annotations

from rpg.data.hub_datasets import BENCHMARKS, benchmark_named
from rpg.reports.logs import Metrics

# The statistic the paper reports per benchmark: mean@32 on AIME/AMC (every value k/960 or k/1280);
# one sample per problem on Minerva / OlympiadBench (Table 7: every value k/272 or k/674), which the
# recipe logs as acc/mean@1 (rpg.validation.samples_per_problem).
PAPER_METRIC = {"AIME24": "acc/mean@32", "AIME25": "acc/mean@32", "AMC23": "acc/mean@32",
                "Minerva": "acc/mean@1", "OlympiadBench": "acc/mean@1"}
IGNORE = ("-", "ignore")  # source_map value that drops a data source


def benchmark_of(data_source: str, source_map: dict[str, str] | None = None) -> str | None:
    if source_map and data_source in source_map:
        bench = source_map[data_source]
        if bench in IGNORE:
            return None
        if bench not in BENCHMARKS:
            raise ValueError(f"source map {data_source}={bench}: benchmark must be one of {BENCHMARKS} or {IGNORE}")
        return bench
    return benchmark_named(data_source)


def benchmark_series(
    metrics: Metrics, metric: str = "acc/mean@32", source_map: dict[str, str] | None = None, section: str = "val-core"
) -> dict[str, tuple[str, dict[int, float]]]:
    """{benchmark: (data_source, {step: value})} for keys ``{section}/{data_source}/{metric}``.

    Two data sources mapping to one benchmark is an error (pass a source_map to disambiguate).
    """
    prefix, suffix = section + "/", "/" + metric
    out: dict[str, tuple[str, dict[int, float]]] = {}
    for key, series in metrics.items():
        if not (key.startswith(prefix) and key.endswith(suffix)) or len(key) <= len(prefix) + len(suffix):
            continue
        ds = key[len(prefix) : -len(suffix)]
        bench = benchmark_of(ds, source_map)
        if bench is None:
            continue
        if bench in out and out[bench][0] != ds:
            raise ValueError(
                f"data sources {out[bench][0]!r} and {ds!r} both map to {bench}; "
                "pass --source-map DATA_SOURCE=BENCHMARK to choose"
            )
        out[bench] = (ds, series)
    return out
