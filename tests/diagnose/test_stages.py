"""A failing analysis stage never ends ``compare`` or ``doctor`` with a traceback: the result is
what the stages before it made, with a note naming the stage and the error, and the exit code is
the one those stages give. Each stage is made to fail here in turn."""

from __future__ import annotations

import json
import logging
import re

import pytest
from typer.testing import CliRunner

from bisect_repro import RecordOptions, record
from bisect_repro.cli import app
from bisect_repro.diagnose.stages import run_stage
from bisect_repro.errors import BisectReproError
from bisect_repro.record.recipe import build

from ..conftest import EXAMPLES

runner = CliRunner()


def test_a_stage_that_fails_leaves_its_fallback_and_a_note() -> None:
    notes: list[str] = []

    def broken() -> int:
        raise KeyError("_forward_module.conv1.weight")

    assert run_stage("replay", notes, broken, 7, "the verdict is from the records alone") == 7
    assert notes == [
        "the replay stage failed (KeyError: '_forward_module.conv1.weight'); the verdict is from "
        "the records alone"
    ]
    assert run_stage("replay", notes, lambda: 3, 7, "unused") == 3 and len(notes) == 1


@pytest.mark.parametrize("error", [BisectReproError("bad input"), KeyboardInterrupt()])
def test_bad_input_and_interrupts_are_not_swallowed(error: BaseException) -> None:
    def raising() -> None:
        raise error

    with pytest.raises(type(error)):
        run_stage("replay", [], raising, None, "unused")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Two runs of the MLP example built with another learning rate: they part at step 0."""
    root = tmp_path_factory.mktemp("stages")
    paths = []
    for name, lr in (("a", 1e-3), ("b", 2e-3)):
        target = f"{EXAMPLES / 'mlp.py'}:build"
        options = RecordOptions(steps=4, every=2, checkpoint_every=2)
        out = record(
            build(target, {"lr": lr}), root / name, options, target=target, config={"lr": lr}
        )
        paths.append(str(out))
    return paths[0], paths[1]


def _broken(*args: object, **kwargs: object) -> None:
    raise KeyError("planted")


def _compare(runs: tuple[str, str], *options: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["compare", *runs, *options])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def test_a_failing_replay_gives_the_records_verdict(runs, monkeypatch) -> None:
    monkeypatch.setattr("bisect_repro.diagnose.compare.compare.walk", _broken)
    code, out, _ = _compare(runs, "--json")
    report = json.loads(out)
    assert code == 1 and report["verdict"]["cause"] == "config", report["verdict"]
    assert report["verdict"]["confidence"] == "inferred"
    assert "the replay stage failed (KeyError: 'planted')" in " ".join(report["notes"])


def test_failing_numerics_leave_the_verdict_without_numerics(runs, monkeypatch) -> None:
    monkeypatch.setattr("bisect_repro.diagnose.compare.compare.judge", _broken)
    code, out, _ = _compare(runs, "--json", "--no-replay")
    report = json.loads(out)
    assert code == 1 and report["verdict"]["cause"] == "config" and report["numerics"] is None
    assert "the numerics stage failed (KeyError: 'planted')" in " ".join(report["notes"])


def test_a_failing_report_prints_the_verdict_in_plain_lines(runs, monkeypatch) -> None:
    monkeypatch.setattr("bisect_repro.report.text.render_comparison", _broken)
    code, out, err = _compare(runs, "--no-replay")
    assert code == 1 and out.startswith("The runs diverge at step "), out
    assert "Cause: the config (inferred)" in out and "the report stage failed" in err


def test_a_failing_html_report_is_not_written_and_says_so(runs, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr("bisect_repro.report.html.comparison_html", _broken)
    page = tmp_path / "report.html"
    code, out, err = _compare(runs, "--no-replay", "--json", "--html", str(page))
    assert code == 1 and json.loads(out)["verdict"]["cause"] == "config"
    assert not page.exists() and "the HTML report stage failed" in err


@pytest.mark.slow
def test_a_failing_doctor_stage_is_a_note_and_the_rest_is_reported(examples, monkeypatch) -> None:
    monkeypatch.setattr(
        "bisect_repro.diagnose.doctor.checks.RecipeChecks.rerun_steps", lambda self: _broken()
    )
    result = runner.invoke(
        app, ["doctor", f"{examples / 'mlp.py'}:build", "--steps", "1", "--json"]
    )
    assert (result.exit_code in (0, 1) and result.exception in (None,)) or isinstance(
        result.exception, SystemExit
    )
    report = json.loads(result.stdout)
    assert any("the re-run stage failed (KeyError: 'planted')" in n for n in report["notes"])
    assert report["findings"], report  # the other stages still ran


@pytest.mark.parametrize("output", [(), ("--json",)])
def test_verbose_gives_each_stage_of_compare_its_seconds(runs, output) -> None:
    try:
        code, _, err = _compare(runs, "--no-replay", *output)
        assert code == 1 and "stage records:" not in err
        result = runner.invoke(app, ["-v", "compare", *runs, "--no-replay", *output])
    finally:
        logging.getLogger("bisect_repro").handlers.clear()
        logging.getLogger("bisect_repro").setLevel(logging.NOTSET)
    timed = dict(
        re.findall(
            r"INFO bisect_repro\.diagnose\.stages: stage ([^:]+): ([0-9.]+) s", result.stderr
        )
    )
    assert set(timed) == {"records", "numerics", "report"}, result.stderr
    assert all(float(seconds) >= 0 for seconds in timed.values())
