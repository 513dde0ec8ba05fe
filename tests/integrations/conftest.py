from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def train(tmp_path: Path):
    """Run an example training script in ``tmp_path`` (as ``python script.py ...``)."""

    def run(script: str, *args: str) -> Path:
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / script), *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return tmp_path

    return run


@pytest.fixture
def compare(tmp_path: Path):
    """``bisect-repro compare --json`` on two runs in ``tmp_path`` (the console script's entry, its
    fork server started ahead): the exit code and the report."""

    def run(a: str, b: str) -> tuple[int, dict]:
        done = subprocess.run(
            [sys.executable, "-m", "bisect_repro", "compare", a, b, "--json"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode in (0, 1), done.stderr[-3000:]
        return done.returncode, json.loads(done.stdout)

    return run
