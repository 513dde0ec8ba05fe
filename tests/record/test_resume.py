"""Resuming an interrupted run in its own directory: the result equals the uninterrupted run."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bisect_repro import Recorder, RecordOptions, Run, record
from bisect_repro.cli import app
from bisect_repro.errors import BisectReproError, RecordingError
from bisect_repro.record.recipe import build
from bisect_repro.store import writer as store

runner = CliRunner()
OPTIONS = {"steps": 30, "every": 3, "checkpoint_every": 9}


class Interrupted(Exception):
    pass


def interrupted_run(examples, out: Path, at: int, name: str = "mlp.py", **config) -> None:
    """Record until step ``at`` and die there, as a killed process would (nothing closes the
    run)."""
    config = {"hidden": 16, **config} if name == "mlp.py" else config
    trainee = build(f"{examples / name}:build", config)
    with (
        pytest.raises(Interrupted),
        Recorder(out, trainee, RecordOptions(**OPTIONS), config=config) as recorder,
    ):
        for batch in recorder.batches():
            if recorder.step == at:
                raise Interrupted
            recorder.log(trainee.step(batch))  # type: ignore[misc]


def resume(examples, out: Path, name: str = "mlp.py", **config) -> Run:
    config = {"hidden": 16, **config} if name == "mlp.py" else config
    trainee = build(f"{examples / name}:build", config)
    record(trainee, out, RecordOptions(**OPTIONS), resume=True, config=config)
    return Run.open(out)


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Run:
    examples = Path(__file__).resolve().parents[2] / "examples"
    trainee = build(f"{examples / 'mlp.py'}:build", {"hidden": 16})
    return Run.open(
        record(trainee, tmp_path_factory.mktemp("whole") / "run", RecordOptions(**OPTIONS))
    )


def assert_equal_runs(resumed: Run, whole: Run) -> None:
    assert resumed.complete
    assert sorted(resumed.snapshots) == sorted(whole.snapshots)
    assert sorted(resumed.checkpoints) == sorted(whole.checkpoints)
    for step in whole.snapshots:
        assert resumed.snapshot(step)["hashes"] == whole.snapshot(step)["hashes"], f"step {step}"
        position = ("epoch", "batch", "base_seed")
        assert [resumed.snapshot(step)["data"][k] for k in position] == [
            whole.snapshot(step)["data"][k] for k in position
        ]
    assert resumed.steps == whole.steps  # loss, data order and batch hash of every step


@pytest.mark.parametrize("at", [1, 9, 10, 17, 29])
def test_resumed_run_equals_the_uninterrupted_one(examples, tmp_path, whole, at) -> None:
    interrupted_run(examples, tmp_path / "r", at)
    before = Run.open(tmp_path / "r")
    assert not before.complete
    resumed = resume(examples, tmp_path / "r")
    assert_equal_runs(resumed, whole)
    last_checkpoint = max(before.checkpoints)
    assert resumed.meta.resumes[0].step == last_checkpoint


def test_resume_keeps_what_it_drops(examples, tmp_path, whole) -> None:
    interrupted_run(examples, tmp_path / "r", 17)  # checkpoint 9, snapshots up to 15
    resume(examples, tmp_path / "r")
    kept = tmp_path / "r" / "rank0" / "superseded" / "resume-001"
    dropped = [json.loads(line) for line in (kept / "index.jsonl").read_text().splitlines()]
    assert [(d["kind"], d["step"]) for d in dropped] == [("snapshot", 12), ("snapshot", 15)]
    assert [
        json.loads(line)["step"] for line in (kept / "steps.jsonl").read_text().splitlines()
    ] == list(range(9, 15))
    assert sorted(p.name for p in (kept / "snapshots").iterdir()) == [
        "step-00000012.st.zst",
        "step-00000015.st.zst",
    ]


def test_resume_after_a_crash_during_resume(examples, tmp_path, whole, monkeypatch) -> None:
    interrupted_run(examples, tmp_path / "r", 20)
    atomic = store.write_atomic

    def crash_on_steps(folder, name, data):
        if name == "steps.jsonl" and folder.path.name == "rank0":
            raise KeyboardInterrupt  # killed after the index was rewritten, before the step log was
        return atomic(folder, name, data)

    monkeypatch.setattr(store, "write_atomic", crash_on_steps)
    with pytest.raises(KeyboardInterrupt):
        resume(examples, tmp_path / "r")
    monkeypatch.undo()
    halfway = Run.open(tmp_path / "r")
    # readable, extra step lines only
    assert max(halfway.snapshots) == 18 and max(halfway.steps) == 17
    assert_equal_runs(resume(examples, tmp_path / "r"), whole)


def test_a_damaged_last_checkpoint_falls_back_to_the_one_before(examples, tmp_path, whole) -> None:
    interrupted_run(examples, tmp_path / "r", 20)
    damaged = tmp_path / "r" / "rank0" / "checkpoints" / "step-00000018.st.zst"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x40
    damaged.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="step-00000018.*checksum.*earlier checkpoint"):
        resumed = resume(examples, tmp_path / "r")
    assert resumed.meta.resumes[0].step == 9
    assert_equal_runs(resumed, whole)


def test_a_write_failure_while_resuming_leaves_the_run_as_it_was(
    examples, tmp_path, monkeypatch
) -> None:
    interrupted_run(examples, tmp_path / "r", 20)
    index = (tmp_path / "r" / "rank0" / "index.jsonl").read_bytes()
    replace = os.replace

    def full(source, target, **folders):
        if str(target) == "index.jsonl":
            raise OSError(28, "No space left on device", str(target))
        return replace(source, target, **folders)

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(
        RecordingError, match="cannot resume the run: No space left on device"
    ) as caught:
        resume(examples, tmp_path / "r")
    assert "\n" not in str(caught.value)
    monkeypatch.undo()
    assert (tmp_path / "r" / "rank0" / "index.jsonl").read_bytes() == index


def test_resume_refuses_other_options_a_complete_run_and_a_run_without_checkpoint(
    examples, tmp_path, whole
) -> None:
    interrupted_run(examples, tmp_path / "r", 12)
    trainee = build(f"{examples / 'mlp.py'}:build", {"hidden": 16})
    with pytest.raises(
        BisectReproError, match=r"recorded with --every 3, not 5; resume with the same options"
    ):
        Recorder(tmp_path / "r", trainee, RecordOptions(**{**OPTIONS, "every": 5}), resume=True)
    with pytest.raises(BisectReproError, match=r"recorded with --set"):
        Recorder(
            tmp_path / "r", trainee, RecordOptions(**OPTIONS), resume=True, config={"hidden": 32}
        )
    with pytest.raises(RecordingError, match="complete; nothing to resume"):
        Recorder(whole.path, trainee, resume=True)
    writer = store.RunWriter.create(tmp_path / "fresh", {"options": {**OPTIONS, "start_step": 0}})
    writer.close()  # killed before its first commit
    with pytest.raises(RecordingError, match="no readable checkpoint"):
        Recorder(tmp_path / "fresh", trainee, resume=True)
    with pytest.raises(BisectReproError, match="no such run"):
        Recorder(tmp_path / "nothing", trainee, resume=True)
    # the refusals released the lock; options default to the run's
    Recorder(tmp_path / "r", trainee, resume=True).close()


def test_resuming_a_run_that_was_itself_started_from_another_keeps_its_schedule(
    examples, tmp_path, whole
) -> None:
    trainee = build(f"{examples / 'mlp.py'}:build", {"hidden": 16})
    with (
        pytest.raises(Interrupted),
        Recorder(
            tmp_path / "r", trainee, RecordOptions(**OPTIONS), resume_from=(whole.path, 9)
        ) as rec,
    ):
        for batch in rec.batches():
            if rec.step == 25:
                raise Interrupted
            rec.log(trainee.step(batch))  # type: ignore[misc]
    record(
        build(f"{examples / 'mlp.py'}:build", {"hidden": 16}),
        tmp_path / "r",
        RecordOptions(**OPTIONS),
        resume=True,
    )
    resumed = Run.open(tmp_path / "r")
    assert sorted(resumed.snapshots) == [s for s in sorted(whole.snapshots) if s >= 9]
    for step in resumed.snapshots:
        assert resumed.snapshot(step)["hashes"] == whole.snapshot(step)["hashes"]


def test_cnn_with_workers_resumes_exactly(examples, tmp_path) -> None:
    trainee = build(f"{examples / 'cnn.py'}:build", {"num_workers": 2})
    reference = Run.open(
        record(trainee, tmp_path / "whole", RecordOptions(**{**OPTIONS, "steps": 22}))
    )
    trainee = build(f"{examples / 'cnn.py'}:build", {"num_workers": 2})
    with (
        pytest.raises(Interrupted),
        Recorder(tmp_path / "r", trainee, RecordOptions(**{**OPTIONS, "steps": 22})) as recorder,
    ):
        for batch in recorder.batches():
            if recorder.step == 20:  # past the first epoch (16 batches)
                raise Interrupted
            recorder.log(trainee.step(batch))  # type: ignore[misc]
    trainee = build(f"{examples / 'cnn.py'}:build", {"num_workers": 2})
    record(trainee, tmp_path / "r", RecordOptions(**{**OPTIONS, "steps": 22}), resume=True)
    resumed = Run.open(tmp_path / "r")
    assert resumed.complete and sorted(resumed.snapshots) == sorted(reference.snapshots)
    for step in reference.snapshots:
        assert resumed.snapshot(step)["hashes"] == reference.snapshot(step)["hashes"], step


def test_cli_resume(examples, tmp_path, whole) -> None:
    interrupted_run(examples, tmp_path / "r", 14)
    args = [
        "record",
        f"{examples / 'mlp.py'}:build",
        "--out",
        str(tmp_path / "r"),
        "--steps",
        "30",
        "--every",
        "3",
    ]
    args += ["--checkpoint-every", "9", "--set", "hidden=16", "--quiet"]
    plain = runner.invoke(app, args)
    assert plain.exit_code == 2 and "--resume to continue it" in plain.stderr
    both = runner.invoke(app, [*args, "--resume", "--force"])
    assert both.exit_code == 2 and "not both" in both.stderr
    other = runner.invoke(
        app, [*args[:-5], "--checkpoint-every", "10", "--set", "hidden=16", "--resume"]
    )
    assert other.exit_code == 2 and "--checkpoint-every 9, not 10" in other.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # resuming a run killed between commits warns about nothing
        result = runner.invoke(app, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    assert_equal_runs(Run.open(tmp_path / "r"), whole)
    compared = runner.invoke(app, ["compare", str(whole.path), str(tmp_path / "r"), "--json"])
    # and compare says so
    assert compared.exit_code == 0 and json.loads(compared.stdout)["identical"], compared.output
    again = runner.invoke(app, [*args, "--resume"])
    assert again.exit_code == 2 and "nothing to resume" in again.stderr
