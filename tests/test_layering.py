"""The package's imports run one way: capture, store, serve, record, replay, diagnose, report, then
the CLI.

Every import inside ``bisect_repro`` is read from the source (nothing is imported): relative
(``from .x``, ``from ..x``) and absolute (``import bisect_repro.x``, ``from bisect_repro.x``), at
the top of a module or inside a function alike. An import of a later layer from an earlier one
fails the test, naming the line; so does any cycle between modules, inside a layer too.

Inside ``diagnose/`` (one layer, its subfolders included), the parts keep apart: its shared
modules at the top import none of its subfolders, ``doctor/`` imports nothing of ``compare/``,
``numerics/`` or ``show/``, and none of those imports ``doctor/``; ``show/`` imports neither
``compare/`` nor ``numerics/``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "bisect_repro"
LAYERS = [
    "version",
    "variables",
    "errors",
    "stateful",
    "trainee",
    "capture",
    "store",
    "serve",
    "record",
    "replay",
    "diagnose",
    "report",
    "integrations",
    "demo",
    "cli",
    "__main__",
]


def layer_of(parts: tuple[str, ...]) -> int:
    name = parts[0].removesuffix(".py")
    return LAYERS.index(name) if name in LAYERS else len(LAYERS)


def _imports(package: Path, path: Path) -> Iterator[tuple[int, tuple[str, ...]]]:
    """``(line, dotted parts below the package)`` of every import of the package in ``path``: for
    ``from x import name``, ``x.name`` (``name`` may be a module or an attribute)."""
    relative = path.relative_to(package).parts
    folder = relative[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                head, *rest = alias.name.split(".")
                if head == package.name:
                    yield node.lineno, tuple(rest)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                head, *rest = (node.module or "").split(".")
                if head != package.name:
                    continue
                base = tuple(rest)
            else:
                base = folder[: len(folder) - (node.level - 1)] if node.level > 1 else folder
                base = (*base, *(node.module.split(".") if node.module else ()))
            for alias in node.names:
                yield node.lineno, (*base, alias.name)


def _module(package: Path, parts: tuple[str, ...]) -> str | None:
    """The module file ``parts`` names (``a.b.name`` → ``a/b.py`` when ``name`` is an attribute)."""
    for end in range(len(parts), 0, -1):
        stem = "/".join(parts[:end])
        if (package / f"{stem}.py").is_file():
            return f"{stem}.py"
        if (package / stem / "__init__.py").is_file():
            return (
                f"{stem}/__init__.py"
                if end == len(parts) or not (package / stem / f"{parts[end]}.py").is_file()
                else None
            )
    return None


def upward_imports(package: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).parts
        if relative == ("__init__.py",):
            continue  # the public API gathers every layer
        here = layer_of(relative)
        for line, parts in _imports(package, path):
            if parts and parts[0] != "__version__" and layer_of(parts) > here:
                found.append(f"{'/'.join(relative)}:{line} imports {'.'.join(parts)}")
    return found


# Inside diagnose/: the part a module is in (its subfolder, "" for the shared modules at the top)
# and the parts it must not import.
DIAGNOSE_APART = {
    "": {"compare", "numerics", "doctor", "show"},
    "doctor": {"compare", "numerics", "show"},
    "compare": {"doctor", "show"},
    "numerics": {"doctor", "show"},
    "show": {"compare", "numerics", "doctor"},
}


def diagnose_part(parts: tuple[str, ...]) -> str | None:
    """The part of ``diagnose/`` that ``parts`` (a module's path, or an import's dotted parts) is
    in: its subfolder, or ``""`` for a module at the top; ``None`` outside ``diagnose/``."""
    if not parts or parts[0] != "diagnose":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in DIAGNOSE_APART else ""


def crossed_parts(package: Path = PACKAGE) -> list[str]:
    """Every import inside ``diagnose/`` of a part its importer must keep apart from."""
    found = []
    for path in sorted((package / "diagnose").rglob("*.py")):
        relative = path.relative_to(package).parts
        here = diagnose_part(relative)
        if here is None or relative == ("diagnose", "__init__.py"):
            continue
        for line, parts in _imports(package, path):
            there = diagnose_part(parts)
            if there and there != here and there in DIAGNOSE_APART.get(here, set()):
                found.append(f"{'/'.join(relative)}:{line} imports {'.'.join(parts)}")
    return found


def import_cycles(package: Path = PACKAGE) -> list[list[str]]:
    """Every cycle of imports between modules (the package's own ``__init__`` aside), each as the
    modules on it, starting from its smallest name."""
    graph: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        name = "/".join(path.relative_to(package).parts)
        if name == "__init__.py":
            continue
        targets = {_module(package, parts) for _, parts in _imports(package, path) if parts}
        graph[name] = {t for t in targets if t is not None and t != name and t != "__init__.py"}
    cycles: set[tuple[str, ...]] = set()

    def walk(node: str, trail: list[str], on_trail: set[str]) -> None:
        for target in sorted(graph.get(node, ())):
            if target in on_trail:
                cycle = trail[trail.index(target) :]
                start = cycle.index(min(cycle))
                cycles.add(tuple(cycle[start:] + cycle[:start]))
            elif target not in done:
                walk(target, [*trail, target], on_trail | {target})
        done.add(node)

    done: set[str] = set()
    for node in sorted(graph):
        if node not in done:
            walk(node, [node], {node})
    return [list(cycle) for cycle in sorted(cycles)]


def test_no_module_imports_a_later_layer() -> None:
    assert upward_imports() == []


def test_no_import_cycle_even_inside_a_layer_or_a_function() -> None:
    assert import_cycles() == []


def test_diagnose_parts_keep_apart() -> None:
    assert crossed_parts() == []


def test_the_check_would_see_doctor_import_compare(tmp_path) -> None:
    package = tmp_path / "bisect_repro"
    for part in ("doctor", "compare", "show"):
        (package / "diagnose" / part).mkdir(parents=True)
    (package / "diagnose" / "doctor" / "checks.py").write_text(
        "from ..compare.records import Records\nfrom ..causes import Cause\n"
    )
    (package / "diagnose" / "compare" / "walk.py").write_text(
        "from .records import Records\nfrom ..causes import Cause\n"
    )
    (package / "diagnose" / "causes.py").write_text(
        "def f():\n    from bisect_repro.diagnose.show.summary import run_summary\n"
    )
    assert crossed_parts(package) == [
        "diagnose/causes.py:2 imports diagnose.show.summary.run_summary",
        "diagnose/doctor/checks.py:1 imports diagnose.compare.records.Records",
    ]


def test_the_check_would_see_an_upward_import(tmp_path) -> None:
    package = tmp_path / "bisect_repro"
    (package / "capture").mkdir(parents=True)
    source = (
        "from ..diagnose.compare import compare\nfrom .rng import RandomStreams\nfrom .. "
        "import errors\n"
    )
    source += "def late():\n    import bisect_repro.report.text\n"
    (package / "capture" / "x.py").write_text(source)
    assert upward_imports(package) == [
        "capture/x.py:1 imports diagnose.compare.compare",
        "capture/x.py:5 imports report.text",
    ]


def test_the_check_would_see_a_cycle_through_a_function_level_import(tmp_path) -> None:
    package = tmp_path / "bisect_repro"
    (package / "replay").mkdir(parents=True)
    (package / "replay" / "__init__.py").write_text("")
    (package / "replay" / "replica.py").write_text("def make():\n    from .ranks import Ranked\n")
    (package / "replay" / "ranks.py").write_text("from .replica import Replica\n")
    (package / "replay" / "alone.py").write_text("from bisect_repro.replay import ranks\n")
    assert import_cycles(package) == [["replay/ranks.py", "replay/replica.py"]]
