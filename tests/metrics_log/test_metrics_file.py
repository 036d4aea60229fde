"""The one reader of verl's file-logger JSONL (rpg.metrics_log.file): its rules, and that the harness and the
reports, which read the same files, apply them alike."""

from __future__ import annotations

import json
import warnings

import pytest
from messages import names, one_line

from rpg.metrics_log.file import MAX_STEP, MetricsFileError, readable_records, records, step_of


def _write(path, text: str | bytes):
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _lines(*recs) -> str:
    return "".join(json.dumps(r) + "\n" for r in recs)


def test_records_in_file_order_with_their_lines_values_as_logged(tmp_path):
    log = _write(tmp_path / "m.jsonl", '{"step": 0, "data": {"a": 1, "b": null}}\n\n'
                                       '{"step": 2, "data": {"a": "x"}}\r\n{"step": 1, "c": 0.5}\n')
    assert list(records(log)) == [(1, 0, {"a": 1, "b": None}), (3, 2, {"a": "x"}), (4, 1, {"c": 0.5})]


def test_a_cut_last_line_is_skipped_and_said_a_broken_earlier_line_is_an_error(tmp_path):
    log = _write(tmp_path / "m.jsonl", _lines({"step": 0, "data": {"a": 1}}) + '{"step": 1, "data": {"a"\n\n')
    cut = []
    assert list(records(log, lambda n, why: cut.append((n, why)))) == [(1, 0, {"a": 1})]
    assert cut == [(2, "Expecting ':' delimiter")]
    _write(log, _lines({"step": 0, "data": {}}) + "not json\n" + _lines({"step": 2, "data": {}}))
    with pytest.raises(MetricsFileError) as err:
        list(records(log))
    assert isinstance(err.value, ValueError)
    assert one_line(str(err.value)).startswith(f"{log}:2: ")  # the file and the line
    names(str(err.value), "Expecting value", "'not json'", "last line")


def test_text_is_utf8_a_bom_is_dropped_and_records_end_at_newlines_only(tmp_path):
    log = _write(tmp_path / "m.jsonl", b"\xef\xbb\xbf" + _lines({"step": 0, "data": {"a\u2028b": 1}}).encode())
    assert list(records(log)) == [(1, 0, {"a\u2028b": 1})]  # str.splitlines would have cut the record in two
    _write(log, b'{"step": 0, "data": {"a": 1}}\n{"step": 1, "data": {"caf\xe9": 1}}\n')
    with pytest.raises(MetricsFileError, match=rf"^{log}: not UTF-8 text \(line 2, byte 26: 0xe9\)"):
        list(records(log))


@pytest.mark.parametrize("line, why", [
    ('[1, 2]', "expected an object with a 'step' key, got [1, 2]"),
    ('{"data": {"a": 1}}', "expected an object with a 'step' key"),
    ('{"step": 1, "data": 5}', "'data' must be an object of metrics, got 5"),
    ('{"step": 1.5, "data": {}}', "step must be an integer, got 1.5"),
    ('{"step": true, "data": {}}', "step must be an integer, got True"),
    ('{"step": "3", "data": {}}', "step must be an integer, got '3'"),
    ('{"step": null, "data": {}}', "step must be an integer, got None"),
    ('{"step": NaN, "data": {}}', "step must be an integer, got nan"),
    (f'{{"step": {MAX_STEP + 1}, "data": {{}}}}', "step must be an integer below 2**63 in size"),
    ('{"step": ' + "1" * 5000 + '}', "a number too long to read (Exceeds the limit (4300 digits)"),
])
def test_what_is_not_a_record_is_an_error_naming_the_line_even_the_last(tmp_path, line, why):
    log = _write(tmp_path / "m.jsonl", _lines({"step": 0, "data": {}}) + line + "\n")
    with pytest.raises(MetricsFileError) as err:
        list(records(log))
    assert str(err.value).startswith(f"{log}:2: {why}"), str(err.value)


def test_steps():
    assert [step_of(v, "w") for v in (0, 7, 3.0, -2, MAX_STEP)] == [0, 7, 3, -2, MAX_STEP]
    assert [step_of(v, "w", cell=True) for v in ("12", " +7 ", "1e3", "3.0")] == [12, 7, 1000, 3]
    for value in ("3.5", "", "nan", "inf", "x"):
        with pytest.raises(MetricsFileError, match=r"^w: step must be an integer, got"):
            step_of(value, "w", cell=True)
    with pytest.raises(MetricsFileError, match=r"^w: step must be an integer below 2\*\*63 in size, got '99999"):
        step_of("9" * 400, "w", cell=True)
    with pytest.raises(MetricsFileError, match=r"^w: step must be an integer, got '12'"):
        step_of("12", "w")  # a JSON step is a number


def test_readable_records_follow_a_file_being_written(tmp_path):
    log = _write(tmp_path / "m.jsonl", b"\xef\xbb\xbf" + _lines({"step": 0, "data": {"a": 0}}).encode()
                 + b'not json\n{"step": "x"}\n{"step": 1, "data": {"a": 1}}\n{"step": 2, "da')
    found, offset = readable_records(log)
    assert found == [(0, {"a": 0}), (1, {"a": 1})]  # what is no record is skipped, never fatal
    assert log.read_bytes()[offset:] == b'{"step": 2, "da'  # the unfinished line is read again next time
    with open(log, "ab") as f:
        f.write(b'ta": {"a": 2}}\n{"step": 3, "data": {"a": 3}}')
    found, offset = readable_records(log, offset)
    assert found == [(2, {"a": 2}), (3, {"a": 3})] and offset == log.stat().st_size  # a whole record, unfinished
    with open(log, "ab") as f:
        f.write(b"\n")
    assert readable_records(log, offset) == ([], offset + 1)


@pytest.mark.parametrize("text", [
    _lines({"step": 0, "data": {"a": 1}}) + "{broken\n" + _lines({"step": 1, "data": {"a": 2}}),
    _lines({"step": 0, "data": {"a": 1}}, {"step": 2.5, "data": {"a": 2}}),
    _lines({"step": 0, "data": {"a": 1}}, {"step": 1, "data": [1]}),
])
def test_the_harness_and_the_reports_refuse_a_file_alike(tmp_path, text):
    """Before, the harness's own parser read a fractional step as its integer part, stopped at a ``data``
    that is no object with a TypeError, and named a broken line otherwise than the reports did."""
    from rpg.trainer_process import read_metrics
    from rpg.reports.logs import read_run

    log = _write(tmp_path / "metrics.jsonl", text)
    with pytest.raises(MetricsFileError) as harness:
        read_metrics(log)
    with pytest.raises(MetricsFileError) as reports:
        read_run(log)
    assert str(harness.value) == str(reports.value) and str(harness.value).startswith(f"{log}:2: ")


def test_the_harness_and_the_reports_read_a_file_alike(tmp_path):
    """The same records and steps; the harness keeps values as logged, the reports read numbers (null: NaN)."""
    from rpg.trainer_process import read_metrics
    from rpg.reports.logs import read_run

    log = _write(tmp_path / "metrics.jsonl", _lines({"step": 0, "data": {"a": 1, "b": None}},
                                                    {"step": 1, "a": 2}) + '{"step": 2, "data": {"a"')
    assert read_metrics(log) == {0: {"a": 1, "b": None}, 1: {"a": 2}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = read_run(log)
    assert metrics["a"] == {0: 1.0, 1: 2.0} and list(metrics["b"]) == [0]
    assert any(f"{log}:3: skipping truncated last line" in str(w.message) for w in caught)
