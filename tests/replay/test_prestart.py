"""A fork server started ahead, as ``bisect-repro compare`` starts: taken by the first replica
whose environment it has, told then what to preload, and ended when no replica takes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_repro import __main__ as entry
from bisect_repro.replay import prestart
from bisect_repro.replay.bootstrap import SPEC_VARIABLE
from bisect_repro.replay.forks import forking
from tests.replay.test_forks import REPORTING, _report, exiting_with_7


@pytest.mark.parametrize(
    ("argv", "started"),
    [
        (["compare", "a", "b"], True),
        (["-v", "compare", "a", "b", "--json"], True),
        (["compare", "a", "b", "--no-replay"], False),
        (["compare", "--help"], False),
        (["record", "--out", "compare", "x.py:build"], False),
        (["show", "compare"], False),
        ([], False),
    ],
)
def test_only_a_compare_that_replays_starts_a_server_ahead(
    monkeypatch, argv: list[str], started: bool
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(sys, "argv", ["bisect-repro", *argv])
    monkeypatch.setattr(prestart, "prestart", lambda: calls.append("prestart"))
    monkeypatch.setattr("bisect_repro.cli.main", lambda: calls.append("cli"))
    entry.main()
    assert calls == (["prestart", "cli"] if started else ["cli"])


def _replica_environment(recipe: Path) -> dict[str, str]:
    spec = {"kind": "recipe", "target": f"{recipe}:build", "path": str(recipe), "config": {}}
    return {**prestart.replica_environment(), SPEC_VARIABLE: json.dumps(spec)}


@pytest.mark.slow
def test_the_replica_with_its_environment_takes_it_once_and_a_server_left_over_ends(
    tmp_path: Path, caplog
) -> None:
    recipe = tmp_path / "reporting.py"
    recipe.write_text(REPORTING)
    ahead, unused = prestart.prestart(), prestart.prestart()
    # another environment
    assert prestart.take({**prestart.replica_environment(), "OMP_NUM_THREADS": "3"}) is None
    caplog.set_level("INFO", logger="bisect_repro.replay.forks")

    def never() -> subprocess.Popen[bytes]:
        raise AssertionError("the server started ahead forks: no fresh process is started")

    with forking() as forks:
        copy = forks.start(
            _replica_environment(recipe),
            {SPEC_VARIABLE},
            ["numpy"],
            str(tmp_path),
            tmp_path / "log",
            never,
        )
        # the recipe's one-line error, as a fresh process exits
        assert copy is not None and copy.wait(timeout=120) == 2
        assert (
            (forks.started, forks.forked) == (1, 1)
            and ahead.process.poll() is None
            and unused.process.poll() is None
        )
    assert "taken, started ahead" in caplog.text
    # MKL's first call, in the copy
    assert (
        int(str(_report(tmp_path / "log")["settled"])) > 0 or not _report(tmp_path / "log")["mkl"]
    )
    # both ended with the block
    assert ahead.process.wait(timeout=30) == 0 and unused.process.wait(timeout=30) == 0
    assert prestart.take(prestart.replica_environment()) is None


@pytest.mark.slow
def test_a_server_started_ahead_unfit_after_its_preloads_starts_the_replica_afresh(
    tmp_path: Path, monkeypatch
) -> None:
    # the library it is told to preload is shadowed by one whose import runs a parallel op
    (tmp_path / "torchaudio.py").write_text("import torch\ntorch.ones(1 << 20).exp()\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    recipe = tmp_path / "reporting.py"
    recipe.write_text(REPORTING)
    ahead = prestart.prestart()
    fresh: list[int] = []
    start_afresh = exiting_with_7(fresh)
    with forking() as forks:
        first = forks.start(
            _replica_environment(recipe),
            {SPEC_VARIABLE},
            ["torchaudio"],
            str(tmp_path),
            tmp_path / "log",
            start_afresh,
        )
        # None: the server had already said it is unfit, and the caller starts its own process
        if first is not None:
            assert first.wait(timeout=120) == 7 and first.pid == fresh[0]
        assert (forks.started, forks.forked) == (1, 0)
    assert ahead.process.wait(timeout=30) == 0 and os.environ["OMP_NUM_THREADS"] == "2"
