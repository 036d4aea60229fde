"""Memoized YAML parsing for the test processes: ``OmegaConf.load`` keyed by the text it parses.

Many tests compose the recipe's Hydra config (every paper script, every refused value, every variant: about
700 compositions in a suite). Each composition has Hydra read and parse the same ~33 YAML files of the
recipe and of verl's config tree (``OmegaConf.load`` in Hydra's file and package config sources), and the
parsing (PyYAML's pure-Python loader, then OmegaConf's node construction) was most of a composition's time.
Here the first parse of a text is kept and every later load of the same text gets a deep copy of it: the
same object a fresh parse would give (parsing is a function of the text alone; the copy shares no node with
the kept one or with another caller's), at about a seventh of the cost. Keyed by the whole text, so an
edited file is parsed again. Hydra's composition itself (defaults lists, overrides, merging, interpolation)
is untouched. Installed for the pytest processes only (``tests/conftest.py``); the subprocesses that tests
start, and every run of the project, parse as usual.
"""

from __future__ import annotations

import copy
import io
import os
import pathlib

from omegaconf import OmegaConf

_ORIGINAL = OmegaConf.load
_PARSED: dict[str, object] = {}


def _load(file_):
    if isinstance(file_, (str, pathlib.Path)):
        with io.open(os.path.abspath(file_), "r", encoding="utf-8") as f:  # as OmegaConf.load opens a path
            text = f.read()
    elif getattr(file_, "read", None):
        text = file_.read()  # from the stream's position, as yaml.load reads it (Hydra reads a header first)
        if isinstance(text, bytes):
            text = text.decode("utf-8")
    else:
        return _ORIGINAL(file_)  # OmegaConf's own TypeError
    parsed = _PARSED.get(text)
    if parsed is None:
        stream = io.StringIO(text)
        stream.name = getattr(file_, "name", str(file_))  # what PyYAML's error marks name, as for the file
        parsed = _PARSED[text] = _ORIGINAL(stream)
    return copy.deepcopy(parsed)


def install() -> None:
    """Route ``OmegaConf.load`` through the memo (idempotent)."""
    OmegaConf.load = staticmethod(_load)


def installed() -> bool:
    return OmegaConf.load is _load
