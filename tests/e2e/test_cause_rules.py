"""The cause rules end to end on unchanged scripts: a script's flag is its config (proven by
relaunching run B with run A's arguments), and a data file edit is the data content, never the
data order, with the replay or without. Every verdict is checked against its cause's rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cli import run_cli
from tests.rules_check import assert_rules_hold

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SECRET = "s3cret-value-never-shown"
TEXT = "the quick brown fox jumps over the lazy dog. " * 6


def _record(folder: Path, out: str, *command: str) -> None:
    done = run_cli(
        "record",
        "--out",
        out,
        "--every",
        "2",
        "--checkpoint-every",
        "4",
        "--",
        "python",
        *command,
        cwd=folder,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def _compare(folder: Path, a: str, b: str, *options: str) -> tuple[dict[str, Any], str]:
    done = run_cli("compare", a, b, "--json", *options, cwd=folder)
    assert done.returncode == 1, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert_rules_hold(result)
    return result, done.stdout + done.stderr


@pytest.fixture(scope="module")
def gamma_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gamma")
    (folder / "train.py").write_text((SCRIPTS / "steplr_classifier.py").read_text())
    _record(folder, "a", "train.py", "--api-token", SECRET)
    _record(folder, "b", "train.py", "--gamma", "0.5", "--api-token", SECRET)
    return folder


@pytest.mark.slow
def test_a_flag_that_differs_is_the_config_proven_by_relaunching_run_b_with_run_as_arguments(
    gamma_runs: Path,
) -> None:
    result, shown = _compare(gamma_runs, "a", "b")
    # the parsed values, defaults included; the equal secret is not a difference
    assert result["config_diff"] == {"--gamma": [0.7, 0.5]}
    verdict = result["verdict"]
    assert (verdict["step"], verdict["cause"], verdict["confidence"], verdict["config_keys"]) == (
        4,
        "config",
        "proven",
        ["--gamma"],
    )
    assert (
        "--gamma 0.7 in run A, 0.5 in run B" in verdict["explanation"]
        and "--gamma: 0.7 vs 0.5" in verdict["fix"]
    )
    relaunch = next(e for e in verdict["evidence"] if e["experiment"] == "config")
    assert relaunch["outcome"] == "matches" and "--api-token REDACTED" in relaunch["detail"]
    assert SECRET not in shown


@pytest.mark.slow
def test_without_the_replay_the_flag_is_still_the_config_named_with_both_values(
    gamma_runs: Path,
) -> None:
    result, _ = _compare(gamma_runs, "a", "b", "--no-replay")
    verdict = result["verdict"]
    assert (
        verdict["cause"] == "config"
        and verdict["config_keys"] == ["--gamma"]
        and verdict["step"] in (4, 5)
    ), verdict
    assert "--gamma 0.7 in run A, 0.5 in run B" in verdict["explanation"]
    assert "None" not in " ".join(
        [verdict["explanation"], *(e["detail"] for e in verdict["evidence"])]
    )


@pytest.mark.slow
def test_a_data_file_edit_is_the_data_content_with_the_replay_and_without(tmp_path: Path) -> None:
    # the same length: the same windows drawn
    for name, text in (("A", TEXT), ("B", TEXT.replace("lazy", "hazy"))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "data.txt").write_text(text)
        (tmp_path / name / "train.py").write_text((SCRIPTS / "char_model.py").read_text())
        _record(tmp_path / name, "run", "train.py")
    for options in ((), ("--no-replay",)):
        result, _ = _compare(tmp_path, "A/run", "B/run", *options)
        verdict, logs = result["verdict"], result["first_log_difference"]
        assert logs["order"] is None and logs["batch"] is not None, logs
        assert (verdict["step"], verdict["phase"], verdict["cause"]) == (
            logs["batch"],
            "data",
            "data_content",
        ), verdict
