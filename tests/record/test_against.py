"""The decisions of a recording made against a reference: which record differs first, where the run
stops, and the reference's checks, against fakes (no training)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from bisect_repro import Recorder, RecordOptions, Run
from bisect_repro.errors import BisectReproError
from bisect_repro.record.against import Against, Matcher, Mismatch, ReferenceCheck, stops_at
from bisect_repro.record.recipe import build
from bisect_repro.record.reference import SnapshotDigests, code_identity, open_reference
from bisect_repro.store.writer import RunWriter
from tests.fakes import MODEL


def _line(step: int, *, loss: float = 1.0, batch: str = "b", order: str | None = "o") -> dict:
    return {"step": step, "loss": loss, "order": order, "batch": batch}


def _digests(tensor: str = "h", **streams: str) -> SnapshotDigests:
    return SnapshotDigests({"w": tensor}, {"torch": "t", **streams})


class FakeReference:
    """A reference whose records the test sets: step lines, snapshots, how far it committed, and
    its end once complete; ``grows`` are the ``through`` values successive reads find."""

    def __init__(
        self,
        lines: Mapping[int, dict[str, Any]],
        snapshots: Mapping[int, SnapshotDigests],
        *,
        complete: bool = True,
        through: int | None = None,
        grows: list[int] | None = None,
    ) -> None:
        self.lines, self.snapshots = dict(lines), dict(snapshots)
        self.complete = complete
        self._through = max(self.snapshots) if through is None else through
        self.grows = list(grows or [])
        self.failed: str | None = None
        self.reads = 0

    @property
    def end(self) -> int | None:
        return max(self.snapshots) if self.complete else None

    @property
    def through(self) -> int | None:
        return self._through

    def step_line(self, step: int) -> Mapping[str, Any] | None:
        return self.lines.get(step) if step < self._through or self.complete else None

    def snapshot(self, step: int) -> SnapshotDigests | None:
        return self.snapshots.get(step) if step <= self._through else None

    def refresh(self) -> None:
        self.reads += 1
        if self.grows:
            self._through = self.grows.pop(0)


def _reference(steps: int = 10, every: int = 5, **kwargs: Any) -> FakeReference:
    return FakeReference(
        {s: _line(s) for s in range(steps)},
        {s: _digests() for s in range(0, steps + 1, every)},
        **kwargs,
    )


def _feed(matcher: Matcher, step: int, lines: list[dict], snapshot: SnapshotDigests) -> None:
    matcher.feed(step, lines, snapshot)


@pytest.mark.parametrize(
    ("field", "changed"),
    [("order", {"order": "x"}), ("batch", {"batch": "x"}), ("loss", {"loss": 2.0})],
)
def test_the_first_step_line_that_differs_is_the_mismatch(field: str, changed: dict) -> None:
    matcher = Matcher(_reference())
    _feed(matcher, 0, [], _digests())
    lines = [_line(s) for s in range(5)]
    lines[3] = {**lines[3], **changed}
    lines[4] = {**lines[4], "loss": 9.0}  # a later difference is not the first
    _feed(matcher, 5, lines, _digests())
    assert matcher.mismatch == Mismatch(3, field)
    assert matcher.matched == 3


def test_equal_records_match_up_to_the_snapshot() -> None:
    matcher = Matcher(_reference())
    _feed(matcher, 0, [], _digests())
    _feed(matcher, 5, [_line(s) for s in range(5)], _digests())
    assert matcher.mismatch is None and matcher.matched == 5


def test_where_numerics_settings_differ_only_the_data_and_streams_are_checked() -> None:
    notes: list[str] = []
    against = Against(run="a", on_note=notes.append)
    check = ReferenceCheck(against, _reference(), {"torch.get_num_threads": [1, 2]})
    assert not check.matcher.exact
    assert "torch.get_num_threads: 1 vs 2" in notes[0] and "data and the random streams" in notes[0]
    matcher = check.matcher
    _feed(matcher, 0, [], _digests(tensor="rounded"))
    _feed(matcher, 5, [_line(s, loss=1.0 + s / 1e7) for s in range(5)], _digests("rounded"))
    assert matcher.mismatch is None and matcher.matched == 5  # weights and losses not held to bits
    lines = [_line(s) for s in range(5, 10)]
    lines[2] = {**lines[2], "batch": "other"}
    _feed(matcher, 10, lines, _digests("rounded"))
    assert matcher.mismatch == Mismatch(7, "batch")  # the data still is
    # the same settings: every field is held to bits
    assert ReferenceCheck(Against(run="a", on_note=notes.append), _reference(), {}).matcher.exact
    assert len(notes) == 1


def test_a_state_hash_that_differs_names_the_tensor() -> None:
    matcher = Matcher(_reference())
    _feed(matcher, 0, [], _digests())
    _feed(matcher, 5, [_line(s) for s in range(5)], _digests(tensor="other"))
    assert matcher.mismatch == Mismatch(5, "snapshot", "w")


def test_a_stream_that_comes_apart_is_a_mismatch_one_that_always_differed_unmoved_is_not() -> None:
    reference = FakeReference(
        {s: _line(s) for s in range(10)},
        {s: _digests(numpy="a0", python="p") for s in (0, 5, 10)},
    )
    matcher = Matcher(reference)
    # python differs from the start and never moves (unseeded, never drawn): not a difference
    _feed(matcher, 0, [], _digests(numpy="a0", python="q"))
    _feed(matcher, 5, [_line(s) for s in range(5)], _digests(numpy="a0", python="q"))
    assert matcher.mismatch is None
    _feed(matcher, 10, [_line(s) for s in range(5, 10)], _digests(numpy="b1", python="q"))
    assert matcher.mismatch == Mismatch(10, "streams", "numpy")


def test_a_stream_that_always_differed_and_is_drawn_from_is_a_mismatch() -> None:
    reference = FakeReference(
        {s: _line(s) for s in range(10)},
        {0: _digests(python="p0"), 5: _digests(python="p1")},
    )
    matcher = Matcher(reference)
    _feed(matcher, 0, [], _digests(python="q0"))
    _feed(matcher, 5, [_line(s) for s in range(5)], _digests(python="q1"))
    assert matcher.mismatch == Mismatch(5, "streams", "python")


def test_records_past_the_reference_end_are_not_checked_and_noted_once() -> None:
    matcher = Matcher(_reference(steps=5))
    _feed(matcher, 0, [], _digests())
    _feed(matcher, 5, [_line(s) for s in range(5)], _digests())
    assert matcher.beyond is None
    _feed(matcher, 10, [{**_line(s), "loss": 7.0} for s in range(5, 10)], _digests("x"))
    assert matcher.beyond == 5 and matcher.mismatch is None and matcher.matched == 5


def test_a_reference_being_written_is_waited_for_and_read_again() -> None:
    reference = _reference(complete=False, through=0, grows=[0, 5])
    matcher = Matcher(reference)
    _feed(matcher, 0, [], _digests())
    lines = [_line(s) for s in range(5)]
    lines[2] = {**lines[2], "batch": "x"}
    _feed(matcher, 5, lines, _digests())
    assert matcher.mismatch is None  # the reference had not committed step 2: waiting
    assert reference.reads == 1
    _feed(matcher, 10, [_line(s) for s in range(5, 10)], _digests())
    assert matcher.mismatch == Mismatch(2, "batch")  # read again, it has


def test_a_step_the_reference_never_logged_is_skipped() -> None:
    reference = _reference()
    del reference.lines[1]
    matcher = Matcher(reference)
    _feed(matcher, 0, [], _digests())
    _feed(matcher, 5, [{**_line(s), "loss": 5.0 if s == 1 else 1.0} for s in range(5)], _digests())
    assert matcher.mismatch is None


@pytest.mark.parametrize(
    ("step", "due", "mismatch", "end", "against", "stops"),
    [
        (40, True, Mismatch(33, "batch"), None, Against(run="a"), True),
        (41, False, Mismatch(33, "batch"), None, Against(run="a"), False),
        (40, True, Mismatch(33, "batch"), None, Against(run="a", keep_going=True), False),
        (40, True, None, None, Against(run="a"), False),
        (20, False, None, 20, Against(run="a", stop_at_end=True), True),
        (19, False, None, 20, Against(run="a", stop_at_end=True), False),
        (20, True, None, 20, Against(run="a"), False),
        (20, True, None, None, Against(run="a", stop_at_end=True), False),
    ],
)
def test_where_the_run_stops(
    step: int, due: bool, mismatch: Mismatch | None, end: int | None, against: Against, stops: bool
) -> None:
    assert stops_at(step, due, mismatch, end, against) is stops


def test_the_check_stops_at_the_snapshot_after_the_one_that_showed_the_difference() -> None:
    notes: list[str] = []
    progress: list[int] = []
    check = ReferenceCheck(
        Against(run="a", on_note=notes.append, on_progress=progress.append), _reference(20)
    )
    check.check(0, [], {"hashes": {"w": "h"}, "streams": {}})
    assert not check.stops_at(5, True)
    check.check(
        5,
        [{**_line(s), "batch": "x" if s == 3 else "b"} for s in range(5)],
        {
            "hashes": {"w": "h"},
            "streams": {},
        },
    )
    assert check.stops_at(10, True) and not check.stops_at(9, False)
    assert progress == [0] and len(notes) == 1 and "batch at step 3" in notes[0]


def test_the_training_thread_waits_for_the_previous_check() -> None:
    check = ReferenceCheck(Against(run="a", on_note=lambda _: None), _reference(20))
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: (check.wait(5, lambda: False), done.append(True)))
    waiter.start()
    check.check(0, [], {"hashes": {"w": "h"}, "streams": {}})
    waiter.join(0.2)
    assert not done  # the check of snapshot 5 is not done yet
    check.check(5, [_line(s) for s in range(5)], {"hashes": {"w": "h"}, "streams": {}})
    waiter.join(5)
    assert done
    check.wait(10, lambda: True)  # a failed writer never makes it wait


def _write_run(path: Path, *, complete: bool, code: dict[str, Any] | None) -> None:
    meta = {"target": None, "config": {}, "model": MODEL, "environment": {}}
    if code is not None:
        meta["launch"] = {"argv": [], "code": code}
    writer = RunWriter.create(path, meta)
    writer.append_steps([_line(s) for s in range(3)])
    writer.commit("snapshot", 0, {"step": 0, "hashes": {"w": "h"}, "streams": {}})
    if complete:
        writer.commit("snapshot", 3, {"step": 3, "hashes": {"w": "h"}, "streams": {}})
        writer.finish(3)
    writer.close()


SCRIPT = {"kind": "script", "path": "/work/train.py"}


def test_a_reference_of_the_same_script_opens(tmp_path: Path) -> None:
    _write_run(tmp_path / "a", complete=True, code=SCRIPT)
    reference = open_reference(tmp_path / "a", tmp_path / "b", SCRIPT)
    assert reference.end == 3 and reference.step_line(1) == _line(1)


@pytest.mark.parametrize(
    ("complete", "code", "ours", "out", "problem"),
    [
        (False, SCRIPT, SCRIPT, "b", "a partial run"),
        (True, SCRIPT, {"kind": "script", "path": "/work/other.py"}, "b", "script /work/other.py"),
        (True, SCRIPT, {"kind": "module", "module": "pkg.train"}, "b", "module pkg.train"),
        (True, None, SCRIPT, "b", "no recorded script or recipe"),
        (True, SCRIPT, SCRIPT, "a", "--out"),
        (True, SCRIPT, SCRIPT, "a/inner", "--out"),
    ],
)
def test_a_bad_reference_is_refused_with_one_line(
    tmp_path: Path, complete: bool, code: Any, ours: Any, out: str, problem: str
) -> None:
    _write_run(tmp_path / "a", complete=complete, code=code)
    with pytest.raises(BisectReproError) as raised:
        open_reference(tmp_path / "a", tmp_path / out, ours)
    assert problem in str(raised.value) and "\n" not in str(raised.value)


def test_a_reference_being_written_is_accepted_and_read_as_committed(tmp_path: Path) -> None:
    meta = {"target": None, "config": {}, "model": MODEL, "environment": {}}
    meta["launch"] = {"argv": [], "code": SCRIPT}
    writer = RunWriter.create(tmp_path / "a", meta)  # holds the lock: being written
    try:
        writer.append_steps([_line(s) for s in range(3)])
        writer.commit("snapshot", 0, {"step": 0, "hashes": {"w": "h"}, "streams": {}})
        writer.append_steps([_line(3)])  # not committed: no snapshot after it yet
        reference = open_reference(tmp_path / "a", tmp_path / "b", SCRIPT)
        assert reference.end is None and reference.through == 0
        assert reference.step_line(0) is None  # step lines before the last snapshot only
    finally:
        writer.close()


def test_a_recipe_is_named_by_its_file_and_function() -> None:
    recipe = {"kind": "recipe", "target": "r.py:build", "path": "/w/r.py"}
    assert code_identity(recipe) == ("recipe", "/w/r.py", "build")
    assert code_identity({**recipe, "target": "r.py:other"}) != code_identity(recipe)


def test_a_malformed_reference_snapshot_stops_the_checking_not_the_recording(
    tmp_path: Path,
) -> None:
    meta = {"target": None, "config": {}, "model": MODEL, "environment": {}}
    writer = RunWriter.create(tmp_path / "a", {**meta, "launch": {"argv": [], "code": SCRIPT}})
    writer.append_steps([_line(s) for s in range(3)])
    writer.commit("snapshot", 0, {"step": 0, "hashes": ["not", "a", "mapping"], "streams": {}})
    writer.commit("snapshot", 3, {"step": 3, "hashes": {"w": "h"}, "streams": {}})
    writer.finish(3)
    writer.close()
    matcher = Matcher(open_reference(tmp_path / "a", tmp_path / "b", SCRIPT))
    _feed(matcher, 0, [], _digests())
    assert matcher.mismatch is None and matcher.failed is not None
    assert "hashes" in matcher.failed and str(tmp_path / "a") in matcher.failed


def _loop(
    examples: Path, out: Path, against: Any = None, bump_at: int | None = None
) -> tuple[Run, bool]:
    """Twenty steps of the MLP example in a loop of one's own, the loss logged at ``bump_at``
    changed; the run and whether it stopped early."""
    trainee = build(f"{examples / 'mlp.py'}:build", {"hidden": 8})
    assert trainee.step is not None
    options = RecordOptions(steps=20, every=5, checkpoint_every=10)
    with Recorder(out, trainee, options, against=against) as recorder:
        for batch in recorder.batches():
            loss = trainee.step(batch)
            recorder.log(loss + 1 if recorder.step == bump_at else loss)
    return Run.open(out), recorder.stopped_early


def test_a_recorder_loop_against_a_reference_ends_at_the_snapshot_after_the_difference(
    examples: Path, tmp_path: Path
) -> None:
    reference, stopped = _loop(examples, tmp_path / "a")
    assert not stopped and reference.complete and len(reference.steps) == 20
    notes: list[str] = []
    against = Against(run=tmp_path / "a", on_note=notes.append)
    same, stopped = _loop(examples, tmp_path / "same", against)
    assert not stopped and same.complete and len(same.steps) == 20 and notes == []
    # the loss of step 7 differs: the snapshot at 10 shows it, the run stops at 15, complete
    parted, stopped = _loop(examples, tmp_path / "b", against, bump_at=7)
    assert stopped and parted.complete and parted.last_step == 15 and len(parted.steps) == 15
    assert notes == [
        f"differs from {tmp_path / 'a'} first in the loss at step 7; the run stops "
        "at its next snapshot"
    ]
