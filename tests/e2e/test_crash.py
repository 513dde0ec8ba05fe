"""Crash consistency: ``bisect-repro record`` killed with SIGKILL at moments spread over a run.

Each trial starts the command line in a subprocess and kills it when the run's index has reached
a chosen number of lines (plus a random few milliseconds), or the moment a checkpoint is being
written (its temporary file exists). Two trials run at a time. Afterwards:

- no file is visible under its final name half-written (every ``*.st.zst`` decodes completely);
- ``Run.open`` reads the run and every committed snapshot and checkpoint, every step before the
  last committed snapshot is logged, and ``show --json`` reports the run incomplete with that
  last complete step;
- for the first three trials that have a checkpoint and did not finish, ``record --resume``
  finishes the run, and it equals an uninterrupted run of the same recipe, hash for hash.

``BISECT_REPRO_CRASH_TRIALS`` sets the number of trials (default 8).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import zstandard
from typer.testing import CliRunner

from bisect_repro import RecordOptions, Run, record
from bisect_repro.cli import app
from bisect_repro.record.recipe import build
from bisect_repro.store import codec

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
TRIALS = int(os.environ.get("BISECT_REPRO_CRASH_TRIALS", "8"))
STEPS, EVERY, CHECKPOINT_EVERY, HIDDEN = 24, 2, 4, 256
OPTIONS = [
    "--steps",
    str(STEPS),
    "--every",
    str(EVERY),
    "--checkpoint-every",
    str(CHECKPOINT_EVERY),
    "--set",
    f"hidden={HIDDEN}",
]
# snapshots, checkpoints, end
INDEX_LINES = (STEPS // EVERY + 1) + (STEPS // CHECKPOINT_EVERY + 1) + 1
runner = CliRunner()


@dataclass
class Trial:
    number: int
    out: Path
    trigger: str
    returncode: int | None = None
    killed_mid_checkpoint: bool = False


def index_lines(out: Path) -> int:
    try:
        return (out / "rank0" / "index.jsonl").read_bytes().count(b"\n")
    except OSError:
        return 0


def checkpoint_being_written(out: Path) -> bool:
    try:
        return any(
            entry.name.endswith(".tmp") for entry in os.scandir(out / "rank0" / "checkpoints")
        )
    except OSError:
        return False


def run_trial(trial: Trial) -> Trial:
    rng = random.Random(trial.number)
    command = [
        sys.executable,
        "-m",
        "bisect_repro.cli",
        "record",
        f"{EXAMPLES / 'mlp.py'}:build",
        "--out",
        str(trial.out),
        *OPTIONS,
    ]
    process = subprocess.Popen(
        [*command, "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    if trial.trigger == "checkpoint":
        target = lambda: checkpoint_being_written(trial.out)  # noqa: E731
        delay = 0.0
    else:
        lines = int(trial.trigger.split(":")[1])
        target = lambda: index_lines(trial.out) >= lines  # noqa: E731
        delay = rng.uniform(0, 0.02)
    deadline = time.monotonic() + 60
    while process.poll() is None and not target() and time.monotonic() < deadline:
        time.sleep(0.0005)
    if delay:
        time.sleep(delay)
    trial.killed_mid_checkpoint = checkpoint_being_written(trial.out)
    process.send_signal(signal.SIGKILL)
    process.wait()
    trial.returncode = process.returncode
    return trial


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Run:
    trainee = build(f"{EXAMPLES / 'mlp.py'}:build", {"hidden": HIDDEN})
    out = tmp_path_factory.mktemp("reference") / "run"
    return Run.open(
        record(
            trainee, out, RecordOptions(steps=STEPS, every=EVERY, checkpoint_every=CHECKPOINT_EVERY)
        )
    )


def triggers(count: int) -> list[str]:
    """Every fourth trial waits for a checkpoint write; the others spread over the index's lines."""
    found = []
    for number in range(count):
        if number % 4 == 3:
            found.append("checkpoint")
        else:
            found.append(f"index:{round(number * (INDEX_LINES - 1) / max(count - 1, 1))}")
    return found


def check_no_half_written_file(out: Path) -> None:
    for folder in ("snapshots", "checkpoints"):
        for file in (out / "rank0" / folder).iterdir():
            if file.name.endswith(".tmp"):
                continue  # a write in progress, never under a final name; nothing reads it
            data = file.read_bytes()
            codec.decode(data, file, raw_size=zstandard.frame_content_size(data))


def check_committed(trial: Trial) -> Run:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torn last line is allowed and reported
        run = Run.open(trial.out)
    for step in run.snapshots:
        assert run.snapshot(step)["step"] == step
    for step in run.checkpoints:
        assert set(run.checkpoint(step)) >= {"model", "optimizer", "streams", "data"}
    if run.last_step is not None:
        assert set(range(run.last_step)) <= set(run.steps), (
            f"trial {trial.number}: step lines missing before the last snapshot"
        )
    # a checkpoint is committed after its step's snapshot
    assert set(run.checkpoints) <= set(run.snapshots)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shown = runner.invoke(app, ["show", str(trial.out), "--json"])
    assert shown.exit_code == 0, shown.output
    summary = json.loads(shown.stdout)
    assert summary["last_step"] == run.last_step and summary["complete"] == run.complete
    if run.complete:
        # killed after the end line only
        assert sorted(run.snapshots) == list(range(0, STEPS + 1, EVERY))
    return run


def resume_and_compare(trial: Trial, reference: Run) -> None:
    args = [
        "record",
        f"{EXAMPLES / 'mlp.py'}:build",
        "--out",
        str(trial.out),
        *OPTIONS,
        "--quiet",
        "--resume",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    resumed = Run.open(trial.out)
    assert resumed.complete and sorted(resumed.snapshots) == sorted(reference.snapshots)
    for step in reference.snapshots:
        assert resumed.snapshot(step)["hashes"] == reference.snapshot(step)["hashes"], (
            f"trial {trial.number}, step {step}"
        )
    assert resumed.steps == reference.steps


@pytest.mark.slow
def test_sigkill_at_any_moment_leaves_a_readable_resumable_run(tmp_path, reference) -> None:
    started = time.monotonic()
    trials = [
        Trial(number, tmp_path / f"run-{number:02d}", trigger)
        for number, trigger in enumerate(triggers(TRIALS))
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(run_trial, trials))
    last_steps: list[int | None] = []
    resumed = 0
    for trial in done:
        assert trial.returncode in (-signal.SIGKILL, 0), (
            f"trial {trial.number} failed on its own: {trial.returncode}"
        )
        if not (trial.out / "run.json").exists():  # killed before the run existed: nothing to keep
            result = runner.invoke(app, ["show", str(trial.out)])
            assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
            continue
        check_no_half_written_file(trial.out)
        run = check_committed(trial)
        last_steps.append(run.last_step)
        # the first three that can resume, wherever the kills landed
        if run.checkpoints and not run.complete and resumed < 3:
            resume_and_compare(trial, reference)
            resumed += 1
    killed = [t for t in done if t.returncode == -signal.SIGKILL]
    assert len(killed) >= TRIALS * 3 // 4, [t.returncode for t in done]
    assert any(t.killed_mid_checkpoint for t in done), (
        "no trial was killed while a checkpoint was being written"
    )
    assert len(set(last_steps)) >= min(5, TRIALS // 4), last_steps  # kills spread over the run
    assert resumed >= 2
    print(
        f"\n{TRIALS} trials in {time.monotonic() - started:.1f}s: {len(killed)} killed, "
        f"{sum(t.killed_mid_checkpoint for t in done)} mid-checkpoint, {resumed} resumed and "
        "compared, "
        f"last complete steps {sorted({s for s in last_steps if s is not None})}"
    )
