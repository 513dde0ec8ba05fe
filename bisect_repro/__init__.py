"""bisect-repro: find where, and why, two training runs that should match part ways.

The public API::

    Trainee          what a recipe returns: model, optimizer, loader, step, scheduler, streams
    Recorder         records a training loop you drive yourself
    RecordOptions    how often to snapshot and checkpoint
    record           runs a Trainee's step function under a Recorder
    current_step     the step the running Recorder is at (instead of a counter of your own)
    Run              a run directory opened for reading
    compare          compares two runs and bisects to the first divergent step, layer and op
    doctor           audits a recipe (or this environment) for sources of irreproducibility
    hash_tensors     the on-device content hash of tensors, by name
    BisectReproError the base of every error bisect-repro raises on purpose
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .version import __version__

if TYPE_CHECKING:
    from .capture.hashing import hash_tensors
    from .diagnose.compare.compare import compare
    from .diagnose.doctor.doctor import doctor
    from .errors import BisectReproError
    from .record.recorder import Recorder, RecordOptions, current_step, record
    from .store.run import Run
    from .trainee import Trainee


def _module_of(name: str) -> ModuleType | None:
    """The module that defines a public name, imported on first use: the command line starts its
    fork server before it imports torch (see replay/prestart.py). Whatever records or replays
    imports ``bisect_repro.capture``, which makes MKL's first vector-math call (capture/vml.py)."""
    match name:
        case "Recorder" | "RecordOptions" | "current_step" | "record":
            from .record import recorder

            return recorder
        case "compare":
            from .diagnose.compare import compare

            return compare
        case "doctor":
            from .diagnose.doctor import doctor

            return doctor
        case "Run":
            from .store import run

            return run
        case "Trainee":
            from . import trainee

            return trainee
        case "hash_tensors":
            from .capture import hashing

            return hashing
        case "BisectReproError":
            from . import errors

            return errors
    return None


class _Package(ModuleType):
    """This package's module: the public function ``record`` keeps its name when the subpackage
    ``bisect_repro.record`` is first imported (the import system then binds the subpackage to its
    parent's attribute, which would hide the function; ``import bisect_repro.record.x`` and
    ``from bisect_repro.record import x`` find the subpackage in ``sys.modules``)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "record" and isinstance(value, ModuleType):
            return  # the name stays the function, which __getattr__ imports on first use
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    module = _module_of(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "BisectReproError",
    "RecordOptions",
    "Recorder",
    "Run",
    "Trainee",
    "__version__",
    "compare",
    "current_step",
    "doctor",
    "hash_tensors",
    "record",
]
