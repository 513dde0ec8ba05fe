"""The cause ``code`` end to end through the CLI: a small script copied into two folders, one
constant edited in one copy, each copy recorded; compared, the runs ran different code: the file
named, its first differing line shown, ``inferred`` (no experiment swaps the code), before a flag
that differs too. Every verdict is checked against its cause's rule."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cli import run_cli
from tests.rules_check import assert_rules_hold

SCRIPT = (Path(__file__).resolve().parent / "scripts" / "tiny_regression.py").read_text()
LINE = "    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)"
EDITED = LINE.replace("lr=0.05", "lr=0.07")
LINE_NUMBER = SCRIPT.splitlines().index(LINE) + 1


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, env={"COLUMNS": "200"})


def _record(folder: Path, out: str, *flags: str) -> None:
    command = ("python", "train.py", *flags)
    done = _cli(
        "record",
        "--out",
        out,
        "--every",
        "2",
        "--checkpoint-every",
        "2",
        "--",
        *command,
        cwd=folder,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def _compare(root: Path, a: str, b: str, *options: str) -> dict[str, Any]:
    done = _cli("compare", a, b, "--json", *options, cwd=root)
    assert done.returncode == 1, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    assert_rules_hold(result)
    return result


@pytest.fixture(scope="module")
def copies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``A/run``: the script as it is; ``B/run``: its learning rate edited in its own copy;
    ``C/run``: the edited copy recorded with a flag that differs too."""
    root = tmp_path_factory.mktemp("code")
    for name, text in (("A", SCRIPT), ("B", SCRIPT.replace(LINE, EDITED))):
        (root / name).mkdir()
        (root / name / "train.py").write_text(text)
        _record(root / name, "run")
    _record(root / "B", "../C/run", "--iterations", "5")
    return root


def _code_named(verdict: dict[str, Any]) -> None:
    assert (verdict["cause"], verdict["confidence"]) == ("code", "inferred"), verdict
    assert "the runs ran different code: train.py (sha256 " in verdict["explanation"]
    assert (
        f"first differing at line {LINE_NUMBER}: {LINE!r} in run A, {EDITED!r} in run B"
        in (verdict["explanation"])
    )
    assert verdict["fix"].startswith("run both from the same code (train.py")


@pytest.mark.slow
def test_a_script_edited_in_one_copy_is_the_code_with_its_first_differing_line(
    copies: Path,
) -> None:
    result = _compare(copies, "A/run", "B/run")
    (code,) = result["code_diff"]
    assert code["path"] == [str(copies / name / "train.py") for name in "AB"]
    assert code["first_lines"] == {"line": [LINE_NUMBER] * 2, "a": [LINE], "b": [EDITED]}
    assert result["config_diff"] == {} and result["replay"]["performed"]
    verdict = result["verdict"]
    _code_named(verdict)
    # the replay placed it, in step 0's update, and could prove nothing
    assert (verdict["step"], verdict["phase"]) == (0, "optimizer"), verdict
    assert "the replay could not prove it" in verdict["explanation"]
    shown = _cli("compare", "A/run", "B/run", "--no-replay", cwd=copies).stdout
    assert "Cause: different source code" in shown and "code diff" in shown and "lr=0.07" in shown


@pytest.mark.slow
def test_the_code_outranks_a_flag_that_differs_too(copies: Path) -> None:
    result = _compare(copies, "A/run", "C/run", "--no-replay")
    assert result["config_diff"] == {"--iterations": [4, 5]}
    _code_named(result["verdict"])
    assert result["verdict"]["config_keys"] == []


@pytest.mark.slow
def test_no_line_is_shown_from_a_copy_changed_since_it_was_recorded(copies: Path) -> None:
    edited = copies / "B" / "train.py"
    recorded = edited.read_text()
    edited.write_text(recorded + "# edited again\n")
    try:
        result = _compare(copies, "A/run", "B/run", "--no-replay")
    finally:
        edited.write_text(recorded)
    (code,) = result["code_diff"]
    assert code["first_lines"] is None
    assert code["lines_unavailable"] == "run B's train.py changed since the run was recorded"
    verdict = result["verdict"]
    assert verdict["cause"] == "code" and "the lines are not shown" in verdict["explanation"]
