"""``python -m rpg.data`` never guesses: a templated problem is recognised
whatever its line endings and surrounding whitespace, several candidate columns stop with one line naming
them and the option that chooses one, a ``--data-source`` no reward function scores is refused, a corrupt
input names its file, an input labelled for another benchmark keeps its label (or ``--relabel`` says it does not),
and the small cases of ``prepare-all --datasets``, duplicated JSON keys, an all-rejected
run and an empty ``--out`` are each one line or a correct result."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from messages import names, one_line

from rpg.data import PROMPT_PREFIX, prepare, unwrap_prompt
from rpg.data.__main__ import main as cli_main
from rpg.data.prepare import rejects_path

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
ROWS = [{"problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(3)]


def _cli(capsys, *args):
    rc = cli_main(list(args))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- item 1: CRLF / whitespace


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared eval files not found at {SHARED}")
def test_crlf_templated_aime25_problems_are_unwrapped_once_and_deduplicated(tmp_path, capsys):
    """30 AIME25 rows, prompt content with CRLF line endings (a file saved on Windows), as a JSONL input: all 21
    written prompts held the instruction twice."""
    rows = pq.read_table(SHARED / "aime25.parquet").to_pylist()[:30]
    crlf = [{"problem": r["prompt"][0]["content"].replace("\n", "\r\n"), "answer": r["reward_model"]["ground_truth"]}
            for r in rows]
    src = _jsonl(tmp_path / "crlf.jsonl", crlf)
    rc, out, _ = _cli(capsys, "prepare", "aime2025", "--input", str(src), "--out", str(tmp_path / "o" / "crlf.parquet"))
    assert rc == 0, out
    written = pq.read_table(tmp_path / "o" / "crlf.parquet").to_pylist()
    distinct = {r["extra_info"]["raw_problem"] for r in rows}
    assert len(written) == len(distinct)
    for w in written:
        content = w["prompt"][0]["content"]
        assert content.count(PROMPT_PREFIX.strip()) == 1, content[:200]
        # the problem is the authors' raw problem, its own bytes (CRLF) kept
        assert w["extra_info"]["raw_problem"].replace("\r\n", "\n") in distinct
    # LF and CRLF copies of the same problems are duplicates of each other
    lf = [{"problem": r["prompt"][0]["content"], "answer": r["reward_model"]["ground_truth"]} for r in rows]
    both = _jsonl(tmp_path / "both.jsonl", lf + crlf)
    s = prepare("aime2025", tmp_path / "both.parquet", input_path=both)
    assert s.problems == len(distinct) and all(r.reason.startswith("duplicate of line") for r in s.rejects)


@pytest.mark.parametrize("eol, before, after", [
    ("\r\n", "", ""), ("\r", "", ""), ("\n", "  \n", "\n\n"), ("\n", "\ufeff", " "), ("\r\n", "", "\r\n"),
])
def test_template_detection_ignores_line_endings_and_surrounding_whitespace(eol, before, after):
    from rpg.data import format_prompt

    def text(problem: str) -> str:
        return before + format_prompt(problem).replace("\n", eol) + after

    problem = "Find $x$.\nGiven $x^2 = 4$ and $x > 0$."
    own = problem.replace("\n", eol)  # the problem keeps its own bytes
    assert unwrap_prompt(text(problem)) == own
    assert unwrap_prompt(text(format_prompt(problem))) == own  # wrapped twice: unwrapped twice
    assert unwrap_prompt(before + "not templated " + problem.replace("\n", eol) + after) is None


# ----------------------------------------------------------------------------- item 2: several candidate columns


def test_several_answer_columns_stop_naming_them_and_the_option(tmp_path, capsys):
    """GSM8K style: the worked solution in ``answer``, the number in ``final_answer``."""
    src = _jsonl(tmp_path / "gsm.jsonl", [{"question": "Natalia sold 48 clips ...", "answer": "... #### 72",
                                           "final_answer": "72"}])
    out = tmp_path / "o.parquet"
    rc, _, err = _cli(capsys, "prepare", "aime2025", "--input", str(src), "--out", str(out))
    assert rc == 2 and one_line(err).startswith(f"error: {src}: ")
    names(err, "'answer', 'final_answer'", "--answer-key")
    assert not out.exists()
    rc, stdout, _ = _cli(capsys, "prepare", "aime2025", "--input", str(src), "--out", str(out),
                         "--answer-key", "final_answer")
    assert rc == 0 and pq.read_table(out).to_pylist()[0]["reward_model"]["ground_truth"] == "72"
    assert "problem column 'question', answer column 'final_answer'" in stdout


def test_several_problem_columns_stop_and_the_summary_names_the_layout(tmp_path, capsys):
    src = _jsonl(tmp_path / "two.jsonl", [{"problem": "P?", "question": "Q?", "answer": "1"}])
    rc, _, err = _cli(capsys, "prepare", "aime2025", "--input", str(src), "--out", str(tmp_path / "o.parquet"))
    assert rc == 2 and one_line(err).startswith(f"error: {src}: ")
    names(err, "'problem', 'question'", "--problem-key")
    s = prepare("aime2025", tmp_path / "o.parquet", input_path=src, problem_key="question")
    assert "problem column 'question', answer column 'answer'" in s.line()
    verl = prepare("aime2025", tmp_path / "v.parquet", input_path=tmp_path / "o.parquet")
    assert "verl layout: prompt, reward_model.ground_truth" in verl.line()


# ----------------------------------------------------------------------------- item 6: --data-source


def test_a_data_source_no_reward_function_scores_is_refused(tmp_path, capsys):
    src = _jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "o.parquet"
    rc, _, err = _cli(capsys, "prepare", "aime2025", "--input", str(src), "--out", str(out),
                      "--data-source", "my_eval_set")
    assert rc == 2 and len(err.splitlines()) == 1 and not out.exists()
    assert err.startswith("error: --data-source my_eval_set: ")
    names(err, "rpg.reward.compute_score", "math_dapo, math, math_dapo_reasoning, aime*, amc*, minerva*, olympiad*",
          "default_compute_score")
    assert "'openai/gsm8k'" in err and "--any-data-source" in err
    # sources a scorer handles, in any letter case for rpg.reward's own routes, and verl's
    for ds in ("AIME2026", "amc_23", "minerva_math", "openai/gsm8k"):
        assert prepare("aime2025", out, input_path=src, data_source=ds).rows_written == 3
    # the user's own reward function scores it: an explicit opt-in
    rc, _, _ = _cli(capsys, "prepare", "aime2025", "--input", str(src), "--out", str(out),
                    "--data-source", "my_eval_set", "--any-data-source")
    assert rc == 0 and pq.read_table(out).column("data_source").to_pylist() == ["my_eval_set"] * 3


# ----------------------------------------------------------------------------- item 9: corrupt input


def _corrupt_parquet(path: Path) -> Path:
    """A parquet file whose footer and schema read, but whose snappy data pages do not."""
    table = pa.table({"problem": [f"What is {i}?" * 20 for i in range(200)], "answer": [str(i) for i in range(200)]})
    pq.write_table(table, path, compression="snappy")
    raw = bytearray(path.read_bytes())
    for i in range(100, 300):
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))
    return path


def test_a_corrupt_parquet_input_names_its_file(tmp_path, capsys):
    bad = _corrupt_parquet(tmp_path / "aime2025.parquet")
    rc, _, err = _cli(capsys, "prepare", "aime2025", "--input", str(bad), "--out", str(tmp_path / "o" / "x.parquet"))
    assert rc == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"error: {bad}: not a readable parquet file (") and "snappy" in err.lower()
    # several inputs: the broken one is named
    indir = tmp_path / "raw"
    indir.mkdir()
    _jsonl(indir / "aime2024.jsonl", ROWS)
    bad.rename(indir / "aime2025.parquet")
    rc, _, err = _cli(capsys, "prepare-all", "--input-dir", str(indir), "--out-dir", str(tmp_path / "all"),
                      "--datasets", "aime2024,aime2025")
    assert rc == 2 and err.splitlines()[-1].startswith(f"error: {indir / 'aime2025.parquet'}: not a readable parquet")


# ----------------------------------------------------------------------------- item 12: small silent cases


@pytest.mark.parametrize("datasets, expected", [
    ("", "error: --datasets '' names no dataset; allowed: "),
    (" , ", "error: --datasets ' , ' names no dataset; allowed: "),
    ("aime2025,aime2025", "error: --datasets names aime2025 twice; name each dataset once"),
])
def test_prepare_all_datasets_list_is_checked(tmp_path, capsys, datasets, expected):
    rc, out, err = _cli(capsys, "prepare-all", "--out-dir", str(tmp_path / "o"), "--input-dir", str(tmp_path),
                        "--datasets", datasets)
    assert rc == 2 and out == "" and len(err.splitlines()) == 1 and err.startswith(expected), err
    assert not (tmp_path / "o").exists()


def test_a_json_line_with_a_duplicated_key_is_rejected_naming_line_and_key(tmp_path, capsys):
    src = tmp_path / "dup.jsonl"
    src.write_text(json.dumps(ROWS[0]) + "\n" + '{"problem": "What is 5+5?", "answer": "10", "answer": "11"}\n'
                   + '{"problem": "Q?", "reward_model": {"ground_truth": "1", "ground_truth": "2"}, "answer": "3"}\n',
                   encoding="utf-8")
    out = tmp_path / "o.parquet"
    rc, _, err = _cli(capsys, "prepare", "aime2025", "--input", str(src), "--out", str(out))
    assert rc == 0
    two, three = err.splitlines()[-2:]
    names(two, str(src), "line 2", "duplicate key 'answer'")
    names(three, str(src), "line 3", "duplicate key 'ground_truth'")
    assert pq.read_table(out).column("reward_model").to_pylist() == [{"ground_truth": "1", "style": "rule"}]
    # a .json list: the row is rejected the same way (rows of a .json document have no line)
    doc = tmp_path / "dup.json"
    doc.write_text('[{"problem": "A?", "answer": "1"}, {"problem": "B?", "answer": "2", "problem": "C?"}]')
    s = prepare("aime2025", tmp_path / "j.parquet", input_path=doc)
    assert [(r.where, r.reason) for r in s.rejects] == [("row 1", "duplicate key 'problem' in the JSON object")]


def test_a_run_that_rejects_every_row_keeps_the_previous_rejects_file(tmp_path, capsys):
    out = tmp_path / "o.parquet"
    first = _jsonl(tmp_path / "first.jsonl", [*ROWS, {"problem": "", "answer": "1"}])
    prepare("aime2025", out, input_path=first)
    before_out, before_rejects = out.read_bytes(), rejects_path(out).read_bytes()
    bad = _jsonl(tmp_path / "bad.jsonl", [{"problem": "", "answer": "1"}, {"problem": "x"}])
    rc, _, err = _cli(capsys, "prepare", "aime2025", "--input", str(bad), "--out", str(out))
    failed = tmp_path / "o.failed.rejects.jsonl"
    assert rc == 2 and err.splitlines()[-1].startswith("error: aime2025: ")
    names(err.splitlines()[-1], str(bad), "2 rejected", "empty problem: 1", "no answer: 1", f"{out} and",
          str(rejects_path(out)), "kept", str(failed))
    assert out.read_bytes() == before_out and rejects_path(out).read_bytes() == before_rejects
    assert len(failed.read_text().splitlines()) == 2
    # a later good run removes the stale failed-run file along with writing its own
    prepare("aime2025", out, input_path=first)
    assert not failed.exists()


@pytest.mark.parametrize("args", [
    ["prepare", "aime2025", "--input", "IN", "--out", ""],
    ["prepare", "aime2025", "--input", "", "--out", "o.parquet"],
    ["prepare-all", "--out-dir", "", "--input-dir", "."],
    ["prepare-all", "--out-dir", "o", "--input-dir", " "],
])
def test_an_empty_path_option_is_refused(tmp_path, capsys, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "in.jsonl", ROWS)
    args = [str(tmp_path / "in.jsonl") if a == "IN" else a for a in args]
    with pytest.raises(SystemExit) as exit_:
        cli_main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "an empty path" in err.splitlines()[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


# ----------------------------------------------------------------------------- a file keeps its benchmark


@pytest.mark.skipif(not (SHARED / "aime25.parquet").is_file(), reason=f"the authors' aime25.parquet not found in {SHARED}")
def test_the_aime25_file_is_not_written_as_aime2024_unless_relabel_says_so(tmp_path, capsys):
    """`prepare aime2024 --input aime25.parquet` wrote 30 AIME 2025 problems labelled aime2024 without a word (the
    tables then put AIME25 results in the AIME24 column): one line naming both, nothing written; --relabel writes
    them, saying so in one line."""
    src, out = SHARED / "aime25.parquet", tmp_path / "x.parquet"
    rc, stdout, err = _cli(capsys, "prepare", "aime2024", "--input", str(src), "--out", str(out))
    assert rc == 2 and not out.exists() and stdout == ""
    assert one_line(err).startswith(f"error: {src}: ")
    names(err, "'aime2025' (AIME25, 960 rows)", "'aime2024'", "python -m rpg.data list", "--relabel")
    rc, stdout, err = _cli(capsys, "prepare", "aime2024", "--input", str(src), "--out", str(out), "--relabel")
    assert rc == 0 and "wrote 30 rows (30 problems)" in stdout
    assert one_line(err).startswith("warning: aime2024: ")
    names(err, str(src), "'aime2025' (AIME25, 960 rows)", "data_source 'aime2024'", "--relabel")
    assert set(pq.read_table(out, columns=["data_source"]).column("data_source").to_pylist()) == {"aime2024"}


@pytest.mark.parametrize("dataset,labels,refused", [
    ("aime2024", ["aime2024", "aime2024", "aime2025"], {"aime2025": 1}),  # one foreign row is enough
    ("aime2024", ["math_dapo"] * 3, {}),  # the authors' AIME24 file (reports: math_dapo -> AIME24)
    ("amc2023", ["amc_23"] * 3, {}),  # the authors' AMC23 file
    ("aime2025", ["AIME2025"] * 3, {}),  # any case
    ("minerva", ["olympiadbench"] * 3, {"olympiadbench": 3}),
    ("dapo-math-17k-en", ["math_dapo", "aime2024", "amc2023"], {"aime2024": 1, "amc2023": 1}),  # a test set as training
    ("dapo-math-17k-en", ["some_math_set"] * 3, {}),  # a training set of no benchmark: the preset's label
])
def test_rows_labelled_for_another_benchmark_are_refused(tmp_path, dataset, labels, refused):
    """A built frame (verl's layout, with a data_source column): rows naming the benchmark the preset writes (or,
    for a training preset, none) are prepared; others refused in one line naming each label with its count,
    unless relabel, which the summary records."""
    from rpg.data.hub_datasets import benchmark_named
    from rpg.data.rows import Problem, build_rows

    rows = build_rows([Problem(f"What is {i}+2?", str(i + 2), i) for i in range(len(labels))], "x", "test")
    for row, label in zip(rows, labels):
        row["data_source"] = label
    src = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    if not refused:
        assert prepare(dataset, tmp_path / "o.parquet", input_path=src).relabel_line() is None
        return
    with pytest.raises(ValueError) as err:
        prepare(dataset, tmp_path / "o.parquet", input_path=src)
    named = ", ".join(f"{v!r} ({benchmark_named(v)}, {n} rows)" for v, n in refused.items())
    assert str(err.value).startswith(f"{src}: its rows are labelled data_source {named}, but {dataset} writes ")
    assert "\n" not in str(err.value) and not (tmp_path / "o.parquet").exists()
    s = prepare(dataset, tmp_path / "o.parquet", input_path=src, relabel=True)
    assert s.relabelled == refused and s.rows_written == len(labels)
