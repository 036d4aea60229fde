"""The authors' prompt template (their README and evaluation files; DAPO-Math-17k's), shared by training and eval.

The user turn is ``PROMPT_PREFIX + problem + PROMPT_SUFFIX``; verl applies the model's chat template
later (RLHFDataset -> AgentLoop), so the parquet stores only this user message.
"""

from __future__ import annotations

PROMPT_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
PROMPT_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def format_prompt(problem: str) -> str:
    """Wrap a raw problem statement in the template (no stripping: byte-exact with the authors' files)."""
    return PROMPT_PREFIX + problem + PROMPT_SUFFIX


def unwrap_prompt(content: str) -> str | None:
    """Inverse of :func:`format_prompt`: the raw problem, or None if ``content`` is not templated."""
    if (
        content.startswith(PROMPT_PREFIX)
        and content.endswith(PROMPT_SUFFIX)
        and len(content) >= len(PROMPT_PREFIX) + len(PROMPT_SUFFIX)
    ):
        return content[len(PROMPT_PREFIX) : len(content) - len(PROMPT_SUFFIX)]
    return None
