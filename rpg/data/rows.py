"""Pure row checks and the verl RLHFDataset row layout (no I/O).

Input records are plain dicts from a parquet/JSON/JSONL file or a Hugging Face dataset, in one of
two layouts:

* ``verl``  -- already a verl row: ``prompt`` (chat list) + ``reward_model.ground_truth``; the
  problem is ``extra_info.raw_problem`` if present, else the user message with the prompt template
  (``rpg.data.template``) removed (this is how DAPO-Math-17k and the authors' eval parquets are stored);
* ``plain`` -- a problem column and an answer column (names from the preset or the CLI).

Every input row either becomes one problem or is rejected with ``(index, reason)``; nothing is
dropped silently. Duplicates (the same ``dedup_key``: the text up to Unicode NFKC normalisation, case and
whitespace) keep the first occurrence; a problem ``exclude`` names (an evaluation set's, for a training set)
is rejected naming where it is.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rpg.data.template import format_prompt, unwrap_prompt

# CJK ideographs, kana and hangul (not full-width punctuation, which can appear in English text).
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


_SURROGATE = re.compile(r"[\ud800-\udfff]")
EVAL_OVERLAP = "in an evaluation set"  # a training row's reject reason (the class of the counts), then (<file>)
NUMBER_ANSWER = "a number answer"  # the reject reason of a float that is not an integer (then the value)


def _unicode_problem(text: str, what: str) -> str | None:
    """The rejection reason when ``text`` holds a lone surrogate (JSON's ``"\\ud800"`` escape decodes to
    one; it is not a Unicode character and cannot be written as UTF-8 to the parquet file)."""
    m = _SURROGATE.search(text)
    return None if m is None else f"lone surrogate U+{ord(m.group()):04X} in the {what} (not valid Unicode)"


def _invisible(text: str) -> list[str] | None:
    """The code points of a text that shows nothing: only whitespace, control (Cc: NUL, ...) and
    format (Cf: zero-width space/joiners U+200B-U+200D, word joiner U+2060, BOM U+FEFF, soft hyphen,
    direction marks) characters; None when something visible is left."""
    if any(not ch.isspace() and unicodedata.category(ch) not in ("Cc", "Cf") for ch in text):
        return None
    return sorted({f"U+{ord(ch):04X}" for ch in text if not ch.isspace()})


def _empty_reason(text: str, reason: str, blank: str = "") -> str | None:
    """``reason + blank`` for an empty or blank text, ``reason (only invisible characters: U+...)``
    for one that only looks empty, None for a text with something visible."""
    codes = _invisible(text)
    if codes is None:
        return None
    return f"{reason} (only invisible characters: {', '.join(codes)})" if codes else reason + blank


@dataclass(frozen=True)
class Layout:
    kind: str                      # "verl" | "plain"
    problem_key: str | None = None
    answer_key: str | None = None

    @property
    def answer_column(self) -> str:
        return "reward_model.ground_truth" if self.kind == "verl" else str(self.answer_key)

    def describe(self) -> str:
        """The columns read, for the summary line."""
        if self.kind == "verl":
            return "verl layout: prompt, reward_model.ground_truth"
        return f"problem column {self.problem_key!r}, answer column {self.answer_key!r}"


@dataclass(frozen=True)
class BadRecord:
    """An input row that could not even be parsed (e.g. an invalid JSONL line); rejected with ``reason``."""

    reason: str


@dataclass(frozen=True)
class Reject:
    index: int               # 0-based row of the input (as extra_info.source_index)
    reason: str
    line: int | None = None  # 1-based line of a JSONL input

    @property
    def where(self) -> str:
        return f"line {self.line}" if self.line is not None else f"row {self.index}"


@dataclass(frozen=True)
class Problem:
    problem: str       # exact text (not stripped: prompts stay byte-identical to the source's)
    answer: str
    source_index: int  # row index in the input
    number: float | None = None  # the float the answer was stored as (27.0 -> answer "27"), if it was one


def resolve_layout(
    columns: Iterable[str],
    problem_keys: Sequence[str],
    answer_keys: Sequence[str],
    problem_key: str | None = None,
    answer_key: str | None = None,
) -> Layout:
    """Choose the input layout from the column names; explicit keys win. ValueError if impossible, or when
    several candidate columns are present (a GSM8K-style file has a worked solution in ``answer`` and the
    number in ``final_answer``): the caller names one (``--problem-key`` / ``--answer-key``), never a guess."""
    cols = set(columns)
    if problem_key is None and answer_key is None and {"prompt", "reward_model"} <= cols:
        return Layout("verl")
    pk = problem_key or _the_one(cols, problem_keys, "problem")
    ak = answer_key or _the_one(cols, answer_keys, "answer")
    for name, key, tried in (("problem", pk, problem_keys), ("answer", ak, answer_keys)):
        if key is None or key not in cols:
            wanted = repr(key) if key else f"one of {list(tried)}"
            raise ValueError(
                f"no {name} column: wanted {wanted}; the input has columns {sorted(cols)} "
                f"(set --{name}-key)"
            )
    return Layout("plain", pk, ak)


def _the_one(cols: set[str], candidates: Sequence[str], name: str) -> str | None:
    present = [k for k in candidates if k in cols]
    if len(present) > 1:
        raise ValueError(f"several {name} columns: {', '.join(map(repr, present))}; choose one with --{name}-key COLUMN")
    return present[0] if present else None


def _answer_text(value, column: str) -> tuple[str, float | None]:
    """Ground truth as a non-empty str, and the number it was stored as when it was a float; raises
    ValueError(reason) otherwise.

    ints (not bools) are converted with str(); a float with an integral value (``27.0``: some hub copies of the
    evaluation sets store answers as numbers) is that integer's text (``"27"``, which ``Answer: 27`` matches),
    up to 2**53 (beyond, a float no longer holds every integer); any other float is refused naming ``column``:
    how it was written (0.1, 0.10, 1/10) cannot be told from it, and a guess could mis-score every response.
    A one-element list of str (OlympiadBench's ``final_answer``) is unwrapped; surrounding whitespace is
    removed (the scorers ignore it).
    """
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if value is None:
        raise ValueError("no answer (missing or null)")
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer() and abs(value) <= 2**53):
            raise ValueError(f"{NUMBER_ANSWER} {value!r} in column {column!r} (not an integer a float holds exactly: "
                             "how it was written cannot be told; store the answers as text)")
        return str(int(value)), value
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        kind = f"list of {len(value)} items" if isinstance(value, list) else type(value).__name__
        raise ValueError(f"non-string answer ({kind})")
    text = str(value)
    blank = " (empty string)" if text == "" else " (only whitespace)"
    for reason in (_unicode_problem(text, "answer"), _empty_reason(text, "no answer", blank)):
        if reason:
            raise ValueError(reason)
    return text.strip(), None


def _verl_problem(record: dict) -> tuple[object, object]:
    rm = record.get("reward_model")
    if not isinstance(rm, dict):
        raise ValueError(f"reward_model is not a mapping ({type(rm).__name__})")
    answer = rm.get("ground_truth")
    extra = record.get("extra_info")
    if isinstance(extra, dict) and extra.get("raw_problem") is not None:
        return extra["raw_problem"], answer
    prompt = record.get("prompt")
    if isinstance(prompt, str):  # some processed copies store the templated text, not a chat list
        content = prompt
    else:
        if not isinstance(prompt, list) or not prompt:
            raise ValueError("prompt is neither a string nor a non-empty chat list")
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if not users or not isinstance(users[-1].get("content"), str):
            raise ValueError("prompt has no user message with string content")
        content = users[-1]["content"]
    problem = unwrap_prompt(content)
    if problem is None:
        raise ValueError("prompt is not in the authors' prompt template and extra_info.raw_problem is missing")
    return problem, answer


def check_record(index: int, record: object, layout: Layout, english_only: bool) -> Problem:
    """One input row -> Problem, or ValueError whose message is the rejection reason."""
    if isinstance(record, BadRecord):
        raise ValueError(record.reason)
    if not isinstance(record, dict):
        raise ValueError(f"row is not a mapping ({type(record).__name__})")
    if layout.kind == "verl":
        problem, answer = _verl_problem(record)
    else:
        if layout.problem_key not in record:
            raise ValueError(f"missing problem column {layout.problem_key!r}")
        problem, answer = record.get(layout.problem_key), record.get(layout.answer_key)
    if not isinstance(problem, str):
        raise ValueError(f"non-string problem ({type(problem).__name__})")
    problem = unwrap_prompt(problem) or problem  # never wrap the template twice
    for reason in (_unicode_problem(problem, "problem"), _empty_reason(problem, "empty problem")):
        if reason:
            raise ValueError(reason)
    answer_text, number = _answer_text(answer, layout.answer_column)
    if english_only and _CJK.search(problem):
        raise ValueError("non-English problem (CJK characters)")
    return Problem(problem, answer_text, index, number)


def dedup_key(problem: str) -> str:
    """What the same problem written twice shares: the text after Unicode NFKC normalisation (``é`` composed or
    decomposed, full-width digits, ligatures), case folding, and with its whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFKC", problem).casefold().split())


def select_problems(
    records: Iterable[object], layout: Layout, english_only: bool = False, lines: Sequence[int] | None = None,
    exclude: Mapping[str, str] | None = None,
) -> tuple[list[Problem], list[Reject], int]:
    """Check every record, drop (and report) duplicates. Returns (problems, rejects, rows_read).

    ``lines``: the 1-based file line of each record (JSONL), so that rejects name lines, not rows.
    ``exclude``: ``{dedup_key: where}`` of problems to reject (``in an evaluation set (<where>)``).
    """
    problems: list[Problem] = []
    rejects: list[Reject] = []
    first_seen: dict[str, Problem] = {}
    n = 0

    def reject(index: int, reason: str) -> Reject:
        return Reject(index, reason, None if lines is None else lines[index])

    for index, record in enumerate(records):
        n += 1
        try:
            p = check_record(index, record, layout, english_only)
        except ValueError as err:
            rejects.append(reject(index, str(err)))
            continue
        key = dedup_key(p.problem)
        first = first_seen.get(key)
        if first is not None:
            of = reject(first.source_index, "").where
            if first.answer == p.answer:
                reason = f"duplicate of {of}"
            else:
                reason = f"duplicate of {of} with a different answer ({p.answer!r:.40} vs {first.answer!r:.40})"
            rejects.append(reject(index, reason))
            continue
        if exclude is not None and key in exclude:
            rejects.append(reject(index, f"{EVAL_OVERLAP} ({exclude[key]})"))
            continue
        first_seen[key] = p
        problems.append(p)
    return problems, rejects, n


def build_rows(problems: Sequence[Problem], data_source: str, split: str, copies: int = 1) -> list[dict]:
    """verl RLHFDataset rows, ``copies`` consecutive rows per problem.

    copies=1 is the layout for verl 0.9.1 (mean@k from ``val_kwargs.n=k``: verl groups the k samples
    of a row by a per-row uid). copies=k reproduces the authors' files (k identical rows,
    ``val_kwargs.n=1``); in verl 0.9.1 that logs ``acc/mean@1`` whose value equals mean@k.
    ``extra_info.index`` is the problem id, ``extra_info.copy`` the copy number.
    """
    if not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies must be an integer >= 1, got {copies!r}")
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rows = []
    for pid, p in enumerate(problems):
        for c in range(copies):
            rows.append(
                {
                    "data_source": data_source,
                    "prompt": [{"role": "user", "content": format_prompt(p.problem)}],
                    "ability": "MATH",
                    "reward_model": {"ground_truth": p.answer, "style": "rule"},
                    "extra_info": {
                        "index": pid,
                        "copy": c,
                        "raw_problem": p.problem,
                        "split": split,
                        "source_index": p.source_index,
                    },
                }
            )
    return rows
