"""The package's imports run one way: capture, store, record, replay, diagnose, report, then the CLI.

Every ``from .`` / ``from ..`` import inside ``bisect_repro`` is read from the source (nothing is
imported), and an import of a later layer from an earlier one fails the test, naming the line.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "bisect_repro"
LAYERS = [
    "version", "errors", "stateful", "trainee", "capture", "store", "serve", "record", "replay", "diagnose", "report",
    "integrations", "demo", "cli",
]  # fmt: skip


def layer_of(parts: tuple[str, ...]) -> int:
    name = parts[0].removesuffix(".py")
    return LAYERS.index(name) if name in LAYERS else len(LAYERS)


def upward_imports(package: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).parts
        if relative == ("__init__.py",):
            continue  # the public API gathers every layer
        here = layer_of(relative)
        folder = relative[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            base = folder[: len(folder) - (node.level - 1)] if node.level > 1 else folder
            target = (*base, *(node.module.split(".") if node.module else ()))
            names = [target] if node.module else [(*target, alias.name) for alias in node.names]
            for parts in names:
                if parts and parts[0] != "__version__" and layer_of(parts) > here:
                    found.append(f"{'/'.join(relative)}:{node.lineno} imports {'.'.join(parts)}")
    return found


def test_no_module_imports_a_later_layer() -> None:
    assert upward_imports() == []


def test_the_check_would_see_an_upward_import(tmp_path) -> None:
    package = tmp_path / "bisect_repro"
    (package / "capture").mkdir(parents=True)
    source = "from ..diagnose.compare import compare\nfrom .rng import RandomStreams\nfrom .. import errors\n"
    (package / "capture" / "x.py").write_text(source)
    assert upward_imports(package) == ["capture/x.py:1 imports diagnose.compare"]
