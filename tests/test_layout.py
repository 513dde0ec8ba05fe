"""The package's modules stay small: every ``.py`` file under ``bisect_repro/`` is at most 400 lines.

A module that grows past the limit fails the test, named with its length: split it by concept
rather than raise the limit. Lines are counted as ``wc -l`` counts them, blank lines and
docstrings included.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "bisect_repro"
MODULE_LINES = 400


def oversized(package: Path = PACKAGE, limit: int = MODULE_LINES) -> list[str]:
    """``path: N lines`` for every module of ``package`` longer than ``limit`` lines."""
    lengths = {path: len(path.read_text(encoding="utf-8").splitlines()) for path in sorted(package.rglob("*.py"))}
    return [f"{path.relative_to(package.parent)}: {n} lines" for path, n in lengths.items() if n > limit]


def test_every_module_is_at_most_400_lines() -> None:
    assert sorted(PACKAGE.rglob("*.py")), PACKAGE  # the package is where the test looks
    assert oversized() == []


def test_the_check_would_see_a_long_module(tmp_path) -> None:
    package = tmp_path / "bisect_repro"
    (package / "diagnose").mkdir(parents=True)
    (package / "diagnose" / "long.py").write_text("x = 1\n" * (MODULE_LINES + 1))
    (package / "diagnose" / "short.py").write_text("x = 1\n" * MODULE_LINES)
    (package / "notes.txt").write_text("x\n" * 1000)
    assert oversized(package) == ["bisect_repro/diagnose/long.py: 401 lines"]
