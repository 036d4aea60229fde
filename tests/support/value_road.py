"""Follow one value through the project's code: the files whose functions hand it on, on its way to the loss.

``ValueRoad(value, roots, sinks)`` is a ``sys.setprofile`` hook. At every call into a file under ``roots`` it looks
at the callee's arguments, at every return from one at the returned object, for the value or an object that holds it
(a walk of OmegaConf configs with their interpolations resolved, dataclasses, mappings, sequences,
``functools.partial`` and the project's own objects' attributes). ``sinks`` name the moments the value is handed to
its next carrier (a code object -> a name: the driver's hand-over to verl, the construction of the loss's config,
the loss's entry point); the object handed on there is the *carrier*. A file is on the road when one of its frames

* holds the value and is on the call stack at such a moment (a construction counts when the object it built is the
  one the loss receives), or
* returns a carrier, or an object holding one (the frames a composed config is returned through on its way).

A function that receives the config and returns without handing it on (a check, a read of another key) is a side
branch, not the road.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import types
from pathlib import Path

DEPTH = 12
GENERATOR = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
PROJECT_MODULES = ("rpg", "recipe", "main_rpg", "__main__")


def _project_object(obj) -> bool:
    module = type(obj).__module__ or ""
    return module.split(".")[0] in PROJECT_MODULES


class ValueRoad:
    def __init__(self, value: float, roots: list[Path], sinks: dict, last: str):
        self.value = value
        self.roots = tuple(str(r) + "/" for r in roots)
        self.sinks = sinks  # code object -> name of the moment
        self.last = last  # the moment whose carrier is what the loss receives
        self.held: set[int] = set()  # id(frame) of frames whose arguments held the value at their call
        self.frames: list = []  # those frames (kept alive so that ids stay theirs)
        self.returned: list[tuple[str, object]] = []  # (file, returned object holding the value)
        self.events: list[tuple[str, list, list[str]]] = []  # (moment, carriers handed on, files on the stack)
        self._generators: dict[int, object] = {}  # generator frames entered (kept alive so that ids stay theirs)
        self._known: dict[int, object] = {}  # OmegaConf containers known to hold the value (kept alive)

    # ---------------------------------------------------------------- what holds the value
    def holds(self, obj, depth: int = DEPTH, seen=None) -> bool:
        if isinstance(obj, float):
            return obj == self.value
        if depth <= 0 or obj is None or isinstance(obj, (bool, int, str, bytes, type, types.ModuleType,
                                                        types.FunctionType, types.BuiltinFunctionType)):
            return False
        if seen is None:
            seen = set()
        if id(obj) in seen:
            return False
        seen.add(id(obj))
        module = type(obj).__module__ or ""
        if module.startswith("omegaconf"):
            return self._config_holds(obj)
        if isinstance(obj, dict):
            return any(self.holds(v, depth - 1, seen) for v in list(obj.values()))
        if isinstance(obj, (list, tuple, set, frozenset)):
            return any(self.holds(v, depth - 1, seen) for v in list(obj))
        if isinstance(obj, functools.partial):
            return self.holds((obj.args, obj.keywords), depth - 1, seen)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return any(self.holds(getattr(obj, f.name, None), depth - 1, seen) for f in dataclasses.fields(obj))
        attrs = getattr(obj, "__dict__", None)
        return _project_object(obj) and isinstance(attrs, dict) and self.holds(attrs, depth - 1, seen)

    def _config_holds(self, obj) -> bool:
        from omegaconf import OmegaConf

        if id(obj) in self._known:  # the value stays in a config once it is there
            return True
        try:
            if not OmegaConf.is_config(obj):  # a value node
                found = self.holds(obj._dereference_node()._value())
            else:
                try:
                    plain = OmegaConf.to_container(obj, resolve=True)
                except Exception:  # noqa: BLE001 - an interpolation that does not resolve here: the raw nodes
                    plain = OmegaConf.to_container(obj, resolve=False)
                found = self.holds(plain, DEPTH * 3)
        except Exception:  # noqa: BLE001
            return False
        if found:
            self._known[id(obj)] = obj
        return found

    def contains(self, obj, targets: set[int], depth: int = DEPTH, seen=None) -> bool:
        """``obj`` is, or holds as a part (not inside an OmegaConf config), an object whose id is in ``targets``."""
        if id(obj) in targets:
            return True
        if depth <= 0 or isinstance(obj, (float, bool, int, str, bytes, type(None))):
            return False
        if seen is None:
            seen = set()
        if id(obj) in seen or (type(obj).__module__ or "").startswith("omegaconf"):
            return False
        seen.add(id(obj))
        if isinstance(obj, dict):
            items = list(obj.values())
        elif isinstance(obj, (list, tuple)):
            items = list(obj)
        elif isinstance(obj, functools.partial):
            items = [*obj.args, *obj.keywords.values()]
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            items = [getattr(obj, f.name, None) for f in dataclasses.fields(obj)]
        elif _project_object(obj) and isinstance(getattr(obj, "__dict__", None), dict):
            items = list(obj.__dict__.values())
        else:
            return False
        return any(self.contains(item, targets, depth - 1, seen) for item in items)

    # ---------------------------------------------------------------- the hook
    def _mine(self, frame) -> str | None:
        name = frame.f_code.co_filename
        return name if name.startswith(self.roots) else None

    def __call__(self, frame, event, arg):
        if event == "call":
            if frame.f_code.co_flags & GENERATOR:  # a generator resumed: its arguments were seen at its first call
                if id(frame) in self._generators:
                    return
                self._generators[id(frame)] = frame
            if (name := self._mine(frame)) is not None and self.holds(dict(frame.f_locals)):
                self.held.add(id(frame))
                self.frames.append(frame)
            moment = self.sinks.get(frame.f_code)
            if moment is not None:
                self._sink(moment, frame)
        elif event == "return" and (name := self._mine(frame)) is not None and self.holds(arg):
            self.returned.append((name, arg))

    def _sink(self, moment: str, frame) -> None:
        carriers = [v for v in dict(frame.f_locals).values() if self.holds(v)]
        files, f = [], frame
        while f is not None:
            if (name := self._mine(f)) is not None and (id(f) in self.held or self.holds(dict(f.f_locals))):
                files.append(name)
            f = f.f_back
        self.events.append((moment, carriers, files))

    def road(self) -> dict[str, set[str]]:
        """file -> why it is on the road (the moments it was on the stack for, or ``returned a carrier``). A moment
        whose name starts with ``built`` (a construction) counts when its object is one the loss receives."""
        received = {id(c) for moment, carriers, _ in self.events if moment == self.last for c in carriers}
        road: dict[str, set[str]] = {}
        handed: set[int] = set()
        for moment, carriers, files in self.events:
            if moment.startswith("built") and not any(id(c) in received for c in carriers):
                continue  # a construction whose object the loss never receives (a check's)
            handed |= {id(c) for c in carriers}
            for name in files:
                road.setdefault(name, set()).add(moment)
        for name, obj in self.returned:
            if self.contains(obj, handed):
                road.setdefault(name, set()).add("returned a carrier")
        return road

    def __enter__(self):
        sys.setprofile(self)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
