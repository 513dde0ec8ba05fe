"""The benchmark command runs (tiny sizes, a few seconds) and writes its two result files.

Benchmarks are not timed here; this only keeps ``python -m benchmarks.run`` from rotting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.extended
def test_the_benchmark_command_runs_and_writes_its_tables(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.run",
            "--quick",
            "--device",
            "cpu",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["quick"] is True
    assert {"date", "torch", "device", "cpu"} <= set(results["machine"])
    hash_rows = results["hash"]["rows"]
    assert hash_rows and all(
        row["bisect-repro hash GB/s"] > 0 and row["read ceiling x.sum() GB/s"] > 0
        for row in hash_rows
    )
    configurations = {row["configuration"]: row for row in results["overhead_mlp"]["rows"]}
    assert set(configurations) == {"no recorder", "every=10", "every=1"}
    assert configurations["no recorder"]["overhead"] == 1.0
    # whole processes (the GPT's on the CPU in the quick run)
    for key in ("overhead_cnn2m", "overhead_gpt"):
        process = {row["configuration"]: row for row in results[key]["rows"]}
        assert (
            set(process) == {"plain loop", "every=10", "every=1"}
            and process["plain loop"]["loop overhead"] == 1.0
        )
    assert {row["file"] for row in results["storage"]["rows"]} >= {"snapshot", "checkpoint"}
    compare = results["compare"]
    # the Jitter layer
    assert compare["found"] == [compare["diverges_at"], "forward", "6", "rng_state"]
    assert compare["replayed steps"] >= 1 and compare["compare s"] > 0
    table = (tmp_path / "results.md").read_text()
    for title in (
        "## Hash throughput",
        "## Recording overhead, MLP",
        "whole process",
        "## Storage",
        "## Compare cost",
    ):
        assert title in table, title
