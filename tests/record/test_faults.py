"""Faults while recording: disk full, permission denied, a file removed underneath, a file too
large.

Each fault is injected where the operating system would report it (``open``, ``os.replace``, a
write), or made real where an unprivileged test can (a removed directory, ``RLIMIT_FSIZE``).
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bisect_repro import Recorder, RecordOptions, Run, record
from bisect_repro.cli import app
from bisect_repro.errors import BisectReproError, RecordingError, RunLockedError
from bisect_repro.record.recipe import build
from bisect_repro.record.recorder import RecordingWarning
from bisect_repro.store import writer as store
from bisect_repro.store.anchor import Folder

runner = CliRunner()
OPTIONS = {"steps": 12, "every": 2, "checkpoint_every": 4}


class Counted:
    """A trainee's step function that counts its calls."""

    def __init__(self, trainee) -> None:
        self.trainee, self.calls, self.inner = trainee, 0, trainee.step

    def __call__(self, batch):
        self.calls += 1
        return self.inner(batch)


def mlp(examples):
    trainee = build(f"{examples / 'mlp.py'}:build", {"hidden": 16})
    counter = Counted(trainee)
    trainee.step = counter
    return trainee, counter


def fail_on(monkeypatch, fragment: str, error: OSError, *, after: int = 0) -> list[str]:
    """Make opening for writing in the store fail for paths containing ``fragment``, after ``after``
    such opens."""
    seen: list[str] = []
    opening = Folder._open

    def failing_open(self, name, flags, *args, **kwargs):
        path = str(self.path / name)
        if fragment in path and flags & (os.O_WRONLY | os.O_RDWR):
            seen.append(path)
            if len(seen) > after:
                raise error
        return opening(self, name, flags, *args, **kwargs)

    monkeypatch.setattr(Folder, "_open", failing_open)
    return seen


def enospc(path: str = "") -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


def assert_committed_prefix_intact(path: Path, clean: Run, last: int | None) -> Run:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = Run.open(path)
    assert not run.complete
    assert run.last_step == last
    for step in run.snapshots:
        assert run.snapshot(step)["hashes"] == clean.snapshot(step)["hashes"]
    for step in run.checkpoints:
        run.checkpoint(step)
    leftovers = [p.name for p in path.rglob("*.tmp")]
    assert leftovers == [], leftovers  # a failed write removes its temporary file
    return run


@pytest.fixture(scope="module")
def clean(examples_dir, tmp_path_factory) -> Run:
    trainee = build(f"{examples_dir / 'mlp.py'}:build", {"hidden": 16})
    return Run.open(
        record(trainee, tmp_path_factory.mktemp("clean") / "run", RecordOptions(**OPTIONS))
    )


@pytest.fixture(scope="module")
def examples_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("depth", [0, 2])
def test_disk_full_stops_training_with_one_line_naming_the_run_and_the_cause(
    examples, tmp_path, monkeypatch, clean, depth
) -> None:
    trainee, counter = mlp(examples)
    fail_on(monkeypatch, "snapshots/.step-00000006", enospc())
    with (
        pytest.raises(RecordingError) as caught,
        Recorder(tmp_path / "r", trainee, RecordOptions(**OPTIONS), max_pending_writes=depth) as r,
    ):
        for batch in r.batches():
            r.log(trainee.step(batch))  # type: ignore[misc]
    message = str(caught.value)
    assert (
        "\n" not in message
        and str(tmp_path / "r") in message
        and "No space left on device" in message
    )
    assert "writing step 6" in message and "--resume" in message
    assert (
        isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == errno.ENOSPC
    )
    if depth == 0:
        # stopped at once: the snapshot of step 6 is taken before its step runs
        assert counter.calls == 6
    run = assert_committed_prefix_intact(tmp_path / "r", clean, last=4)
    # step lines come first
    assert sorted(run.checkpoints) == [0, 4] and sorted(run.steps) == [0, 1, 2, 3, 4, 5]
    assert (tmp_path / "r" / ".lock").exists()
    # the lock was released
    Recorder(
        tmp_path / "r", build(f"{examples / 'mlp.py'}:build", {}), RecordOptions(force=True)
    ).close()


def test_warn_keeps_training_with_one_warning_and_recording_stopped(
    examples, tmp_path, monkeypatch, clean
) -> None:
    trainee, counter = mlp(examples)
    # the 3rd write of index lines, one commit each: snapshot 4
    fail_on(monkeypatch, "index.jsonl", enospc(), after=2)
    with (
        warnings.catch_warnings(record=True) as caught,
        Recorder(
            tmp_path / "r", trainee, RecordOptions(**OPTIONS, on_error="warn"), max_pending_writes=0
        ) as r,
    ):
        warnings.simplefilter("always")
        for batch in r.batches():
            r.log(trainee.step(batch))  # type: ignore[misc]
    ours = [w for w in caught if issubclass(w.category, RecordingWarning)]
    assert (
        len(ours) == 1
        and "No space left on device" in str(ours[0].message)
        and "training goes on" in str(ours[0].message)
    )
    assert counter.calls == 12
    run = assert_committed_prefix_intact(tmp_path / "r", clean, last=2)
    assert sorted(run.checkpoints) == [0]


def test_permission_denied_on_a_checkpoint(examples, tmp_path, monkeypatch, clean) -> None:
    trainee, _ = mlp(examples)
    fail_on(
        monkeypatch,
        "checkpoints/.step-00000008",
        PermissionError(errno.EACCES, os.strerror(errno.EACCES), "x"),
    )
    with pytest.raises(RecordingError, match="Permission denied"):
        record(trainee, tmp_path / "r", RecordOptions(**OPTIONS))
    # snapshot 8 was committed before its checkpoint
    run = assert_committed_prefix_intact(tmp_path / "r", clean, last=8)
    assert sorted(run.checkpoints) == [0, 4]


def test_a_rename_that_fails_leaves_no_file_under_its_final_name(
    examples, tmp_path, monkeypatch, clean
) -> None:
    trainee, _ = mlp(examples)
    replace = os.replace

    def failing_replace(source, target, **folders):
        if "step-00000010" in str(target):
            raise enospc(str(target))
        return replace(source, target, **folders)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(RecordingError, match="No space left"):
        record(trainee, tmp_path / "r", RecordOptions(**OPTIONS))
    assert_committed_prefix_intact(tmp_path / "r", clean, last=8)
    assert not (tmp_path / "r" / "rank0" / "snapshots" / "step-00000010.st.zst").exists()


def test_a_folder_removed_underneath_is_reported(examples, tmp_path) -> None:
    trainee, counter = mlp(examples)
    inner = counter.inner

    def step(batch):
        if counter.calls == 5:
            shutil.rmtree(tmp_path / "r" / "rank0" / "snapshots")  # someone cleans up while it runs
        return inner(batch)

    counter.inner = step
    with (
        pytest.raises(RecordingError) as caught,
        Recorder(tmp_path / "r", trainee, RecordOptions(**OPTIONS), max_pending_writes=0) as r,
    ):
        for batch in r.batches():
            r.log(trainee.step(batch))  # type: ignore[misc]
    assert "No such file or directory" in str(caught.value) and "\n" not in str(caught.value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = Run.open(tmp_path / "r")
    # checkpoints are in another folder, intact
    assert not run.complete and sorted(run.checkpoints) == [0, 4]
    for step in run.checkpoints:
        run.checkpoint(step)


def test_a_failure_to_create_the_run_is_one_line(examples, tmp_path, monkeypatch) -> None:
    trainee, counter = mlp(examples)
    fail_on(monkeypatch, "run.json", enospc())
    with pytest.raises(
        RecordingError, match="cannot create the run: No space left on device"
    ) as caught:
        record(trainee, tmp_path / "r", RecordOptions(**OPTIONS))
    assert counter.calls == 0 and "\n" not in str(caught.value)


def test_a_bug_in_the_writer_is_not_disguised_as_a_disk_fault(
    examples, tmp_path, monkeypatch
) -> None:
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(store.RunWriter, "commit_group", broken)
    trainee, _ = mlp(examples)
    with pytest.raises(ZeroDivisionError):
        record(trainee, tmp_path / "r", RecordOptions(**OPTIONS, on_error="warn"))


def test_state_that_needs_pickle_is_a_one_line_error(examples, tmp_path) -> None:
    trainee, _ = mlp(examples)
    trainee.scheduler = type(
        "Odd",
        (),
        {"state_dict": lambda self: {"f": lambda: None}, "load_state_dict": lambda self, s: None},
    )()
    with pytest.raises(
        BisectReproError, match=r"state\.scheduler\.f: a function cannot be stored without pickle"
    ):
        record(trainee, tmp_path / "r", RecordOptions(**OPTIONS))


# -- the command line ----------------------------------------------------------------------


def cli_record(examples, out: Path, *extra: str):
    args = [
        "record",
        f"{examples / 'mlp.py'}:build",
        "--out",
        str(out),
        "--steps",
        "12",
        "--every",
        "2",
        "--checkpoint-every",
        "4",
    ]
    return runner.invoke(app, [*args, "--set", "hidden=16", "--quiet", *extra])


def test_cli_disk_full_is_exit_2_and_one_line(examples, tmp_path, monkeypatch) -> None:
    fail_on(monkeypatch, "snapshots/.step-00000004", enospc())
    result = cli_record(examples, tmp_path / "r")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert str(tmp_path / "r") in lines[0] and "No space left on device" in lines[0]


def test_cli_on_error_warn_finishes_training_with_one_warning(
    examples, tmp_path, monkeypatch
) -> None:
    fail_on(monkeypatch, "snapshots/.step-00000004", enospc())
    result = cli_record(examples, tmp_path / "r", "--on-error", "warn")
    assert result.exit_code == 0, result.output
    warned = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert (
        len(warned) == 1
        and "No space left on device" in warned[0]
        and "training goes on" in warned[0]
    )
    shown = runner.invoke(app, ["show", str(tmp_path / "r")])
    assert shown.exit_code == 0 and "incomplete (last complete step 2)" in " ".join(
        shown.stdout.split()
    )


def test_cli_refuses_an_unknown_on_error(examples, tmp_path) -> None:
    result = cli_record(examples, tmp_path / "r", "--on-error", "ignore")
    assert result.exit_code == 2 and "--on-error ignore" in result.stderr


def test_a_real_file_size_limit_is_exit_2_and_one_line(examples, tmp_path) -> None:
    """A real EFBIG from the kernel: RLIMIT_FSIZE below a checkpoint's size, SIGXFSZ ignored."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, 40_000))

    args = [
        "--steps",
        "12",
        "--every",
        "2",
        "--checkpoint-every",
        "4",
        "--set",
        "hidden=64",
        "--quiet",
    ]
    command = [
        sys.executable,
        "-m",
        "bisect_repro.cli",
        "record",
        f"{examples / 'mlp.py'}:build",
        "--out",
        str(tmp_path / "r"),
        *args,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, preexec_fn=limit)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "File too large" in lines[0] and str(tmp_path / "r") in lines[0], (
        result.stderr
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = Run.open(tmp_path / "r")
    assert run.snapshots and not run.complete
    for step in run.snapshots:
        run.snapshot(step)


# -- the lock ------------------------------------------------------------------------------


def test_a_second_recorder_is_kept_out_with_the_holder_named(examples, tmp_path) -> None:
    trainee, _ = mlp(examples)
    with Recorder(tmp_path / "r", trainee, RecordOptions(**OPTIONS)) as first:
        assert (tmp_path / "r" / ".lock").read_text().strip() == str(os.getpid())
        other, _ = mlp(examples)
        with pytest.raises(RunLockedError) as caught:
            Recorder(tmp_path / "r", other, RecordOptions(**OPTIONS, force=True))
        assert str(tmp_path / "r") in str(caught.value) and f"pid {os.getpid()}" in str(
            caught.value
        )
        with pytest.raises(RunLockedError):
            Recorder(tmp_path / "r", other, resume=True)
        for batch in first.batches():
            first.log(trainee.step(batch))  # type: ignore[misc]
    assert Run.open(tmp_path / "r").complete  # the refused recorders deleted nothing
    again, _ = mlp(examples)
    record(again, tmp_path / "r", RecordOptions(**OPTIONS, force=True))  # released at close


def test_cli_names_the_process_holding_the_lock(examples, tmp_path) -> None:
    assert cli_record(examples, tmp_path / "r").exit_code == 0
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, os; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
            "f.truncate(0); f.write(str(os.getpid())); f.flush(); print('held', flush=True); "
            "sys.stdin.read()",
            str(tmp_path / "r" / ".lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        result = cli_record(examples, tmp_path / "r", "--force")
        assert result.exit_code == 2
        assert f"pid {holder.pid}" in result.stderr and "another recorder" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    finally:
        holder.kill()
        holder.wait()
    assert Run.open(tmp_path / "r").complete
