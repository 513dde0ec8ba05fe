"""How long a replaying process may take to answer: a deadline proportional to the recorded step
time.

Every wait on a replaying process already notices the process's death at once (the wait checks
it every half second). A live process that stops answering (a loop that never reaches the next
step, a data position it cannot reach) is stopped by a deadline: each request may take
:data:`SLOWER` times the recorded time of the steps it covers, and never less than
:data:`FLOOR_S` (building the model, a traced step, a loaded machine). A progress report from
the process starts the count again. When the deadline passes the wait raises one line naming
the request, the time allowed and the recorded step time.

The recorded step time (:func:`step_seconds`) is read from the run's own snapshot files: the time
between the first and the last one written, over the steps between them, from their
modification times as the file system keeps them (``lstat``, no link followed, nothing read). A
run copied without its times reads as fast as the copy, and gets the floor.

Where the guarantees stop: the floor is generous on purpose, so a process that hangs is stopped
after minutes, not seconds; the times of a run are what its files say, and a crafted run can
only make its own replay wait longer (up to the cap :data:`CEILING_S`) or fail sooner.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ..errors import BisectReproError
from ..store.run import Run

__all__ = [
    "CEILING_S",
    "FLOOR_S",
    "SLOWER",
    "Deadline",
    "DeadlinePassed",
    "allowance",
    "guarded",
    "step_seconds",
]

SLOWER = 200
"""How many times slower than recorded a replayed step may be (traced in full, on a loaded
machine)."""
FLOOR_S = 900.0
CEILING_S = 24 * 3600.0


class DeadlinePassed(BisectReproError):
    """A replaying process did not answer in the time its recorded steps allow."""


def step_seconds(run: Run) -> float | None:
    """The recorded seconds a step took (see the module docstring); ``None`` when the run cannot
    say."""
    if len(run.snapshots) < 2:
        return None
    first, last = min(run.snapshots), max(run.snapshots)
    try:
        times = [os.lstat(run.folder / run.snapshots[step].file).st_mtime for step in (first, last)]
    except OSError:
        return None
    return max(0.0, times[1] - times[0]) / (last - first)


def allowance(seconds_per_step: float | None, steps: int) -> float:
    """The seconds a request covering ``steps`` steps may take."""
    scaled = SLOWER * (seconds_per_step or 0.0) * max(1, steps)
    return min(CEILING_S, max(FLOOR_S, scaled))


def guarded(
    deadline: Deadline, wait: Callable[[], None], progress: Callable[[int], None] | None
) -> tuple[Callable[[], None], Callable[[int], None]]:
    """``wait`` that also checks ``deadline``, and ``progress`` that also starts it again."""

    def waiting() -> None:
        wait()
        deadline.check()

    def advanced(done: int) -> None:
        deadline.extend()
        if progress is not None:
            progress(done)

    return waiting, advanced


class Deadline:
    """A deadline for one request; :meth:`check` raises once it has passed, :meth:`extend` starts it
    again."""

    def __init__(
        self,
        what: str,
        seconds: float,
        seconds_per_step: float | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what, self.seconds, self.per_step, self._clock = what, seconds, seconds_per_step, clock
        self._until = clock() + seconds

    def extend(self) -> None:
        self._until = self._clock() + self.seconds

    def check(self) -> None:
        if self._clock() >= self._until:
            recorded = f"{self.per_step:.3g} s a step" if self.per_step else "not known"
            raise DeadlinePassed(
                f"{self.what}: no answer within {self.seconds:.0f} s "
                f"({SLOWER}x the recorded step time, {recorded}, at least {FLOOR_S:.0f} s); "
                "the replaying process was stopped; the verdict is from the records alone"
            )
