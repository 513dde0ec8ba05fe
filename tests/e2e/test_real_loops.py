"""Loops written the way public training scripts are: no torch optimizer, batches sliced by index,
``config=vars(args)`` with the output folder in it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

LOOPS = Path(__file__).resolve().parent / "loops"


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


@pytest.mark.extended
def test_a_hand_written_sgd_loop_diverging_by_thread_count(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text((LOOPS / "hand_sgd.py").read_text())
    for name, threads in (("a", "1"), ("b", "2")):
        done = _run(str(script), "--out", name, "--threads", threads, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
    # as the console script runs
    done = _run("-m", "bisect_repro", "-v", "compare", "a", "b", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    # the fork server started before the command imported torch
    assert "taken, started ahead" in done.stderr
    # each stage's seconds (-v)
    stages = set(re.findall(r"stage (.+): [0-9.]+ s$", done.stderr, re.MULTILINE))
    expected = {"records", "launch", "replay to the divergent step", "experiments", "numerics"}
    assert expected | {"report"} <= stages, done.stderr[-3000:]
    assert any(stage.startswith("experiment: ") for stage in stages), stages
    report = json.loads(done.stdout)
    verdict = report["verdict"]
    assert (verdict["phase"], verdict["layer"], verdict["op"]) == (
        "forward",
        "centre",
        "aten.mean.default",
    ), verdict
    assert verdict["step"] in (0, 1) and verdict["confidence"] == "proven", verdict
    assert verdict["cause"] == "environment" and "torch.set_num_threads" in verdict["fix"], verdict
    assert "out" not in (verdict.get("config_keys") or []) and "'out'" not in verdict["fix"]
    assert report["replay"]["faithful"] is True


def test_gradient_accumulation_over_sampled_batches_with_a_global_counter(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text((LOOPS / "accumulate.py").read_text())
    for name, extra in (("a", ()), ("b", ()), ("c", ("--reseed-at", "6"))):
        done = _run(str(script), "--out", name, *extra, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
    same = _run("-m", "bisect_repro.cli", "compare", "a", "b", "--json", cwd=tmp_path)
    assert same.returncode == 0 and json.loads(same.stdout)["identical"], same.stderr[-2000:]
    done = _run("-m", "bisect_repro.cli", "compare", "a", "c", "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads(done.stdout)
    verdict = report["verdict"]
    assert (
        verdict["step"],
        verdict["phase"],
        verdict["layer"],
        verdict["cause"],
        verdict["rng"],
    ) == (
        6,
        "forward",
        "1",
        "rng_state",
        ["torch"],
    )
    assert verdict["confidence"] == "proven" and verdict["reseeded"][0]["call"] == "torch.seed()", (
        verdict
    )
    assert report["replay"]["from_step"] == 4 and report["replay"]["faithful"], report["replay"]
