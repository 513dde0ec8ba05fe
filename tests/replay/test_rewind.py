"""Whether a rewound step reproduces its first run and the records, and which repeats a verified
rewind serves: the decisions of :mod:`bisect_repro.replay.rewind`, on fakes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest

from bisect_repro.capture.trace import TraceEntry
from bisect_repro.replay.rewind import Rewinds, unfaithful
from bisect_repro.serve.protocol import StepResult
from bisect_repro.store.run import Run


@dataclass
class _Records:
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    hashes: dict[int, dict[str, str]] = field(default_factory=dict)

    @property
    def snapshots(self) -> list[int]:
        return sorted(self.hashes)

    def snapshot(self, step: int) -> dict[str, Any]:
        return {"hashes": self.hashes[step]}


FIRST = StepResult(
    step=5,
    entries=[
        TraceEntry("forward", "0", "0.output", "d1"),
        TraceEntry("backward", "0", "0.weight.grad", "d2"),
    ],
    loss=0.5,
    outcome="after",
    streams_after={"torch": "t1"},
    batch="b",
)
RECORDS = _Records(steps={5: {"batch": "b", "loss": 0.5}}, hashes={6: {"0.weight": "w"}})


def _why(
    again: StepResult, records: _Records = RECORDS, hashes: dict[str, str] | None = None
) -> str | None:
    return unfaithful(
        FIRST, again, cast(Run, records), 5, {"0.weight": "w"} if hashes is None else hashes
    )


def test_a_rewind_that_reproduces_the_first_run_and_the_records_is_faithful() -> None:
    assert _why(replace(FIRST)) is None


@pytest.mark.parametrize(
    ("again", "says"),
    [
        (replace(FIRST, entries=FIRST.entries[:1]), "traced other tensors"),
        (
            replace(
                FIRST,
                entries=[FIRST.entries[0], TraceEntry("backward", "0", "0.weight.grad", "other")],
            ),
            "traced other tensors",
        ),
        (replace(FIRST, outcome="elsewhere"), "ended in another state"),
        (replace(FIRST, streams_after={"torch": "t2"}), "ended in another state"),
        (replace(FIRST, batch="another"), "did not reproduce the recorded batch"),
        (replace(FIRST, loss=0.25), "did not reproduce the recorded loss"),
    ],
)
def test_a_rewind_that_differs_from_the_first_run_or_the_records_is_not_faithful(
    again: StepResult, says: str
) -> None:
    why = _why(again)
    assert why is not None and says in why and "a local counter" in why


def test_the_snapshot_after_the_step_and_a_log_without_the_loss_are_checked_as_far_as_they_go() -> (
    None
):
    assert "recorded state after it" in (_why(replace(FIRST), hashes={"0.weight": "moved"}) or "")
    unlogged = _Records(steps={5: {"batch": "b"}}, hashes={})
    assert _why(replace(FIRST), unlogged, hashes={}) is None
    assert "another batch, or to another loss" in (
        _why(replace(FIRST, loss=0.25), unlogged, hashes={}) or ""
    )


@pytest.mark.parametrize(
    ("step", "plain", "compiles", "consumes", "serves"),
    [
        (5, True, False, False, True),
        (5, True, False, True, True),
        # other streams, but the data draws moved none: the kept batch is the one drawn
        (5, False, False, False, True),
        # a fresh process would draw the data under the other streams
        (5, False, False, True, False),
        (5, True, True, False, False),  # a compiler trial compiles afresh
        (4, True, False, False, False),  # not the verified step
    ],
)
def test_which_repeats_a_verified_rewind_serves(
    step: int, plain: bool, compiles: bool, consumes: bool, serves: bool
) -> None:
    assert Rewinds(step=5, consumes=consumes).serves(step, plain=plain, compiles=compiles) is serves
    assert not Rewinds().serves(step, plain=plain, compiles=compiles)
