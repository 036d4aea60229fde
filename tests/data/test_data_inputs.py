"""``python -m rpg.data prepare``/``prepare-all`` lose no good row to the input encoding,
name files and lines in their messages, keep every reject in a rejects file, and find the authors'
file names."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from messages import names, one_line

from rpg.data import prepare
from rpg.data.__main__ import main as cli_main
from rpg.data.prepare import failed_rejects_path, rejects_path

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
ROWS = [{"problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(3)]


def _jsonl_bytes(records) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_bom_keeps_the_first_row(tmp_path):
    for suffix, body in ((".jsonl", _jsonl_bytes(ROWS)), (".json", json.dumps(ROWS).encode())):
        src = tmp_path / f"bom{suffix}"
        src.write_bytes(b"\xef\xbb\xbf" + body)
        s = prepare("aime2025", tmp_path / "o.parquet", input_path=src)
        assert (s.rows_read, s.rows_written, s.rejects) == (3, 3, []), suffix


def test_invalid_utf8_rejects_only_its_line_and_names_it(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_bytes(_jsonl_bytes(ROWS[:1]) + b'{"problem": "caf\xe9?", "answer": "1"}\n' + _jsonl_bytes(ROWS[1:]))
    s = prepare("aime2025", tmp_path / "o.parquet", input_path=src)
    assert s.rows_written == 3
    assert [(r.where, r.reason) for r in s.rejects] == [("line 2", "invalid UTF-8 byte 0xe9 at column 17")]
    assert "invalid UTF-8: 1" in s.line()
    doc = tmp_path / "bad.json"
    doc.write_bytes(b'[{"problem": "a", "answer": "1"},\n {"problem": "caf\xe9", "answer": "2"}]')
    with pytest.raises(ValueError, match=rf"^{doc}:2:18: invalid UTF-8 byte 0xe9$"):
        prepare("aime2025", tmp_path / "o.parquet", input_path=doc)


def test_reject_lines_are_file_lines(tmp_path):
    src = tmp_path / "gaps.jsonl"
    src.write_text("\n" + json.dumps(ROWS[0]) + "\n\n\n" + json.dumps({"problem": "", "answer": "1"}) + "\n"
                   + json.dumps(ROWS[0]) + "\n", encoding="utf-8")
    s = prepare("aime2025", tmp_path / "o.parquet", input_path=src)
    assert [(r.index, r.line, r.reason) for r in s.rejects] == [(1, 5, "empty problem"), (2, 6, "duplicate of line 2")]
    side = [json.loads(x) for x in rejects_path(tmp_path / "o.parquet").read_text().splitlines()]
    assert side == [{"index": 1, "line": 5, "reason": "empty problem"}, {"index": 2, "line": 6, "reason": "duplicate of line 2"}]


def test_all_rejected_shows_reasons_and_writes_the_rejects_file(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_bytes(_jsonl_bytes([{"problem": "", "answer": "1"}, {"problem": "x"}, {"problem": "", "answer": "2"}]))
    out = tmp_path / "o.parquet"
    assert cli_main(["prepare", "aime2025", "--input", str(src), "--out", str(out)]) == 2
    *rejected, error = capsys.readouterr().err.splitlines()
    assert rejected == [f"  {src}: rejected line 1: empty problem", f"  {src}: rejected line 2: no answer (missing or null)",
                        f"  {src}: rejected line 3: empty problem"]
    assert error.startswith("error: aime2025: ")
    names(error, str(src), "3 rejected", "empty problem: 2", "no answer: 1", str(failed_rejects_path(out)))
    assert not out.exists() and len(failed_rejects_path(out).read_text().splitlines()) == 3
    assert not rejects_path(out).exists()  # that name belongs to a written o.parquet


def test_directory_input_and_directory_out(tmp_path, capsys):
    assert cli_main(["prepare", "aime2025", "--input", str(tmp_path), "--out", str(tmp_path / "o.parquet")]) == 2
    line = one_line(capsys.readouterr().err.strip())
    assert line.startswith("error: ")
    names(line, repr(str(tmp_path)), "directory", ".parquet/.json/.jsonl", "prepare-all --input-dir")
    src = tmp_path / "in.jsonl"
    src.write_bytes(_jsonl_bytes(ROWS))
    outdir = tmp_path / "data.parquet"  # a directory, even with a .parquet name
    outdir.mkdir()
    assert cli_main(["prepare", "aime2025", "--input", str(src), "--out", str(outdir)]) == 0
    assert pq.read_metadata(outdir / "aime2025.parquet").num_rows == 3
    assert cli_main(["prepare", "aime2025", "--input", str(src), "--out", f"{tmp_path / 'new'}/"]) == 0
    assert (tmp_path / "new" / "aime2025.parquet").is_file()
    capsys.readouterr()
    assert cli_main(["prepare", "aime2025", "--input", str(src), "--out", str(src / "o.parquet")]) == 2  # under a file
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and str(src) in err[0]


def test_duplicates_are_summarised_not_listed(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_bytes(_jsonl_bytes([ROWS[i % 3] for i in range(300)] + [{"problem": "What is 0+1?", "answer": "9"}]))
    assert cli_main(["prepare", "aime2025", "--input", str(src), "--out", str(tmp_path / "o.parquet")]) == 0
    cap = capsys.readouterr()
    names(one_line(cap.err), str(src), "line 301", "line 1", "'9'", "'1'")  # only the conflicting duplicate listed
    summary = cap.out.strip().splitlines()[-1]
    names(summary, "rejected 298", "duplicate: 297", "different answer: 1", str(tmp_path / "o.rejects.jsonl"))
    assert len((tmp_path / "o.rejects.jsonl").read_text().splitlines()) == 298


def _eval_file(path: Path, n: int) -> Path:
    path.write_bytes(_jsonl_bytes([{"problem": f"P{i}", "answer": str(i)} for i in range(n)]))
    return path


def test_prepare_all_accepts_the_authors_file_names(tmp_path, capsys):
    indir = tmp_path / "authors"
    indir.mkdir()
    for name, n in (("aime-2024.jsonl", 30), ("aime25.jsonl", 30), ("amc-23.jsonl", 40), ("dapo-math-17k-eng.jsonl", 5)):
        _eval_file(indir / name, n)
    rc = cli_main(["prepare-all", "--out-dir", str(tmp_path / "out"), "--input-dir", str(indir),
                   "--datasets", "dapo-math-17k-en,aime2024,aime2025,amc2023"])
    assert rc == 0, capsys.readouterr().err
    assert {p.name: pq.read_metadata(p).num_rows for p in (tmp_path / "out").glob("*.parquet")} == {
        "dapo-math-17k-en.parquet": 5, "aime2024.parquet": 30, "aime2025.parquet": 30, "amc2023.parquet": 40}
    capsys.readouterr()
    assert cli_main(["prepare-all", "--out-dir", str(tmp_path / "out"), "--input-dir", str(indir), "--datasets", "minerva"]) == 2
    line = one_line(capsys.readouterr().err.strip())
    assert line.startswith("error: ")
    names(line, f"--input-dir {indir}", "minerva.parquet, minerva.json, minerva.jsonl")
    _eval_file(indir / "aime2025.jsonl", 3)
    assert cli_main(["prepare-all", "--out-dir", str(tmp_path / "out"), "--input-dir", str(indir), "--datasets", "aime2025"]) == 2
    assert "several files for aime2025: aime2025.jsonl, aime25.jsonl" in capsys.readouterr().err


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared eval files not found at {SHARED}")
def test_prepare_all_reads_the_shipped_eval_files(tmp_path, capsys):
    rc = cli_main(["prepare-all", "--out-dir", str(tmp_path), "--input-dir", str(SHARED),
                   "--datasets", "aime2024,aime2025,amc2023"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert cap.err == ""  # 930 + 930 + 1240 duplicate rows: counted, not listed
    assert [pq.read_metadata(tmp_path / f"{k}.parquet").num_rows for k in ("aime2024", "aime2025", "amc2023")] == [30, 30, 40]


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli_main(["prepare", "aime2025", *args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_lone_surrogate_rejects_its_line_keeps_the_others(tmp_path, capsys):
    src = tmp_path / "sur.jsonl"  # "\ud800" is valid JSON but not valid Unicode: parquet cannot hold it
    src.write_text('{"problem": "a?", "answer": "1"}\n{"problem": "b\\ud800?", "answer": "2"}\n'
                   '{"problem": "c?", "answer": "3\\udfff"}\n{"problem": "d?", "answer": "4"}\n', encoding="ascii")
    out = tmp_path / "o.parquet"
    rc, stdout, err = _cli(capsys, "--input", str(src), "--out", str(out))
    assert rc == 0, err
    two, three = err.splitlines()
    names(two, str(src), "line 2", "U+D800", "problem")
    names(three, str(src), "line 3", "U+DFFF", "answer")
    assert "read 4 rows" in stdout and "wrote 2 rows" in stdout and "rejected 2 (lone surrogate: 2)" in stdout
    assert pq.read_table(out).column("extra_info").to_pylist()[1]["raw_problem"] == "d?"
    side = [json.loads(x) for x in rejects_path(out).read_text(encoding="utf-8").splitlines()]
    assert [(r["line"], r["reason"].split(" (")[0]) for r in side] == [
        (2, "lone surrogate U+D800 in the problem"), (3, "lone surrogate U+DFFF in the answer")]
    doc = tmp_path / "sur.json"  # a .json list: the row is named by its index
    doc.write_text('[{"problem": "a?", "answer": "1"}, {"problem": "\\udc80", "answer": "2"}]', encoding="ascii")
    s = prepare("aime2025", tmp_path / "p.parquet", input_path=doc)
    assert (s.rows_written, [(r.where, r.reason) for r in s.rejects]) == (
        1, [("row 1", "lone surrogate U+DC80 in the problem (not valid Unicode)")])


@pytest.mark.parametrize("name, body, what", [
    ("empty.jsonl", b"", "empty file: no rows (expected one JSON object per line, UTF-8)"),
    ("blank.jsonl", b"\n  \n\r\n", "empty file: no rows (expected one JSON object per line, UTF-8)"),
    ("empty.json", b"", "empty file: no rows (expected a JSON list of objects, UTF-8)"),
    ("list.json", b" [ ]\n", "the JSON list is empty: no rows"),
    ("nobom16.jsonl", '{"problem": "a", "answer": "1"}\n'.encode("utf-16-le"),
     "looks like UTF-16 or UTF-32 without a byte-order mark; save it as UTF-8"),
])
def test_empty_and_misencoded_inputs_get_one_line(tmp_path, capsys, name, body, what):
    src = tmp_path / name
    src.write_bytes(body)
    rc, _, err = _cli(capsys, "--input", str(src), "--out", str(tmp_path / "o.parquet"))
    assert (rc, err) == (2, f"error: {src}: {what}\n")


def test_empty_parquet_input_is_named(tmp_path, capsys):
    import pyarrow as pa

    src = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"problem": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), src)
    rc, _, err = _cli(capsys, "--input", str(src), "--out", str(tmp_path / "o.parquet"))
    assert (rc, err) == (2, f"error: {src}: no rows\n")


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_with_a_byte_order_mark_are_decoded(tmp_path, codec):
    rows = [*ROWS, {"problem": "Résumé: 2·3 = ?", "answer": "6"}]
    text = "".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows)
    bom = {"utf-16": b"", "utf-16-be": b"\xfe\xff", "utf-32": b""}[codec]
    for suffix, body in ((".jsonl", text), (".json", json.dumps(rows, ensure_ascii=False))):
        src = tmp_path / f"in{suffix}"
        src.write_bytes(bom + body.encode(codec))  # Python's utf-16/utf-32 write a BOM; utf-16-be does not
        s = prepare("aime2025", tmp_path / "o.parquet", input_path=src)
        assert (s.rows_written, s.rejects) == (4, []), (codec, suffix)
        assert pq.read_table(tmp_path / "o.parquet").column("extra_info").to_pylist()[3]["raw_problem"] == rows[3]["problem"]
    bad = tmp_path / "bad.json"  # a document that does not decode is an error (JSONL: its line is rejected, below)
    bad.write_bytes(b"\xff\xfe" + '[{"problem": "a"}'.encode("utf-16-le") + b"\x00\xd8")  # unpaired surrogate
    with pytest.raises(ValueError, match=rf"^{bad}: not valid UTF-16 \(byte-order mark FF FE\) at byte 36"):
        prepare("aime2025", tmp_path / "o.parquet", input_path=bad)


def test_invisible_problems_and_answers_are_empty(tmp_path, capsys):
    junk = ["\u0000", "\u200b", "\u200c\u200d", "\ufeff", " \u2060 \t", "\u00ad\u200e"]
    records = [ROWS[0], *({"problem": p, "answer": "1"} for p in junk), {"problem": "What is 9+1?", "answer": "\u200b"}]
    src = tmp_path / "inv.jsonl"
    src.write_bytes(_jsonl_bytes(records))
    out = tmp_path / "o.parquet"
    rc, stdout, err = _cli(capsys, "--input", str(src), "--out", str(out))
    assert rc == 0, err
    lines = err.splitlines()
    names(lines[0], str(src), "line 2: empty problem", "U+0000")
    names(lines[5], str(src), "line 7: empty problem", "U+00AD, U+200E")
    names(lines[6], str(src), "line 8: no answer", "U+200B")
    assert "wrote 1 rows" in stdout and "rejected 7 (empty problem: 6, no answer: 1)" in stdout
    assert [json.loads(x)["line"] for x in rejects_path(out).read_text().splitlines()] == [2, 3, 4, 5, 6, 7, 8]


def test_unwritable_out_is_reported_under_the_given_path(tmp_path, capsys, monkeypatch):
    import tempfile

    import rpg.data.io as dio

    def denied(prefix="", suffix="", dir=None):  # what mkstemp raises in a directory the user cannot write
        raise PermissionError(13, "Permission denied", f"{dir}/{prefix}abc123{suffix}")

    monkeypatch.setattr(dio.tempfile, "mkstemp", denied)
    src = tmp_path / "in.jsonl"
    src.write_bytes(_jsonl_bytes(ROWS))
    out = tmp_path / "ro" / "o.parquet"
    rc, _, err = _cli(capsys, "--input", str(src), "--out", str(out))
    assert (rc, err) == (2, f"error: cannot write {out}: Permission denied\n")
    assert tempfile.mkstemp is denied


# --- hostile inputs through the command line: every problem named with its file and line -------------------------

@pytest.mark.parametrize("body, reasons", [
    (b'"\\ud800"\n', ["line 1: row is not a mapping (str)"]),
    (b"[]\n", ["line 1: row is not a mapping (list)"]),
    (b"{bad\n{worse\n", ["line 1: invalid JSON line (Expecting property name enclosed in double quotes)",
                         "line 2: invalid JSON line (Expecting property name enclosed in double quotes)"]),
])
def test_a_jsonl_without_any_object_names_each_line(tmp_path, capsys, body, reasons):
    """No line is a JSON object: each line is rejected with its reason (not "no problem column ... []")."""
    src = tmp_path / "in.jsonl"
    src.write_bytes(body)
    out = tmp_path / "o.parquet"
    rc, _, err = _cli(capsys, "--input", str(src), "--out", str(out))
    lines = err.splitlines()
    assert rc == 2 and lines[:-1] == [f"  {src}: rejected {r}" for r in reasons]
    assert lines[-1].startswith(f"error: aime2025: no valid rows in {src} ({len(reasons)} rejected: ")
    assert lines[-1].endswith(f"nothing written; every rejected row in {failed_rejects_path(out)}")
    assert [json.loads(x)["line"] for x in failed_rejects_path(out).read_text().splitlines()] == list(
        range(1, len(reasons) + 1))


def test_missing_columns_name_the_input_file(tmp_path, capsys):
    import pyarrow as pa

    src = tmp_path / "cols.parquet"
    pq.write_table(pa.table({"question_text": ["a"], "sol": ["1"]}), src)
    rc, _, err = _cli(capsys, "--input", str(src), "--out", str(tmp_path / "o.parquet"))
    assert rc == 2 and one_line(err).startswith(f"error: {src}: ")
    names(err, "['problem', 'question', 'Problem', 'Question']", "['question_text', 'sol']", "--problem-key")


def test_not_parquet_is_one_line_naming_the_file(tmp_path, capsys):
    for body in (b"", b"hello, not parquet\n"):
        src = tmp_path / "fake.parquet"
        src.write_bytes(body)
        rc, _, err = _cli(capsys, "--input", str(src), "--out", str(tmp_path / "o.parquet"))
        assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("error: ") and f"'{src}'" in err, err


@pytest.mark.parametrize("parent", ["afile", "afile/sub"])
def test_out_under_a_file_names_the_out_path(tmp_path, capsys, parent):
    src = tmp_path / "in.jsonl"
    src.write_bytes(_jsonl_bytes(ROWS))
    (tmp_path / "afile").write_text("")
    out = tmp_path / parent / "o.parquet"
    rc, _, err = _cli(capsys, "--input", str(src), "--out", str(out))
    assert (rc, err) == (2, f"error: cannot write {out}: {tmp_path / 'afile'} is a file, not a directory\n")


def test_out_in_a_directory_that_cannot_be_created_names_the_out_path(tmp_path, capsys, monkeypatch):
    def denied(self, *args, **kwargs):  # what mkdir raises under a directory the user cannot write
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", denied)
    src = tmp_path / "in.jsonl"
    src.write_bytes(_jsonl_bytes(ROWS))
    out = tmp_path / "ro" / "new" / "o.parquet"
    rc, _, err = _cli(capsys, "--input", str(src), "--out", str(out))
    assert (rc, err) == (2, f"error: cannot write {out}: cannot create directory {out.parent}: Permission denied\n")


def test_out_equal_to_the_input_is_refused(tmp_path, capsys):
    src = tmp_path / "in.parquet"
    assert prepare("aime2025", src, input_path=_eval_file(tmp_path / "in.jsonl", 3)).rows_written == 3
    before = src.read_bytes()
    (tmp_path / "alias").symlink_to(tmp_path)
    for out in (src, tmp_path / "alias" / "in.parquet"):  # the same directory entry, however spelled
        rc, _, err = _cli(capsys, "--input", str(src), "--out", str(out))
        assert rc == 2 and one_line(err).startswith(f"error: {out} ")
        names(err, "input", "output")
    assert src.read_bytes() == before
    rej = tmp_path / "o.rejects.jsonl"  # the rejects file next to --out would overwrite the input
    rej.write_bytes(_jsonl_bytes(ROWS))
    rc, _, err = _cli(capsys, "--input", str(rej), "--out", str(tmp_path / "o.parquet"))
    assert (rc, err) == (2, f"error: {rej} (the rejects file of {tmp_path / 'o.parquet'}) is the input file; "
                            "write the output elsewhere\n")
    indir = tmp_path / "raw"  # prepare-all with --out-dir = --input-dir
    indir.mkdir()
    prepare("aime2025", indir / "aime2025.parquet", input_path=_eval_file(tmp_path / "e.jsonl", 3))
    before = (indir / "aime2025.parquet").read_bytes()
    assert cli_main(["prepare-all", "--input-dir", str(indir), "--out-dir", str(indir), "--datasets", "aime2025"]) == 2
    err = capsys.readouterr().err
    assert one_line(err).startswith(f"error: {indir / 'aime2025.parquet'} ")
    names(err, "input", "output")
    assert (indir / "aime2025.parquet").read_bytes() == before


@pytest.mark.parametrize("codec", ["utf-16", "utf-32"])
def test_utf16_jsonl_with_a_bad_or_truncated_line_keeps_the_other_lines(tmp_path, capsys, codec):
    le = codec + "-le"
    text = "".join(json.dumps(r) + "\r\n" for r in ROWS)
    src = tmp_path / "in.jsonl"
    bad_unit = {"utf-16": b"\x00\xd8", "utf-32": b"\x00\x00\x11\x00"}[codec]  # lone surrogate / beyond U+10FFFF
    src.write_bytes("".encode(codec) + text.encode(le) + '{"problem": "x'.encode(le) + bad_unit + '"}\n'.encode(le)
                    + json.dumps({"problem": "What is 7+1?", "answer": "8"}).encode(le) + b"\n\x00"[:1])  # cut short
    out = tmp_path / "o.parquet"
    rc, stdout, err = _cli(capsys, "--input", str(src), "--out", str(out))
    assert rc == 0, err
    lines = err.splitlines()
    assert [x.split(": ", 1)[1].split(" (")[0] for x in lines] == ["rejected line 4: not valid " + codec.upper(),
                                                                   "rejected line 5: not valid " + codec.upper()]
    assert "read 5 rows" in stdout and "wrote 3 rows" in stdout


def test_a_line_with_an_integer_too_long_for_python_is_rejected_by_line_and_the_others_kept(tmp_path, capsys):
    """json parses integers with int(), which stops at sys.get_int_max_str_digits() (4300): that line is a
    reject naming file and line; the valid rows are written."""
    src = tmp_path / "big.jsonl"
    src.write_text(json.dumps(ROWS[0]) + "\n" + '{"problem": "How big?", "answer": ' + "7" * 5000 + "}\n"
                   + json.dumps(ROWS[1]) + "\n", encoding="utf-8")
    out = tmp_path / "o.parquet"
    rc, stdout, err = _cli(capsys, "--input", str(src), "--out", str(out))
    assert rc == 0, err
    (line,) = err.splitlines()
    assert line.startswith(f"  {src}: rejected line 2: integer too long (more than 4300 digits;"), line
    assert "wrote 2 rows" in stdout and pq.read_table(out).num_rows == 2
    doc = tmp_path / "big.json"  # a .json document is read whole: one line naming the file
    doc.write_text('[{"problem": "a", "answer": ' + "7" * 5000 + "}]", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"^{doc}: integer too long \(more than 4300 digits;"):
        prepare("aime2025", tmp_path / "p.parquet", input_path=doc)
