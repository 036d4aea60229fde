"""What the declaration of the ``rpg:`` block writes: the recipe YAML's block and the docs table.

``render_rpg_block()`` is the ``rpg:`` block of recipe/rpg/config/rpg_trainer.yaml, each key with its
default and its doc as a comment; ``settings_table()`` is the table of docs/verl-integration.md, every
key with its default, what it allows and its doc (the loss's four verl actor keys included, where the
loss declares them). Tests check that both files hold exactly what these return.
"""

from __future__ import annotations

import textwrap

from rpg.config.block import BLOCK_RULES
from rpg.config.block import Key, declared_keys, group_docs
from rpg.config.allowed_values import yaml_value
from rpg.config.loss import RULES as LOSS_RULES

WIDTH = 118  # the YAML's longest line
COMMENT_COLUMN = 34


def _commented(text: str, doc: str | None) -> list[str]:
    """``text`` with ``doc`` as a comment after it, wrapped at ``WIDTH`` under the comment's column."""
    if not doc:
        return [text]
    column = max(COMMENT_COLUMN, len(text) + 2)
    chunks = textwrap.wrap(doc, WIDTH - column - 2, break_on_hyphens=False)
    return [f"{text.ljust(column)}# {chunks[0]}", *(f"{' ' * column}# {c}" for c in chunks[1:])]


def render_rpg_block() -> str:
    """The ``rpg:`` block as the recipe YAML states it (every default; docs as comments)."""
    docs = group_docs()
    lines, opened = _commented("rpg:", "written by rpg.config.render_rpg_block() from the declaration, "
                                       "rpg.config.RPGSettings (a test checks)"), []
    for k in declared_keys():
        *parents, leaf = k.path.split(".")[1:]
        common = 0
        while common < min(len(opened), len(parents)) and opened[common] == parents[common]:
            common += 1
        del opened[common:]
        for part in parents[common:]:
            opened.append(part)
            lines += _commented(f"{'  ' * len(opened)}{part}:", docs.get(".".join(["rpg", *opened])))
        indent = "  " * (len(parents) + 1)
        if isinstance(k.default, tuple) and k.default:  # a mapping (rpg.validation.samples_per_problem)
            lines += _commented(f"{indent}{leaf}:", k.doc)
            lines += [f"{indent}  {yaml_value(p)}: {yaml_value(n)}" for p, n in k.default]
        else:
            lines += _commented(f"{indent}{leaf}: {yaml_value(k.default)}", k.doc)
    return "\n".join(lines) + "\n"


def allowed(k: Key) -> str:
    """What ``k`` allows: its kind (an ``RPGLossConfig`` field: its rules), then the rules between keys."""
    own = [k.kind.expected] if k.kind is not None else [r.expected for r in LOSS_RULES if r.field == k.name]
    return "; ".join([*own, *(r.expected for r in BLOCK_RULES if r.key == k.path)])


def settings_table() -> str:
    """Every key of the ``rpg:`` block (and the loss's verl actor keys) as a markdown table: key, default,
    allowed values, whether a resume compares it with the checkpoint's (``recorded``), meaning
    (docs/verl-integration.md holds it; a test checks it is current)."""
    rows = ["| key | default | allowed | resume compares | meaning |", "|---|---|---|---|---|"]
    for k in declared_keys(actor_fields=True):
        cells = (f"`{k.path}`", f"`{yaml_value(k.default)}`", allowed(k), "yes" if k.recorded else "no", k.doc)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)
