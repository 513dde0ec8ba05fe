"""bisect-repro: find where, and why, two training runs that should match part ways.

The public API::

    Trainee          what a recipe returns: model, optimizer, loader, step, scheduler, generators, state
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

from .capture import vml
from .capture.hashing import hash_tensors
from .diagnose.compare.compare import compare
from .diagnose.doctor.doctor import doctor
from .errors import BisectReproError
from .record.recorder import Recorder, RecordOptions, current_step, record
from .store.run import Run
from .trainee import Trainee
from .version import __version__

vml.settle()  # the first call of MKL's vector math, made before any code this process records or replays

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
