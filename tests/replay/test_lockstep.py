"""Two runs replayed side by side to the first step where they part, on fake replicas recorded from
their programs."""

from __future__ import annotations

from pathlib import Path

import pytest

from bisect_repro.diagnose.compare.records import read_records
from bisect_repro.replay.launch import LaunchSpec
from bisect_repro.replay.lockstep import Divergence, Lockstep, Parted
from bisect_repro.replay.replica import ReplicaFailed
from bisect_repro.store.meta import CodeKind
from bisect_repro.store.run import Run
from tests.fake_programs import one_layer, only_at, record, reseed, reseeding
from tests.fake_replica import Call, FakeReplica, Launcher, Outcome, Program

SPECS = (
    LaunchSpec(kind=CodeKind.SCRIPT, path="/code/a.py"),
    LaunchSpec(kind=CodeKind.SCRIPT, path="/code/b.py"),
)
STEPS = 8  # a snapshot every 2 steps


def recorded(
    tmp_path: Path, a: Program, b: Program, checkpoints: tuple[int, ...] = (0, 4)
) -> tuple[Run, Run]:
    return (
        record(a, tmp_path / "a", steps=STEPS, every=2, checkpoints=checkpoints),
        record(b, tmp_path / "b", steps=STEPS, every=2, checkpoints=checkpoints),
    )


def counting(call: Call) -> Outcome:
    """A step that reads how many steps the process ran (a counter in a closure): no checkpoint
    holds it."""
    return one_layer(call, forward=call.calls)


def counting_and_reseeding(call: Call) -> Outcome:
    """:func:`counting`, that reseeds from entropy at step 5."""
    streams, seeded = reseed(call) if call.step == 5 else (call.streams, None)
    return one_layer(call, forward=call.calls, streams=streams, seeding=[seeded] if seeded else [])


def replayed(
    runs: tuple[Run, Run], launcher: Launcher, first: tuple[int, int] | None = (0, 0)
) -> tuple[Lockstep, Divergence | None]:
    """Replay the runs from their last checkpoint at or before the last equal snapshot (4), as
    ``compare`` does."""
    records = read_records(*runs)
    assert (records.last_equal, records.end) == (4, 5)
    lockstep = Lockstep(runs, SPECS, start=launcher)
    return lockstep, lockstep.find((4, 4), 4, records.end, first)


def test_the_replicas_step_together_to_the_first_step_where_they_differ(tmp_path: Path) -> None:
    a, b = Program(step=one_layer), Program(step=only_at(5, reseeding))
    runs = recorded(tmp_path, a, b)
    launcher = Launcher({"/code/a.py": a, "/code/b.py": b})
    lockstep, found = replayed(runs, launcher)
    assert found is not None and (found.step, found.parted_only) == (5, False)
    # the same batch: the step itself computes differently
    assert found.fetched[0] == found.fetched[1]
    assert [e.tensor for e in found.light[0].entries] == ["batch.indices", "batch.0", "fc.weight"]
    assert (
        found.light[0].entries[:2] == found.light[1].entries[:2]
        and found.light[0].entries[2] != found.light[1].entries[2]
    )
    assert (lockstep.from_step, lockstep.replayed, lockstep.notes) == (4, 2, [])
    # run B reseeds from entropy there: its replay cannot reproduce its own recorded loss
    assert lockstep.parted == [Parted(run="B", step=5, what="loss")]
    assert [(r.label, r.step) for r in launcher.started] == [
        (f"run A ({runs[0].path})", 6),
        (f"run B ({runs[1].path})", 6),
    ]
    lockstep.close()
    assert all(r.closed for r in launcher.started)


def test_a_step_where_the_replicas_agree_but_one_parts_from_its_records_is_returned_too(
    tmp_path: Path,
) -> None:
    a, b = Program(step=one_layer), Program(step=only_at(5, reseeding))
    runs = recorded(tmp_path, a, b)
    # run B's replay runs run A's code
    lockstep, found = replayed(runs, Launcher({"/code/a.py": a, "/code/b.py": a}), first=None)
    assert found is not None and (found.step, found.parted_only) == (5, True)
    assert found.light[0].entries == found.light[1].entries
    assert lockstep.parted == [Parted(run="B", step=5, what="loss")] and lockstep.notes == []


def test_a_replica_parting_from_its_records_while_fast_forwarding_steps_from_the_checkpoints(
    tmp_path: Path,
) -> None:
    a, b = Program(step=one_layer), Program(step=one_layer)
    runs = recorded(tmp_path, a, b)
    # run A's code changed since: step 3's update
    changed = Program(step=only_at(3, lambda call: one_layer(call, lr=0.5)))
    launcher = Launcher({"/code/a.py": changed, "/code/b.py": b})
    lockstep = Lockstep(runs, SPECS, start=launcher)
    found = lockstep.find((0, 0), 4, 7)  # the records never part: the replay does
    # step 3's loss is as recorded
    assert lockstep.parted == [Parted(run="A", step=4, what="state at the snapshot")]
    assert lockstep.notes == [
        "the replayed runs already differ at step 4, where the records agree; replaying step by "
        "step from 0"
    ]
    assert found is not None and (
        found.step,
        found.parted_only,
        lockstep.from_step,
        lockstep.replayed,
    ) == (3, False, 0, 4)


def test_a_replay_parting_before_the_divergence_is_tried_again_from_the_first_checkpoints(
    tmp_path: Path,
) -> None:
    a, b = Program(step=counting), Program(step=counting_and_reseeding)
    runs = recorded(tmp_path, a, b)
    launcher = Launcher({"/code/a.py": a, "/code/b.py": b})
    lockstep, found = replayed(runs, launcher)
    assert lockstep.notes == [
        "the replay from the checkpoints at steps 4/4 parted from the records (run A at step 4 "
        "(loss), run B at step 4 (loss)): "
        "the loop reads state the checkpoints do not hold (a local counter of the running loop, "
        "such as enumerate's, "
        "or an object's attribute; read recorder.step or bisect_repro.current_step() instead); "
        "replaying from the first checkpoints instead"
    ]
    assert len(launcher.started) == 4 and launcher.started[0].closed and launcher.started[1].closed
    assert lockstep.replicas == (launcher.started[2], launcher.started[3])
    assert found is not None and (
        found.step,
        found.parted_only,
        lockstep.from_step,
        lockstep.replayed,
    ) == (5, False, 0, 6)
    # from step 0 the replay is faithful up to the reseed
    assert lockstep.parted == [Parted(run="B", step=5, what="loss")]


def test_without_first_checkpoints_the_step_where_the_replay_parts_is_returned(
    tmp_path: Path,
) -> None:
    a, b = Program(step=counting), Program(step=counting_and_reseeding)
    lockstep, found = replayed(
        recorded(tmp_path, a, b), Launcher({"/code/a.py": a, "/code/b.py": b}), first=None
    )
    assert found is not None and (found.step, found.parted_only) == (4, True)
    assert lockstep.parted == [
        Parted(run="A", step=4, what="loss"),
        Parted(run="B", step=4, what="loss"),
    ]
    assert lockstep.notes == []


def test_a_replica_that_cannot_start_leaves_no_other_replica_running(tmp_path: Path) -> None:
    program = Program(step=one_layer)
    runs = recorded(tmp_path, program, program)
    launcher = Launcher({"/code/a.py": program})

    def start(spec: LaunchSpec, label: str) -> FakeReplica:
        if spec.path == "/code/b.py":
            raise ReplicaFailed(f"replay of {label}: cannot start")
        return launcher(spec, label)

    with pytest.raises(ReplicaFailed, match="cannot start"):
        Lockstep(runs, SPECS, start=start)
    assert [(r.label, r.closed) for r in launcher.started] == [(f"run A ({runs[0].path})", True)]


def reseeding_once(call: Call) -> Outcome:
    """Step 5 reseeds from entropy on its first run in a process only (a loop's counter decides)."""
    return reseeding(call) if call.step == 5 and call.runs == 0 else one_layer(call)


def test_a_step_whose_repeat_seeds_otherwise_is_repeated_afresh_from_the_first_checkpoints(
    tmp_path: Path,
) -> None:
    a, b = Program(step=one_layer), Program(step=reseeding_once)
    runs = recorded(tmp_path, a, b)
    launcher = Launcher({"/code/a.py": a, "/code/b.py": b})
    lockstep, found = replayed(runs, launcher)
    assert found is not None and found.step == 5
    lockstep.settle_repeats(found)
    assert lockstep.notes and "run B" in lockstep.notes[0] and "(steps 0/0)" in lockstep.notes[0]
    replica_b = launcher.started[1]
    assert all(r.afresh and not r.reruns for r in launcher.started)
    processes = replica_b.processes
    # each a fresh process, replayed from step 0
    again = [replica_b.run(5, trace="none") for _ in range(2)]
    assert all(r.seeding and r.seeding[0]["call"] == "torch.seed()" for r in again)
    assert replica_b.processes == processes + 2
