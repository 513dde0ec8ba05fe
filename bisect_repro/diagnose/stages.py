"""One analysis stage at a time, each of which may fail without ending the analysis.

``compare``, ``show`` and ``doctor`` are made of stages: the records, the replay and its
experiments, the numerics, the report. The records are what every later stage refines: a later
stage that fails with an internal error (a bug, a framework that behaves unexpectedly) leaves the
result as the stages before it made it, with a note naming the stage and the error, and the
command exits as those stages say. :func:`run_stage` is that rule.

Each stage's wall time goes to the ``bisect_repro`` logger at INFO (``stage NAME: S s``), which
``--verbose`` shows: :func:`timed`, which :func:`run_stage` uses, and which the stages that cannot
fail on their own (the records, the launch, the walk to the divergent step, each experiment) use
directly.

Where the guarantees stop: errors about the user's input (:class:`~bisect_repro.errors.
BisectReproError`: a run that is not a run, a refused replay) are not internal and still end the
command with their one-line message; ``KeyboardInterrupt`` and ``SystemExit`` end it too.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from ..errors import BisectReproError

__all__ = ["run_stage", "stage_note", "timed"]

T = TypeVar("T")

_log = logging.getLogger(__name__)


@contextlib.contextmanager
def timed(stage: str) -> Iterator[None]:
    """Log the wall time of the block as the stage's (at INFO), whether or not it raises."""
    started = time.perf_counter()
    try:
        yield
    finally:
        _log.info("stage %s: %.2f s", stage, time.perf_counter() - started)


def stage_note(stage: str, error: BaseException, instead: str) -> str:
    """The note of a failed stage: which, the error in one line, and what the result is instead."""
    text = " ".join(str(error).split())
    shown = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return f"the {stage} stage failed ({shown[:300]}); {instead}"


def run_stage(stage: str, notes: list[str], call: Callable[[], T], fallback: T, instead: str) -> T:
    """``call()``, or ``fallback`` with a note in ``notes`` where it fails with an internal error
    (``instead``: what the result is then, as the note says it)."""
    try:
        with timed(stage):
            return call()
    except BisectReproError:
        raise
    except Exception as error:
        _log.debug("the %s stage failed", stage, exc_info=True)
        notes.append(stage_note(stage, error, instead))
        return fallback
