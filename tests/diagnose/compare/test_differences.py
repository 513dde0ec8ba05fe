"""What differs in how two runs were set up, one typed bundle: the code each ran, where its SHA-256
differs, with the first lines that differ where both files are here as recorded; the bundle's JSON
form read back; both reports showing it."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

from rich.console import Console

from bisect_repro.diagnose.compare.differences import (
    MAX_LINES,
    CodeDifference,
    Differences,
    FirstLines,
    code_differences,
    first_lines,
)
from bisect_repro.diagnose.compare.records import read_records
from bisect_repro.diagnose.compare.settings import SettingsDifference
from bisect_repro.diagnose.compare.verdict import CompareResult, Verdict
from bisect_repro.report.html import comparison_html
from bisect_repro.report.text import render_comparison
from bisect_repro.store.run import Run
from tests.diagnose.compare.test_records import run

SCRIPT = "import torch\n\nlr = 0.05\nsteps = 4\nprint(lr)\n"


def launch(path: Path, text: str | None = None) -> dict[str, Any]:
    """A script's launch record: ``path`` written with ``text`` (when given) and its hash."""
    if text is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    digest = hashlib.sha256((text or path.read_text()).encode()).hexdigest()
    code = {"kind": "script", "path": str(path), "sha256": digest}
    return {"executable": "python", "argv": ["train.py"], "cwd": str(path.parent), "code": code}


def scripts(tmp_path: Path, a: str, b: str) -> tuple[Run, Run]:
    return (
        run(tmp_path / "a", launch=launch(tmp_path / "A" / "train.py", a)),
        run(tmp_path / "b", launch=launch(tmp_path / "B" / "train.py", b), hashes={4: "moved"}),
    )


def test_code_whose_hash_differs_is_named_with_its_first_differing_lines(tmp_path: Path) -> None:
    a, b = scripts(tmp_path, SCRIPT, SCRIPT.replace("lr = 0.05", "lr = 0.07"))
    (found,) = code_differences(a, b)
    assert found.name == "train.py" and found.kind == ("script", "script")
    assert found.path == (str(tmp_path / "A" / "train.py"), str(tmp_path / "B" / "train.py"))
    assert found.first_lines == FirstLines(line=(3, 3), a=("lr = 0.05",), b=("lr = 0.07",))
    assert found.lines_unavailable is None
    assert (
        found.lines_described()
        == "first differing at line 3: 'lr = 0.05' in run A, 'lr = 0.07' in run B"
    )
    assert read_records(a, b).differences.code == (found,)


def test_the_same_code_in_two_places_is_no_difference(tmp_path: Path) -> None:
    assert code_differences(*scripts(tmp_path, SCRIPT, SCRIPT)) == ()
    # a run that records no code hash compares with nothing
    bare = run(tmp_path / "bare")
    assert code_differences(bare, scripts(tmp_path / "x", SCRIPT, "other\n")[1]) == ()


def test_no_line_is_shown_from_a_file_absent_here_or_changed_since_it_was_recorded(
    tmp_path: Path,
) -> None:
    a, b = scripts(tmp_path, SCRIPT, SCRIPT.replace("steps = 4", "steps = 5"))
    (tmp_path / "B" / "train.py").write_text(SCRIPT + "# edited after the run\n")
    (changed,) = code_differences(a, b)
    assert changed.first_lines is None
    assert changed.lines_unavailable == "run B's train.py changed since the run was recorded"
    (tmp_path / "A" / "train.py").unlink()
    (absent,) = code_differences(a, b)
    assert absent.lines_unavailable == "run A's train.py is not on this machine"
    assert absent.lines_described().startswith("the lines are not shown: run A's train.py")


def test_the_first_lines_are_those_of_the_first_change_in_each_file() -> None:
    assert first_lines("a\nb\nc\n", "a\nb\nc\n") is None
    # an inserted line: nothing in run A there, the line in run B
    inserted = first_lines("a\nb\nc\n", "a\nx\nb\nc\n")
    assert inserted == FirstLines(line=(2, 2), a=(), b=("x",))
    # two changes far apart: the first alone
    far = first_lines("1\n2\n3\n4\n5\n6\n", "1\nX\n3\n4\n5\nY\n")
    assert far == FirstLines(line=(2, 2), a=("2",), b=("X",))
    many = first_lines("k\n" + "a\n" * 10, "k\n" + "b\n" * 10)
    assert many is not None and len(many.a) == len(many.b) == MAX_LINES


def test_the_bundle_reads_back_from_its_json_and_both_reports_show_the_code() -> None:
    code = CodeDifference(
        kind=("script", "script"),
        path=("/x/A/train.py", "/x/B/train.py"),
        sha256=("a" * 64, "b" * 64),
        first_lines=FirstLines(line=(3, 3), a=("lr = 0.05",), b=("lr = 0.07",)),
    )
    settings = SettingsDifference(step=2, differing={"optimizer.group0.lr": [0.05, 0.07]})
    differences = Differences(config={"--steps": [4, 5]}, code=(code,), settings=settings)
    verdict = Verdict(step=2, explanation="the code differs", fix="run the same code")
    result = CompareResult(runs=["a", "b"], differences=differences, verdict=verdict)
    found = result.to_json()
    assert found["code_diff"][0]["first_lines"] == {
        "line": [3, 3],
        "a": ["lr = 0.05"],
        "b": ["lr = 0.07"],
    }
    assert found["config_diff"] == {"--steps": [4, 5]} == result.config_diff
    assert CompareResult.from_json(found).differences == differences
    out = io.StringIO()
    render_comparison(result, Console(file=out, width=200))
    assert "code diff" in out.getvalue() and "line 3: lr = 0.07" in out.getvalue()
    page = comparison_html(result, [{}, {}])
    assert "<h2>Code diff</h2>" in page and "/x/B/train.py" in page and "lr = 0.07" in page
