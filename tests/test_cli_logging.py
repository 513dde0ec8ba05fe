"""``--verbose`` turns on the bisect_repro logger: what a replay starts, and with ``-vv`` each
request."""

from __future__ import annotations

import logging

import pytest
from typer.testing import CliRunner

from bisect_repro.cli import app

runner = CliRunner()


@pytest.mark.extended
def test_verbose_logs_the_processes_a_replay_starts_and_very_verbose_each_request() -> None:
    try:
        quiet = runner.invoke(app, ["doctor", "bisect_repro.demo:build", "--steps", "1", "--json"])
        assert "started process" not in quiet.stderr
        verbose = runner.invoke(
            app, ["-v", "doctor", "bisect_repro.demo:build", "--steps", "1", "--json"]
        )
        assert verbose.exit_code in (0, 1), verbose.output
        assert "INFO bisect_repro.replay.forks: replay of bisect_repro.demo:build" in verbose.stderr
        assert "started process" in verbose.stderr
        assert "DEBUG" not in verbose.stderr
        very = runner.invoke(
            app, ["-vv", "doctor", "bisect_repro.demo:build", "--steps", "1", "--json"]
        )
        assert (
            "DEBUG bisect_repro.replay.replica:" in very.stderr and ": describe {}" in very.stderr
        )
    finally:
        logging.getLogger("bisect_repro").handlers.clear()
        logging.getLogger("bisect_repro").setLevel(logging.NOTSET)
