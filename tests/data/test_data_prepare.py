"""Data preparation: local files, fake hub loader, row checks, determinism, atomic writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from messages import names

from rpg.data import format_prompt, prepare, unwrap_prompt
from rpg.data.__main__ import main as cli_main
from rpg.data.prepare import rejects_path
from rpg.data.rows import resolve_layout
from rpg.reward import MATH_DAPO, MATH_VERIFY, scorer_for

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"

# The authors' prompt template (their README and evaluation files), typed out independently of rpg.data.template.
SPEC_PROMPT = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{question}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def _write_jsonl(path: Path, records: list) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


MIXED = [
    {"problem": "What is 1+1?", "answer": "2"},                # 0 ok
    {"problem": "", "answer": "3"},                            # 1 empty problem
    {"problem": "Compute 2+2.", "answer": None},               # 2 no answer
    {"problem": 17, "answer": "4"},                            # 3 non-string problem
    {"problem": "Compute 3.5+1.", "answer": 4.5},              # 4 a non-integral number
    {"problem": "What is  1+1?", "answer": "2"},               # 5 duplicate of 0 (whitespace)
    {"problem": "What is 1+1?", "answer": "3"},                # 6 duplicate, different answer
    "{not json",                                               # 7 invalid JSON line
    {"problem": "Find x if x^2=9, x>0.", "answer": 3},          # 8 ok (int answer -> "3")
    {"problem": "Give the answer.", "answer": ["7"]},          # 9 ok (one-element list)
    {"problem": "Two answers?", "answer": ["1", "2"]},         # 10 list of 2 items
    {"problem": "   ", "answer": "1"},                         # 11 empty problem (whitespace)
    [1, 2],                                                    # 12 not a mapping
    {"problem": "计算 1+1。", "answer": "2"},                    # 13 CJK: kept for eval presets
    {"problem": "Missing answer key"},                         # 14 no answer
    {"problem": "What is 2*3?", "answer": "  "},                # 15 empty answer
]

EXPECTED_REJECTS = {
    1: "empty problem",
    2: "no answer (missing or null)",
    3: "non-string problem (int)",
    4: "a number answer 4.5 in column 'answer' (not an integer a float holds exactly: how it was written cannot be "
       "told; store the answers as text)",
    5: "duplicate of line 1",  # JSONL rejects name file lines (row 0 is line 1)
    6: "duplicate of line 1 with a different answer ('3' vs '2')",
    7: "invalid JSON line",
    10: "non-string answer (list of 2 items)",
    11: "empty problem",
    12: "row is not a mapping (list)",
    14: "no answer (missing or null)",
    15: "no answer (only whitespace)",
}


def test_template_is_spec_6_2():
    assert format_prompt("Q?") == SPEC_PROMPT.format(question="Q?")
    assert unwrap_prompt(format_prompt(" a\nb ")) == " a\nb "
    assert unwrap_prompt("Solve this: 1+1") is None


def test_local_jsonl_rejects_by_index_with_reason(tmp_path):
    src = _write_jsonl(tmp_path / "in.jsonl", MIXED)
    out = tmp_path / "out" / "aime.parquet"
    s = prepare("aime2024", out, input_path=src)
    assert s.rows_read == len(MIXED)
    got = {r.index: r.reason for r in s.rejects}
    assert set(got) == set(EXPECTED_REJECTS)
    for i, reason in EXPECTED_REJECTS.items():
        assert got[i].startswith(reason), (i, got[i])
    assert s.problems == s.rows_written == 4  # rows 0, 8, 9, 13
    line = s.line()
    assert "read 16 rows" in line and "wrote 4 rows" in line and "rejected 12" in line
    assert "duplicate: 1" in line and "duplicate with a different answer: 1" in line
    assert "empty problem: 2" in line and "invalid JSON: 1" in line
    rows = pq.read_table(out).to_pylist()
    assert [r["extra_info"]["source_index"] for r in rows] == [0, 8, 9, 13]
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["2", "3", "7", "2"]
    assert rows[0]["prompt"] == [{"role": "user", "content": SPEC_PROMPT.format(question="What is 1+1?")}]
    assert rows[0]["data_source"] == "aime2024" and rows[0]["extra_info"]["split"] == "test"
    side = [json.loads(x) for x in rejects_path(out).read_text().splitlines()]
    assert [d["index"] for d in side] == sorted(EXPECTED_REJECTS)
    assert [d["line"] for d in side] == [i + 1 for i in sorted(EXPECTED_REJECTS)]


def test_train_preset_rejects_non_english(tmp_path):
    extra = [{"problem": "Kana ひらがな?", "answer": "1"}, {"problem": "Full-width punctuation（x）？", "answer": "1"}]
    src = _write_jsonl(tmp_path / "train.jsonl", MIXED[:1] + MIXED[13:14] + extra)
    s = prepare("dapo-math-17k-en", tmp_path / "train.parquet", input_path=src)
    assert [(r.index, r.reason) for r in s.rejects] == [(1, "non-English problem (CJK characters)"),
                                                        (2, "non-English problem (CJK characters)")]
    assert s.problems == 2
    row = pq.read_table(tmp_path / "train.parquet").to_pylist()[0]
    assert row["data_source"] == "math_dapo" and row["extra_info"]["split"] == "train"


def test_rerun_is_byte_identical_and_leaves_no_temp_files(tmp_path):
    src = _write_jsonl(tmp_path / "in.jsonl", MIXED)
    out = tmp_path / "o.parquet"
    prepare("amc2023", out, input_path=src, copies=3)
    first, first_rej = out.read_bytes(), rejects_path(out).read_bytes()
    prepare("amc2023", out, input_path=src, copies=3)
    assert out.read_bytes() == first and rejects_path(out).read_bytes() == first_rej
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "o.parquet", "o.rejects.jsonl"]
    # a clean input removes the stale rejects file
    clean = _write_jsonl(tmp_path / "clean.jsonl", MIXED[:1])
    prepare("amc2023", out, input_path=clean)
    assert not rejects_path(out).exists()


def test_failed_write_keeps_previous_file(tmp_path, monkeypatch):
    src = _write_jsonl(tmp_path / "in.jsonl", MIXED[:1])
    out = tmp_path / "o.parquet"
    prepare("aime2025", out, input_path=src)
    before = out.read_bytes()

    import rpg.data.io as dio

    def boom(table, where, **kw):
        Path(where).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(dio.pq, "write_table", boom)
    with pytest.raises(OSError, match="disk full"):
        prepare("aime2025", out, input_path=_write_jsonl(tmp_path / "in2.jsonl", MIXED[8:9]))
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "in2.jsonl", "o.parquet"]


def test_copies_layout(tmp_path):
    src = _write_jsonl(tmp_path / "in.jsonl", [MIXED[0], MIXED[8]])
    out = tmp_path / "k.parquet"
    s = prepare("aime2025", out, input_path=src, copies=32)
    assert s.rows_written == 64
    rows = pq.read_table(out).to_pylist()
    assert [r["extra_info"]["index"] for r in rows] == [0] * 32 + [1] * 32
    assert [r["extra_info"]["copy"] for r in rows] == list(range(32)) * 2
    with pytest.raises(ValueError, match="copies"):
        prepare("aime2025", out, input_path=src, copies=0)


def test_json_list_input_and_explicit_keys(tmp_path):
    src = tmp_path / "in.json"
    src.write_text(json.dumps([{"Q": "What is 5-2?", "A": "3"}, {"Q": "What is 6-2?", "A": "4"}]))
    s = prepare("minerva", tmp_path / "m.parquet", input_path=src, problem_key="Q", answer_key="A")
    assert (s.rows_read, s.rows_written, s.rejects) == (2, 2, [])
    rows = pq.read_table(tmp_path / "m.parquet").to_pylist()
    assert rows[1]["extra_info"]["raw_problem"] == "What is 6-2?"
    assert scorer_for(rows[0]["data_source"]) == MATH_VERIFY


def test_missing_columns_is_a_clear_error(tmp_path):
    src = _write_jsonl(tmp_path / "in.jsonl", [{"text": "x", "label": "1"}])
    with pytest.raises(ValueError, match=r"no problem column.*\['label', 'text'\]"):
        prepare("aime2024", tmp_path / "o.parquet", input_path=src)
    with pytest.raises(ValueError, match="no answer column"):
        resolve_layout(["problem"], ("problem",), ("answer",))
    with pytest.raises(ValueError, match="suffix"):
        prepare("aime2024", tmp_path / "o.parquet", input_path=tmp_path / "in.csv")
    with pytest.raises(ValueError, match="unknown dataset 'aime'"):
        prepare("aime", tmp_path / "o.parquet", input_path=src)
    assert not (tmp_path / "o.parquet").exists()


def test_all_rows_rejected_writes_nothing(tmp_path):
    src = _write_jsonl(tmp_path / "in.jsonl", [MIXED[1], MIXED[2]])
    with pytest.raises(ValueError, match="no valid rows"):
        prepare("aime2024", tmp_path / "o.parquet", input_path=src)
    assert not (tmp_path / "o.parquet").exists()


class _FakeDataset(list):
    """Stands in for datasets.Dataset: iterable of dicts with column_names."""

    def __init__(self, rows):
        super().__init__(rows)
        self.column_names = list(rows[0])


def test_hub_path_column_mapping_with_injected_loader(tmp_path):
    calls = []

    def loader(name, config):
        calls.append((name, config))
        return {"test": _FakeDataset([{"id": 1, "problem": "P1?", "answer": "11"}, {"id": 2, "problem": "P2?", "answer": 22}])}

    s = prepare("aime2025", tmp_path / "a.parquet", hub_loader=loader)
    assert calls == [("math-ai/aime25", None)] and s.source == "hf:math-ai/aime25"
    rows = pq.read_table(tmp_path / "a.parquet").to_pylist()
    assert [(r["extra_info"]["raw_problem"], r["reward_model"]["ground_truth"]) for r in rows] == [("P1?", "11"), ("P2?", "22")]

    # question/final_answer columns (OlympiadBench-style lists), a named split, a name override
    def loader2(name, config):
        calls.append((name, config))
        return {
            "train": _FakeDataset([{"question": "Q0", "final_answer": ["$5$"]}]),
            "test": _FakeDataset([{"question": "Q1", "final_answer": ["$\\frac{1}{2}$"]}]),
        }

    with pytest.raises(ValueError, match=r"several splits \['train', 'test'\]"):
        prepare("olympiadbench", tmp_path / "b.parquet", hub_loader=loader2)
    s = prepare("olympiadbench", tmp_path / "b.parquet", hf_name="x/ob", hf_config="en", hf_split="test", hub_loader=loader2)
    assert calls[-1] == ("x/ob", "en")
    row = pq.read_table(tmp_path / "b.parquet").to_pylist()[0]
    assert row["reward_model"]["ground_truth"] == "$\\frac{1}{2}$" and row["data_source"] == "olympiadbench"
    with pytest.raises(ValueError, match="no split 'dev'"):
        prepare("olympiadbench", tmp_path / "b.parquet", hf_split="dev", hub_loader=loader2)


def test_importing_rpg_data_does_not_import_datasets():
    code = "import sys, rpg.data, rpg.data.__main__; print('datasets' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_output_loads_in_verl_rlhf_dataset(tmp_path):
    """verl's own RLHFDataset reads the file (tokenizer unused without prompt-length filtering)."""
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    src = _write_jsonl(tmp_path / "in.jsonl", [MIXED[0], MIXED[8]])
    out = tmp_path / "v.parquet"
    prepare("aime2024", out, input_path=src)
    cfg = OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": str(tmp_path / "cache")})
    ds = RLHFDataset(data_files=[str(out)], tokenizer=None, config=cfg)
    assert len(ds) == 2
    row = ds[1]
    assert row["raw_prompt"] == [{"role": "user", "content": SPEC_PROMPT.format(question="Find x if x^2=9, x>0.")}]
    assert row["reward_model"]["ground_truth"] == "3" and row["data_source"] == "aime2024"
    assert row["index"] == 1 and row["extra_info"]["raw_problem"] == "Find x if x^2=9, x>0."


def test_cli_prepare_and_prepare_all(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "in.jsonl", MIXED)
    rc = cli_main(["prepare", "amc2023", "--input", str(src), "--out", str(tmp_path / "amc.parquet"), "--show-rejects", "1"])
    cap = capsys.readouterr()
    assert rc == 0 and "rejected 12" in cap.out and "rejected line 2: empty problem" in cap.err
    assert "10 more" in cap.err  # 11 listed rejects (the plain duplicate is only counted), 1 shown
    rc = cli_main(["prepare", "amc2023", "--input", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "x.parquet")])
    assert rc == 2 and "input file not found" in capsys.readouterr().err

    indir = tmp_path / "local"
    indir.mkdir()
    _write_jsonl(indir / "dapo-math-17k-en.jsonl", MIXED[:1])
    _write_jsonl(indir / "aime2024.jsonl", MIXED[8:10])
    rc = cli_main(["prepare-all", "--out-dir", str(tmp_path / "all"), "--input-dir", str(indir),
                   "--datasets", "dapo-math-17k-en,aime2024", "--eval-copies", "4"])
    assert rc == 0
    assert pq.read_metadata(tmp_path / "all" / "dapo-math-17k-en.parquet").num_rows == 1
    assert pq.read_metadata(tmp_path / "all" / "aime2024.parquet").num_rows == 8
    rc = cli_main(["prepare-all", "--out-dir", str(tmp_path / "all"), "--input-dir", str(indir), "--datasets", "amc2023"])
    assert rc == 2 and "no file for amc2023" in capsys.readouterr().err


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared eval files not found at {SHARED}")
@pytest.mark.parametrize(
    "fname,key,n_problems,ds_name",
    [("aime-2024.parquet", "aime2024", 30, "aime2024"), ("aime25.parquet", "aime2025", 30, "aime2025"),
     ("amc-23.parquet", "amc2023", 40, "amc2023")],
)
def test_shared_real_eval_files(tmp_path, fname, key, n_problems, ds_name):
    src = SHARED / fname
    orig = pq.read_table(src).to_pylist()
    out = tmp_path / f"{key}.parquet"
    s = prepare(key, out, input_path=src)
    assert (s.rows_read, s.problems, s.rows_written) == (len(orig), n_problems, n_problems)
    assert len(s.rejects) == len(orig) - n_problems and all(r.reason.startswith("duplicate of row") for r in s.rejects)
    rows = pq.read_table(out).to_pylist()
    assert {r["data_source"] for r in rows} == {ds_name} and scorer_for(ds_name) == MATH_DAPO
    # prompts and answers are byte-identical to the authors' rows for the same problem
    by_content = {o["prompt"][0]["content"]: o["reward_model"]["ground_truth"] for o in orig}
    assert len(by_content) == n_problems
    for r in rows:
        assert by_content[r["prompt"][0]["content"]] == r["reward_model"]["ground_truth"]
    # authors' 32-copies layout: same row count as the shipped file
    s32 = prepare(key, tmp_path / "k.parquet", input_path=src, copies=32)
    assert s32.rows_written == len(orig)


def test_templated_inputs_are_never_wrapped_twice(tmp_path):
    content = SPEC_PROMPT.format(question="What is 9-4?")
    recs = [
        {"prompt": content, "reward_model": {"ground_truth": "5"}, "data_source": "math_dapo"},   # str prompt
        {"prompt": [{"role": "user", "content": "free text"}], "reward_model": {"ground_truth": "1"}},
        {"prompt": [], "reward_model": {"ground_truth": "1"}},
        {"prompt": [{"role": "user", "content": content}], "reward_model": "5"},
    ]
    s = prepare("dapo-math-17k-en", tmp_path / "t.parquet", input_path=_write_jsonl(tmp_path / "t.jsonl", recs))
    reasons = {r.index: r.reason for r in s.rejects}
    assert sorted(reasons) == [1, 2, 3]
    names(reasons[1], "prompt", "template", "extra_info.raw_problem")
    names(reasons[2], "prompt", "string", "chat list")
    names(reasons[3], "reward_model", "mapping (str)")
    rows = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert rows[0]["prompt"][0]["content"] == content
    # plain layout whose problem column already holds the templated text (e.g. processed copies)
    s = prepare("aime2025", tmp_path / "p.parquet", problem_key="prompt", answer_key="solution",
                input_path=_write_jsonl(tmp_path / "p.jsonl", [{"prompt": content, "solution": "5"}]))
    assert pq.read_table(tmp_path / "p.parquet").to_pylist()[0]["prompt"][0]["content"] == content


def test_hub_failure_is_a_clear_error(tmp_path, capsys):
    def offline(name, config):
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub")

    with pytest.raises(ValueError, match=r"could not load Hugging Face dataset 'math-ai/amc23'.*--input"):
        prepare("amc2023", tmp_path / "a.parquet", hub_loader=offline)
    assert not (tmp_path / "a.parquet").exists()


def test_problems_shared_by_the_training_set_and_an_evaluation_set_are_named(tmp_path, capsys):
    """Before: an AIME 2024 problem copied into the training file was written to both, without a word; and the
    duplicate check folded whitespace only (é composed and decomposed counted as two problems)."""
    aime = "Find the number of ordered pairs $(m, n)$ such that $m^2 n = 20^{20}$. Café."
    indir = tmp_path / "in"
    indir.mkdir()
    _write_jsonl(indir / "aime2024.jsonl", [{"problem": aime, "answer": "231"}, {"problem": "Other.", "answer": "1"}])
    _write_jsonl(indir / "dapo-math-17k-en.jsonl", [
        {"problem": "What is 1+1?", "answer": "2"},
        {"problem": "FIND the number of ordered pairs $(m,  n)$ such that $m^2 n = 20^{20}$. Cafe\u0301.", "answer": "231"},
        {"problem": "Caf\u00e9 au lait: what is 2+2?", "answer": "4"},
        {"problem": "Cafe\u0301 au lait: what is 2+2?", "answer": "4"},  # the same, é decomposed
    ])
    out = tmp_path / "out"
    args = ["prepare-all", "--input-dir", str(indir), "--out-dir", str(out), "--datasets", "dapo-math-17k-en,aime2024"]
    assert cli_main(args) == 0
    cap = capsys.readouterr()
    train, test = out / "dapo-math-17k-en.parquet", out / "aime2024.parquet"
    (warning,) = [x for x in cap.err.splitlines() if x.startswith(f"warning: {train} ")]
    names(warning, "1 problem", str(test), "NFKC", "--drop-eval-overlap")
    assert pq.read_metadata(train).num_rows == 3  # kept (warned), the decomposed é a duplicate
    assert "rejected 1 (duplicate: 1)" in cap.out
    assert cli_main([*args, "--drop-eval-overlap"]) == 0
    cap = capsys.readouterr()
    (dropped,) = [x for x in cap.out.splitlines() if x.startswith("dapo-math-17k-en: dropped ")]
    names(dropped, "dropped 1 problem", str(test), str(train))
    assert "warning" not in cap.err
    assert "rejected 2 (duplicate: 1, in an evaluation set: 1)" in cap.out
    assert pq.read_table(train).column("extra_info").to_pylist()[1]["raw_problem"] == "Caf\u00e9 au lait: what is 2+2?"
    assert pq.read_metadata(train).num_rows == 2 and pq.read_metadata(test).num_rows == 2
    reasons = [json.loads(x)["reason"] for x in rejects_path(train).read_text().splitlines()]
    assert reasons == [f"in an evaluation set ({test})", "duplicate of line 3"]


def test_an_answer_stored_as_an_integral_number_is_that_integer(tmp_path, capsys):
    """Before: a ground truth stored as a number (27.0, as some hub copies of evaluation sets store it) was
    rejected, every row of a set stored that way; ``Answer: 27`` must score +1 against it."""
    import pyarrow as pa

    from rpg.reward import compute_score

    src = tmp_path / "aime.parquet"
    pq.write_table(pa.table({"problem": ["What is 3^3?", "What is 2^5?"], "answer": [27.0, 32.0]}), src)
    assert cli_main(["prepare", "aime2024", "--input", str(src), "--out", str(tmp_path / "out.parquet")]) == 0
    line = capsys.readouterr().out.strip()
    names(line.splitlines()[-1], "rejected 0", "integers: 2", "27.0 -> '27'")
    rows = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["27", "32"]
    scored = compute_score(rows[0]["data_source"], "3^3 = 27.\nAnswer: 27", rows[0]["reward_model"]["ground_truth"])
    assert scored["score"] == 1.0, scored
    # a number that is not an integer a float holds exactly: refused naming the column, never a guess
    _write_jsonl(tmp_path / "frac.jsonl", [{"question": "Half of 1?", "final_answer": 0.5},
                                           {"question": "Big?", "final_answer": 2.0**60}, {"question": "Ok?", "final_answer": 3.0}])
    assert cli_main(["prepare", "aime2024", "--input", str(tmp_path / "frac.jsonl"), "--out", str(tmp_path / "f.parquet"),
                     "--problem-key", "question", "--answer-key", "final_answer"]) == 0
    cap = capsys.readouterr()
    one, two = cap.err.splitlines()
    names(one, "line 1", "0.5", "'final_answer'")
    names(two, "line 2", "1.152921504606847e+18", "'final_answer'")
    assert "rejected 2 (a number answer: 2)" in cap.out and "written as integers: 1 (3.0 -> '3')" in cap.out
