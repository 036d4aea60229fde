"""``when_imported(name, callback)``: run ``callback(module)`` right after a module is first imported (a standard
``sys.meta_path`` post-import hook), or at once if it is imported already: registrations into a verl module that
must not be imported early (it is heavy, or imported while ``import verl`` runs).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Run ``callback(module)`` right after ``fullname`` has been imported for the first time."""

    def __init__(self, fullname: str, callback: Callable):
        self.fullname, self.callback = fullname, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.fullname:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_then_register(module):
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_register
        return spec


def when_imported(fullname: str, callback: Callable) -> None:
    if fullname in sys.modules:
        callback(sys.modules[fullname])
    else:
        sys.meta_path.insert(0, _PostImportHook(fullname, callback))
