"""Code pinned to its hash: a replay runs exactly the bytes whose SHA-256 was checked and shown.

The controller checks the recorded file's SHA-256 and shows it before asking for consent; the
file could change between that moment and the import. :func:`pin` records the checked path and
hash in the replaying process, before any of the run's code is imported; from then on that file
is only ever run from bytes read once and hashed (never from a ``.pyc`` cache, never read again):

- a module (``-m``, or a module recipe) through :class:`PinnedFinder`, first on ``sys.meta_path``,
  which gives the pinned file a loader that compiles the verified bytes;
- a recipe file through :func:`loader`, which the recipe loader asks for;
- a script through :func:`code`, which :func:`bisect_repro.record.script.run_as_main` runs.

Bytes whose hash differs raise :class:`PinnedCodeChanged` (one line, nothing of the file run).

Where the guarantees stop: only the pinned file is checked, not what it imports.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from pathlib import Path
from types import CodeType, ModuleType

from ..errors import BisectReproError

__all__ = ["PinnedCodeChanged", "PinnedFinder", "code", "loader", "pin"]

_PINS: dict[Path, str] = {}


class PinnedCodeChanged(BisectReproError):
    """The file changed after its SHA-256 was checked: nothing of it runs."""


def pin(path: str | Path, sha256: str) -> None:
    """Run ``path`` in this process only from bytes whose SHA-256 is ``sha256``."""
    _PINS[Path(path).resolve()] = sha256
    if not any(isinstance(finder, PinnedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, PinnedFinder())


def _verified(path: Path) -> bytes | None:
    """The bytes of a pinned file, read once and checked against its hash; ``None`` if not
    pinned."""
    expected = _PINS.get(path.resolve())
    if expected is None:
        return None
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != expected:
        raise PinnedCodeChanged(
            f"{path}: changed after its SHA-256 {expected[:16]}... was checked and shown; nothing "
            "of it was run; run compare again"
        )
    return data


def code(path: str | Path) -> CodeType | None:
    """The code object of a pinned file, compiled from its verified bytes; ``None`` if not
    pinned."""
    data = _verified(Path(path))
    return None if data is None else compile(data, str(path), "exec", dont_inherit=True)


class PinnedLoader(importlib.machinery.SourceFileLoader):
    """Loads a pinned file from its verified bytes, never from a bytecode cache."""

    def get_code(self, fullname: str) -> CodeType:
        found = code(self.path)
        if found is None:  # pragma: no cover - made only for pinned files
            raise ImportError(f"{self.path} is not pinned", name=fullname)
        return found


def loader(name: str, path: str | Path) -> PinnedLoader | None:
    """A loader of ``path`` under ``name`` when the file is pinned, else ``None`` (the default
    loader)."""
    return PinnedLoader(name, str(path)) if Path(path).resolve() in _PINS else None


class PinnedFinder(importlib.abc.MetaPathFinder):
    """Finds modules as the path finder does, and gives a pinned file its :class:`PinnedLoader`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.origin and spec.has_location:
            pinned = loader(fullname, spec.origin)
            if pinned is not None:
                spec.loader = pinned
        return spec
