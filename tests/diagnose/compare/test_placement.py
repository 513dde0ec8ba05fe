"""Where a verdict's location comes from: the replay's only when it reproduced the records up to
the divergent step, else the records'; the closing note lists each walk of the replay."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bisect_repro.diagnose.compare.causes import Cause
from bisect_repro.diagnose.compare.from_records import records_verdict
from bisect_repro.diagnose.compare.placement import closing_note, place
from bisect_repro.diagnose.compare.records import read_records
from bisect_repro.diagnose.compare.verdict import Confidence, Verdict
from bisect_repro.replay.lockstep import Attempt, Parted
from tests.fakes import write_run

CALL = {
    "stream": "torch",
    "call": "torch.seed()",
    "entropy": True,
    "where": "train.py:9",
    "value": 5,
}


def _run(path: Path, seeded: bool) -> Any:
    lines = [
        {"step": s, "loss": 2.5 if seeded and s == 3 else 1.0, "order": None, "batch": f"b{s}"}
        for s in range(6)
    ]
    if seeded:
        lines[3]["seeded"] = [CALL]
    hashes = {0: "w0", 2: "w2", 4: "moved" if seeded else "w4", 6: "moved" if seeded else "w6"}
    return write_run(path, lines, {s: {"hashes": {"fc.weight": h}} for s, h in hashes.items()})


def _replayed() -> Verdict:
    return Verdict(
        step=3,
        phase="forward",
        layer="2",
        tensor="2.output",
        op="aten.bernoulli_.float",
        cause=Cause.RNG_STATE,
        confidence=Confidence.INFERRED,
    )


def test_a_faithful_replay_keeps_its_location_and_says_so(tmp_path: Path) -> None:
    records = read_records(_run(tmp_path / "a", False), _run(tmp_path / "b", True))
    named = records_verdict(records)
    verdict = place(_replayed(), named, SimpleNamespace(from_step=0), faithful=True)
    assert (verdict.phase, verdict.layer, verdict.tensor) == ("forward", "2", "2.output")
    assert [(e.experiment, e.subject) for e in verdict.evidence] == [("location", "the replay")]
    assert "reproduced both runs' records up to step 3" in verdict.evidence[0].detail


def test_a_replay_that_parted_before_the_step_never_places_the_verdict(tmp_path: Path) -> None:
    records = read_records(_run(tmp_path / "a", False), _run(tmp_path / "b", True))
    named = records_verdict(records)
    verdict = place(_replayed(), named, SimpleNamespace(from_step=0), faithful=False)
    assert (verdict.step, verdict.phase, verdict.layer, verdict.tensor, verdict.op) == (
        3,
        None,
        None,
        None,
        None,
    )
    assert [(e.experiment, e.subject, e.outcome.value) for e in verdict.evidence] == [
        ("location", "the records", "inconclusive")
    ]


def test_the_closing_note_shows_each_walk_with_its_steps_and_verdict() -> None:
    parted = (Parted(run="B", step=9, what="loss"),)
    one = SimpleNamespace(attempts=[Attempt((5, 5), 5, (), 9)])
    assert closing_note(one, _replayed()) is None  # one walk: the replay line says it all
    two = SimpleNamespace(attempts=[Attempt((5, 5), 5, parted, 9), Attempt((0, 0), 10, (), 9)])
    note = closing_note(two, _replayed())
    assert note == (
        "the replays: from the checkpoints at steps 5/5, 5 step(s) replayed, parted from the "
        "records (run B at step 9 (loss)): "
        "no verdict taken from it; from the checkpoints at steps 0/0, 10 step(s) replayed, matched "
        "the records: step 3, "
        "rng_state, inferred"
    )
