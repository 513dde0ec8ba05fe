"""The console script (``bisect-repro``): what it does around the command it runs."""

from __future__ import annotations

import gc
import sys

import pytest

from bisect_repro import cli


@pytest.mark.parametrize("argv", [["--help"], ["show", "/nonexistent/run"]])
def test_the_objects_alive_when_a_command_ends_are_frozen_out_of_the_collector(
    monkeypatch, argv
) -> None:
    frozen: list[int] = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(len(frozen)))
    monkeypatch.setattr(sys, "argv", ["bisect-repro", *argv])
    with pytest.raises(SystemExit) as ended:
        cli.main()
    assert ended.value.code == (0 if argv == ["--help"] else 2)  # the command's own exit code, kept
    assert frozen == [0]  # once, after the command, whether it succeeded or not
