"""The authors' prompt template (their README and evaluation files; DAPO-Math-17k's), shared by training and eval.

The user turn is ``PROMPT_PREFIX + problem + PROMPT_SUFFIX``; verl applies the model's chat template
later (RLHFDataset -> AgentLoop), so the parquet stores only this user message.

``unwrap_prompt`` recognises the template whatever the text's line endings (``\\n``, ``\\r\\n``, ``\\r``: a file
saved on Windows) and whitespace around it, so that a templated problem is never wrapped twice.
"""

from __future__ import annotations

import re

PROMPT_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
PROMPT_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def _any_eol(text: str) -> str:
    """``text`` as a pattern in which each ``\\n`` matches any one line ending (a ``\\r`` before ``\\n`` is never
    a line ending of its own)."""
    return r"(?:\r\n|\r(?!\n)|\n)".join(re.escape(part) for part in text.split("\n"))


_AROUND = r"[\s\ufeff]*"  # whitespace (and a stray byte-order mark) around the templated text
# the problem is the shortest text before the last suffix (lazy: a CRLF problem never keeps the suffix's \r)
_TEMPLATED = re.compile(rf"\A{_AROUND}{_any_eol(PROMPT_PREFIX)}(.*?){_any_eol(PROMPT_SUFFIX)}{_AROUND}\Z", re.DOTALL)


def format_prompt(problem: str) -> str:
    """Wrap a raw problem statement in the template (no stripping: byte-exact with the authors' files)."""
    return PROMPT_PREFIX + problem + PROMPT_SUFFIX


def unwrap_prompt(content: str) -> str | None:
    """Inverse of :func:`format_prompt`: the raw problem (its own bytes, line endings included), or None if
    ``content`` is not templated. A text templated more than once is unwrapped down to the problem."""
    match = _TEMPLATED.match(content)
    if match is None:
        return None
    while (inner := _TEMPLATED.match(match.group(1))) is not None:
        match = inner
    return match.group(1)
