"""Group commit (``bisect_repro.store.commit``): its writes and fsyncs in an order that a crash at
any moment leaves only whole commits, checked against a model of what a crash keeps
(``tests/durability.py``); a failure commits what came before it and nothing after."""

from __future__ import annotations

import errno
import os
import warnings
from pathlib import Path

import pytest
import torch

from bisect_repro.store import codec
from bisect_repro.store import commit as group
from bisect_repro.store.commit import Commit, GroupCommitError
from bisect_repro.store.run import Run
from bisect_repro.store.writer import RunWriter
from tests.durability import DiskModel, check_every_commit


def step_lines(first: int, end: int) -> list[dict]:
    return [{"step": s, "loss": 1.0, "order": None, "batch": "b"} for s in range(first, end)]


def commits(
    steps: list[int],
    checkpoints: tuple[int, ...] = (),
    end: bool = False,
    previous: int | None = None,
) -> list[Commit]:
    """One commit per snapshot step, with the step lines since the previous snapshot (``previous``,
    for the first); a checkpoint at ``checkpoints``."""
    made, previous = [], steps[0] if previous is None else previous
    for step in steps:
        tree = {
            "step": step,
            "hashes": {"w": str(step)},
            "streams": {},
            "data": {},
            "t": torch.full((64,), float(step)),
        }
        files = [("snapshot", codec.prepare(tree))]
        if step in checkpoints:
            files.append(
                ("checkpoint", codec.prepare({"model": {"w": torch.full((256,), float(step))}}))
            )
        made.append(Commit(step, step_lines(previous, step), files))
        previous = step
    if end:
        made.append(Commit(steps[-1], end=True))
    return made


def open_quietly(path: Path) -> Run:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torn last line warns
        return Run.open(path)


def assert_whole(path: Path) -> Run:
    """The run reads, every file its index names reads whole, and every step before its last
    committed snapshot is logged."""
    run = open_quietly(path)
    for step in run.snapshots:
        assert run.snapshot(step)["hashes"] == {"w": str(step)}
    for step in run.checkpoints:
        assert torch.equal(run.checkpoint(step)["model"]["w"], torch.full((256,), float(step)))
    if run.snapshots:
        assert set(range(max(run.snapshots))) <= set(run.steps)
    return run


def test_a_group_is_committed_in_step_order_with_one_fsync_per_log_and_folder(
    tmp_path, monkeypatch
) -> None:
    model = DiskModel(monkeypatch, tmp_path / "r")
    writer = RunWriter.create(tmp_path / "r", {"target": "t", "config": {}})
    written = check_every_commit(monkeypatch, model)
    del model.events[:]
    writer.commit_group(commits([0, 1, 2, 3], checkpoints=(0, 2), end=True))
    assert [[(line["kind"], line["step"]) for line in lines] for lines in written] == [
        [
            ("snapshot", 0),
            ("checkpoint", 0),
            ("snapshot", 1),
            ("snapshot", 2),
            ("checkpoint", 2),
            ("snapshot", 3),
            ("end", 3),
        ]
    ]
    fsyncs = [path for kind, path in model.events if kind == "fsync"]
    files = [
        f"rank0/{folder}/.step-{s:08d}.st.zst.tmp"
        for s, folder in [(0, "snapshots"), (0, "checkpoints"), (1, "snapshots")]
    ]
    files += [
        f"rank0/{folder}/.step-{s:08d}.st.zst.tmp"
        for s, folder in [(2, "snapshots"), (2, "checkpoints"), (3, "snapshots")]
    ]
    assert fsyncs == [
        *files,
        "rank0/steps.jsonl",
        "rank0/snapshots",
        "rank0/checkpoints",
        "rank0/index.jsonl",
    ]
    run = assert_whole(tmp_path / "r")
    assert (
        run.complete and sorted(run.snapshots) == [0, 1, 2, 3] and sorted(run.checkpoints) == [0, 2]
    )


@pytest.mark.parametrize("durable", [True, False], ids=["power-cut", "killed"])
def test_a_crash_at_any_moment_of_a_group_leaves_only_whole_commits(
    tmp_path, monkeypatch, durable
) -> None:
    # from the start: everything made durable is known
    model = DiskModel(monkeypatch, tmp_path / "r")
    writer = RunWriter.create(tmp_path / "r", {"target": "t", "config": {}})
    writer.commit_group(commits([0], checkpoints=(0,)))
    seen: list[list[int]] = []

    def crash_now() -> None:
        run = assert_whole(model.crashed(tmp_path / f"crash-{len(seen)}", durable=durable))
        seen.append(sorted(run.snapshots))

    model.on_event = crash_now
    check_every_commit(monkeypatch, model)
    writer.commit_group(commits([2, 3, 4], checkpoints=(4,), previous=0))
    writer.commit_group([Commit(4, end=True)])
    assert len(seen) >= 10  # a crash tried at every fsync and rename
    assert all(found in ([0], [0, 2, 3, 4]) for found in seen), seen  # the group is all or nothing
    assert seen[-1] == [0, 2, 3, 4] and open_quietly(tmp_path / "r").complete


def enospc(path: object = "") -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def test_a_file_that_cannot_be_written_commits_what_came_before_it_and_nothing_after(
    tmp_path, monkeypatch
) -> None:
    model = DiskModel(monkeypatch, tmp_path / "r")
    writer = RunWriter.create(tmp_path / "r", {"target": "t", "config": {}})
    write = group.write_temporary

    def failing(folder, name: str, data: bytes) -> str:
        if name == "step-00000002.st.zst" and folder.path.name == "checkpoints":
            raise enospc(folder.path / name)
        return write(folder, name, data)

    monkeypatch.setattr(group, "write_temporary", failing)
    check_every_commit(monkeypatch, model)
    with pytest.raises(GroupCommitError) as caught:
        writer.commit_group(commits([0, 1, 2, 3], checkpoints=(0, 2)))
    # snapshot 2 is committed, its checkpoint is not
    assert caught.value.step == 2 and caught.value.committed == 2
    assert (
        isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == errno.ENOSPC
    )
    run = assert_whole(tmp_path / "r")
    assert sorted(run.snapshots) == [0, 1, 2] and sorted(run.checkpoints) == [0]
    assert sorted(run.steps) == [0, 1]  # nothing of snapshot 3: not even its step lines
    assert list((tmp_path / "r").rglob("*.tmp")) == []


def test_a_rename_that_fails_commits_the_files_before_it(tmp_path, monkeypatch) -> None:
    model = DiskModel(monkeypatch, tmp_path / "r")
    writer = RunWriter.create(tmp_path / "r", {"target": "t", "config": {}})
    replace = os.replace

    def failing(source: object, target: object, **folders: int) -> None:
        if Path(str(target)).name == "step-00000003.st.zst":
            raise enospc(target)
        replace(source, target, **folders)

    monkeypatch.setattr(os, "replace", failing)
    check_every_commit(monkeypatch, model)
    with pytest.raises(GroupCommitError) as caught:
        writer.commit_group(commits([0, 1, 3, 5]))
    assert (caught.value.step, caught.value.committed) == (3, 1)
    run = assert_whole(tmp_path / "r")
    assert (
        sorted(run.snapshots) == [0, 1]
        and not (tmp_path / "r" / "rank0" / "snapshots" / "step-00000005.st.zst").exists()
    )
    assert list((tmp_path / "r").rglob("*.tmp")) == []


def test_a_failed_fsync_before_the_index_commits_nothing_of_the_group(
    tmp_path, monkeypatch
) -> None:
    writer = RunWriter.create(tmp_path / "r", {"target": "t", "config": {}})
    writer.commit_group(commits([0]))
    fsync = os.fsync

    def failing(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("steps.jsonl"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(GroupCommitError) as caught:
        writer.commit_group(commits([1, 2], previous=0))
    assert (caught.value.step, caught.value.committed) == (1, None)
    assert sorted(assert_whole(tmp_path / "r").snapshots) == [0]
