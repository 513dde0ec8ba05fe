"""``bisect-repro record --out B --against A``: a run checked against a clean one while it records,
through the command line. A script knows nothing of bisect-repro and reads a data file; B's copy
of the file has one row edited, drawn at step 33."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bisect_repro.cli import app
from bisect_repro.store.run import Run
from tests.e2e.cli import run_cli

SCRIPTS = Path(__file__).resolve().parent / "scripts"
RECIPES = Path(__file__).resolve().parent / "recipes"
runner = CliRunner()
EVERY = 5
CHANGED = 33  # the step whose batch holds the edited row: batches of 4 rows, in file order
pytestmark = pytest.mark.slow


def _record(cwd: Path, out: str, data: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "record",
        "--out",
        out,
        "--every",
        str(EVERY),
        *flags,
        "--",
        "python",
        "train.py",
        "--data",
        data,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the script, its data file, a copy with the row of step 33 edited, and run
    ``a`` recorded from the clean file."""
    where = tmp_path_factory.mktemp("against")
    shutil.copy(SCRIPTS / "data_file.py", where / "train.py")
    rows = random.Random(0)
    lines = [
        " ".join(f"{rows.uniform(-1, 1):.4f}" for _ in range(6)) + f" {rows.randrange(3)}"
        for _ in range(200)
    ]
    (where / "data.txt").write_text("\n".join(lines) + "\n")
    lines[CHANGED * 4 + 1] = "0.5 0.5 0.5 0.5 0.5 0.5 1"
    (where / "edited.txt").write_text("\n".join(lines) + "\n")
    done = _record(where, "a", "data.txt")
    assert done.returncode == 0, done.stderr[-2000:]
    return where


def test_a_run_that_parts_stops_at_the_next_snapshot_with_the_verdict_compare_gives(
    folder: Path,
) -> None:
    done = _record(folder, "b", "edited.txt", "--against", "a", "--json")
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"first in the batch at step {CHANGED}" in done.stderr
    b = Run.open(folder / "b")
    # the snapshot after the one that shows the difference (35) is where B stops: 40
    first_after = (CHANGED // EVERY + 1) * EVERY
    assert b.complete and max(b.steps) < first_after + EVERY <= b.last_step  # type: ignore[operator]
    assert len(Run.open(folder / "a").steps) == 50  # A ran on: 50 batches
    recorded = json.loads(done.stdout)
    compared = run_cli("compare", "a", "b", "--json", cwd=folder)
    assert compared.returncode == 1, compared.stderr[-2000:]
    verdict = json.loads(compared.stdout)["verdict"]
    assert recorded["verdict"]["step"] == verdict["step"] == CHANGED
    assert recorded["verdict"]["cause"] == verdict["cause"]
    assert recorded["first_log_difference"] == json.loads(compared.stdout)["first_log_difference"]


def test_a_run_that_matches_runs_to_the_end_and_exits_0(folder: Path) -> None:
    done = _record(folder, "same", "data.txt", "--against", "a", "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    same = Run.open(folder / "same")
    assert same.complete and len(same.steps) == 50
    assert "identical" in done.stdout.lower() or "match" in done.stdout.lower()


def test_under_another_thread_count_only_the_data_and_streams_are_held_to_the_reference(
    folder: Path,
) -> None:
    # Whether one thread rounds otherwise than two depends on the CPU: the check must not stop the
    # run for it, and says so before training.
    done = run_cli(
        *("record", "--out", "threads", "--every", str(EVERY), "--against", "a"),
        *("--no-verdict", "--quiet", "--", "python", "train.py", "--data", "data.txt"),
        cwd=folder,
        env={"OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "recorded under other numerics settings (" in done.stderr, done.stderr[-2000:]
    assert "env.OMP_NUM_THREADS: None vs '1'" in done.stderr, done.stderr[-2000:]
    threads = Run.open(folder / "threads")
    assert threads.complete and len(threads.steps) == 50


def test_past_the_reference_end_it_stops_when_asked(folder: Path) -> None:
    done = run_cli(
        "record",
        "--out",
        "longer",
        "--every",
        str(EVERY),
        "--against",
        "a",
        "--stop-at-end",
        "--quiet",
        "--",
        "python",
        "train.py",
        "--data",
        "data.txt",
        "--epochs",
        "2",
        cwd=folder,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    longer = Run.open(folder / "longer")
    assert longer.complete and longer.last_step == 50 and len(longer.steps) == 50


@pytest.mark.extended
def test_with_against_continue_the_whole_run_is_recorded_and_compared(folder: Path) -> None:
    done = _record(folder, "whole", "edited.txt", "--against", "a", "--against-continue", "--json")
    assert done.returncode == 1, done.stderr[-2000:]
    assert len(Run.open(folder / "whole").steps) == 50
    assert json.loads(done.stdout)["verdict"]["step"] == CHANGED


def _partial(folder: Path) -> str:
    shutil.copytree(folder / "a", folder / "partial", dirs_exist_ok=True)
    index = folder / "partial" / "rank0" / "index.jsonl"
    index.write_text("".join(line + "\n" for line in index.read_text().splitlines()[:-1]))
    return "partial"


def _other_script(folder: Path) -> str:
    shutil.copy(folder / "train.py", folder / "other.py")
    done = run_cli(
        "record",
        "--out",
        "other",
        "--every",
        "5",
        "--",
        "python",
        "other.py",
        "--data",
        "data.txt",
        cwd=folder,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return "other"


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda folder: "nowhere", "no such run directory"),
        (lambda folder: "train.py", "not a bisect-repro run"),
        (_partial, "a partial run"),
        (_other_script, "was recorded from script"),
    ],
    ids=["missing", "not-a-run", "partial", "another-script"],
)
def test_a_bad_reference_is_one_line_and_exit_2_before_anything_runs(
    folder: Path, make, problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = make(folder)
    monkeypatch.chdir(folder)
    result = runner.invoke(
        app,
        [
            "record",
            "--out",
            "bad",
            "--against",
            reference,
            "--",
            "python",
            "train.py",
            "--data",
            "data.txt",
        ],
    )
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0] and "Traceback" not in result.output
    assert not (folder / "bad").exists()  # nothing was recorded


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--out", "a", "--against", "a"], "record the new run to a folder of its own"),
        (["--out", "c", "--stop-at-end"], "go with --against A"),
    ],
)
def test_options_that_cannot_work_are_refused(
    folder: Path, flags: list[str], problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(folder)
    result = runner.invoke(
        app, ["record", *flags, "--force", "--", "python", "train.py", "--data", "data.txt"]
    )
    assert result.exit_code == 2 and problem in result.output
    assert len(Run.open(folder / "a").steps) == 50  # the reference is untouched


@pytest.mark.extended
def test_a_recipe_recorded_against_another_setting_stops_at_the_difference(tmp_path: Path) -> None:
    target = f"{RECIPES / 'counter_reseed.py'}:build"
    flags = ["--steps", "40", "--every", "5", "--quiet"]
    done = run_cli("record", target, "--out", "a", *flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    done = run_cli(
        "record",
        target,
        "--out",
        "b",
        *flags,
        "--set",
        "reseed_at=12",
        "--against",
        "a",
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    b = Run.open(tmp_path / "b")
    assert b.complete and b.last_step is not None and b.last_step <= 20
    assert json.loads(done.stdout)["verdict"]["step"] == 12
