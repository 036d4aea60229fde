"""The run names of the shipped scripts (``recipe/rpg/{7b,4b}/run_*.sh``) and the ones closest to another name.

A name the grammar reads composes as its tokens say, shipped or not (``rpg.launch.variants``). A valid name a few
single-character edits from a shipped one (``..._0.2_0.82`` for ``..._0.2_0.28``: two digits swapped) is as often a
typo as a new setting, so the launcher names the closest shipped name in one line (``unshipped_note``) and runs it
as written: the grammar's own unshipped names (the study's ``run_rpg_7b_ufkl1e-4_rf``, another coefficient such as
``ufkl1e-3``) are just as close to shipped ones, and the launch header prints the settings the name gives.
"""

from __future__ import annotations

import difflib

from rpg.common.checkout import CHECKOUT, RECIPE_DIR

NEAR_EDITS = 2  # a valid unshipped name within this many edits of a shipped one gets the note


def known_names() -> list[str]:
    """Names of the scripts shipped in recipe/rpg/{7b,4b} (empty if the recipe is not next to the package)."""
    root = CHECKOUT / RECIPE_DIR
    return sorted(p.stem for d in ("7b", "4b") if (root / d).is_dir() for p in (root / d).glob("run_*.sh"))


def edits(a: str, b: str) -> int:
    """Single-character edits from ``a`` to ``b``: insert, delete, substitute, or swap two adjacent characters
    (the optimal string alignment distance)."""
    before, prev = None, list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], before[j - 2] + 1)
        before, prev = prev, row
    return prev[-1]


def closest_shipped(name: str, max_edits: int | None = None) -> list[str]:
    """The shipped names closest to ``name``: difflib's best three (ratio >= 0.75: a name the grammar cannot read);
    with ``max_edits``, the shipped names at the fewest ``edits`` from it when that is at most ``max_edits``."""
    shipped = known_names()
    if max_edits is None:
        return difflib.get_close_matches(name, shipped, n=3, cutoff=0.75)
    near = sorted((edits(name, s), s) for s in shipped if s != name)
    return [s for d, s in near if d == near[0][0] <= max_edits] if near else []


def unshipped_note(name: str) -> str | None:
    """One line when ``name`` (a valid run name) is not a shipped script but within ``NEAR_EDITS`` edits of one."""
    if name in known_names():
        return None
    near = closest_shipped(name, NEAR_EDITS)
    if not near:
        return None
    return (f"{name} is not a shipped run; closest shipped name{'s' if len(near) > 1 else ''}: {', '.join(near)} "
            "(it runs as its own name reads: the settings below)")
