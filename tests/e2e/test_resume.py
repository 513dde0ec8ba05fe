"""A resumed run against the uninterrupted one, end to end through the CLI, on a script that knows
nothing of bisect-repro (``tests/e2e/scripts/resume_train.py``): run A trains 10 iterations;
run B1 stops after 6 and writes a checkpoint holding the model and the iteration number, and what
``--save`` names (the optimizer's state, torch's random stream, the data position); run B2 resumes
from it. ``compare A B2`` places B2 at A's step 6, audits what the resume restored, and finds the
first divergence after it; ``compare B1 B2`` gives the audit alone.

The truth, checked without the tool (the weights after iteration 10, hashed): B2 starts from A's
weights after 6 updates, bit for bit; with everything saved it trains A's steps 6 to 9 exactly.
Without torch's stream, step 6's input noise (drawn from it before the forward) differs; without
the optimizer's state, Adam starts again and step 6's update differs; without the data position,
the epoch restarts and step 6 takes another sample order.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cli import run_cli

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "resume_train.py"
RESUME = 6
EVERYTHING = "optimizer,rng,data"


def _record(folder: Path, name: str, *args: str) -> Path:
    options = ("--quiet", "--every", "2", "--checkpoint-every", "4", "--out", name)
    done = run_cli("record", *options, "--", sys.executable, "resume_train.py", *args, cwd=folder)
    assert done.returncode == 0, done.stderr[-2000:]
    return folder / name


def _compare(a: Path, b: Path) -> tuple[int, dict[str, Any]]:
    done = run_cli("compare", str(a), str(b), "--json", cwd=a.parent)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("resume")
    shutil.copy(SCRIPT, folder / SCRIPT.name)
    return _record(folder, "a", "--iters", "10")


def _resumed(a: Path, saved: str) -> tuple[Path, Path]:
    """Runs B1 (stopped after ``RESUME`` iterations, saving ``saved``) and B2 (resumed)."""
    folder = a.parent / saved.replace(",", "-")
    folder.mkdir()
    shutil.copy(SCRIPT, folder / SCRIPT.name)
    stopped = ("--iters", "10", "--stop-after", str(RESUME), "--save", saved)
    b1 = _record(folder, "b1", *stopped)
    b2 = _record(folder, "b2", "--iters", "10", "--resume")
    return b1, b2


@pytest.mark.parametrize(
    ("saved", "missing", "expected"),
    [
        pytest.param(EVERYTHING, [], None, id="everything"),
        pytest.param(
            "optimizer,data",
            ["stream torch"],
            (RESUME, "data", "rng_state"),
            id="no-stream",
            marks=pytest.mark.extended,
        ),
        pytest.param(
            "rng,data",
            ["optimizer"],
            (RESUME, "optimizer", "resume"),
            id="no-optimizer",
            marks=pytest.mark.extended,
        ),
        pytest.param(
            "optimizer,rng",
            ["data order"],
            (RESUME, "data", "data_order"),
            id="no-data-position",
            marks=pytest.mark.extended,
        ),
    ],
)
def test_a_resumed_run_is_placed_audited_and_its_first_divergence_found(
    uninterrupted: Path, saved: str, missing: list[str], expected: tuple[int, str, str] | None
) -> None:
    b1, b2 = _resumed(uninterrupted, saved)
    code, report = _compare(uninterrupted, b2)
    resume = report["resume"]
    assert resume is not None and (resume["run"], resume["step"]) == ("B", RESUME), resume
    assert "model" in resume["restored"], resume
    assert [m for m in resume["missing"] if m != "batch"] == missing, resume
    verdict = report["verdict"]
    if expected is None:
        assert code == 0 and report["identical"] and verdict is None, verdict
    else:
        assert code == 1 and verdict is not None, report["notes"]
        assert (verdict["step"], verdict["phase"], verdict["cause"]) == expected, verdict
        assert "resum" in verdict["fix"], verdict["fix"]
    # the stopped run against its own resume: the audit alone (run B1 never drew step 6's batch,
    # so the data position is not audited, and a note says so)
    code, alone = _compare(b1, b2)
    audited = [m for m in missing if m != "data order"]
    assert alone["resume"]["step"] == RESUME and alone["resume"]["missing"] == audited, alone
    assert "the data position is not audited" in alone["resume"]["note"], alone["resume"]
    assert code == (0 if not audited else 1), alone["notes"]


def test_a_run_that_shares_no_state_is_compared_from_its_start(uninterrupted: Path) -> None:
    folder = uninterrupted.parent / "unrelated"
    folder.mkdir()
    shutil.copy(SCRIPT, folder / SCRIPT.name)
    other = _record(folder, "c", "--iters", "4", "--seed", "1")
    code, report = _compare(uninterrupted, other)
    assert code == 1 and report["resume"] is None and report["verdict"]["step"] == 0, report
    assert any("no resume point" in note for note in report["notes"]), report["notes"]
