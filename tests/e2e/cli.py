"""The command line as a user runs it: ``python -m bisect_repro.cli ARGS`` in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def run_cli(
    *args: str, cwd: Path, env: Mapping[str, str] | None = None, timeout: int = 900
) -> subprocess.CompletedProcess[str]:
    """``bisect-repro ARGS`` run in ``cwd``, its output captured; ``env``: variables set on top of
    this process's."""
    return subprocess.run(
        [sys.executable, "-m", "bisect_repro.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
