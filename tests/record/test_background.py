"""The writer thread alone, against a fake commit: groups of what waits, the bound, the first
failure."""

from __future__ import annotations

import errno
import threading

import pytest

from bisect_repro.record.background import BackgroundWriter
from bisect_repro.store.commit import Commit, GroupCommitError


class FakeDisk:
    """Records each group's steps; the first group waits for ``gate``, and ``fail`` raises instead
    of committing."""

    def __init__(self) -> None:
        self.groups: list[list[int]] = []
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.fail: BaseException | None = None

    def commit(self, commits: list[Commit]) -> None:
        self.entered.set()
        self.gate.wait(timeout=30)
        if self.fail is not None:
            raise self.fail
        self.groups.append([c.step for c in commits])


def job(step: int) -> tuple[int, object]:
    return step, lambda: Commit(step)


def test_what_waits_while_a_group_is_written_is_committed_as_one_group() -> None:
    disk = FakeDisk()
    writer = BackgroundWriter("test writer", 3, disk.commit)
    writer.submit(*job(0))
    assert disk.entered.wait(timeout=30)  # the first group is being written ...
    for step in (1, 2, 3):  # ... while three more wait
        writer.submit(*job(step))
    disk.gate.set()
    writer.drain()
    assert disk.groups == [[0], [1, 2, 3]] and writer.committed == 3 and writer.error is None


def test_at_most_depth_plus_one_snapshots_are_pending() -> None:
    disk = FakeDisk()
    writer = BackgroundWriter("test writer", 1, disk.commit)
    writer.submit(*job(0))
    assert disk.entered.wait(timeout=30)
    writer.submit(*job(1))
    assert not writer._slots.acquire(blocking=False)  # a third would wait for room
    disk.gate.set()
    writer.drain()
    assert disk.groups == [[0], [1]]


def test_a_failure_keeps_what_came_before_and_drops_everything_after() -> None:
    disk = FakeDisk()
    writer = BackgroundWriter("test writer", 0, disk.commit)
    disk.gate.set()
    writer.submit(*job(0))
    cause = OSError(errno.ENOSPC, "No space left on device")
    try:
        raise GroupCommitError(4, committed=2) from cause
    except GroupCommitError as error:
        disk.fail = error
    writer.submit(*job(2))
    disk.fail = None
    writer.submit(*job(6))  # dropped: nothing lands after a gap
    assert writer.error is cause and writer.failed_at == 4 and writer.committed == 2
    assert disk.groups == [[0]]


def test_a_snapshot_whose_commit_cannot_be_made_stops_the_group_there() -> None:
    disk = FakeDisk()
    writer = BackgroundWriter("test writer", 3, disk.commit)
    writer.submit(*job(0))
    assert disk.entered.wait(timeout=30)

    def broken() -> Commit:
        raise ZeroDivisionError("a bug")

    writer.submit(*job(1))
    writer.submit(2, broken)
    writer.submit(*job(3))
    disk.gate.set()
    writer.drain()
    assert (
        disk.groups == [[0], [1]]
        and writer.failed_at == 2
        and isinstance(writer.error, ZeroDivisionError)
    )


@pytest.mark.parametrize("depth", [0, 2])
def test_drain_commits_everything_submitted(depth) -> None:
    disk = FakeDisk()
    disk.gate.set()
    writer = BackgroundWriter("test writer", depth, disk.commit)
    for step in range(7):
        writer.submit(*job(step))
    writer.drain()
    assert [s for g in disk.groups for s in g] == list(range(7)) and writer.committed == 6


def test_a_snapshot_s_commit_is_made_as_it_is_taken_not_after_the_group_waited() -> None:
    disk = FakeDisk()
    disk.gate.set()
    made = threading.Event()
    writer = BackgroundWriter("test writer", 3, disk.commit, linger=30.0)

    def make() -> Commit:
        made.set()
        return Commit(0)

    writer.submit(0, make)
    assert made.wait(timeout=10)  # made (its check run) while the group still waits for more
    assert disk.groups == []
    writer.drain()
    assert disk.groups == [[0]]
