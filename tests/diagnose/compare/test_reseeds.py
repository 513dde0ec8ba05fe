"""The reseed_kept experiment: which runs are replayed with their reseeds leaving the streams as
they are (those whose step logs show reseeds at the step), and what a match or a difference says."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, cast

from bisect_repro.capture.seeding import SeedingCall
from bisect_repro.capture.trace import TraceEntry
from bisect_repro.diagnose.compare.causes import Cause
from bisect_repro.diagnose.compare.draft import Draft
from bisect_repro.diagnose.compare.reseeds import prove_kept
from bisect_repro.diagnose.compare.verdict import Confidence
from bisect_repro.replay.rewind import Rewinds
from bisect_repro.serve.protocol import StepResult
from tests.fakes import write_run

CALL = {
    "stream": "torch",
    "call": "torch.seed()",
    "entropy": True,
    "where": "train.py:9",
    "value": 5,
}


def _run(path: Path, reseeds: bool) -> Any:
    lines = [{"step": s, "loss": 1.0, "order": None, "batch": f"b{s}"} for s in range(4)]
    if reseeds:
        lines[2]["seeded"] = [CALL]
    return write_run(
        path, lines, {0: {"hashes": {"fc.weight": "w"}}, 4: {"hashes": {"fc.weight": "w"}}}
    )


def _trace(mask: str) -> StepResult:
    return StepResult(step=2, entries=[TraceEntry("forward", "2", "2.output", mask)])


class _Fresh:
    """A fresh replica that computes ``mask`` at the step, and notes what it was asked."""

    def __init__(self, mask: str, asked: list[Any]) -> None:
        self.mask, self.asked, self.step = mask, asked, None

    def __enter__(self) -> _Fresh:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def connect(self) -> None:
        pass

    def restore(
        self, run: Path, step: int, environment: Any = None, *, kept_from: int | None = None
    ) -> None:
        self.asked.append(("restore", step, kept_from))

    def skip(self, until: int) -> None:
        self.asked.append(("skip", until))

    def fetch(self) -> None:
        pass

    def run(self, step: int, trace: str) -> StepResult:
        return _trace(self.mask)


def _prove(
    tmp_path: Path, reseeds: tuple[bool, bool], kept_mask: str
) -> tuple[Draft, Any, list[Any]]:
    runs = (_run(tmp_path / "a", reseeds[0]), _run(tmp_path / "b", reseeds[1]))
    asked: list[Any] = []
    verdict = Draft(step=2, phase="forward", layer="2", tensor="2.output")
    found = prove_kept(
        verdict,
        runs,
        ("spec a", "spec b"),
        (0, 0),
        (_trace("a"), _trace("b")),
        lambda spec, label: _Fresh(kept_mask, asked),
    )
    return verdict, found, asked


def test_the_run_that_reseeds_computes_the_others_step_with_its_reseed_kept_proven(
    tmp_path: Path,
) -> None:
    verdict, found, asked = _prove(tmp_path, (False, True), "a")
    # replayed from its checkpoint, kept from the step on
    assert asked == [("restore", 0, 2), ("skip", 2)]
    assert (found.experiment, found.outcome.value) == (
        "reseed_kept",
        "matches",
    ) and found.subject.startswith("run B with torch.seed()")
    assert (verdict.cause, verdict.confidence, verdict.rng) == (
        Cause.RNG_STATE,
        Confidence.PROVEN,
        ["torch"],
    )
    assert verdict.reseeded == [SeedingCall.from_json(CALL)]
    # the JSON form: the call less its value
    made = verdict.verdict(explanation="", fix="", evidence=[found])
    assert made.to_json()["reseeded"] == [{k: v for k, v in CALL.items() if k != "value"}]


def test_a_kept_reseed_that_still_differs_proves_nothing(tmp_path: Path) -> None:
    verdict, found, _ = _prove(tmp_path, (False, True), "other")
    assert (
        found.outcome.value == "differs"
        and verdict.cause is Cause.UNKNOWN
        and verdict.reseeded == []
    )


def test_without_reseeds_in_the_step_logs_the_experiment_does_not_run(tmp_path: Path) -> None:
    verdict, found, asked = _prove(tmp_path, (False, False), "a")
    assert found is None and asked == [] and verdict.cause is Cause.UNKNOWN


def test_when_both_runs_reseed_both_are_replayed_with_their_reseeds_kept(tmp_path: Path) -> None:
    verdict, found, asked = _prove(tmp_path, (True, True), "same")
    assert [a for a in asked if a[0] == "restore"] == [("restore", 0, 2)] * 2
    assert found.outcome.value == "matches" and found.subject.startswith("run A and run B with")
    assert verdict.confidence is Confidence.PROVEN and len(verdict.reseeded) == 2


def _fresh(asked: list[Any], spec: Any, label: str) -> _Fresh:
    return _Fresh("a", asked)


class _Rewound:
    """The replay's replica of a run, standing after the step, with a verified rewind (or none)."""

    def __init__(self, verified: bool, asked: list[Any]) -> None:
        self.rewinds, self.asked = Rewinds(step=2 if verified else None), asked

    def run(self, step: int, trace: str, kept_entropy: bool) -> StepResult:
        self.asked.append(("rewound", step, kept_entropy))
        return _trace("a")


def test_a_verified_rewind_runs_the_experiment_in_the_replays_process_and_none_starts_afresh(
    tmp_path: Path,
) -> None:
    runs = (_run(tmp_path / "a", False), _run(tmp_path / "b", True))
    for verified, expected in (
        (True, [("rewound", 2, True)]),
        (False, [("restore", 0, 2), ("skip", 2)]),
    ):
        asked: list[Any] = []
        verdict = Draft(step=2, phase="forward", layer="2", tensor="2.output")
        replicas = cast(Any, (_Rewound(verified, asked), _Rewound(verified, asked)))
        found = prove_kept(
            verdict,
            runs,
            ("spec a", "spec b"),
            (0, 0),
            (_trace("a"), _trace("b")),
            partial(_fresh, asked),
            replicas,
        )
        assert asked == expected and found is not None and found.outcome.value == "matches"
