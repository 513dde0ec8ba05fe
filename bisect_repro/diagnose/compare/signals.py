"""What the records show exactly, as typed values: the signals a cause's precondition reads.

:class:`Signals` are read from two runs' records (:meth:`Signals.of_records`) or from a finished
comparison, its JSON read back included (:meth:`Signals.of_result`): the first step whose sample
order differs, the first whose batch differs, the config values, command-line arguments and
optimizer settings that differ, the environment keys, the code files whose SHA-256 differs, the
random streams that differ and were drawn from, and the steps whose logs show a reseed from
entropy. Each is read from a typed field (the differences bundle, the timeline, the logs), never
from the words of a sentence. What only a replay can show (a run that differs from itself, a
stream swap that made the difference vanish) is read from the verdict's evidence, by each item's
experiment, outcome and run (:func:`shown_by`).

Where the guarantees stop: signals read from a finished comparison cannot tell whether sample
indices were recorded; they are taken to be.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .causes import Cause
from .differences import Differences
from .resume import Resume
from .verdict import CompareResult, Outcome, TimelineRow, Verdict

if TYPE_CHECKING:
    from .records import Records

__all__ = ["Signals", "at_or_before", "shown_by"]


@dataclass(frozen=True, kw_only=True)
class Signals:
    """What the records show exactly (see the module docstring)."""

    order: int | None = None
    """The first step whose sample indices differ."""
    batch: int | None = None
    """The first step whose batch (its tensors' hashes) differs."""
    order_recorded: bool = True
    """Whether the sample indices were recorded at the step where the batch first differs."""
    config: tuple[str, ...] = ()
    """Config keys, command-line arguments and optimizer settings whose values differ."""
    environment: tuple[str, ...] = ()
    code: tuple[str, ...] = ()
    """The code files (by name) whose SHA-256 differs."""
    streams: tuple[str, ...] = ()
    """Random streams that differ at a snapshot and were drawn from."""
    reseeded: tuple[int, ...] = ()
    """Steps whose logs show a stream reseeded from entropy."""
    at_start: tuple[int, tuple[str, ...]] | None = None
    """The first snapshot, where the runs already differ, with the streams that differ there (drawn
    from or not: what the build drew before it is not in the records)."""
    structure: str | None = None
    unrestored: tuple[str, ...] = ()
    """The parts of the training state a resume did not restore (the resume audit's)."""
    resumed: int | None = None
    """The step where one run resumed from the other's state."""

    @classmethod
    def of_records(cls, records: Records) -> Signals:
        logs = records.logs
        batch = logs.get("batch")
        recorded = batch is None or records.a.steps.get(batch, {}).get("order") is not None
        unused = set(records.unused_streams())
        return cls(
            order=logs.get("order"),
            batch=batch,
            order_recorded=recorded,
            **_setup(records.differences),
            streams=_drawn(records.timeline, unused),
            reseeded=tuple(records.reseeded_steps()),
            at_start=_at_start(records.timeline, records.last_equal),
            structure=records.structure,
            unrestored=_unrestored(records.resume),
            resumed=records.resume.step if records.resume is not None else None,
        )

    @classmethod
    def of_result(cls, result: CompareResult) -> Signals:
        logs, verdict = result.first_log_difference, result.verdict
        reseeded = list(result.reseeded_steps)
        # the calls a replay saw, or the step logs show, up to the step
        if verdict is not None and verdict.reseeded:
            reseeded.append(verdict.step)
        return cls(
            order=logs.get("order"),
            batch=logs.get("batch"),
            order_recorded=True,  # a finished comparison does not say; taken as recorded
            **_setup(result.differences),
            streams=_drawn(result.timeline, set(result.unused_streams)),
            reseeded=tuple(sorted(set(reseeded))),
            at_start=_at_start(result.timeline, result.snapshots.get("last_equal")),
            structure=verdict.tensor
            if verdict is not None and verdict.cause is Cause.STRUCTURE
            else None,
            unrestored=_unrestored(result.resume),
            resumed=result.resume.step if result.resume is not None else None,
        )

    def described(self) -> str:
        """The data and settings signals in words (what a broken rule is told against)."""
        order = (
            f"sample order differs from step {self.order}"
            if self.order is not None
            else "sample order equal"
        )
        batch = f"batch differs from step {self.batch}" if self.batch is not None else "batch equal"
        config = (
            f"settings differ: {', '.join(self.config)}" if self.config else "no setting differs"
        )
        return f"{order}, {batch}, {config}"


def _setup(differences: Differences) -> dict[str, tuple[str, ...]]:
    """The signals of the differences bundle: config (with the optimizer settings), environment,
    code."""
    settings = ("optimizer settings",) if differences.settings is not None else ()
    return {
        "config": (*differences.config, *settings),
        "environment": tuple(differences.environment),
        "code": tuple(c.name for c in differences.code),
    }


def _unrestored(resume: Resume | None) -> tuple[str, ...]:
    """The parts of the training state a resume did not restore."""
    return tuple(resume.state_missing) if resume is not None else ()


def _drawn(timeline: list[TimelineRow], unused: set[str]) -> tuple[str, ...]:
    """The streams that differ at some snapshot, less those nothing drew from."""
    return tuple(dict.fromkeys(s for row in timeline for s in row.streams if s not in unused))


def _at_start(
    timeline: list[TimelineRow], last_equal: int | None
) -> tuple[int, tuple[str, ...]] | None:
    """The first snapshot and its differing streams, where the runs differ from their first snapshot
    on."""
    if last_equal is not None or not timeline or timeline[0].equal:
        return None
    return timeline[0].step, tuple(timeline[0].streams)


def shown_by(
    verdict: Verdict, experiments: tuple[str, ...], outcome: Outcome, *, one_run: bool = False
) -> bool:
    """Whether one of ``experiments`` (its kind, narrowed to a name or not) showed ``outcome`` in
    the verdict's evidence (``one_run``: on one run on its own, not on both)."""
    return any(
        e.experiment in experiments and e.outcome is outcome and (not one_run or e.run is not None)
        for e in verdict.evidence
    )


def at_or_before(step: int | None, verdict: Verdict) -> bool:
    """Whether ``step`` is the verdict's step or an earlier one."""
    return step is not None and step <= verdict.step
