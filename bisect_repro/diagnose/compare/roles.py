"""Each rank's first mismatch sorted into origin or receiver, from the records of every rank.

A collective (DDP's gradient all-reduce, FSDP's reduce-scatter) carries one rank's difference to
the others within the step it runs in, so every rank of a data-parallel group differs from that
step's snapshot on. What tells them apart is what differed first on the rank itself:

| the rank's first mismatch                                   | role       |
|-------------------------------------------------------------|------------|
| at the earliest step over all ranks, in its own step log or seeding calls | origin |
| at the earliest step, and no rank's own log differs there  | origin     |
| at the earliest step, only its state, another rank's log differs there | receiver |
| at a later step                                             | receiver   |

Where the guarantees stop: roles are inferred from records only, at the resolution of the
snapshots (``--every``); two ranks that part on their own at different steps are told apart only
when the later one's difference comes before the collectives reach it, which the records cannot
show: it reads as a receiver.

:func:`through_collectives` gives a receiver (or a rank whose records explain nothing) the cause of
the rank that parted first, inferred to have reached it through the collectives.
"""

from __future__ import annotations

from dataclasses import replace

from .causes import Cause
from .causes.registry import cause_title
from .records import Records
from .verdict import Verdict

__all__ = ["ORIGIN", "RECEIVER", "roles", "through_collectives"]

ORIGIN = "origin"
RECEIVER = "receiver"


def _own(records: Records, step: int) -> bool:
    """Whether the rank's own step log or seeding calls differ at ``step`` (not only a snapshot
    after it)."""
    return step in records.logs.values() or bool(records.reseeds(step, step))


def roles(ranks: list[tuple[Records, Verdict | None]]) -> dict[int, str]:
    """Each parted rank's role, by rank (see the module docstring's table); ranks that agree have
    none."""
    parted = [(records, verdict) for records, verdict in ranks if verdict is not None]
    if not parted:
        return {}
    first = min(verdict.step for _, verdict in parted)
    own = {
        records.a.rank
        for records, verdict in parted
        if verdict.step == first and _own(records, first)
    }
    found = {}
    for records, verdict in parted:
        rank = records.a.rank
        at_first = verdict.step == first
        found[rank] = ORIGIN if at_first and (rank in own or not own) else RECEIVER
    return found


def through_collectives(
    verdict: Verdict | None, first: Verdict, *, receiver: bool = False
) -> Verdict | None:
    """A rank's verdict when its own records explain nothing, or it is a ``receiver`` (its state
    differed only after another rank's log did), and the ``first`` rank's records name a cause at
    or before its step: that cause, inferred to have reached this rank through the collectives
    (DDP's all-reduce carries one rank's difference to every rank in the same step)."""
    own = verdict is not None and verdict.cause is not Cause.UNKNOWN and not receiver
    if verdict is None or own or first.cause is Cause.UNKNOWN or verdict.rank == first.rank:
        return verdict
    if first.step > verdict.step:
        return verdict
    return replace(
        verdict,
        cause=first.cause,
        rng=list(first.rng),
        config_keys=list(first.config_keys),
        environment_keys=list(first.environment_keys),
        explanation=(
            f"{verdict.explanation}; rank {first.rank} parted first, at step {first.step} "
            f"({cause_title(first.cause)}), "
            "and the collectives carry a rank's difference to the others, so this rank is "
            "inferred to follow it"
        ),
        fix=first.fix,
    )
