"""Who seeds a random stream, from where, and whether from entropy: a watch on the seeding
functions.

:class:`SeedingWatch` wraps, while it is installed, the functions that (re)seed a stream:
``torch.seed``/``torch.manual_seed`` (and ``torch.random``'s and ``torch.cuda``'s), ``random.seed``
(the module's and ``random.Random.seed``), ``numpy.random.seed`` and ``numpy.random.default_rng``.
Each call is noted with the stream it seeds, whether its seed came from entropy (no seed given:
the OS or the clock decides), and the call site: the first frame outside torch, NumPy, ``random``
and bisect-repro, as ``file:line``.

``fixed=N`` turns every call that would seed from entropy into one seeded with ``N``: the
experiment that proves a reseed is what makes a step differ from itself (with it fixed, the step
repeats). Each call from entropy notes the value it produced (``value``, see
:mod:`bisect_repro.capture.entropy`); with a ``feed`` (a replay), it is given the value its run
recorded instead, or leaves its stream as it is (the experiment that proves a reseed is what makes
one run differ from another).

Where the guarantees stop: only calls through these names are seen; a function bound to another
name before the watch was installed (``from torch import seed``), ``torch.Generator.seed()`` (a
C method that cannot be wrapped), ``numpy.random.RandomState()`` (a class other code checks
instances of) and seeds computed from the clock and passed explicitly are
noted only as explicit seeds, or not at all; their effect on the stream is still seen by
comparing stream states (see ``diagnose``). Calls made by the standard library (``tempfile``
seeds a private ``random.Random()`` from entropy the first time it names a file, on whichever
thread and step that happens) are not noted: they never seed a stream a training step draws from.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import sys
import sysconfig
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from types import FrameType
from typing import Any

import numpy as np
import torch

from .entropy import EntropyFeed, give, produced

__all__ = ["SeedingCall", "SeedingWatch"]

_SKIPPED = (
    *(os.path.dirname(module.__file__ or "") + os.sep for module in (torch, np)),
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # bisect_repro
    os.path.abspath(random.__file__),
)
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_COMPILER = tuple(
    os.path.join(os.path.dirname(torch.__file__ or ""), part) + os.sep
    for part in ("_dynamo", "_inductor")
)
"""torch's compiler, which makes private ``random.Random()`` instances while it traces: never a
training stream."""


def _in_stdlib(name: str) -> bool:
    return name.startswith(_STDLIB) and "-packages" + os.sep not in name


@dataclass(frozen=True)
class SeedingCall:
    """One call that seeded a stream."""

    stream: str
    """The stream it seeds: ``torch``, ``cuda``, ``python``, ``numpy``, or ``new numpy Generator`` /
    ``new RandomState``."""
    call: str
    """The call as written: ``torch.seed()``, ``random.seed(3)``, ``np.random.default_rng()``."""
    entropy: bool
    """No seed was given: the OS or the clock chose it."""
    where: str | None
    """``file:line`` of the caller, the first frame outside torch, NumPy, ``random`` and
    bisect-repro; ``None`` when no frame is, as for code given to ``python -c``."""
    value: Any = None
    """What a call from entropy produced (see :mod:`bisect_repro.capture.entropy`); only a step
    log holds it (:meth:`to_record`)."""
    replayed: str | None = None
    """In a replay, what was done with a call from entropy (a key of
    :data:`~bisect_repro.capture.entropy.FEED_OUTCOMES`, or ``kept``)."""

    def to_json(self) -> dict[str, Any]:
        found = asdict(self)
        del found["value"]
        if self.replayed is None:
            del found["replayed"]
        return found

    def to_record(self) -> dict[str, Any]:
        """The call as a step log holds it: with the value it produced, where one was seen."""
        found = self.to_json()
        if self.value is not None:
            found["value"] = self.value
        return found

    @classmethod
    def from_json(cls, found: Mapping[str, Any]) -> SeedingCall:
        """A call as :meth:`to_json` wrote it, in a step log (``seeded``) or a verdict
        (``reseeded``); a field that is missing or not text reads as unknown (``""``, or ``None``
        for ``where``)."""

        def text(key: str) -> str:
            value = found.get(key)
            return value if isinstance(value, str) else ""

        replayed = found.get("replayed")
        return cls(
            stream=text("stream"),
            call=text("call"),
            entropy=found.get("entropy") is True,
            where=text("where") or None,
            replayed=replayed if isinstance(replayed, str) else None,
        )

    def describe(self, mark: Callable[[str], str] = str) -> str:
        """``torch.seed() at train.py:9``, or ``torch.seed()`` alone where the call site is unknown.

        ``mark`` wraps the call and the call site each (a report's ``<code>``, with its
        escaping)."""
        return f"{mark(self.call)} at {mark(self.where)}" if self.where else mark(self.call)

    def __str__(self) -> str:
        return self.describe()


def _call_site() -> str | None:
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        raw = frame.f_code.co_filename
        name = os.path.abspath(raw)
        if not name.startswith(_SKIPPED) and not raw.startswith("<"):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _a_librarys_own() -> bool:
    """Whether the seeding call (past ``random.Random.__init__``) comes from torch's compiler, or
    from an installed library's module-level code as it is imported: a private generator made once
    per process (a compile that imports setuptools makes one), never a training stream."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and os.path.abspath(frame.f_code.co_filename) == _SKIPPED[-1]:
        frame = frame.f_back
    if frame is None:
        return False
    name = os.path.abspath(frame.f_code.co_filename)
    return name.startswith(_COMPILER) or (
        frame.f_code.co_name == "<module>" and "-packages" + os.sep in name
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class SeedingWatch:
    """Notes every seeding call while installed (see the module docstring).

    Any number may be installed at once, in any order: the functions are wrapped once, while at
    least one watch is installed, and every installed watch sees every call; ``fixed`` of any of
    them applies.
    """

    def __init__(
        self, fixed: int | None = None, *, on_call: Callable[[SeedingCall], None] | None = None
    ) -> None:
        self.fixed = fixed
        self.feed: EntropyFeed | None = None
        self.calls: list[SeedingCall] = []
        self.on_call = on_call

    def install(self) -> SeedingWatch:
        if not _watches:
            _patch_all()
        _watches.append(self)
        return self

    def uninstall(self) -> None:
        if self in _watches:
            _watches.remove(self)
            if not _watches:
                for undo in reversed(_undo):
                    undo()
                _undo.clear()

    def _see(self, call: SeedingCall) -> None:
        self.calls.append(call)
        if self.on_call is not None:
            self.on_call(call)

    @contextmanager
    def collecting(self) -> Iterator[list[SeedingCall]]:
        """The calls made inside the block (the watch must be installed)."""
        start = len(self.calls)
        found: list[SeedingCall] = []
        try:
            yield found
        finally:
            found.extend(self.calls[start:])


_watches: list[SeedingWatch] = []
_undo: list[Callable[[], None]] = []


def _wrap(
    owner: Any,
    name: str,
    stream: str,
    label: str,
    seed_of: Callable[..., Any],
    seeded: Callable[..., Any],
) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        where = _call_site()
        # a library's private Random()
        if (where is not None and _in_stdlib(where)) or _a_librarys_own():
            return original(*args, **kwargs)
        seed = seed_of(*args, **kwargs)
        call = SeedingCall(
            stream, f"{label}({'' if seed is None else _shown(seed)})", seed is None, where
        )
        if seed is not None:
            _seen(call)
            return original(*args, **kwargs)
        return _from_entropy(call, label, original, seeded, args, kwargs)

    setattr(owner, name, wrapper)
    _undo.append(lambda: setattr(owner, name, original))


def _seen(call: SeedingCall) -> None:
    for watch in list(_watches):
        watch._see(call)


def _from_entropy(
    call: SeedingCall,
    label: str,
    original: Callable[..., Any],
    seeded: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """A call with no seed: fixed, kept, given its recorded value, or drawn (its value noted)."""
    fixed = next((w.fixed for w in reversed(_watches) if w.fixed is not None), None)
    if fixed is not None:
        _seen(call)
        return seeded(original, fixed, *args, **kwargs)
    feed = next((w.feed for w in reversed(_watches) if w.feed is not None), None)
    if feed is not None:
        value, how = feed.take(call.call, call.where)
        call = dataclasses.replace(call, replayed=how)
        # a new generator is made from entropy all the same
        if how == "kept" and label != "np.random.default_rng":
            _seen(call)
            return torch.initial_seed() if label == "torch.seed" else None
        if value is not None:
            _seen(dataclasses.replace(call, value=value))
            return give(label, value, original, args)
    result = original(*args, **kwargs)
    _seen(dataclasses.replace(call, value=produced(label, result, args)))
    return result


def _patch_all() -> None:
    def first(*args: Any, **kwargs: Any) -> Any:
        return args[0] if args else kwargs.get("seed", kwargs.get("a"))

    def method_first(self_: Any, *args: Any, **kwargs: Any) -> Any:
        return first(*args, **kwargs)

    def entropy_only(*args: Any, **kwargs: Any) -> Any:
        return None

    def torch_fixed(original: Any, fixed: int, *args: Any, **kwargs: Any) -> Any:
        # not the watched name: the fixed seed is not a call of the code's
        torch.random.manual_seed(fixed)
        return fixed

    def cuda_fixed(original: Any, fixed: int, *args: Any, **kwargs: Any) -> Any:
        torch.cuda.manual_seed_all(fixed)

    def with_seed(original: Any, fixed: int, *args: Any, **kwargs: Any) -> Any:
        return original(fixed)

    def method_with_seed(original: Any, fixed: int, self_: Any, *args: Any, **kwargs: Any) -> Any:
        return original(self_, fixed)

    for owner in (torch, torch.random):
        _wrap(owner, "seed", "torch", "torch.seed", entropy_only, torch_fixed)
    _wrap(torch, "manual_seed", "torch", "torch.manual_seed", first, with_seed)
    _wrap(torch.cuda, "seed", "cuda", "torch.cuda.seed", entropy_only, cuda_fixed)
    _wrap(torch.cuda, "seed_all", "cuda", "torch.cuda.seed_all", entropy_only, cuda_fixed)
    _wrap(random, "seed", "python", "random.seed", first, with_seed)
    _wrap(
        random.Random, "seed", "random.Random", "random.Random.seed", method_first, method_with_seed
    )
    _wrap(np.random, "seed", "numpy", "np.random.seed", first, with_seed)
    _wrap(
        np.random, "default_rng", "new numpy Generator", "np.random.default_rng", first, with_seed
    )
