"""Recording against a reference run: each record checked as it is written, the run stopped at the
first difference.

``bisect-repro record --out B --against A`` (and ``Recorder(..., against=...)``) records B as
usual and checks, on the writer's thread, each step line (sample order, batch hash, loss) and each
snapshot (state hashes, each random stream's state) against A's
(:class:`~bisect_repro.record.reference.ReferenceRun`), as :func:`compare`'s reading of the records
does: the same fields, equal or not. The decisions:

- :class:`Matcher`: which record differs first. B's records are checked in the order they are
  written (a snapshot's step lines, then the snapshot); a record A has not committed yet waits
  for it (a reference being written); a step or snapshot A has not got (its own schedule) is
  skipped; past A's end nothing is checked and a note says so. After the first difference nothing
  more is checked.
- :func:`stops_at`: where B stops. At the first snapshot due once the difference is known
  (:class:`Against.keep_going`: never), so that B holds a divergent snapshot past the difference
  for the comparison; at A's last step with :attr:`Against.stop_at_end`. The training thread
  waits at each snapshot for the check of the one before it (:class:`ReferenceCheck`), which was
  queued ``every`` steps earlier and is done by then unless the writer is behind; so a
  difference in the steps before snapshot s stops B at the snapshot after s, every time.
- :class:`ReferenceCheck` with ``numerics`` (the environment keys that differ between A's
  recording and this process, a hash seed aside): the runs can differ by rounding, so only the
  data (order, batch) and the streams are checked, and a note says so before training.
- Stopping: the stop snapshot is committed and the run closed as complete, at that step. A loop
  driven by ``Recorder.batches()`` ends there; a script run under the hooks
  (:mod:`bisect_repro.record.autohooks`) is unwound by :class:`StopRecording`, which its own
  ``except Exception`` does not catch.

Where the guarantees stop: the check is made on the writer's thread, so a writer behind the
training (a slow disk) delays the stop by the snapshots it holds, and makes the training wait for
it at the next snapshot. A script that catches every exception (``except BaseException``, a bare
``except``) goes on past the stop unrecorded. The comparison itself (the verdict) is
``compare``'s, run once B is closed (the command line does; a ``Recorder`` user calls
``compare``).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..errors import BisectReproError
from .reference import SnapshotDigests

__all__ = [
    "Against",
    "Matcher",
    "Mismatch",
    "Reference",
    "ReferenceCheck",
    "StopRecording",
    "stops_at",
]

_LOG_FIELDS = ("order", "batch", "loss")
_DATA_FIELDS = ("order", "batch")


def _note(message: str) -> None:
    print(f"bisect-repro: {message}", file=sys.stderr)


@dataclass(frozen=True, kw_only=True)
class Against:
    """A recording checked against a reference run (see the module docstring)."""

    run: Path | str
    """The reference run directory (A)."""
    keep_going: bool = False
    """Record the whole run; the first difference is reported at the end
    (``--against-continue``)."""
    stop_at_end: bool = False
    """Stop at the reference's last step when the run still matches it (``--stop-at-end``)."""
    on_progress: Callable[[int], None] | None = field(default=None, compare=False)
    """Called on the writer's thread with N each time the run is known to match A before step N."""
    on_note: Callable[[str], None] = field(default=_note, compare=False)
    """Where the notes go (the first difference, the reference's end): stderr by default."""


class StopRecording(BaseException):
    """Raised into a script recorded under the hooks when its run stopped at a difference: the run
    is closed, and the script unwinds (a ``BaseException``, so ``except Exception`` lets it
    through)."""


@dataclass(frozen=True)
class Mismatch:
    """The first record of B that differs from A's: the step, the field (``order``, ``batch``,
    ``loss``, ``snapshot``, ``streams``) and, for a snapshot, the first tensor or stream."""

    step: int
    field: str
    name: str | None = None

    def describe(self) -> str:
        what = {
            "order": "sample order",
            "batch": "batch",
            "loss": "loss",
            "snapshot": "state",
            "streams": "random stream",
        }[self.field]
        return f"{what} at step {self.step}" + (f" ({self.name})" if self.name else "")


class Reference(Protocol):
    """A reference run's committed records
    (:class:`~bisect_repro.record.reference.ReferenceRun`)."""

    failed: str | None

    @property
    def end(self) -> int | None: ...

    @property
    def through(self) -> int | None: ...

    def step_line(self, step: int) -> Mapping[str, Any] | None: ...

    def snapshot(self, step: int) -> SnapshotDigests | None: ...

    def refresh(self) -> None: ...


@dataclass(frozen=True)
class _Record:
    """One record of B to check: a step line, or a snapshot's digests."""

    step: int
    line: Mapping[str, Any] | None = None
    snapshot: SnapshotDigests | None = None


def _snapshot_difference(
    a: SnapshotDigests,
    b: SnapshotDigests,
    before: tuple[SnapshotDigests, SnapshotDigests] | None,
    *,
    exact: bool = True,
) -> tuple[str, str] | None:
    """The first state tensor, then the first stream, whose digest differs (as ``compare`` reads
    them: tensors over both runs' names, streams over the names both hold). A stream counts as
    ``compare``'s timeline counts it: where it was equal at the snapshot ``before`` (A's and B's)
    and differs now, or differed then and was drawn from since in either run; a stream that
    differed from the first snapshot and never moved (an unseeded stream nothing draws from)
    does not. Not ``exact``: the tensors are not compared (runs that can differ by rounding)."""
    for name in dict.fromkeys([*a.hashes, *b.hashes]) if exact else ():
        if a.hashes.get(name) != b.hashes.get(name):
            return "snapshot", name
    if before is None:
        return None
    was_a, was_b = before
    for name in sorted(set(a.streams) & set(b.streams)):
        if a.streams[name] == b.streams[name]:
            continue
        then = (was_a.streams.get(name), was_b.streams.get(name))
        if then[0] == then[1] or then != (a.streams[name], b.streams[name]):
            return "streams", name
    return None


class Matcher:
    """Which of B's records differs first from A's (see the module docstring); fed on one
    thread."""

    def __init__(self, reference: Reference, *, exact: bool = True) -> None:
        self.reference = reference
        self.exact = exact
        """Whether the weights and losses are checked bit for bit (else only the data and the
        streams: runs whose numerics settings differ, see :class:`ReferenceCheck`)."""
        self.mismatch: Mismatch | None = None
        self.matched = 0
        """B's records before this step are known to match A's."""
        self.beyond: int | None = None
        """A's last step, once B went past it still matching."""
        self.failed: str | None = None
        """Why the checking stopped early (the reference could not be read)."""
        self._waiting: list[_Record] = []
        self._before: tuple[SnapshotDigests, SnapshotDigests] | None = None

    @property
    def done(self) -> bool:
        """Nothing more is checked: a difference was found, B went past A, or A failed."""
        return self.mismatch is not None or self.beyond is not None or self.failed is not None

    def feed(
        self, step: int, lines: Sequence[Mapping[str, Any]], snapshot: SnapshotDigests
    ) -> None:
        """Check one snapshot's records of B: the step lines it commits, then the snapshot at
        ``step``."""
        if self.done:
            return
        self._waiting += [_Record(line["step"], line=line) for line in lines]
        self._waiting.append(_Record(step, snapshot=snapshot))
        self._check_waiting()

    def _check_waiting(self) -> None:
        try:
            while self._waiting and not self.done:
                ready = self._ready(self._waiting[0])
                if ready is None:
                    self.reference.refresh()
                    ready = self._ready(self._waiting[0])
                if ready is None:
                    self.failed = self.reference.failed
                    return  # A has not committed it yet: checked at a later snapshot
                self._check(self._waiting.pop(0), ready)
        except BisectReproError as error:  # A damaged after it was opened
            self.failed = str(error)
        if self.done:
            self._waiting.clear()

    def _ready(self, record: _Record) -> bool | None:
        """Whether A has the record's step (``False``: past A's end), ``None`` not yet."""
        end, through = self.reference.end, self.reference.through
        if end is not None:
            return record.step < end or (record.snapshot is not None and record.step == end)
        if through is None:
            return None
        if record.step < through or (record.snapshot is not None and record.step == through):
            return True
        return None

    def _check(self, record: _Record, ready: bool) -> None:
        if not ready:
            self.beyond = self.reference.end
            return
        if record.line is not None:
            theirs = self.reference.step_line(record.step)
            fields = _LOG_FIELDS if self.exact else _DATA_FIELDS
            for name in fields if theirs is not None else ():
                if theirs.get(name) != record.line.get(name):  # type: ignore[union-attr]
                    self.mismatch = Mismatch(record.step, name)
                    return
            self.matched = max(self.matched, record.step + 1)
            return
        assert record.snapshot is not None
        theirs_snapshot = self.reference.snapshot(record.step)
        if theirs_snapshot is None:
            return
        found = _snapshot_difference(
            theirs_snapshot, record.snapshot, self._before, exact=self.exact
        )
        self._before = (theirs_snapshot, record.snapshot)
        if found is not None:
            self.mismatch = Mismatch(record.step, *found)
            return
        self.matched = max(self.matched, record.step)


def stops_at(
    step: int, due: bool, mismatch: Mismatch | None, end: int | None, against: Against
) -> bool:
    """Whether B stops at ``step`` (after its snapshot there): at a snapshot ``due`` once a
    difference is known, unless it keeps going; at A's last step ``end`` with ``stop_at_end``."""
    if mismatch is not None and not against.keep_going:
        return due
    return against.stop_at_end and mismatch is None and end is not None and step >= end


class ReferenceCheck:
    """The checking of one recording: the :class:`Matcher` on the writer's thread, the stop
    decision on the training thread, and the wait between them (see the module docstring)."""

    def __init__(
        self,
        against: Against,
        reference: Reference,
        numerics: Mapping[str, Sequence[Any]] | None = None,
    ) -> None:
        self.against = against
        self.matcher = Matcher(reference, exact=not numerics)
        if numerics:
            shown = ", ".join(
                f"{key}: {a!r} vs {b!r}" for key, (a, b) in list(numerics.items())[:3]
            )
            against.on_note(
                f"{against.run} was recorded under other numerics settings ({shown}): its "
                "weights and losses may differ by rounding, so the check compares the data and "
                "the random streams exactly, not them; `bisect-repro compare` measures the "
                "rounding"
            )
        self.end = reference.end
        """A's last step, as last read (``None`` while A is being written)."""
        self._condition = threading.Condition()
        self._checked: int | None = None
        self._noted = False

    # -- the writer's thread -------------------------------------------------------------------
    def check(self, step: int, lines: list[dict[str, Any]], tree: Mapping[str, Any]) -> None:
        """Check one snapshot's records (its step lines, its tree), then let the training thread
        waiting for it go on."""
        try:
            matcher = self.matcher
            if not matcher.done:
                matcher.feed(step, lines, SnapshotDigests.of(tree))
                self.end = matcher.reference.end
                self._report()
        finally:
            with self._condition:
                self._checked = step
                self._condition.notify_all()

    def _report(self) -> None:
        matcher, against, a = self.matcher, self.against, self.against.run
        if against.on_progress is not None and not matcher.done:
            against.on_progress(matcher.matched)
        if self._noted or not matcher.done:
            return
        self._noted = True
        if matcher.mismatch is not None:
            then = (
                "recording goes on to the end"
                if against.keep_going
                else "the run stops at its next snapshot"
            )
            against.on_note(f"differs from {a} first in the {matcher.mismatch.describe()}; {then}")
        elif matcher.beyond is not None:
            then = "the run stops there" if against.stop_at_end else "recording goes on"
            against.on_note(f"matches {a} to its last step, {matcher.beyond}; {then}")
        elif matcher.failed is not None:
            against.on_note(f"stopped checking against {a} ({matcher.failed}); recording goes on")

    # -- the training thread -------------------------------------------------------------------
    def wait(self, step: int | None, failed: Callable[[], bool]) -> None:
        """Wait until the snapshot at ``step`` was checked (or the writer ``failed``)."""
        if step is None:
            return
        with self._condition:
            while (self._checked is None or self._checked < step) and not failed():
                self._condition.wait(0.05)

    def stops_at(self, step: int, due: bool) -> bool:
        """Whether the run stops at ``step``, after its snapshot there (:func:`stops_at`)."""
        return stops_at(step, due, self.matcher.mismatch, self.end, self.against)
