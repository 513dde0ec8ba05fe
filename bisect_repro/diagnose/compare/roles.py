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
"""

from __future__ import annotations

from .records import Records
from .verdict import Verdict

__all__ = ["ORIGIN", "RECEIVER", "roles"]

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
