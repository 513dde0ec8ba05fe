from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from bisect_repro.errors import (
    RecordingError,
    RunExistsError,
    RunFormatError,
    RunLockedError,
    RunNotFoundError,
)
from bisect_repro.store import run as store
from bisect_repro.store.run import Run
from bisect_repro.store.writer import RunWriter
from tests import fakes
from tests.fakes import fake_ranks


def make_run(path: Path, steps: int = 3) -> RunWriter:
    writer = RunWriter.create(path, {"target": "t", "config": {}})
    for step in range(steps):
        writer.append_steps([{"step": step, "loss": 1.0 / (step + 1), "order": None, "batch": "b"}])
        writer.commit(
            "snapshot",
            step,
            {"step": step, "hashes": {"w": str(step)}, "t": torch.full((2,), float(step))},
        )
    return writer


def test_written_run_reads_back(tmp_path) -> None:
    writer = make_run(tmp_path / "r")
    writer.finish(3)
    run = Run.open(tmp_path / "r")
    assert run.complete and sorted(run.snapshots) == [0, 1, 2] and run.last_step == 2
    assert torch.equal(run.snapshot(1)["t"], torch.ones(2))
    assert run.losses()[1] == 0.5


def test_refuses_to_overwrite_without_force(tmp_path) -> None:
    make_run(tmp_path / "r")
    with pytest.raises(RunExistsError, match="--force"):
        RunWriter.create(tmp_path / "r", {})
    RunWriter.create(tmp_path / "r", {}, force=True)
    assert Run.open(tmp_path / "r").snapshots == {}


def test_force_never_deletes_a_folder_that_is_not_a_run(tmp_path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(RunExistsError, match="not a bisect-repro run"):
        RunWriter.create(tmp_path / "mine", {}, force=True)
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"


def test_a_write_interrupted_before_its_rename_leaves_the_previous_state(
    tmp_path, monkeypatch
) -> None:
    writer = make_run(tmp_path / "r", steps=2)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed before the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        writer.commit("snapshot", 2, {"step": 2, "t": torch.zeros(1)})
    monkeypatch.undo()
    run = Run.open(tmp_path / "r")
    assert sorted(run.snapshots) == [0, 1]
    assert not (tmp_path / "r" / "rank0" / "snapshots" / "step-00000002.st.zst").exists()
    assert torch.equal(run.snapshot(1)["t"], torch.ones(2))


def test_file_without_index_line_is_invisible_and_torn_lines_are_skipped(tmp_path) -> None:
    writer = make_run(tmp_path / "r", steps=2)
    with open(writer.rank / "index.jsonl", "a") as handle:
        handle.write('{"kind": "snapshot", "step": 2, "fi')  # killed mid-line
    with open(writer.rank / "steps.jsonl", "a") as handle:
        handle.write('{"step": 2, "lo')
    with pytest.warns(UserWarning, match="torn"):
        run = Run.open(tmp_path / "r")
    assert sorted(run.snapshots) == [0, 1] and sorted(run.steps) == [0, 1] and not run.complete


@pytest.mark.parametrize(
    "setup, error, message",
    [
        (lambda p: None, RunNotFoundError, "no such run"),
        (lambda p: p.mkdir(), RunNotFoundError, "not a bisect-repro run"),
        (
            lambda p: (p.mkdir(), (p / "run.json").write_text("{garbage")),
            RunFormatError,
            "not valid JSON",
        ),
        (
            lambda p: (p.mkdir(), (p / "run.json").write_text('{"format": 99}')),
            RunFormatError,
            "newer",
        ),
        (lambda p: (p.mkdir(), (p / "run.json").write_text("[1]")), RunFormatError, "no format"),
    ],
)
def test_bad_runs_get_one_line_errors_naming_the_file(tmp_path, setup, error, message) -> None:
    path = tmp_path / "bad"
    setup(path)
    with pytest.raises(error, match=message) as caught:
        Run.open(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_missing_snapshot_file_is_named(tmp_path) -> None:
    writer = make_run(tmp_path / "r")
    (writer.rank / "snapshots" / "step-00000001.st.zst").unlink()
    with pytest.raises(RunFormatError, match="missing"):
        Run.open(tmp_path / "r").snapshot(1)


def test_no_pickle_is_ever_used_to_read_or_write(tmp_path, monkeypatch) -> None:
    def forbidden(*args, **kwargs):
        raise AssertionError("pickle used")

    for name in ("load", "loads", "dump", "dumps"):
        monkeypatch.setattr(pickle, name, forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(torch, "save", forbidden)
    make_run(tmp_path / "r").finish(3)
    run = Run.open(tmp_path / "r")
    for step in run.snapshots:
        run.snapshot(step)
    for file in (tmp_path / "r").rglob("*"):
        if file.is_file() and file.suffix == ".zst":
            assert file.read_bytes()[:4] == b"\x28\xb5\x2f\xfd"  # a zstandard frame, not a pickle
        elif file.is_file() and file.name != ".lock":
            for line in file.read_text().splitlines():
                json.loads(line) if file.suffix == ".jsonl" else None
    assert json.loads((tmp_path / "r" / "run.json").read_text())["format"] == store.FORMAT


# -- distributed runs: one folder per rank -------------------------------------------------


def test_a_world_size_beyond_any_run_is_refused_when_read(tmp_path) -> None:
    """Every reader walks a run's ranks: the count read from run.json is bounded before it drives a
    loop."""
    run_path = fake_ranks(tmp_path / "r", {0: {0: {"w": "a"}}, 1: {0: {"w": "a"}}})
    meta = json.loads((run_path / "run.json").read_text())
    meta["distributed"]["world_size"] = 10**12
    (run_path / "run.json").write_text(json.dumps(meta))
    with pytest.raises(RunFormatError, match=r"world_size.*above"):
        Run.open(run_path)


def test_a_distributed_run_has_a_folder_per_rank_and_is_format_2(tmp_path) -> None:
    run_path = fake_ranks(
        tmp_path / "r", {0: {0: {"w": "a"}, 2: {"w": "b"}}, 1: {0: {"w": "a"}, 2: {"w": "c"}}}
    )
    assert json.loads((run_path / "run.json").read_text())["format"] == store.DISTRIBUTED_FORMAT
    run = Run.open(run_path)
    assert (run.rank, run.world_size, run.layout) == (0, 2, "ddp")
    other = run.open_rank(1)
    assert (
        other.rank == 1 and other.rank_meta.rank == 1 and other.snapshot(2)["hashes"] == {"w": "c"}
    )
    assert Run.open(run_path, 1).snapshot(2)["hashes"] == {"w": "c"} and other.complete
    with pytest.raises(RunNotFoundError, match="has no rank 2"):
        run.open_rank(2)


def test_a_missing_or_foreign_rank_folder_is_one_line(tmp_path) -> None:
    run_path = fake_ranks(tmp_path / "r", {0: {0: {"w": "a"}}, 1: {0: {"w": "a"}}})
    (run_path / "rank1" / "rank.json").write_text(json.dumps({"rank": 0}))
    with pytest.raises(RunFormatError, match="does not describe rank 1"):
        Run.open(run_path, 1)
    (run_path / "rank1" / "rank.json").unlink()
    with pytest.raises(RunFormatError, match=r"rank\.json: missing"):
        Run.open(run_path, 1)
    shutil.rmtree(run_path / "rank1")
    with pytest.raises(RunFormatError, match="rank 1 of 2 has no records"):
        Run.open(run_path, 1)
    assert Run.open(run_path).rank == 0  # the other ranks still read


def test_each_rank_folder_has_one_writer_and_force_waits_for_them(tmp_path) -> None:
    meta = fakes.distributed_meta(2)
    first = RunWriter.create(tmp_path / "r", meta, rank_meta={"rank": 0})
    second = RunWriter.join(tmp_path / "r", 1, {"rank": 1})
    with pytest.raises(RunLockedError, match="another recorder"):
        RunWriter.join(tmp_path / "r", 1, {"rank": 1})
    first.close()
    with pytest.raises(RunLockedError):  # rank 1 still writes: its folder is not deleted under it
        RunWriter.create(tmp_path / "r", meta, force=True, rank_meta={"rank": 0})
    assert Run.open(tmp_path / "r").rank_meta.rank == 0  # nothing was deleted
    second.close()
    RunWriter.create(tmp_path / "r", meta, force=True, rank_meta={"rank": 0}).close()
    assert not (tmp_path / "r" / "rank1").exists()
    with pytest.raises(RecordingError, match="cannot join"):
        RunWriter.join(tmp_path / "r", 2, {"rank": 2})


def test_a_single_process_run_stays_format_1_without_rank_metadata(tmp_path) -> None:
    make_run(tmp_path / "r").finish(3)
    run = Run.open(tmp_path / "r")
    assert (
        run.meta.format == 1
        and run.distributed is None
        and run.world_size == 1
        and run.rank_meta is None
    )
    assert sorted(p.name for p in (tmp_path / "r" / "rank0").iterdir()) == [
        "checkpoints",
        "index.jsonl",
        "snapshots",
        "steps.jsonl",
    ]
