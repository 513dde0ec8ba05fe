"""MKL's vector math on the CPU: its first call in a process is made here, once, and thrown away.

On x86, torch computes ``sqrt`` of float tensors with MKL's vector math library (VML), split
among its OpenMP threads. The first such call in a process, when two threads make it at once,
now and then computes one thread's share in a less exact path: measured with torch 2.13.0+cpu
(MKL 2024.2) on a 2-core Xeon, ``torch.sqrt`` of 16,000 floats on 2 threads was off by an ulp in
5,679 elements in 2 of 45 fresh processes on a loaded machine, and later calls in the same
process were exact. Adam and RMSprop take a ``sqrt`` of their second moment at every step, so
two runs of the same seeded script part, at the first optimizer step, in a few processes in a
hundred; and a replay does not reproduce a record that carries it.

Design decision: :func:`settle` runs that first call when ``bisect_repro.capture`` is imported
(which whatever records or replays imports before the code it runs does anything), on enough
elements for every thread to take a share, and discards its result. Runs recorded and replayed
with bisect-repro are then free of it.

A fork server (:mod:`bisect_repro.replay.forks`) must not start OpenMP threads before it
forks, so it starts with :data:`DEFER_VARIABLE` set: the import then leaves the call to each copy,
which makes it first thing, before the code it replays runs.

Where the guarantees stop: the same script run without bisect-repro keeps the effect; a thread
count raised after the import starts threads whose first call was not made here (no such effect
was seen in that case, and none is claimed); torch built without MKL has nothing to settle.
"""

from __future__ import annotations

import os

import torch

from ..variables import DEFER_VARIABLE

__all__ = ["GRAIN", "settle"]

GRAIN = 2048
"""Elements ATen hands one thread at a time for a unary float op (its ``grain_size``)."""

settled: int = 0
"""How many elements the first call took (0 until :func:`settle` ran)."""


def settle() -> int:
    """Make this process's first vector-math call now, on every intra-op thread; the elements
    used."""
    global settled
    if settled or not torch.backends.mkl.is_available() or os.environ.get(DEFER_VARIABLE):
        return settled
    count = GRAIN * 2 * max(1, torch.get_num_threads())
    for dtype in (torch.float32, torch.float64):
        torch.ones(count, dtype=dtype).sqrt()
    settled = count
    return count
