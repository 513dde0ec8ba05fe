"""Origin or receiver: each rank's first mismatch sorted by what differed on the rank itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from bisect_repro.diagnose.compare.records import Records
from bisect_repro.diagnose.compare.roles import ORIGIN, RECEIVER, roles
from bisect_repro.diagnose.compare.verdict import Verdict


@dataclass
class _Rank:
    rank: int


@dataclass
class _Records:
    """What :func:`roles` reads of a rank's records: its rank, its logs' first differences, its
    reseeds."""

    a: _Rank
    logs: dict[str, int | None] = field(default_factory=dict)
    reseeded: list[int] = field(default_factory=list)

    def reseeds(self, start: int, end: int) -> list[tuple[int, dict[str, Any]]]:
        return [(step, {}) for step in self.reseeded if start <= step <= end]


def _parted(
    rank: int, step: int | None, *, log: int | None = None, reseed: int | None = None
) -> tuple[Records, Verdict | None]:
    records = _Records(
        _Rank(rank),
        logs={"loss": log} if log is not None else {},
        reseeded=[reseed] if reseed is not None else [],
    )
    return cast(Records, records), (Verdict(step=step) if step is not None else None)


@pytest.mark.parametrize(
    ("ranks", "expected"),
    [
        ([_parted(0, 7), _parted(1, 7, reseed=7)], {0: RECEIVER, 1: ORIGIN}),
        ([_parted(0, 7, log=7), _parted(1, 7), _parted(2, None)], {0: ORIGIN, 1: RECEIVER}),
        ([_parted(0, 5), _parted(1, 5)], {0: ORIGIN, 1: ORIGIN}),
        ([_parted(0, 9, log=9), _parted(1, 4, log=4)], {0: RECEIVER, 1: ORIGIN}),
        ([_parted(0, None), _parted(1, None)], {}),
    ],
)
def test_a_ranks_role_follows_what_differed_on_it_first(
    ranks: list[tuple[Records, Verdict | None]], expected: dict[int, str]
) -> None:
    assert roles(ranks) == expected
