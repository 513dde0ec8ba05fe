"""A resumed run against fakes: the audit compares the streams at the same point of the resume step
in both runs (as the step's first batch is noted, else the resumed script's streams from before its
first step drew its data, else not at all); the cause ``resume`` is named where the resume did not
restore an optimizer's state, never proven, after the data and a stream the resume missed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bisect_repro.capture.rng import tree_digest
from bisect_repro.diagnose.compare.causes import Cause
from bisect_repro.diagnose.compare.causes.registry import REGISTRY
from bisect_repro.diagnose.compare.from_records import records_verdict
from bisect_repro.diagnose.compare.records import read_records, start_at_resume
from bisect_repro.diagnose.compare.resume import align, audit
from bisect_repro.diagnose.compare.signals import Signals
from bisect_repro.diagnose.compare.verdict import Confidence, Verdict
from bisect_repro.store.run import Run
from tests.diagnose.compare.test_differences import launch
from tests.fakes import write_run

ADAM = "optimizer.state.0.exp_avg"
STREAM_0, STREAM_1, STREAM_2 = ({"kind": "python", "state": [n]} for n in range(3))


def _uninterrupted(path: Path, *, noted: bool = True) -> Run:
    """Six steps, a snapshot every two; torch's stream moves each step; its step records hold the
    streams as each snapshot step's first batch was noted (one draw after the snapshot's)."""
    lines = [
        {"step": s, "loss": 1.0, "order": f"o{s}", "batch": f"b{s}"}
        | ({"streams": {"torch": f"noted{s}"}} if noted and s % 2 == 0 else {})
        for s in range(6)
    ]
    snapshots = {
        s: {"hashes": {"fc.weight": f"w{s}", ADAM: f"m{s}"}, "streams": {"torch": {"n": [s]}}}
        for s in (0, 2, 4, 6)
    }
    return write_run(path, lines, snapshots)


def _resumed(
    path: Path,
    *,
    adam: str = "m2",
    noted: str | None = "noted2",
    start: str | None = None,
    auto: bool = True,
    losses: dict[int, float] | None = None,
) -> Run:
    """A script resumed from run A's state after 2 steps (its own steps 0 to 3 are A's 2 to 5): the
    model of A's step 2, the optimizer state ``adam``, its first snapshot's streams taken at its
    first forward (one draw later than A's at step 2), step 0's noted and start streams as given."""
    first: dict[str, Any] = {"step": 0, "loss": 1.0, "order": "o2", "batch": "b2"}
    first |= {"streams": {"torch": noted}} if noted else {}
    first |= {"start": {"torch": start}} if start else {}
    lines = [first] + [
        {"step": s, "loss": (losses or {}).get(s, 1.0), "order": f"o{s + 2}", "batch": f"b{s + 2}"}
        for s in (1, 2, 3)
    ]
    # what the resume missed moves the later states away from run A's (a stream: its draws too)
    drawn = "" if noted in ("noted2", None) and start in (None, tree_digest({"n": [2]})) else "x"
    parted = "x" if drawn or adam != "m2" else ""
    snapshots = {
        0: {"hashes": {"fc.weight": "w2", ADAM: adam}, "streams": {"torch": {"n": [2, "drawn"]}}},
        **{
            s: {
                "hashes": {"fc.weight": f"w{s + 2}{parted}", ADAM: f"m{s + 2}{parted}"},
                "streams": {"torch": {"n": [s + 2, drawn] if drawn else [s + 2]}},
            }
            for s in (2, 4)
        },
    }
    script = launch(path.parent / f"{path.name}-code" / "train.py", "print(1)\n")
    return write_run(path, lines, snapshots, launch=script | ({"hooks": "auto"} if auto else {}))


def _audited(a: Run, b: Run) -> Any:
    a, b, resume = align(a, b)
    assert resume is not None and (resume.run, resume.step) == ("B", 2)
    return a, b, audit(a, b, resume)


def test_the_streams_are_audited_as_each_run_noted_its_resume_steps_first_batch(
    tmp_path: Path,
) -> None:
    _, _, restored = _audited(_uninterrupted(tmp_path / "a"), _resumed(tmp_path / "b"))
    assert restored.missing == [], restored
    _, _, other = _audited(
        _uninterrupted(tmp_path / "a2"), _resumed(tmp_path / "b2", noted="elsewhere")
    )
    assert other.missing == ["stream torch"], other


def test_without_noted_streams_a_resumed_script_is_audited_from_before_its_first_draw(
    tmp_path: Path,
) -> None:
    a = _uninterrupted(tmp_path / "a", noted=False)
    # its streams from before its first draw, against run A's snapshot as its step 2 began
    restored = _resumed(tmp_path / "b1", noted=None, start=tree_digest({"n": [2]}))
    assert _audited(a, restored)[2].missing == []
    other = _resumed(tmp_path / "b2", noted=None, start="elsewhere")
    assert _audited(a, other)[2].missing == ["stream torch"]
    # neither: a script's first snapshot (at its first forward) is not held against a step start
    neither = _audited(a, _resumed(tmp_path / "b3", noted=None))[2]
    assert not any(p.part.startswith("stream") for p in neither.parts), neither
    # a run the Recorder recorded (not a script): its first snapshot is its step's start
    recorder = _audited(a, _resumed(tmp_path / "b4", noted=None, auto=False))[2]
    assert recorder.missing == ["stream torch"], recorder


def test_an_optimizer_state_the_resume_missed_is_the_cause_resume_never_proven(
    tmp_path: Path,
) -> None:
    a, b, resume = _audited(
        _uninterrupted(tmp_path / "a"), _resumed(tmp_path / "b", adam="fresh", losses={1: 2.0})
    )
    assert resume.missing == ["optimizer"] and resume.state_missing == ["optimizer"]
    records = read_records(a, b)
    start_at_resume(records, resume)
    verdict = records_verdict(records)
    assert (verdict.cause, verdict.phase, verdict.confidence) == (
        Cause.RESUME,
        "optimizer",
        Confidence.INFERRED,
    )
    assert "load it when resuming" in verdict.fix and "optimizer" in verdict.fix
    signals = Signals.of_records(records)
    assert (signals.unrestored, signals.resumed) == (("optimizer",), 2)
    entry = REGISTRY[Cause.RESUME]
    assert entry.holds(signals, Verdict(step=2, cause=Cause.RESUME))
    assert not entry.holds(signals, Verdict(step=1, cause=Cause.RESUME))  # before the resume
    assert not entry.holds(Signals(), Verdict(step=2, cause=Cause.RESUME))
    assert entry.proof.startswith("none")


def test_a_stream_the_resume_missed_too_is_named_by_its_own_cause_before_the_optimizer(
    tmp_path: Path,
) -> None:
    a, b, resume = _audited(
        _uninterrupted(tmp_path / "a"),
        _resumed(tmp_path / "b", adam="fresh", noted="elsewhere", losses={1: 2.0}),
    )
    assert resume.missing == ["optimizer", "stream torch"]
    records = read_records(a, b)
    start_at_resume(records, resume)
    # the batches are equal; the stream differs at the resume and is drawn from: named first
    assert records_verdict(records).cause is Cause.RNG_STATE
