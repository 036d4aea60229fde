"""verl's file-logger JSONL, read by one set of rules: the harness's metrics history and the reports.

verl's ``FileLogger`` (verl/utils/tracking.py) writes one line per ``logger.log`` call,
``{"step": s, "data": {...}}``, with orjson (NaN and ±inf become ``null``) in one unbuffered write. The
harness (``rpg.trainer_process.metrics``: fold and read a run's segments), the reports
(``rpg.reports.logs.read_file_logger``), the driver's look for a step's record
(``rpg.metrics_log.history.logged_training_steps``), the launchers' check of an output folder
(``rpg.trainer_process.run_dir.check_fresh_start``) and the study's measured times (``rpg_lab.study.runner``) all read it
here (the file's name in a run's output folder: ``rpg.trainer_process.run_dir.METRICS_FILE``):

* text: UTF-8, a leading byte-order mark dropped; any other byte is an error naming its line and byte.
  Records are separated by ``\\n`` alone (``\\r\\n`` too; ``str.splitlines`` would also cut a record at a
  U+2028 a JSON string may hold); blank lines are skipped.
* a cut last line: only the last non-blank line can be cut off by a kill (the run was writing it). When it
  is not JSON it is skipped and ``records``' ``cut`` is told (the reports warn); a line before it that is
  not JSON is damage, an error: never read past or folded away silently.
* a record: a JSON object with a step key (``STEP_KEYS``: verl's ``step``, and the step columns of W&B's
  exports, ``_step`` first, as a W&B history exported as JSONL has it; the first one present is the step);
  its metrics are its ``data`` object or, without ``data``, its other keys (a flat ``{"step": s, key: value}``
  line). A ``data`` that is not an object is an error.
* a step: a JSON integer, or a number with an integral value (``3.0``), at most 2**63 - 1 in size (verl's
  step counter, every logger's step column); a boolean, a string, a fraction, NaN or ±inf is an error.
  ``step_of(..., cell=True)`` reads a W&B CSV cell by the same rule (there, text: ``"12"``).
* values: as parsed, ``null`` included; what to make of them is the caller's (the harness keeps them as
  logged, the reports read numbers and nulls as NaN).

Every error is a ``MetricsFileError`` (a ``ValueError``) of one line starting ``<file>:<line>:``, or
``<file>:`` for the text's encoding. ``records`` reads a finished file by these rules;
``readable_records`` reads a file being written, from a byte offset, and skips what it cannot read (never
fatal: the harness's live metrics, read again with ``records`` at the run's end).
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path

MAX_STEP = 2**63 - 1  # verl's step counter and every logger's step column are 64-bit integers
# the keys (JSONL) and columns (W&B CSV) that hold a record's step, the first one present wins: W&B's history
# (``_step``), its panel exports (``Step``), verl's file logger (``step``), and the step metrics verl and W&B log
STEP_KEYS = ("_step", "Step", "step", "global_step", "trainer/global_step")
_DIGITS = re.compile(r"\s*[+-]?\d+\s*")


class MetricsFileError(ValueError):
    """A metrics file that cannot be read by the rules above; one line naming the file and the line."""


def utf8_text(path: str | Path) -> str:
    """The file as UTF-8 text (a BOM is dropped); ``MetricsFileError`` naming the file and the first bad byte."""
    raw = Path(path).read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line, column = raw.count(b"\n", 0, err.start) + 1, err.start - raw.rfind(b"\n", 0, err.start)
        raise MetricsFileError(f"{path}: not UTF-8 text (line {line}, byte {column}: 0x{raw[err.start]:02x}); "
                               "export the log as UTF-8") from None


def short(value) -> str:
    """``repr`` of a logged value, a long one cut to its first characters and its length."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def step_of(value, where: str, cell: bool = False) -> int:
    """``value`` as a step by the rules above, else ``MetricsFileError`` starting ``where``. ``cell``: a CSV
    cell, whose text is read as a number (digits exactly, at any length; ``"3.0"``, ``"1e3"`` by value)."""
    not_int = MetricsFileError(f"{where}: step must be an integer, got {short(value)}")
    too_big = MetricsFileError(f"{where}: step must be an integer below 2**63 in size, got {short(value)}")
    number = value
    if cell and isinstance(value, str):
        if _DIGITS.fullmatch(value):
            if len(value.strip().lstrip("+-")) > 19:  # beyond 2**63 (and int()'s digit limit, 4300)
                raise too_big
            number = int(value)
        else:
            try:
                number = float(value)
            except ValueError:
                raise not_int from None
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise not_int
    if isinstance(number, float) and not (math.isfinite(number) and number == int(number)):
        raise not_int
    if abs(number) > MAX_STEP:
        raise too_big
    return int(number)


def record_of(obj, where: str) -> tuple[int, dict]:
    """``(step, data)`` of one parsed line by the rules above, else ``MetricsFileError`` starting ``where``."""
    key = next((k for k in STEP_KEYS if k in obj), None) if isinstance(obj, dict) else None
    if key is None:
        raise MetricsFileError(f"{where}: expected an object with a 'step' key, got {short(obj)} (a step key is "
                               f"one of {', '.join(STEP_KEYS)})")
    step = step_of(obj[key], where)
    if "data" not in obj:  # a flat record
        return step, {k: v for k, v in obj.items() if k != key}
    if not isinstance(obj["data"], dict):
        raise MetricsFileError(f"{where}: 'data' must be an object of metrics, got {short(obj['data'])}")
    return step, obj["data"]


def _json(line: str, where: str):
    """The JSON value of one line; ``json.JSONDecodeError`` when it is not JSON (a cut last line may not be)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        raise
    except ValueError as err:  # an integer longer than int() converts (sys.get_int_max_str_digits)
        raise MetricsFileError(f"{where}: a number too long to read ({' '.join(str(err).split())})") from None


def records(path: str | Path, cut: Callable[[int, str], None] | None = None) -> Iterator[tuple[int, int, dict]]:
    """``(line number, step, data)`` of each record of the file at ``path``, in file order, by the rules
    above. ``cut(line number, why)`` is called when the last line is cut off (it is skipped)."""
    path = Path(path)
    lines = [(n, line) for n, line in enumerate(utf8_text(path).split("\n"), 1) if line.strip()]
    for i, (n, line) in enumerate(lines):
        where = f"{path}:{n}"
        try:
            obj = _json(line, where)
        except json.JSONDecodeError as err:
            if i < len(lines) - 1:
                raise MetricsFileError(f"{where}: not a JSON line ({err.msg}: {line.strip()[:60]!r}); only the last "
                                       "line may be cut off by a kill: repair or remove this line (the file is left "
                                       "as it is)") from None
            if cut is not None:
                cut(n, err.msg)
            continue
        yield (n, *record_of(obj, where))


def readable_records(path: str | Path, offset: int = 0) -> tuple[list[tuple[int, dict]], int]:
    """``(step, data)`` of each record the file at ``path`` holds from byte ``offset`` on, and the offset to
    read from next: after the last complete line, or after a last line without its newline that is a whole
    record already. A line that is not a record by the rules above is skipped (never fatal)."""
    with open(path, "rb") as f:
        f.seek(offset)
        chunk = f.read()
    end = chunk.rfind(b"\n") + 1
    lines = chunk[:end].split(b"\n")[:-1]  # the complete lines
    unfinished = chunk[end:]
    found = []
    for n, raw in enumerate([*lines, unfinished]):
        if n == 0 and offset == 0:
            raw = raw.removeprefix(codecs.BOM_UTF8)
        if not raw.strip():
            continue
        try:
            found.append(record_of(_json(raw.decode("utf-8"), str(path)), str(path)))
        except (UnicodeDecodeError, ValueError):  # not UTF-8, not JSON (an unfinished line), not a record
            continue
        if n == len(lines):  # the unfinished last line is a whole record already
            end = len(chunk)
    return found, offset + end
