"""Runs that seed from entropy replay exactly: each call from entropy is given, in the replay, the
value its run recorded. A reseed behind state no checkpoint holds (a loop's ``enumerate``, an
object's attribute) is found in a replay from the first checkpoint, whose repeats of the step run
in fresh processes, and proven by running the step with the reseed leaving its stream as it is.
A step log whose recorded seed is bad is refused in one line.

The Recorder-API loop with ``enumerate`` is in ``test_counters``, the user's own torchrun (rank 1
reseeding at step 9) in ``test_unchanged_scripts``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.cli import run_cli

HERE = Path(__file__).resolve().parent
RECIPE = HERE / "recipes" / "attribute_reseed.py"


def _compare(a: str, b: str, cwd: Path) -> tuple[int, dict]:
    done = run_cli("compare", a, b, "--json", cwd=cwd)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return done.returncode, json.loads(done.stdout)


def _proven_at_step_9(report: dict, where: str) -> None:
    verdict = report["verdict"]
    found = (
        verdict["step"],
        verdict["phase"],
        verdict["layer"],
        verdict["cause"],
        verdict["rng"],
        verdict["confidence"],
    )
    assert found == (9, "forward", "2", "rng_state", ["torch"], "proven"), verdict
    assert (
        verdict["reseeded"][0]["call"] == "torch.seed()"
        and verdict["reseeded"][0]["where"] == where
    ), verdict["reseeded"]
    proof = [
        (e["subject"].split(" with")[0], e["outcome"])
        for e in verdict["evidence"]
        if e["experiment"] == "reseed_kept"
    ]
    assert proof == [("run B", "matches")], verdict["evidence"]
    located = [e["subject"] for e in verdict["evidence"] if e["experiment"] == "location"]
    assert located == ["the replay"], verdict["evidence"]
    assert report["replay"]["faithful"] and report["replay"]["from_step"] == 0, report["replay"]


def _line_of(path: Path, text: str) -> int:
    return next(
        number for number, line in enumerate(path.read_text().splitlines(), 1) if text in line
    )


@pytest.mark.extended
@pytest.mark.slow
def test_an_unchanged_script_reseeding_behind_enumerate_replays_exactly_and_is_proven(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text((HERE / "scripts" / "enumerate_reseed.py").read_text())
    for out, extra in (("a", ()), ("a2", ()), ("b", ("--reseed-at", "9"))):
        done = run_cli(
            "record",
            "--out",
            out,
            "--every",
            "5",
            "--checkpoint-every",
            "5",
            "--",
            "python",
            "train.py",
            *extra,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    recorded = [
        line
        for line in (tmp_path / "b" / "rank0" / "steps.jsonl").read_text().splitlines()
        if '"seeded"' in line
    ]
    assert (
        len(recorded) == 1
        and json.loads(recorded[0])["step"] == 9
        and isinstance(json.loads(recorded[0])["seeded"][0]["value"], int)
    )
    code, same = _compare("a", "a2", tmp_path)
    assert code == 0 and same["identical"], same
    code, report = _compare("a", "b", tmp_path)
    assert code == 1
    _proven_at_step_9(report, f"{script}:{_line_of(script, 'torch.seed()')}")


@pytest.mark.extended
@pytest.mark.slow
def test_a_recipe_reseeding_behind_an_attribute_is_proven_and_the_closing_note_shows_each_replay(
    tmp_path: Path,
) -> None:
    for out, extra in (("a", ()), ("a2", ()), ("b", ("--set", "reseed_at=9"))):
        schedule = ("--steps", "12", "--every", "5", "--checkpoint-every", "5")
        done = run_cli(
            "record", f"{RECIPE}:build", "--out", out, "--quiet", *schedule, *extra, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr[-2000:]
    code, same = _compare("a", "a2", tmp_path)
    assert code == 0 and same["identical"], same
    code, report = _compare("a", "b", tmp_path)
    assert code == 1
    _proven_at_step_9(report, f"{RECIPE}:{_line_of(RECIPE, 'torch.seed()')}")
    closing = report["notes"][-1]
    assert closing.startswith(
        "the replays: from the checkpoints at steps 5/5, 5 step(s) replayed, parted from the "
        "records"
    ), closing
    assert (
        "from the checkpoints at steps 0/0, 10 step(s) replayed, matched the records: step 9, "
        "rng_state, proven" in closing
    ), closing


@pytest.mark.slow
def test_a_loop_seeding_numpy_and_python_from_entropy_at_its_start_replays_exactly(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text((HERE / "loops" / "seeded_from_entropy.py").read_text())
    for out in ("a", "b"):
        done = subprocess.run(
            [sys.executable, str(script), "--out", out],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    code, report = _compare("a", "b", tmp_path)
    verdict = report["verdict"]
    assert code == 1 and (verdict["step"], verdict["cause"], verdict["confidence"]) == (
        0,
        "rng_state",
        "proven",
    ), verdict
    assert sorted(verdict["rng"]) == ["numpy", "python"], verdict
    assert report["replay"]["faithful"] and report["replay"]["parted"] == [], report["replay"]


@pytest.mark.extended
@pytest.mark.slow
def test_a_recorded_seed_of_the_wrong_type_is_refused_in_one_line(tmp_path: Path) -> None:
    """A step log is run data: a seed that is not what its call produces is named with its file."""
    run = tmp_path / "a"
    done = run_cli(
        "record",
        f"{RECIPE}:build",
        "--out",
        "a",
        "--quiet",
        "--steps",
        "3",
        "--every",
        "1",
        "--set",
        "reseed_at=1",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    steps = run / "rank0" / "steps.jsonl"
    lines = [json.loads(line) for line in steps.read_text().splitlines()]
    assert [r["step"] for r in lines if "seeded" in r] == [1]
    for bad in ("12", -1, 2**64, 1.5):
        for record in lines:
            for call in record.get("seeded", []):
                call["value"] = bad
        steps.write_text("".join(json.dumps(r) + "\n" for r in lines))
        shown = run_cli("show", "a", cwd=tmp_path)
        assert shown.returncode == 2 and "Traceback" not in shown.stderr, shown.stderr
        message = shown.stderr.strip().splitlines()
        assert len(message) == 1 and "a/rank0/steps.jsonl: " in message[0], message
        assert "the value of seeding call 'torch.seed()' is not an integer" in message[0], message
