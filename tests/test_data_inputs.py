"""Issue 11.9: ``python -m rpg.data prepare``/``prepare-all`` lose no good row to the input encoding,
name files and lines in their messages, keep every reject in a rejects file, and find the authors'
file names."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rpg.data import prepare
from rpg.data.__main__ import main as cli_main
from rpg.data.prepare import rejects_path

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
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
    err = capsys.readouterr().err.strip()
    assert err == (f"error: aime2025: no valid rows in {src} (3 rejected: empty problem: 2, no answer: 1); "
                   f"nothing written; every rejected row in {rejects_path(out)}")
    assert not out.exists() and len(rejects_path(out).read_text().splitlines()) == 3


def test_directory_input_and_directory_out(tmp_path, capsys):
    assert cli_main(["prepare", "aime2025", "--input", str(tmp_path), "--out", str(tmp_path / "o.parquet")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: input {str(tmp_path)!r} is a directory; pass one .parquet/.json/.jsonl file "
        "(prepare-all --input-dir reads a directory)")
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
    assert cap.err.splitlines() == ["  rejected line 301: duplicate of line 1 with a different answer ('9' vs '1')"]
    assert cap.out.strip().endswith(f"rejected 298 (duplicate: 297, duplicate with a different answer: 1); "
                                    f"every rejected row in {tmp_path / 'o.rejects.jsonl'}")
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
    assert capsys.readouterr().err.strip() == (
        f"error: --input-dir {indir}: no file for minerva; looked for minerva.parquet, minerva.json, minerva.jsonl")
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
