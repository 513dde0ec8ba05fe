"""A script that keeps its own step counter: the reseed it plants at step 9 is found exactly.

Counters in a closure and in a module global are state the recorder captures (checkpoints hold
them, a step run again starts from them), so the replay reproduces the reseed and the experiments
prove it. A loop's ``enumerate`` counter is a local of the running loop, which nothing outside can
restore: the replay from the first checkpoint reproduces it (the reseed given the seed run B
recorded), and each repeat of the step runs in a fresh process replayed to it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "loops" / "counters.py"


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("counters")
    copy = folder / "train.py"
    copy.write_text(SCRIPT.read_text())
    return copy


@pytest.mark.slow
@pytest.mark.parametrize("counter", ["closure", "global", "enumerate"])
def test_a_reseed_behind_a_counter_of_the_scripts_own(script: Path, counter: str) -> None:
    folder = script.parent
    for name, extra in (("a", ()), ("b", ("--reseed-at", "9"))):
        done = _run(
            str(script), "--out", f"{counter}-{name}", "--counter", counter, *extra, cwd=folder
        )
        assert done.returncode == 0, done.stderr[-2000:]
    done = _run(
        "-m", "bisect_repro.cli", "compare", f"{counter}-a", f"{counter}-b", "--json", cwd=folder
    )
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads(done.stdout)
    verdict = report["verdict"]
    assert (verdict["step"], verdict["cause"], verdict["rng"]) == (9, "rng_state", ["torch"]), (
        verdict
    )
    assert verdict["reseeded"][0]["call"] == "torch.seed()" and verdict["reseeded"][0][
        "where"
    ].startswith(f"{script}:")
    assert "reseed_at" not in (verdict.get("config_keys") or [])
    assert (verdict["phase"], verdict["layer"], verdict["confidence"]) == (
        "forward",
        "2",
        "proven",
    ), verdict
    assert report["replay"]["faithful"], report
    # a local of the running loop: repeats of the step run in fresh processes from the start
    if counter == "enumerate":
        done = _run(str(script), "--out", "enumerate-a2", "--counter", counter, cwd=folder)
        assert done.returncode == 0, done.stderr[-2000:]
        same = _run(
            "-m", "bisect_repro.cli", "compare", "enumerate-a", "enumerate-a2", "--json", cwd=folder
        )
        assert same.returncode == 0 and json.loads(same.stdout)["identical"], same.stderr[-2000:]
        assert any(
            e["experiment"] == "reseed_kept" and e["outcome"] == "matches"
            for e in verdict["evidence"]
        ), verdict["evidence"]
        assert report["replay"]["from_step"] == 0, report["replay"]
        assert any("fresh process" in note for note in report["notes"]), report["notes"]
    else:
        assert any(
            e["experiment"] == "reseed_fixed" and e["outcome"] == "matches"
            for e in verdict["evidence"]
        ), verdict["evidence"]
        assert report["replay"]["from_step"] == 5 and report["replay"]["replayed_steps"] <= 5, (
            report["replay"]
        )
