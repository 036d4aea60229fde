"""A data file a run reads, checked before Ray starts: what verl 0.9.1 reads of it, and a reward for each row.

A wrong data file otherwise fails after Ray, the model load and the whole validation before training:
``KeyError: 'prompt'`` at the first training batch (a raw problem/answer file), a TransferQueue error at the
first validation (a ``data_source`` the reward function does not know), ``Unable to concatenate an empty
list of datasets`` (no file at all), a row whose answer is null or not text scored by no one (the reward
function raises: the row drops out of validation, or every row does and TransferQueue fails on an empty list).
``file_problems`` reads what decides this, cheaply: a parquet file's schema (its footer), its ``data_source``
column and the leaf ``reward_model.ground_truth``, never the other columns (the three evaluation files: about a
millisecond each, docs/data-and-reports.md). A ``.json`` / ``.jsonl`` file (verl reads those too, with
``datasets``' JSON loader) has no footer and is read whole.

What verl reads (``verl.utils.dataset.rl_dataset.RLHFDataset`` and the reward loop's managers):

* the suffix: ``.parquet``, ``.json`` or ``.jsonl`` (anything else: ``Unsupported file format``);
* ``data.prompt_key`` (default ``prompt``): a chat list of ``{"role", "content"}`` messages;
* ``reward_model.ground_truth`` and ``data_source``: every reward manager reads them from each row, and the
  reward function scores by ``data_source`` (``rpg.reward.scored_sources.Scorer``), against the answer: a string
  that is not blank for ``rpg.reward`` and verl's scorers (``answer_problem``; a user's own function is given
  what the row holds).

``data_problems`` is the one check of a run's data keys (``DATA_KEYS``): the lists are not empty, every local
file exists and passes ``file_problems`` for the reward function the run scores with (``scorer_of``). One line
per problem naming the key and the file (``Absent``: a local file that does not exist here). It reads the config
through a getter, so that the driver (``rpg.verl.input_paths.input_path_problems``: the composed config; DRY_RUN
refuses on the same lines, an ``Absent`` one only warns) and the launchers before anything starts
(``override_problems``: the overrides they pass, ``rpg.launch`` and the tiny demo) run the same check without
importing torch or verl.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa

from rpg.config import RECIPE_REWARD  # rpg.reward_function's value for rpg.reward's compute_score
from rpg.reward.scored_sources import ANY, Scorer, is_rpg_reward, rpg_scorer, verl_scorer

DATA_KEYS = ("data.train_files", "data.val_files")
VERL_SUFFIXES = (".parquet", ".json", ".jsonl")  # RLHFDataset._read_files_and_tokenize
ANSWER_COLUMN = "reward_model.ground_truth"  # each row's answer, which the reward function scores against
PREPARE_HINT = "prepare it with `python -m rpg.data prepare` (docs/data-and-reports.md)"


class Absent(str):
    """A problem line saying that a local path does not exist on this machine. The driver refuses it like any
    other; a dry run (``rpg.launch``, DRY_RUN=1) only warns, since the path may exist where the run runs."""


class UnreadableFile(ValueError):
    """A data file pyarrow cannot read (message: pyarrow's reason)."""


Getter = Callable[[str], Any]  # dotted config key -> its value (plain Python; None when absent or null)
_RPG_HINT = ("score it with your own function (reward.custom_reward_function.path and .name), or write a data_source "
             "it handles")


def scorer_of(get: Getter) -> Scorer:
    """The reward function verl will call for the run's rows: ``reward.custom_reward_function`` (path, name)
    when a path is set (``rpg.reward.compute_score``, or the user's own: any ``data_source``), else the
    recipe's ``rpg.reward_function`` (the driver sets the path from it), else verl's ``default_compute_score``."""
    path, name = get("reward.custom_reward_function.path"), get("reward.custom_reward_function.name")
    if path:
        return rpg_scorer(_RPG_HINT) if is_rpg_reward(str(path), name) else ANY
    spec = get("rpg.reward_function")
    if spec is None:
        return verl_scorer("(rpg.reward_function=null)", f"use the recipe's rpg.reward (rpg.reward_function={RECIPE_REWARD}) "
                           "or a reward.custom_reward_function that scores it")
    return rpg_scorer(_RPG_HINT) if spec == RECIPE_REWARD else ANY


def data_file_problem(key: str, value: Any) -> str | None:
    """None if ``value`` is remote (``://``: verl copies it) or an existing file; else the one-line reason."""
    if not isinstance(value, str) or not value:
        return f"{key}={value!r} is not a file path"
    if "://" in value:
        return None
    p = Path(value).expanduser()
    if p.is_file():
        return None
    if p.is_dir():
        return f"{key}={value}: is a directory, expected a parquet file"
    return Absent(f"{key}={value}: no such file")


def data_problems(get: Getter, keys: Sequence[str] = DATA_KEYS) -> list[str]:
    """One line per problem of the run's data files (``keys``, read with ``get``): an empty list, a missing
    file, then what ``file_problems`` finds in each local file (empty: verl can read them all and score every row)."""
    scorer, prompt_key = scorer_of(get), get("data.prompt_key") or "prompt"
    problems = []
    for key in keys:
        value = get(key)
        if (empty := list_problem(key, value)) is not None:
            problems.append(empty)
            continue
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        for i, v in enumerate(values):
            name = f"{key}[{i}]" if len(values) > 1 else key
            missing = data_file_problem(name, v)
            if missing is not None:
                problems.append(missing)
            elif "://" not in v:
                problems += file_problems(name, v, scorer=scorer, prompt_key=prompt_key)
    return problems


def shared_file_warning(get: Getter) -> str | None:
    """One line when a file is both a training and a validation file (the same file: local paths resolved): the run
    is evaluated on problems it trains on. A warning, the run goes on, as ``rpg.data prepare`` warns of an
    evaluation set's problems in a training set."""
    def files(key: str) -> list[str]:
        value = get(key)
        items = list(value) if isinstance(value, (list, tuple)) else [value] if value else []
        return [v if "://" in v else os.path.realpath(os.path.expanduser(v)) for v in items if isinstance(v, str) and v]

    train = set(files(DATA_KEYS[0]))
    if shared := [v for v in dict.fromkeys(files(DATA_KEYS[1])) if v in train]:
        return (f"{' and '.join(DATA_KEYS)} both name {', '.join(shared)}: the run is evaluated on the problems it "
                "trains on (a model evaluated on problems it has seen)")
    return None


def override_problems(set_values: Mapping[str, Any], default: Getter) -> list[str]:
    """``data_problems`` of a run given as Hydra override values (``rpg.override_lists.values``), before its
    config is composed: the data keys the overrides set (a ``${...}`` interpolation is left to the driver, which
    checks the resolved value), every other key read from them or else from ``default`` (the recipe's YAML)."""
    def get(key: str) -> Any:
        return set_values[key] if key in set_values else default(key)

    keys = [k for k in DATA_KEYS if k in set_values and "${" not in str(set_values[k])]
    return data_problems(get, keys)


def list_problem(key: str, value) -> str | None:
    """An empty file list (``data.val_files=[]``, or ``VAL_FILES=' , '``): verl has nothing to read."""
    if isinstance(value, (list, tuple)) and not value:
        return f"{key}=[]: names no file; verl reads at least one (a path or a list of paths)"
    return None


class Layout(NamedTuple):
    """What the checks read of a data file: its schema and row count, its ``data_source`` column and its answers
    (``reward_model.ground_truth``, one value per row; each None when the file has no such column)."""

    schema: pa.Schema
    rows: int
    data_source: pa.ChunkedArray | None
    answers: pa.ChunkedArray | None


def read_layout(path: str | Path) -> Layout:
    """The file's ``Layout``; ``UnreadableFile`` if pyarrow cannot read it. A parquet file: the footer and two
    columns only, ``data_source`` and the leaf ``reward_model.ground_truth`` (a map ``reward_model``: the whole)."""
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        if path.suffix.lower() == ".parquet":
            with pq.ParquetFile(path) as pf:
                schema, rows = pf.schema_arrow, pf.metadata.num_rows
                columns = [*(["data_source"] if "data_source" in schema.names else []),
                           *([leaf] if (leaf := _answer_path(schema)) is not None else [])]
                table = pf.read(columns=columns)  # a struct's leaf comes back inside its struct
        else:
            table = _read_json(path)
            schema, rows = table.schema, table.num_rows
    except (pa.ArrowException, OSError, ValueError) as err:
        raise UnreadableFile(" ".join(str(err).split()) or type(err).__name__) from None
    column = table.column("data_source") if "data_source" in table.column_names else None
    answers = _answers(table.column("reward_model")) if _answer_path(schema) is not None else None
    return Layout(schema, rows, column, answers)


def _answer_path(schema: pa.Schema) -> str | None:
    """The column to read for the answers: the leaf of a struct ``reward_model``, a map ``reward_model`` whole;
    None without one (``layout_problems`` names it)."""
    if "reward_model" not in schema.names:
        return None
    t = schema.field("reward_model").type
    if pa.types.is_struct(t) and t.get_field_index("ground_truth") >= 0:
        return ANSWER_COLUMN
    return "reward_model" if pa.types.is_map(t) else None


def _answers(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """The answer of each row: the ``ground_truth`` of a struct or map ``reward_model`` column (null where the row's
    ``reward_model`` is null or, in a map, lacks the key)."""
    import pyarrow.compute as pc

    if pa.types.is_struct(column.type):
        return pc.struct_field(column, "ground_truth")
    return pc.map_lookup(column, pa.scalar("ground_truth", column.type.key_type), "first")


def _read_json(path: Path) -> pa.Table:
    """A JSON Lines file with pyarrow; a JSON list document (``datasets`` reads both) with ``json``."""
    import pyarrow.json as pj

    try:
        return pj.read_json(path)
    except pa.ArrowInvalid:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise ValueError("a .json data file must hold JSON Lines or a list of objects") from None
        return pa.Table.from_pylist(data)


def _chat_list(t: pa.DataType) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    v = t.value_type
    return pa.types.is_struct(v) and {"role", "content"} <= {v.field(i).name for i in range(v.num_fields)}


def layout_problems(schema: pa.Schema, prompt_key: str = "prompt") -> list[str]:
    """What verl would miss in a file with this schema (empty: in verl's layout)."""
    names = schema.names
    missing = []
    if prompt_key not in names:
        missing.append(f"no column {prompt_key!r} (data.prompt_key)")
    elif not _chat_list(schema.field(prompt_key).type):
        missing.append(f"column {prompt_key!r} (data.prompt_key) is {schema.field(prompt_key).type}, not a chat list "
                       "of {role, content} messages")
    if "reward_model" not in names:
        missing.append("no column 'reward_model' (with a field 'ground_truth')")
    else:
        t = schema.field("reward_model").type
        if pa.types.is_struct(t) and "ground_truth" not in {t.field(i).name for i in range(t.num_fields)}:
            missing.append(f"column 'reward_model' has no field 'ground_truth' ({t})")
        elif not (pa.types.is_struct(t) or pa.types.is_map(t)):
            missing.append(f"column 'reward_model' is {t}, not a mapping with a field 'ground_truth'")
    if "data_source" not in names:
        missing.append("no column 'data_source'")
    elif not (pa.types.is_string(schema.field("data_source").type) or pa.types.is_large_string(
            schema.field("data_source").type) or pa.types.is_dictionary(schema.field("data_source").type)):
        missing.append(f"column 'data_source' is {schema.field('data_source').type}, not text")
    return missing


def file_problems(key: str, path: str, *, scorer: Scorer, prompt_key: str = "prompt") -> list[str]:
    """One line per problem of the existing local data file ``path`` given as ``key`` (empty: verl can read
    it and ``scorer`` scores every row)."""
    where = f"{key}={path}"
    suffix = Path(path).suffix.lower()
    if suffix not in VERL_SUFFIXES:
        return [f"{where}: verl reads {', '.join(VERL_SUFFIXES[:-1])} and {VERL_SUFFIXES[-1]} data files, "
                f"not {suffix or 'a file without a suffix'!r}"]
    try:
        schema, rows, column, answers = read_layout(Path(path).expanduser())  # as data_file_problem, ~ expanded
    except UnreadableFile as err:
        kind = "parquet" if suffix == ".parquet" else "JSON"
        return [f"{where}: not a readable {kind} file ({err})"]
    missing = layout_problems(schema, prompt_key)
    if missing:
        return [f"{where}: not in verl's layout: {', '.join(missing)}; it has columns {sorted(schema.names)}: "
                f"{PREPARE_HINT}"]
    if rows == 0:
        return [f"{where}: no rows"]
    problems = []
    if column is not None and column.null_count:
        problems.append(f"{where}: {column.null_count} of {rows} rows have no data_source (null); every row needs one "
                        "(its reward function)")
    unscored = scorer.unscored(sorted(v for v in _distinct(column) if v is not None))
    if unscored:
        what = f"data_source {unscored[0]!r} has" if len(unscored) == 1 else \
            f"data_source values {', '.join(map(repr, unscored))} have"
        problems.append(f"{where}: {what} no reward function: {scorer.name} handles {scorer.allowed}; {scorer.hint}")
    if scorer.text_answers and answers is not None and (answer := answer_problem(answers, rows)) is not None:
        problems.append(f"{where}: {answer}: {scorer.name} scores each response against its row's answer, a "
                        "string that is not blank; write one in every row (python -m rpg.data prepare does), or "
                        "score the rows with your own reward.custom_reward_function")
    return problems


SHOWN_ROWS = 5  # row indices a refusal names before "..."


def answer_problem(answers: pa.ChunkedArray, rows: int) -> str | None:
    """What is wrong with the answers of a file (``reward_model.ground_truth``, one per row), naming the column,
    the first ``SHOWN_ROWS`` bad rows (0-based, in the file's order) and their count; None when every row holds
    text that is not blank. A column that is not text (integers, lists, ...) is wrong in every row."""
    import numpy as np
    import pyarrow.compute as pc

    kind = answers.type
    if pa.types.is_dictionary(kind) or pa.types.is_string_view(kind):  # as plain strings, for the string kernels
        kind = kind.value_type if pa.types.is_dictionary(kind) else pa.large_string()
        answers = answers.cast(kind)
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        what, bad = ("null" if pa.types.is_null(kind) else f"{kind} (not text)"), np.arange(rows)
    else:
        # blank: empty, or whitespace only (utf8_is_space is false on an empty string); null: no answer at all
        blank = pc.or_(pc.equal(pc.utf8_length(answers), 0), pc.utf8_is_space(answers))
        if not answers.null_count and not pc.any(blank).as_py():
            return None
        bad = np.flatnonzero(pc.fill_null(blank, True).to_numpy())
        what = "null, empty or blank"
    shown = ", ".join(str(i) for i in bad[:SHOWN_ROWS]) + (", ..." if len(bad) > SHOWN_ROWS else "")
    return f"{ANSWER_COLUMN} is {what} in {len(bad)} of {rows} rows (row indices {shown})"


def _distinct(column) -> list:
    import pyarrow.compute as pc

    if column is None:
        return []
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    return pc.unique(column).to_pylist()
