"""Data preparation for the RPG runs: verl RLHFDataset parquet files with the paper's prompt.

``python -m rpg.data prepare DATASET --out FILE.parquet [--input FILE | --hf NAME]`` (see
``python -m rpg.data --help`` and docs/data-and-reports.md). Importing this package never touches
the network: the ``datasets`` library is imported only when a hub source is actually read.
"""

from rpg.data.prepare import Summary, prepare
from rpg.data.hub_datasets import SOURCES, SourceSpec, get_source
from rpg.data.template import PROMPT_PREFIX, PROMPT_SUFFIX, format_prompt, unwrap_prompt

__all__ = [
    "PROMPT_PREFIX",
    "PROMPT_SUFFIX",
    "SOURCES",
    "SourceSpec",
    "Summary",
    "format_prompt",
    "get_source",
    "prepare",
    "unwrap_prompt",
]
