"""The documentation a user reads: the README stays short, every relative link resolves, and the
tables of causes are the cause registry's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bisect_repro.diagnose.compare.causes.registry import ENTRIES
from bisect_repro.diagnose.compare.causes.tables import DOCUMENTS, TABLES, rendered

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


@pytest.mark.parametrize("name", DOCUMENTS)
def test_the_tables_of_causes_are_the_registrys(name: str) -> None:
    """README.md, docs/comparing.md and docs/causes.md show each cause's title, meaning, rule,
    proof and fix as the cause registry holds them."""
    text = (ROOT / name).read_text(encoding="utf-8")
    assert "<!-- causes:" in text, f"{name} holds no table of causes"
    assert rendered(text) == text, (
        f"{name}: a table of causes differs from the registry; write them again with "
        "python -m bisect_repro.diagnose.compare.causes.tables"
    )


def test_the_tables_of_causes_list_every_cause_in_the_registry() -> None:
    tables = " ".join(make() for make in TABLES.values())
    assert all(f"| `{entry.cause.value}` |" in tables for entry in ENTRIES)
    assert all(entry.remedy in tables and entry.meaning in tables for entry in ENTRIES)
