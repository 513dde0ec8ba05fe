"""What one cause is, as one object (:class:`CauseEntry`), and the types its parts take and give.

An entry carries everything ``compare`` knows about its cause: the value (``verdict.cause``), the
title a report names it by, what it means, the precondition a verdict naming it must satisfy on
the records' :class:`~bisect_repro.diagnose.compare.signals.Signals` (in words and as a
predicate), the signals by which the records alone name it (each a :class:`RecordsSignal` with
its rank in the precedence and its finder), the experiment that proves it and what is said
without that experiment, its fix in words (the docs' tables), the functions that word its fix and
its explanation for one verdict (from that verdict's :class:`Particulars`), and the few switches
by which the replay treats it.

A finder reads two runs' :class:`~bisect_repro.diagnose.compare.records.Records` and the
:class:`Window` of the divergence and gives a :class:`Finding` (the cause it names, where, in
what words) or ``None`` when its signal is absent.

Where the guarantees stop: an entry is data; nothing here checks that its predicate, finders and
words agree with one another (the tests of each cause do).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ....capture.seeding import SeedingCall
from ..differences import Differences
from .cause import Cause

if TYPE_CHECKING:
    from ..records import Records
    from ..signals import Signals
    from ..verdict import Verdict

__all__ = [
    "CauseEntry",
    "Finder",
    "Finding",
    "Particulars",
    "RecordsSignal",
    "Window",
    "calls_described",
]


@dataclass(frozen=True)
class Window:
    """What the records show between the last equal snapshot and the divergence."""

    end: int
    """The last step that can hold the divergence (``-1``: initialisation)."""
    changed: list[str]
    """Streams equal at the last equal snapshot and different at the first divergent one."""
    all_along: list[str]
    """Streams that already differed at the last equal snapshot and were drawn from since."""
    reseeds: list[tuple[int, dict[str, Any]]]
    """The seeding calls from entropy the step logs show in the window, by step."""


@dataclass(frozen=True, kw_only=True)
class Finding:
    """A cause the records name, where, and in what words."""

    cause: Cause
    what: str
    """What the records show, in words (the verdict's explanation after "from the records
    alone")."""
    step: int | None = None
    phase: str | None = None
    tensor: str | None = None
    rng: list[str] = field(default_factory=list)
    reseeded: list[SeedingCall] = field(default_factory=list)
    config_keys: list[str] = field(default_factory=list)
    environment_keys: list[str] = field(default_factory=list)
    fix: str | None = None
    """The fix, where the finder words its own (else the cause's)."""


Finder = Callable[["Records", Window], "Finding | None"]


def calls_described(reseeds: Sequence[tuple[int, Mapping[str, Any]]]) -> str:
    """The seeding calls of step log lines, each once: ``torch.seed() at vae.py:88; ...``."""
    return "; ".join(dict.fromkeys(SeedingCall.from_json(call).describe() for _, call in reseeds))


@dataclass(frozen=True, kw_only=True)
class RecordsSignal:
    """One signal by which the records alone name a cause."""

    name: str
    rank: int
    """Its place in the precedence: the records' verdict names the finding of the signal of
    lowest rank that is present."""
    when: str
    """When it is present, in words."""
    find: Finder


@dataclass(frozen=True, kw_only=True)
class Particulars:
    """What one verdict names, from which its cause words the fix and the explanation."""

    where: str = ""
    """Where the difference shows (step, pass, tensor, op), for the explanation."""
    streams: Sequence[str] = ()
    reseeds: Sequence[SeedingCall] = ()
    """Seeding calls from entropy, with their call sites."""
    reseeded: bool = False
    """The streams ended the step in another state each time it ran from the same state (else
    ``reseeds`` are calls the step logs show before the step)."""
    between: int | None = None
    """The step whose data was drawn from a stream reseeded since the step before it ended."""
    resumed: bool = False
    unrestored: Sequence[str] = ()
    """The parts of the training state a resume did not restore (optimizers, the recipe's)."""
    loader: Mapping[str, Any] = field(default_factory=dict)
    """The loader's settings (``num_workers``, ...)."""
    op: str | None = None
    config_keys: Sequence[str] = ()
    config: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    """The config values to show, ``{key: [a, b]}``."""
    environment_keys: Sequence[str] = ()
    differences: Differences = field(default_factory=Differences)
    data_by: str | None = None
    """What run B fetched run A's batch under (proven), for a difference in the data."""
    proven: bool = True
    """An experiment made the difference vanish: only then does a sentence say one did."""


@dataclass(frozen=True, kw_only=True)
class CauseEntry:
    """Everything about one cause (see the module docstring)."""

    cause: Cause
    title: str
    """How a report names it."""
    meaning: str
    """What it means, in one sentence (Markdown: the docs' tables show it)."""
    requires: str
    """The precondition on the records, in words (shown when a verdict fails it)."""
    holds: Callable[[Signals, Verdict], bool]
    """Whether the precondition holds for a verdict naming this cause."""
    proof: str
    """The experiment that proves it."""
    unproven: str
    """What the verdict says when that experiment cannot run."""
    remedy: str
    """Its fix in words (Markdown: the docs' tables show it)."""
    fix: Callable[[Particulars], str]
    """The fix for one verdict."""
    explain: Callable[[Particulars], str]
    """What a replayed verdict naming it means where the difference shows."""
    signals: tuple[RecordsSignal, ...] = ()
    """How the records alone name it (none: only a replay can)."""
    parts_from_records: bool = False
    """A faithful replay may still not reproduce its own records at the divergent step under this
    cause."""
    shown_by_parting: bool = False
    """The replay parting from its records is this cause's proof: it stands where the replay parted
    before the divergent step, and the records never relocate it."""
    compiler_may_explain: bool = False
    """Where one run compiled and the other did not, the compiler bisection runs on a step
    with this verdict (a step that differs for a random stream, the data, hidden state or a
    nondeterministic op would differ in every trial for that reason)."""
