"""Known datasets: where to find them on the Hugging Face hub and how their columns map.

Each preset gives the default ``data_source`` written into the parquet. The names are chosen so that
``rpg.reward.compute_score`` routes them as the paper scored them (AIME/AMC/DAPO -> DAPO math scorer,
Minerva/OlympiadBench -> Math-Verify); ``math_dapo`` and ``aime*`` also route in verl's own
``default_compute_score``, ``amc*`` / ``minerva*`` / ``olympiad*`` need ``rpg.reward``.

Hub names and column names could not be checked from the (offline) development machine; they are
the commonly used public copies. Every preset accepts overrides (``--hf``, ``--hf-config``,
``--split``, ``--problem-key``, ``--answer-key``), and a missing column is a clear error listing the
columns that exist.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# the paper's benchmarks, and the one a data_source names (case and punctuation ignored): the reports file a run's
# val-core/<data_source>/... under it (rpg.reports.benchmarks), ``prepare`` keeps an input's (rpg.data.prepare)
BENCHMARKS = ("AIME24", "AIME25", "AMC23", "Minerva", "OlympiadBench")


def benchmark_named(data_source: str) -> str | None:
    """``math_dapo`` (the authors' AIME24 file) or containing ``aime24``/``aime2024`` -> AIME24; containing
    ``aime25``/``aime2025`` -> AIME25; ``amc`` -> AMC23; ``minerva`` -> Minerva; ``olympiad`` -> OlympiadBench;
    anything else None."""
    s = re.sub(r"[^a-z0-9]", "", data_source.lower())
    if s == "mathdapo" or "aime24" in s or "aime2024" in s:
        return "AIME24"
    if "aime25" in s or "aime2025" in s:
        return "AIME25"
    if "amc" in s:
        return "AMC23"
    if "minerva" in s:
        return "Minerva"
    if "olympiad" in s:
        return "OlympiadBench"
    return None


@dataclass(frozen=True)
class SourceSpec:
    key: str                      # CLI name
    data_source: str              # value written to the parquet's data_source column
    split: str                    # "train" or "test" (written to extra_info.split)
    hf_name: str                  # default Hugging Face dataset
    hf_config: str | None = None
    hf_split: str | None = None   # None: the dataset's only split (error if it has several)
    problem_keys: tuple[str, ...] = ("problem", "question", "Problem", "Question")
    answer_keys: tuple[str, ...] = ("answer", "Answer", "final_answer", "ground_truth")
    english_only: bool = False    # reject problems containing CJK characters
    default_copies: int = 1       # rows per problem (eval: 1 + val_kwargs.n=32)
    description: str = ""
    file_names: tuple[str, ...] = ()  # other local file stems (the authors' names) for prepare-all --input-dir

    @property
    def local_stems(self) -> tuple[str, ...]:
        return (self.key, *self.file_names)


SOURCES: dict[str, SourceSpec] = {
    s.key: s
    for s in (
        SourceSpec(
            "dapo-math-17k-en", "math_dapo", "train", "math-dataset/DAPO-17k-Eng", hf_split="train",
            english_only=True, file_names=("dapo-math-17k-eng",),
            description="training set: DAPO-Math-17k, English problems (~13.9k), deduplicated",
        ),
        SourceSpec(
            "dapo-math-17k", "math_dapo", "train", "BytedTsinghua-SIA/DAPO-Math-17k", hf_split="train",
            english_only=True,
            description="training set from the original DAPO-Math-17k (rows repeated; CJK filtered, deduplicated)",
        ),
        SourceSpec(
            "aime2024", "aime2024", "test", "BytedTsinghua-SIA/AIME-2024",
            description="AIME 2024, 30 problems (DAPO's copy, as the authors' prepare script; rows repeated)",
            file_names=("aime-2024",),
        ),
        SourceSpec("aime2025", "aime2025", "test", "math-ai/aime25", description="AIME 2025, 30 problems",
                   file_names=("aime25",)),
        SourceSpec("amc2023", "amc2023", "test", "math-ai/amc23", description="AMC 2023, 40 problems",
                   file_names=("amc-23",)),
        SourceSpec("minerva", "minerva_math", "test", "math-ai/minervamath", description="MinervaMath, 272 problems (Table 7)"),
        SourceSpec(
            "olympiadbench", "olympiadbench", "test", "math-ai/olympiadbench",
            description="OlympiadBench, English text-only math (Table 7)",
        ),
    )
}


def get_source(key: str) -> SourceSpec:
    try:
        return SOURCES[key]
    except KeyError:
        raise ValueError(f"unknown dataset {key!r}; allowed: {', '.join(SOURCES)}") from None
