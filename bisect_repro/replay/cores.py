"""The cores the replaying processes of one controller share: who trains when.

A replaying process trains on torch's OpenMP threads, and an OpenMP thread that has nothing to do
spins for a while before it sleeps. Two replaying processes whose teams together outnumber the
cores (two runs of two threads each on two cores, or a run and the spare processes started for
its next repeats) each spin on cores the other needs, and both run slower than one after the
other (figures in benchmarks/NOTES.md).

Design decision: every request to a replaying process
(:meth:`~bisect_repro.replay.replica.Replica.request`) holds :data:`CORES` for its replica's threads
while it runs; a request whose threads do not fit beside those under way waits, and a spare's
(preparing for a repeat ahead of need) lets every waiting request of the replay itself go first. How
the threads wait is left as it was recorded (``OMP_WAIT_POLICY`` is not set): a nondeterministic
kernel's outcomes depend on the threads' timing, and a replay must reproduce the records as often as
the recording would repeat itself.

Where the guarantees stop: only requests are counted; a process's own start (the code building its
model before it connects) runs beside them.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import torch

__all__ = ["CORES", "Cores"]


class Cores:
    """The cores of this machine, lent to requests by their threads (see the module docstring)."""

    def __init__(self, total: int) -> None:
        self.total = max(1, total)
        self._free = self.total
        self._urgent = 0  # urgent requests waiting
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def held(self, threads: int | None = None, *, urgent: bool = True) -> Iterator[None]:
        """Hold cores for ``threads`` (``None``: as many as torch uses here; at most all of them)
        while the block runs, waiting until they are free; a request that is not ``urgent`` (a
        spare's, preparing ahead of need) also waits while an urgent one does."""
        need = min(self.total, max(1, threads if threads is not None else torch.get_num_threads()))
        with self._changed:
            self._urgent += urgent
            try:
                self._changed.wait_for(lambda: self._free >= need and (urgent or not self._urgent))
            finally:
                self._urgent -= urgent
            self._free -= need
        try:
            yield
        finally:
            with self._changed:
                self._free += need
                self._changed.notify_all()


CORES = Cores(os.cpu_count() or 1)
"""The cores the replicas of this process share."""
