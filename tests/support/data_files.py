"""Small data files in verl's layout for tests that compose a run (the checks before Ray read them:
``rpg.data.checks``), written by ``rpg.data``'s own writer; a model folder those checks accept (``model_folder``)."""

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


def model_folder(path: Path) -> Path:
    """A folder the checks before Ray accept as a local model (``rpg.verl.input_paths.model_folder_problems``): a
    config transformers loads, a word-level tokenizer that encodes text, a weights file by name (never loaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    AutoConfig.for_model("qwen2", hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=16).save_pretrained(path)
    words = ["[UNK]", "Answer", ":", "42", "What", "is", "+", "1", "?"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(path)
    (path / "model.safetensors").write_bytes(b"")
    return path
