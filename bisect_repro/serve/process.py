"""What a replaying process watches from its first line: seeding calls and thread counts.

The bootstrap (:mod:`bisect_repro.replay.bootstrap`) calls :func:`watch_process` before it runs
the user's code, so that the seeding the code does while it builds the model, and the thread
count it pins, are seen too; the server (:class:`~bisect_repro.serve.server.StepServer`) reads
them with :func:`watched_process` and reports them to ``doctor``. A process that was not started
by the bootstrap (a test that builds a server itself) has no watched process: the server then
installs a seeding watch of its own.

Where the guarantees stop: ``torch.set_num_threads`` is seen only through the module attribute
(code that kept a reference to the function before the bootstrap ran is not seen).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..capture.seeding import SeedingWatch

__all__ = ["WatchedProcess", "watch_process", "watched_process"]


@dataclass
class WatchedProcess:
    """What the process did before and while it served."""

    watch: SeedingWatch
    """The seeding watch, installed before the code ran."""
    threads_set: list[int] = field(default_factory=list)
    """Every ``torch.set_num_threads`` call, in order."""


_watched: WatchedProcess | None = None


def watch_process() -> WatchedProcess:
    """Install the seeding watch and the thread-count spy (once per process)."""
    global _watched
    if _watched is None:
        watched = WatchedProcess(SeedingWatch().install())
        set_num_threads = torch.set_num_threads

        def spy(nthreads: int) -> None:  # torch's own parameter name
            watched.threads_set.append(int(nthreads))
            set_num_threads(nthreads)

        torch.set_num_threads = spy
        _watched = watched
    return _watched


def watched_process() -> WatchedProcess | None:
    """The process's watch, when :func:`watch_process` installed one."""
    return _watched
