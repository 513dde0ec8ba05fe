"""Which cause a verdict may name, checked: each cause's precondition on the records' signals, the
replay's verdict reconciled with the records, and the precedence of causes.

The preconditions are the cause registry's (:mod:`bisect_repro.diagnose.compare.causes`; ``RULES``
is the registry itself): a verdict names a cause only where the records' exact signals
(:class:`~bisect_repro.diagnose.compare.signals.Signals`) allow it. :func:`violation` checks a
verdict against its cause's rule and says, in one sentence, what the records show instead.
``compare`` checks every verdict, from the records or from a replay, before reporting it: a
replayed verdict that fails its rule, or that places the divergence after data the records show
differing (the sample order of its step, the batch of an earlier one) and outside the data, is
replaced by the records' verdict, with a note (:func:`reconcile`).

:data:`PRECEDENCE` is the order in which the records alone name a cause (the first signal present
wins), derived from the signals' ranks in the registry;
:mod:`bisect_repro.diagnose.compare.from_records` reads it.

Where the guarantees stop: a precondition is necessary, not sufficient: a cause that satisfies it
may still not be the reason the runs part (that is what the experiments are for).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from .causes import Cause
from .causes.entry import CauseEntry
from .causes.registry import PRECEDENCE, REGISTRY, cause_title
from .signals import Signals
from .verdict import Confidence, Verdict

__all__ = [
    "PRECEDENCE",
    "RULES",
    "arguments_not_named_for_data",
    "about_the_replayed_runs",
    "enforce",
    "expected_to_part",
    "reconcile",
    "violation",
]

RULES: Mapping[Cause, CauseEntry] = REGISTRY
"""Each cause's rule: its entry's ``requires`` and ``holds``."""


PARALLELISM = re.compile(
    r"(?:^|[-_.])(?:num[-_.]?)?(?:workers?|threads?|jobs|procs|processes|cpus)$|^-?j$",
    re.IGNORECASE,
)
"""An argument whose name says it sets how many workers, threads or processes do the work: a
setting for speed, which the data a script draws is expected not to depend on."""


def arguments_not_named_for_data(
    keys: Sequence[str], reseeded: bool, order_recorded: bool = True
) -> str | None:
    """Why a script's differing arguments are not put to the test for a batch that differs
    (``None``: they are: run B relaunched with run A's arguments, the step then matching, names
    ``config`` in the data). A reseed from entropy at or before the step is the streams' cause
    (``rng_state``); a batch that changes with a worker count alone, where the loader's sample
    indices were recorded, is drawn in workers seeded per worker, the data's own cause
    (``data_content``). Without indices (an ``IterableDataset`` whose workers shard the stream)
    the data's cause cannot be named, and the relaunch is what tells whether the worker count
    decides the batch."""
    if not keys:
        return "no argument differs"
    if reseeded:
        return "a stream was reseeded from entropy at or before the step"
    if order_recorded and all(PARALLELISM.search(key.lstrip("-")) for key in keys):
        return (
            f"only the parallelism differs ({', '.join(keys)}): a batch that changes with the "
            "number of workers is drawn in "
            "workers seeded per worker, so the data is named, not the argument"
        )
    return None


def violation(verdict: Verdict, signals: Signals) -> str | None:
    """What is wrong with naming ``verdict.cause`` on these signals (``None``: its precondition
    holds)."""
    rule = RULES[verdict.cause]
    if rule.holds(signals, verdict):
        return None
    return (
        f"{verdict.cause.value} requires that {rule.requires}, and the records do not show it "
        f"({signals.described()})"
    )


def reconcile(replayed: Verdict, signals: Signals, named: Verdict) -> tuple[Verdict, list[str]]:
    """The verdict to report from a replay's, checked against the records: the replay's where it
    satisfies its cause's rule and agrees with the data the records show; otherwise the records'
    verdict (``named``), at the replay's finer location where the step is the same, with a
    note."""
    problem = violation(replayed, signals)
    # the initial state comes before the first step's data: no data is drawn before it
    data = None if replayed.phase == "init" else _data_before(signals, replayed)
    if problem is None and (data is None or replayed.phase == "data"):
        return replayed, []
    if problem is None:
        problem = (
            f"the records show the batch of step {data} already differs, which the replay "
            f"placed in the {replayed.phase or 'step'}"
        )
    elif named.step == replayed.step and named.phase != "data":
        named = replace(
            named,
            phase=replayed.phase,
            layer=replayed.layer,
            tensor=replayed.tensor,
            op=replayed.op,
        )
    if violation(named, signals) is not None:
        named = replace(named, cause=Cause.UNKNOWN, confidence=Confidence.UNEXPLAINED)
    named = replace(named, rank=replayed.rank, evidence=[*replayed.evidence, *named.evidence])
    note = (
        f"the replay named {cause_title(replayed.cause)} ({replayed.confidence.value}), but "
        f"{problem}; "
        f"the verdict is the records' ({named.cause.value}, {named.confidence.value})"
    )
    return named, [note]


def _data_before(signals: Signals, verdict: Verdict) -> int | None:
    """The step whose data the records show differing before the verdict's place in its step: the
    sample order of that step or an earlier one (a step's order is drawn before its first forward
    pass), or the batch of an earlier step (a step's later micro-batches may be drawn after its
    first forward)."""
    if signals.order is not None and signals.order <= verdict.step:
        return signals.order
    if signals.batch is not None and signals.batch < verdict.step:
        return signals.batch
    return None


def about_the_replayed_runs(verdict: Verdict) -> Verdict | None:
    """A verdict about a replay that parted from its records before the divergent step: proven
    becomes inferred (the verdict is about the replayed runs); ``None`` where the parting is the
    cause's own proof, and the verdict stands as it is."""
    if RULES[verdict.cause].shown_by_parting:
        return None
    if verdict.confidence is Confidence.PROVEN:
        return replace(verdict, confidence=Confidence.INFERRED)
    return verdict


def enforce(verdict: Verdict, signals: Signals) -> tuple[Verdict, list[str]]:
    """A verdict from the records, checked: where it fails its rule, ``unknown`` with a note."""
    problem = violation(verdict, signals)
    if problem is None:
        return verdict, []
    note = (
        f"the records alone pointed to {cause_title(verdict.cause)}, but {problem}; no cause is "
        "named"
    )
    return replace(verdict, cause=Cause.UNKNOWN, confidence=Confidence.UNEXPLAINED), [note]


def expected_to_part(verdict: Verdict | None, *, unrecorded_data: bool = False) -> bool:
    """Whether a replay may part from its own records at the divergent step under this verdict's
    cause (a reseed from entropy, a nondeterministic op, data drawn from no recorded stream)."""
    if verdict is None:
        return False
    return unrecorded_data or bool(verdict.reseeded) or RULES[verdict.cause].parts_from_records
