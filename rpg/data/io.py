"""Reading sources (local files, Hugging Face hub) and writing verl parquet files atomically.

Determinism: the parquet writer options are pinned (below), the schema is explicit (no pandas
metadata, no index column), rows keep input order, and nothing time-dependent is written, so the
same input and the same pyarrow version give byte-identical files.
"""

from __future__ import annotations

import codecs
import errno
import json
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rpg.data.rows import BadRecord

LOCAL_SUFFIXES = (".parquet", ".json", ".jsonl")
# Byte-order marks some editors and exporters write (Windows PowerShell 5's Out-File: UTF-16 LE),
# with the codec of the text after the mark; the UTF-32 LE mark starts with the UTF-16 LE one, so it
# is tested first.
_BOMS = (
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_UNDECODABLE = "\udfff"  # marks undecodable bytes in decoded UTF-16/32 text (a strict decode never yields a lone surrogate)
_LINE_END = re.compile(r"\r\n|\r|\n")  # what bytes.splitlines splits on (not U+2028 etc., valid inside JSON strings)

ROW_SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
        (
            "extra_info",
            pa.struct(
                [
                    ("index", pa.int64()),
                    ("copy", pa.int64()),
                    ("raw_problem", pa.string()),
                    ("split", pa.string()),
                    ("source_index", pa.int64()),
                ]
            ),
        ),
    ]
)

_WRITE_OPTIONS = dict(
    compression="zstd",
    compression_level=3,
    use_dictionary=True,
    write_statistics=True,
    version="2.6",
    data_page_version="1.0",
    row_group_size=8192,
    store_schema=True,
)


def read_local(path: str | Path) -> tuple[list[object], list[str], list[int] | None]:
    """Records, column names and (JSONL only, else None) the 1-based line of each record of a
    local .parquet / .json (list of objects) / .jsonl file.

    Text inputs are UTF-8, with or without a byte-order mark, or UTF-16 / UTF-32 with one
    (``_bom``). A JSONL line that cannot be decoded or is not valid JSON becomes a ``BadRecord``
    (rejected with its line; the other lines are kept, ``_jsonl_lines``); a .json document that
    cannot be decoded or is not valid JSON is an error naming file, line, column (UTF-16 / UTF-32:
    byte). A file without rows is an error naming it.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if path.is_dir():
        raise ValueError(f"input {str(path)!r} is a directory; pass one {'/'.join(LOCAL_SUFFIXES)} file "
                         "(prepare-all --input-dir reads a directory)")
    if suffix not in LOCAL_SUFFIXES:
        raise ValueError(f"unsupported input file {str(path)!r}: suffix must be one of {LOCAL_SUFFIXES}")
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    if suffix == ".parquet":
        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as err:  # a corrupt page says "Corrupt snappy compressed data."
            raise ValueError(f"{path}: not a readable parquet file ({' '.join(str(err).split())})") from None
        if table.num_rows == 0:
            raise ValueError(f"{path}: no rows")
        return table.to_pylist(), list(table.column_names), None
    raw = path.read_bytes()
    expected = "a JSON list of objects" if suffix == ".json" else "one JSON object per line"
    if suffix == ".json":
        raw = _utf8(raw, path)
        if not raw.strip():
            raise ValueError(f"{path}: empty file: no rows (expected {expected}, UTF-8)")
        try:
            data = json.loads(raw.decode("utf-8"), object_pairs_hook=_object)
        except UnicodeDecodeError as err:
            line, col = _position(raw, err.start)
            raise ValueError(f"{path}:{line}:{col}: invalid UTF-8 byte 0x{raw[err.start]:02x}") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{err.lineno}:{err.colno}: not valid JSON ({err.msg})") from None
        except ValueError as err:  # a .json document is one value: it is read whole or not at all
            raise ValueError(f"{path}: {_too_long(err)}") from None
        if isinstance(data, dict) and all(isinstance(v, list) for v in data.values()):
            raise ValueError(f"{path}: column-oriented JSON is not supported; use a list of objects or JSONL")
        if not isinstance(data, list):
            raise ValueError(f"{path}: a .json input must hold a list of objects")
        if not data:
            raise ValueError(f"{path}: the JSON list is empty: no rows")
        data = [_checked(r) for r in data]
        return data, _columns(data), None
    text_lines = _jsonl_lines(raw, path)
    if not text_lines:
        raise ValueError(f"{path}: empty file: no rows (expected {expected}, UTF-8)")
    records, lines = [], []
    for number, text in text_lines:
        lines.append(number)
        if isinstance(text, BadRecord):
            records.append(text)
            continue
        try:
            records.append(_checked(json.loads(text, object_pairs_hook=_object)))
        except json.JSONDecodeError as err:
            records.append(BadRecord(f"invalid JSON line ({err.msg})"))
        except ValueError as err:  # an integer longer than Python converts (sys.get_int_max_str_digits)
            records.append(BadRecord(_too_long(err)))
    return records, _columns(records), lines


class _Duplicated(dict):
    """A JSON object with a key written twice (``json`` would keep the last value without a word): ``key``."""

    key: str


def _object(pairs: list[tuple[str, object]]) -> dict:
    """``json``'s ``object_pairs_hook``: the object, marked when a key occurs twice."""
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    marked = _Duplicated(obj)
    marked.key = next(k for k, _ in pairs if k in seen or seen.add(k))
    return marked


def _duplicated_key(value: object) -> str | None:
    """The first key written twice in a JSON object anywhere in ``value``, else None."""
    if isinstance(value, _Duplicated):
        return value.key
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return next((k for k in map(_duplicated_key, children) if k is not None), None)


def _checked(record: object) -> object:
    """A row with a key written twice is rejected (which value was meant cannot be known)."""
    key = _duplicated_key(record)
    return record if key is None else BadRecord(f"duplicate key {key!r} in the JSON object")


def _too_long(err: ValueError) -> str:
    """The reject reason for a JSON number Python refuses to convert: ``json`` parses integers with
    ``int()``, which stops at ``sys.get_int_max_str_digits()`` digits (4300 by default) with a ValueError."""
    return f"integer too long (more than {sys.get_int_max_str_digits()} digits; {' '.join(str(err).split())})"


def _jsonl_lines(raw: bytes, path: Path) -> list[tuple[int, str | BadRecord]]:
    """(1-based line, text) of each non-blank line of a text file; lines end at \\n, \\r\\n or \\r.

    A line that cannot be decoded is a ``BadRecord`` naming the byte and the encoding, and the
    other lines are kept: UTF-8 is decoded line by line, UTF-16 / UTF-32 (with a byte-order mark)
    as a whole, with the undecodable bytes (a lone surrogate, a last line cut short) marked.
    """
    codec, bom = _bom(raw, path)
    out: list[tuple[int, str | BadRecord]] = []
    if codec == "utf-8":
        for number, line in enumerate(raw[len(bom):].splitlines(), start=1):
            if not line.strip():
                continue
            try:
                out.append((number, line.decode("utf-8")))
            except UnicodeDecodeError as err:
                out.append((number, BadRecord(f"invalid UTF-8 byte 0x{line[err.start]:02x} at column {err.start + 1}")))
        return out
    text, bad = _decode_marked(raw, len(bom), codec)
    name = codec[:6].upper()
    for number, line in enumerate(_LINE_END.split(text), start=1):
        if not line.strip(" \t\x0b\x0c"):
            continue
        marks = line.count(_UNDECODABLE)
        if marks:
            reason, offset = bad[0]
            out.append((number, BadRecord(f"not valid {name} ({reason} at byte {offset})")))
            del bad[:marks]
        else:
            out.append((number, line))
    return out


def _bom(raw: bytes, path: Path) -> tuple[str, bytes]:
    """(codec, byte-order mark) of a text file: UTF-8 without a mark, else the mark's codec.

    UTF-16 / UTF-32 without a mark (a NUL in the first two bytes: JSON text starts with ASCII) is
    refused, as guessing its byte order could garble it.
    """
    for bom, codec in _BOMS:
        if raw.startswith(bom):
            return codec, bom
    if b"\x00" in raw[:2]:
        raise ValueError(f"{path}: looks like UTF-16 or UTF-32 without a byte-order mark; save it as UTF-8")
    return "utf-8", b""


_MARKED = threading.local()  # the undecodable sequences ``_decode_marked`` met, per thread


def _mark(err: UnicodeDecodeError) -> tuple[str, int]:
    _MARKED.found.append((err.reason, err.start))
    return _UNDECODABLE, max(err.end, err.start + 1)


codecs.register_error("rpg-data-mark-undecodable", _mark)


def _decode_marked(raw: bytes, start: int, codec: str) -> tuple[str, list[tuple[str, int]]]:
    """``raw[start:]`` decoded in one pass, each undecodable sequence replaced by ``_UNDECODABLE``;
    plus (reason, file offset) of each, in order."""
    _MARKED.found = []
    text = raw[start:].decode(codec, errors="rpg-data-mark-undecodable")
    return text, [(reason, start + offset) for reason, offset in _MARKED.found]


def _utf8(raw: bytes, path: Path) -> bytes:
    """A whole document's text as UTF-8 bytes, without a byte-order mark (``_bom``); a UTF-16 /
    UTF-32 document that does not decode is an error naming the byte."""
    codec, bom = _bom(raw, path)
    if codec == "utf-8":
        return raw[len(bom):]
    try:
        return raw[len(bom):].decode(codec).encode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not valid {codec[:6].upper()} (byte-order mark {bom.hex(' ').upper()}) "
                         f"at byte {len(bom) + err.start}: {err.reason}") from None


def _position(raw: bytes, offset: int) -> tuple[int, int]:
    """1-based (line, column in bytes) of ``offset`` in ``raw``."""
    line_start = raw.rfind(b"\n", 0, offset) + 1
    return raw.count(b"\n", 0, offset) + 1, offset - line_start + 1


def _columns(records: list[object]) -> list[str]:
    cols: dict[str, None] = {}
    for r in records:
        if isinstance(r, dict):
            cols.update(dict.fromkeys(r))
    return list(cols)


HubLoader = Callable[..., object]


def _default_hub_loader(name: str, config: str | None):
    from datasets import load_dataset  # lazy: never imported unless the hub is used

    return load_dataset(name, config)


def read_hub(
    name: str, config: str | None = None, split: str | None = None, loader: HubLoader | None = None
) -> tuple[Iterator[dict] | list, list[str]]:
    """Records of a Hugging Face dataset split via ``datasets.load_dataset(name, config)``.

    ``loader(name, config)`` must return a mapping split -> dataset (a ``DatasetDict``); tests inject
    a fake. split=None takes the only split and is an error when there are several.
    """
    try:
        dsd = (loader or _default_hub_loader)(name, config)
    except (OSError, ValueError) as err:  # ConnectionError, DatasetNotFoundError, bad config name, ...
        raise ValueError(
            f"could not load Hugging Face dataset {name!r} (config {config!r}): {err}; "
            "offline or a renamed dataset? pass a local file with --input"
        ) from err
    splits = list(dsd.keys())
    if split is None:
        if len(splits) != 1:
            raise ValueError(f"{name}: several splits {splits}; choose one with --split")
        split = splits[0]
    if split not in splits:
        raise ValueError(f"{name}: no split {split!r}; available: {splits}")
    ds = dsd[split]
    columns = list(getattr(ds, "column_names", None) or _columns(list(ds)))
    return ds, columns


def write_parquet_atomic(rows: list[dict], path: str | Path) -> None:
    """Write rows with ROW_SCHEMA to ``path`` via a temp file in the same directory + os.replace."""
    path = Path(path)
    table = pa.Table.from_pylist(rows, schema=ROW_SCHEMA)
    _atomic(path, lambda tmp: pq.write_table(table, tmp, **_WRITE_OPTIONS))


def write_text_atomic(text: str, path: str | Path) -> None:
    path = Path(path)
    _atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


class WriteError(OSError):
    """A file could not be written; the message names the file asked for, not the temporary file."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


def _atomic(path: Path, write: Callable[[str], None]) -> None:
    try:
        make_parent(path)
        _replace_atomically(path, write)
    except OSError as err:  # mkstemp/replace name the temporary file: report the path the user gave
        if isinstance(err, WriteError):
            raise
        raise WriteError(err.errno, err.strerror or str(err), str(path)) from err


def make_parent(path: Path) -> None:
    """Create ``path``'s directory; a WriteError for ``path`` naming the part of it that is a file or
    the directory that cannot be created."""
    for parent in reversed(path.parents):
        if parent.exists() and not parent.is_dir():
            raise WriteError(errno.ENOTDIR, f"{parent} is a file, not a directory", str(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        where = err.filename or path.parent
        raise WriteError(err.errno, f"cannot create directory {where}: {err.strerror or err}", str(path)) from err


def _replace_atomically(path: Path, write: Callable[[str], None]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file normal permissions
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
