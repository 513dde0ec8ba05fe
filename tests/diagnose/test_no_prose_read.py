"""No signal is read back out of words: nothing in ``bisect_repro/diagnose/`` splits, searches or
tests the prefix of an evidence item's text, an explanation, a fix or a finding's words. Signals
are typed values (:mod:`bisect_repro.diagnose.compare.signals`); the one place that reads a
string's form is :meth:`Evidence.from_json`, which reads back the ``kind:name`` form of an
``experiment`` that its own ``to_json`` writes."""

from __future__ import annotations

import ast
from pathlib import Path

DIAGNOSE = Path(__file__).resolve().parents[2] / "bisect_repro" / "diagnose"
READS = {
    "split",
    "rsplit",
    "partition",
    "rpartition",
    "startswith",
    "endswith",
    "removeprefix",
    "removesuffix",
    "find",
    "rfind",
    "index",
    "count",
}
"""String methods that read a part of a string."""
WORDS = (
    "detail",
    "explanation",
    "subject",
    "experiment",
    "what",
    "fix",
    "sentence",
    "describe",
    "text",
)
"""Names of what holds sentences: an evidence item's text and subject, a verdict's explanation and
fix, a finding's words, a text."""
ALLOWED = {
    ("compare/verdict.py", "from_json"): "the JSON form of an experiment read back at the edge",
    ("compare/compiled.py", "_detail"): "PyTorch's description of an op, as its bisector prints it",
}
"""(module, function): where a string's form is read, and why that is no sentence of ours."""


def _holds_prose(expr: ast.expr) -> bool:
    """Whether an expression names something that holds sentences: a name or attribute (not a
    method called on it) that is one of :data:`WORDS`, alone or as a part of a snake-case name."""
    called = {id(n.func) for n in ast.walk(expr) if isinstance(n, ast.Call)}
    names = [
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(expr)
        if isinstance(n, ast.Name) or (isinstance(n, ast.Attribute) and id(n) not in called)
    ]
    return any(word in name.split("_") for name in names for word in WORDS)


def _reads_prose(node: ast.AST) -> str | None:
    """The source of a call or an ``in`` test that reads a part of a sentence, else ``None``."""
    call = (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in READS
        and _holds_prose(node.func.value)
    )
    search = (
        isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Constant)
        and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
        and any(_holds_prose(c) for c in node.comparators)
    )
    return ast.unparse(node) if call or search else None


def prose_reads(root: Path = DIAGNOSE) -> list[str]:
    """Every place under ``root`` that reads a signal out of words (see the module docstring)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef) or (module, function.name) in ALLOWED:
                continue
            for node in ast.walk(function):
                source = _reads_prose(node)
                if source is not None:
                    found.append(f"{module}:{node.lineno}: {source}")
    return sorted(set(found))


def test_no_signal_is_read_out_of_a_sentence() -> None:
    assert prose_reads() == []


def test_the_check_sees_each_way_a_signal_was_read_out_of_words(tmp_path: Path) -> None:
    (tmp_path / "rules.py").write_text(
        "def reseed_step(evidence):\n"
        "    head = evidence.detail.partition(' reseeded from entropy')[0]\n"
        "    return int(head.removeprefix('step '))\n"
        "def shown(e):\n"
        "    return e.experiment.partition(':')[0] == 'stream' and e.subject.startswith('run ')\n"
        "def explanation_for(text, proven):\n"
        "    return text if proven else text.split(', and with run A', 1)[0]\n"
        "def named(verdict):\n"
        "    return 'optimizer' in verdict.explanation\n"
    )
    found = prose_reads(tmp_path)
    assert [line.split(":")[1] for line in found] == ["2", "5", "5", "7", "9"], found
    assert all(line.startswith("rules.py:") for line in found)
