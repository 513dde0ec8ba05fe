"""The recorder's background writer: same bytes, same order, group commit, bounded memory, host
copies."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from bisect_repro import Recorder, RecordOptions, Run
from bisect_repro.record.recipe import build
from bisect_repro.store import writer as store
from tests.durability import DiskModel, check_every_commit

OPTIONS = {"steps": 12, "every": 2, "checkpoint_every": 4}


def run_mlp(examples, out, depth, **options):
    trainee = build(f"{examples / 'mlp.py'}:build", {"hidden": 16})
    with Recorder(
        out, trainee, RecordOptions(**{**OPTIONS, **options}), max_pending_writes=depth
    ) as recorder:
        for batch in recorder.batches():
            recorder.log(trainee.step(batch))  # type: ignore[misc]
    return Run.open(out)


def test_background_writes_the_bytes_the_synchronous_writer_writes(
    examples, tmp_path, monkeypatch
) -> None:
    sync = run_mlp(examples, tmp_path / "sync", depth=0)
    slow = store.RunWriter.commit_group

    def lagging(self, commits):  # the training runs ahead and changes its tensors meanwhile
        time.sleep(0.02)
        return slow(self, commits)

    monkeypatch.setattr(store.RunWriter, "commit_group", lagging)
    background = run_mlp(examples, tmp_path / "background", depth=2)
    for name in ("steps.jsonl", "index.jsonl"):
        assert (tmp_path / "sync" / "rank0" / name).read_bytes() == (
            tmp_path / "background" / "rank0" / name
        ).read_bytes(), name
    for entry in [*sync.snapshots.values(), *sync.checkpoints.values()]:
        assert (sync.path / "rank0" / entry.file).read_bytes() == (
            background.path / "rank0" / entry.file
        ).read_bytes(), entry.file
    assert background.complete and sorted(background.checkpoints) == [0, 4, 8, 12]


@pytest.mark.parametrize("depth", [0, 2, 5])
def test_every_index_line_comes_after_what_it_covers_is_durable(
    examples, tmp_path, monkeypatch, depth
) -> None:
    model = DiskModel(monkeypatch, tmp_path / "r")
    written = check_every_commit(monkeypatch, model)
    run = run_mlp(examples, tmp_path / "r", depth=depth, every=1)
    lines = [(line["kind"], line["step"]) for group in written for line in group]
    expected = [("snapshot", s) for s in range(13)]
    for step in (0, 4, 8, 12):
        expected.insert(expected.index(("snapshot", step)) + 1, ("checkpoint", step))
    assert lines == [*expected, ("end", 12)]  # in step order, each snapshot before its checkpoint
    assert (
        run.complete
        and sorted(run.snapshots) == list(range(13))
        and sorted(run.steps) == list(range(12))
    )
    if depth == 0:
        assert len(written) == 14  # on the training thread: one commit per snapshot, and the end


def test_snapshots_waiting_together_are_committed_together(examples, tmp_path, monkeypatch) -> None:
    gate = hold_writes(monkeypatch)
    groups: list[list[int]] = []
    held = store.RunWriter.commit_group

    def noted(self, commits):
        # the end line may join the last group
        groups.append([c.step for c in commits if not c.end])
        return held(self, commits)

    monkeypatch.setattr(store.RunWriter, "commit_group", noted)
    trainee = build(f"{examples / 'mlp.py'}:build", {"hidden": 16})
    with Recorder(
        tmp_path / "r", trainee, RecordOptions(steps=8, every=1), max_pending_writes=4
    ) as recorder:
        for batch in recorder.batches():
            recorder.log(trainee.step(batch))  # type: ignore[misc]
            # snapshots 0 to 4 are taken, every slot: the first group is held, the rest wait
            if recorder.step == 4:
                gate.set()
    assert [s for g in groups for s in g] == list(range(9)) and max(len(g) for g in groups) > 1
    # fewer commits than snapshots: their fsyncs were shared
    assert len([g for g in groups if g]) < 9
    assert Run.open(tmp_path / "r").complete


def hold_writes(monkeypatch) -> threading.Event:
    """Every write waits until the returned event is set: a disk that has stopped answering."""
    gate = threading.Event()
    written = store.RunWriter.commit_group

    def held(self, commits):
        gate.wait(timeout=30)
        return written(self, commits)

    monkeypatch.setattr(store.RunWriter, "commit_group", held)
    return gate


def test_a_slow_disk_makes_training_wait_instead_of_memory_grow(
    examples, tmp_path, monkeypatch
) -> None:
    gate = hold_writes(monkeypatch)
    trainee = build(f"{examples / 'mlp.py'}:build", {"hidden": 16})
    recorder = Recorder(
        tmp_path / "r", trainee, RecordOptions(steps=20, every=1), max_pending_writes=2
    )

    def train() -> None:
        with recorder:
            for batch in recorder.batches():
                recorder.log(trainee.step(batch))  # type: ignore[misc]

    thread = threading.Thread(target=train)
    thread.start()
    deadline = time.monotonic() + 30  # a loaded machine may take a while to get there
    while recorder.step < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # and it must stay there
    # snapshots 0 to 2 are taken (0 is being written, 1 with it or waiting, 2 waiting), snapshot 3
    # waits for room
    assert recorder.step == 3 and thread.is_alive()
    gate.set()
    thread.join(timeout=60)
    run = Run.open(tmp_path / "r")
    assert run.complete and sorted(run.snapshots) == list(range(21))


def test_close_waits_for_every_queued_write(examples, tmp_path, monkeypatch) -> None:
    written = store.RunWriter.commit_group

    def slow(self, commits):
        time.sleep(0.05)
        return written(self, commits)

    monkeypatch.setattr(store.RunWriter, "commit_group", slow)
    run = run_mlp(examples, tmp_path / "r", depth=3, every=1)
    assert run.complete and sorted(run.snapshots) == list(range(13))
    for step in run.snapshots:
        run.snapshot(step)


def test_the_queued_checkpoint_is_the_state_at_its_step_not_later(
    examples, tmp_path, monkeypatch
) -> None:
    gate = hold_writes(monkeypatch)
    trainee = build(f"{examples / 'mlp.py'}:build", {"hidden": 16})
    with Recorder(
        tmp_path / "r", trainee, RecordOptions(steps=3, every=10), max_pending_writes=2
    ) as recorder:
        at_zero = {k: v.clone() for k, v in trainee.model.state_dict().items()}
        for batch in recorder.batches():
            recorder.log(trainee.step(batch))  # type: ignore[misc]
            if recorder.step == 2:
                gate.set()
    checkpoint = Run.open(tmp_path / "r").checkpoint(0)
    assert all(torch.equal(checkpoint["model"][k], v) for k, v in at_zero.items())
    assert not all(torch.equal(trainee.model.state_dict()[k], v) for k, v in at_zero.items())


def test_the_writer_thread_is_gone_after_close(examples, tmp_path) -> None:
    before = {t.name for t in threading.enumerate()}
    run_mlp(examples, tmp_path / "r", depth=2)
    assert {t.name for t in threading.enumerate()} - before == set()


@pytest.mark.parametrize("depth", [-1])
def test_a_negative_queue_is_refused(examples, tmp_path, depth) -> None:
    from bisect_repro.errors import BisectReproError

    with pytest.raises(BisectReproError, match="max_pending_writes"):
        run_mlp(examples, tmp_path / "r", depth=depth)
