"""The small Python state a training step reads outside the trainee: counters in module globals and
closures.

Real loops keep counters of their own: a module global (``iter_num += 1``), a dict in a closure
(``count["n"] += 1``), a flag a helper sets. A step that decides something by such a counter (a
reseed at step 9, a learning-rate warm-up, an evaluation every N steps) reads state that no
``state_dict`` holds, so a replay restored from a checkpoint, or a step run again from its start,
would see the counter as the replay left it. :class:`PythonState` finds that state and makes it
part of the trainee's: it is saved in checkpoints and restored with them, and kept with a step's
start and put back when the step runs again. It is not hashed into snapshots: a closure also holds
the settings the code was built with, which the config already compares.

What is found, in the module the step's code lives in (the module of the step function, or the
one that made the Recorder):

- its globals bound to *small* values: ``int``, ``float``, ``bool``, and lists, tuples and dicts
  (with string keys) of those, at most :data:`MAX_ITEMS` items and two levels deep;
- the closure cells of the functions defined in that module, of the step function, and of the
  functions the code that made the Recorder holds in its local variables (``maybe_reseed =
  make_helper()`` in ``main``), holding small values the same way (a ``{"n": 0}`` counter),
  named ``<function>.<variable>``.

Restoring is data only: a saved value is put back only under a name found here, only when it is
small and of the same type as the value there now; mutable containers are updated in place, so
that every reference to them sees the value. Nothing is imported, called or evaluated.

Where the guarantees stop:

- a local variable of a running frame (``for t, batch in enumerate(...)``: ``t``) cannot be read
  or set from outside; read ``recorder.step`` (or ``bisect_repro.current_step()``) instead;
- strings, objects and large containers are not captured (a path, a model, a dataset);
- names bound after the Recorder was made are found at the next snapshot, not before.
"""

from __future__ import annotations

import copy
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_ITEMS", "PythonState", "Scope", "caller_scope", "is_small"]

MAX_ITEMS = 64
_SCALARS = (bool, int, float)


@dataclass(frozen=True)
class Scope:
    """Where a loop's counters live: its module's globals, and functions it holds (whose closures
    count)."""

    namespace: dict[str, Any] | None = None
    functions: tuple[types.FunctionType, ...] = ()


def caller_scope() -> Scope:
    """The scope of the nearest calling frame outside this package, the code that made the
    Recorder (a script's ``main``, a library's trainer): its module's globals, and the functions
    among its local variables (a helper made by a factory, whose closure keeps a counter)."""
    frame: types.FrameType | None = sys._getframe(1)
    while (
        frame is not None
        and str(frame.f_globals.get("__name__", "")).split(".")[0] == __name__.split(".")[0]
    ):
        frame = frame.f_back
    if frame is None:
        return Scope()
    local = (
        ()
        if frame.f_locals is frame.f_globals
        else tuple(v for v in frame.f_locals.values() if isinstance(v, types.FunctionType))
    )
    return Scope(frame.f_globals, local)


def is_small(value: Any, depth: int = 2) -> bool:
    """Whether ``value`` is state this module captures (see the module docstring)."""
    if type(value) in _SCALARS:
        return True
    if depth == 0 or type(value) not in (list, tuple, dict) or len(value) > MAX_ITEMS:
        return False
    if type(value) is dict:
        return all(type(k) is str and is_small(v, depth - 1) for k, v in value.items())
    return all(is_small(v, depth - 1) for v in value)


def _same_shape(saved: Any, current: Any) -> bool:
    if type(saved) is not type(current) and not (type(saved) is list and type(current) is tuple):
        return False
    return is_small(saved)


def _put_back(current: Any, saved: Any) -> Any:
    """``saved`` as the value to bind: a mutable container of the same type is updated in place."""
    if type(current) is dict and type(saved) is dict:
        current.clear()
        current.update(copy.deepcopy(saved))
        return current
    if type(current) is list and type(saved) is list:
        current[:] = copy.deepcopy(saved)
        return current
    if type(current) is tuple:
        return tuple(saved)
    return copy.deepcopy(saved)


class PythonState:
    """The counters of one module and its functions' closures (see the module docstring)."""

    def __init__(self, scope: Scope) -> None:
        self._namespace = scope.namespace
        self._held = scope.functions

    def _functions(self) -> dict[str, types.FunctionType]:
        """The functions whose closures count: those held, and those the module defines."""
        namespace = self._namespace or {}
        module = namespace.get("__name__")
        defined = (
            v
            for v in namespace.values()
            if isinstance(v, types.FunctionType) and v.__module__ == module
        )
        found: dict[str, types.FunctionType] = {}
        for function in (*self._held, *defined):
            if function.__closure__:
                found.setdefault(function.__qualname__, function)
        return found

    def _cells(self) -> dict[str, types.CellType]:
        cells: dict[str, types.CellType] = {}
        for qualname, function in self._functions().items():
            for variable, cell in zip(
                function.__code__.co_freevars, function.__closure__ or (), strict=False
            ):
                try:
                    contents = cell.cell_contents
                except ValueError:  # an empty cell: bound later
                    continue
                if is_small(contents):
                    cells[f"{qualname}.{variable}"] = cell
        return cells

    def _globals(self) -> dict[str, Any]:
        namespace = self._namespace or {}
        return {
            name: value
            for name, value in namespace.items()
            if not name.startswith("__") and is_small(value)
        }

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """Copies of every counter found now: ``{"globals": {...}, "cells": {...}}``."""
        return {
            "globals": copy.deepcopy(self._globals()),
            "cells": {
                name: copy.deepcopy(cell.cell_contents) for name, cell in self._cells().items()
            },
        }

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Put saved counters back (only names found here, of the same type: see the module
        docstring)."""
        if not isinstance(state, Mapping):
            return
        namespace, saved_globals = self._namespace, state.get("globals")
        if namespace is not None and isinstance(saved_globals, Mapping):
            for name, current in self._globals().items():
                if name in saved_globals and _same_shape(saved_globals[name], current):
                    namespace[name] = _put_back(current, saved_globals[name])
        saved_cells = state.get("cells")
        if isinstance(saved_cells, Mapping):
            for name, cell in self._cells().items():
                if name in saved_cells and _same_shape(saved_cells[name], cell.cell_contents):
                    cell.cell_contents = _put_back(cell.cell_contents, saved_cells[name])
