"""Checks of a message's facts, not its wording: a refusal the product promises on one line is one line, and it
names what a user needs (the key, the file, the values allowed, the command to run)."""

from __future__ import annotations


def one_line(text: str) -> str:
    """``text`` as its one line (a trailing newline allowed); fails when it spans more lines or none."""
    lines = text.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0].strip(), f"not one line ({len(lines)}):\n{text}"
    return lines[0]


def names(text: str, *facts: str) -> str:
    """``text``, after checking that it holds every fact given (a key, a path, a value, a command)."""
    missing = [fact for fact in facts if fact not in text]
    assert not missing, f"{missing} not in:\n{text}"
    return text
