"""Capture: what a training process is, as plain data: its tensors' content hashes, every random
stream, the data position, the environment. Nothing here writes a file.

Some of it acts on the process to see it: :mod:`~bisect_repro.capture.seeding` wraps the seeding
functions of ``random``, NumPy and torch while a watch is installed;
:mod:`~bisect_repro.capture.data` stands in for a loader's index sampler to remember the indices it
yields; :mod:`~bisect_repro.capture.vml` makes MKL's first vector-math call at import. Each says in
its docstring what it changes and how it is undone."""

from . import vml as _vml

# the first call of MKL's vector math, made before any code this process records or replays
_vml.settle()
