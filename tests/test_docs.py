"""The documentation a user reads: the README stays short, and every relative link resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_read_in_ten_minutes() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines; move details to docs/ (at most {README_MAX_LINES})"
    )


@pytest.mark.parametrize("document", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(document: Path) -> None:
    if not document.exists():
        pytest.fail(f"{document.relative_to(ROOT)} is linked from the README but missing")
    broken = [
        target
        for target in LINK.findall(document.read_text(encoding="utf-8"))
        if "://" not in target
        and not target.startswith("mailto:")
        and not (document.parent / target).exists()
    ]
    assert broken == [], f"{document.relative_to(ROOT)} links to missing files: {broken}"
