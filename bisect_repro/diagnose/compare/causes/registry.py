"""The registry: one :class:`~bisect_repro.diagnose.compare.causes.entry.CauseEntry` per cause, and
every table of causes derived from it.

:data:`REGISTRY` maps each :class:`~bisect_repro.diagnose.compare.causes.cause.Cause` to its entry
(the module of the cause, in this package, holds it). From it come the precondition table the rules
check (``RULES``), the precedence in which the records alone name a cause (:data:`PRECEDENCE`,
each cause's signals ordered by their rank), the fix and explanation dispatch (:func:`fix_for`,
:func:`explanation_for`), the title a report prints (:func:`cause_title`), whether the compiler
bisection runs on a verdict, and the docs' tables of causes
(:mod:`~bisect_repro.diagnose.compare.causes.tables`).

The registry is checked as it is built: each cause has exactly one entry, and no two signals share
a name or a rank (:class:`RuntimeError` at import otherwise).

Where the guarantees stop: the order of :data:`ENTRIES` is the order of the docs' tables, not a
precedence; only the signals' ranks order the records' verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from . import (
    code,
    config,
    data_content,
    data_order,
    environment,
    hidden_state,
    nondeterministic_op,
    resume,
    rng_state,
    structure,
    unknown,
)
from .cause import Cause
from .entry import CauseEntry, Particulars, RecordsSignal

__all__ = [
    "ENTRIES",
    "PRECEDENCE",
    "REGISTRY",
    "cause_title",
    "entry_of",
    "explanation_for",
    "fix_for",
]

ENTRIES: tuple[CauseEntry, ...] = (
    structure.ENTRY,
    data_order.ENTRY,
    data_content.ENTRY,
    code.ENTRY,
    resume.ENTRY,
    config.ENTRY,
    rng_state.ENTRY,
    environment.ENTRY,
    nondeterministic_op.ENTRY,
    hidden_state.ENTRY,
    unknown.ENTRY,
)
"""Every cause's entry, in the order the docs' tables list them."""


def _checked(entries: tuple[CauseEntry, ...]) -> Mapping[Cause, CauseEntry]:
    """The entries by cause, once each is known to be the only one of its cause and every signal's
    name and rank its own."""
    by_cause = {entry.cause: entry for entry in entries}
    missing = [c.value for c in Cause if c not in by_cause]
    if missing or len(by_cause) != len(entries):
        raise RuntimeError(f"the cause registry needs one entry per cause: {missing or entries}")
    signals = [s for entry in entries for s in entry.signals]
    for what in ("name", "rank"):
        seen = [getattr(s, what) for s in signals]
        if len(set(seen)) != len(seen):
            raise RuntimeError(f"two signals of the cause registry share a {what}: {seen}")
    return MappingProxyType(by_cause)


REGISTRY: Mapping[Cause, CauseEntry] = _checked(ENTRIES)

PRECEDENCE: tuple[tuple[RecordsSignal, Cause], ...] = tuple(
    sorted(
        ((signal, entry.cause) for entry in ENTRIES for signal in entry.signals),
        key=lambda item: item[0].rank,
    )
)
"""How the records alone name a cause: each signal with the cause it belongs to, by rank; the
first signal present wins."""


def entry_of(cause: Cause | str) -> CauseEntry:
    """The entry of a cause (given by member or by value)."""
    return REGISTRY[Cause(cause)]


def cause_title(cause: Cause | str) -> str:
    """How a report names a cause (``rng_state``: a random stream not seeded alike); a value no
    entry knows is shown as it is."""
    try:
        return entry_of(cause).title
    except ValueError:
        return str(cause)


def fix_for(cause: Cause, particulars: Particulars) -> str:
    """The fix for a verdict naming ``cause``, given what it names."""
    return REGISTRY[cause].fix(particulars)


def explanation_for(cause: Cause, particulars: Particulars) -> str:
    """What a verdict naming ``cause`` means where its difference shows."""
    return REGISTRY[cause].explain(particulars)
