"""The docs' tables of causes, made from the registry.

Each table sits in its document between ``<!-- causes:NAME -->`` and ``<!-- /causes -->``:
``meanings`` (README.md: each cause, the title a report gives it, what it means), ``fixes``
(docs/comparing.md: what it means, the fix it names), ``rules`` (docs/causes.md: what the records
must show, the experiment that proves it, what is said without it) and ``precedence``
(docs/causes.md: the records' signals in the order the records alone name a cause).
:func:`rendered` is a document with its tables made again; ``python -m
bisect_repro.diagnose.compare.causes.tables [ROOT]`` writes them, and ``tests/test_docs.py`` fails
while a document's table differs from the registry's.

Where the guarantees stop: only the text between the markers is made; the prose around the tables
is written by hand.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .registry import ENTRIES, PRECEDENCE

__all__ = ["DOCUMENTS", "TABLES", "rendered", "write"]


def _row(*cells: str) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [_row(*header), _row(*("---" for _ in header)), *(_row(*row) for row in rows)]
    return "\n".join(lines)


def meanings() -> str:
    rows = [(f"`{e.cause.value}`", e.title, e.meaning) for e in ENTRIES]
    return _table(("cause", "the report says", "what it means"), rows)


def fixes() -> str:
    rows = [(f"`{e.cause.value}`", e.meaning, e.remedy) for e in ENTRIES]
    return _table(("cause", "what it means", "the fix it names"), rows)


def rules() -> str:
    rows = [(f"`{e.cause.value}`", e.requires, e.proof, e.unproven) for e in ENTRIES]
    header = (
        "cause",
        "the records must show",
        "the experiment that proves it",
        "without that experiment",
    )
    return _table(header, rows)


def precedence() -> str:
    rows = [
        (str(place), f"`{signal.name}`", f"`{cause.value}`", signal.when)
        for place, (signal, cause) in enumerate(PRECEDENCE, 1)
    ]
    return _table(("order", "signal", "its cause", "present when"), rows)


TABLES: dict[str, Callable[[], str]] = {
    "meanings": meanings,
    "fixes": fixes,
    "rules": rules,
    "precedence": precedence,
}
"""Each table by its marker's name."""

DOCUMENTS = ("README.md", "docs/comparing.md", "docs/causes.md")
"""The documents that hold the tables, relative to the repository's root."""

_BLOCK = re.compile(r"(<!-- causes:(\w+) -->\n)(.*?)(<!-- /causes -->)", re.DOTALL)


def rendered(text: str) -> str:
    """``text`` with the table between each pair of markers made again from the registry."""

    def table(match: re.Match[str]) -> str:
        return f"{match.group(1)}{TABLES[match.group(2)]()}\n{match.group(4)}"

    return _BLOCK.sub(table, text)


def write(root: Path) -> list[Path]:
    """Each document under ``root`` with its tables made again; the documents that changed."""
    changed = []
    for name in DOCUMENTS:
        path = root / name
        text = path.read_text(encoding="utf-8")
        made = rendered(text)
        if made != text:
            path.write_text(made, encoding="utf-8")
            changed.append(path)
    return changed


if __name__ == "__main__":
    for path in write(Path(sys.argv[1] if len(sys.argv) > 1 else ".")):
        print(f"wrote {path}")
