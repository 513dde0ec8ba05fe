"""The code is formatted for reading: lines of at most 100 columns, one formatter with no
exceptions, and functions held small by complexity checks rather than modules by a line count.

``pyproject.toml`` sets ruff's line length and selects ``C901`` (cyclomatic complexity) and
``PLR0915`` (statements per function); CI runs ``ruff format --check`` and ``ruff check``. These
tests hold the settings themselves, so that loosening one is a visible change, and keep
``fmt: skip`` and ``fmt: off`` out of the code.
"""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("bisect_repro", "tests", "examples", "benchmarks")


def ruff_settings() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]


def formatter_exceptions(root: Path = ROOT) -> list[str]:
    """``path:line`` of every ``fmt: skip`` or ``fmt: off`` comment under the code folders."""
    found = []
    markers = ("# fmt: " + "skip", "# fmt: " + "off")  # not written whole: this file holds none
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if any(marker in line for marker in markers):
                    found.append(f"{path.relative_to(root)}:{number}")
    return found


def test_lines_are_at_most_100_columns_and_complexity_is_checked() -> None:
    ruff = ruff_settings()
    assert ruff["line-length"] <= 100
    lint = ruff["lint"]
    assert {"C901", "PLR0915"} <= set(lint["select"]), lint["select"]
    assert lint["mccabe"]["max-complexity"] <= 12
    assert lint["pylint"]["max-statements"] <= 50


def test_the_formatter_has_no_exceptions() -> None:
    assert formatter_exceptions() == []


def test_the_check_would_see_an_exception(tmp_path) -> None:
    for folder in FOLDERS:
        (tmp_path / folder).mkdir()
    (tmp_path / "tests" / "a.py").write_text("x = 1\ny = [1,2]  # fmt: " + "skip\n")
    (tmp_path / "bisect_repro" / "b.py").write_text("# fmt: " + "off\n")
    assert formatter_exceptions(tmp_path) == ["bisect_repro/b.py:1", "tests/a.py:2"]
