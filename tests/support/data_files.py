"""Small data files in verl's layout for tests that compose a run (the checks before Ray read them:
``rpg.data.checks``), written by ``rpg.data``'s own writer."""

from __future__ import annotations

from pathlib import Path

from rpg.data.io import write_parquet_atomic
from rpg.data.rows import Problem, build_rows


def verl_file(path: Path, data_source: str = "aime2025", n: int = 3) -> Path:
    """``n`` one-line problems with ``data_source`` (default: one ``rpg.reward`` and verl score)."""
    problems = [Problem(f"What is {i}+1?", str(i + 1), i) for i in range(n)]
    write_parquet_atomic(build_rows(problems, data_source, "test"), path)
    return path


def answers_file(path: Path, answers: list, data_source: str = "aime2025") -> Path:
    """A file in verl's layout whose rows hold ``answers`` as their ``reward_model.ground_truth`` as given (None:
    null, an integer: an integer column), the mistakes ``rpg.data.checks.answer_problem`` refuses."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = build_rows([Problem(f"What is {i}+1?", "x", i) for i in range(len(answers))], data_source, "test")
    for row, answer in zip(rows, answers):
        row["reward_model"]["ground_truth"] = answer
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
