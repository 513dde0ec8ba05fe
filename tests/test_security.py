"""Nothing is unpickled, and reading a run never imports or executes anything.

Two checks: a static one over the whole package source (no pickle-family import, no
``torch.load`` without ``weights_only=True``, no ``eval``/``exec``, dynamic imports only where
recipes are loaded on purpose), and a dynamic one that reads a run under a Python audit hook in a
fresh interpreter and fails on any import, exec, compile, unpickling or process start.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from bisect_repro.cli import app

PACKAGE = Path(__file__).resolve().parent.parent / "bisect_repro"
FORBIDDEN_MODULES = {
    "pickle",
    "cPickle",
    "_pickle",
    "dill",
    "cloudpickle",
    "joblib",
    "marshal",
    "shelve",
    "copyreg",
}
# imports the user's recipe for `record`, by design; never on a read path
RECIPE_LOADER = "recipe.py"
# runs the user's own script (recorded unchanged, and in a replaying process), by design; never on a
# read path
SCRIPT_RUNNER = "script.py"
# imports libraries by name, only those in forks.PRELOADED, before it forks replaying processes
FORK_SERVER = "forkserver.py"
# compiles the replayed file from the bytes whose hash was checked, by design; never on a read path
PINNED_LOADER = "pinned.py"
IMPORTERS = {RECIPE_LOADER, FORK_SERVER, PINNED_LOADER}
# run the user's checked code as __main__ or as a module
CODE_RUNNERS = {SCRIPT_RUNNER, PINNED_LOADER}


def calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else ast.unparse(func)
                if isinstance(func, ast.Attribute)
                else ""
            )
            found.append((name, node))
    return found


def keyword_is(node: ast.Call, name: str, value: object) -> bool:
    return any(
        k.arg == name and isinstance(k.value, ast.Constant) and k.value.value == value
        for k in node.keywords
    )


def import_problems(tree: ast.AST, file: str) -> list[str]:
    problems = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "torch"
            and any(a.name == "load" for a in node.names)
        ):
            problems.append(f"{file}:{node.lineno} imports torch.load under another name")
        if isinstance(node, ast.Import):
            names = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names = {(node.module or "").split(".")[0]}
        else:
            continue
        if names & FORBIDDEN_MODULES:
            problems.append(f"{file}:{node.lineno} imports {sorted(names & FORBIDDEN_MODULES)}")
        if "importlib" in names and file not in IMPORTERS:
            problems.append(f"{file}:{node.lineno} imports importlib")
        if "runpy" in names and file != SCRIPT_RUNNER:
            problems.append(f"{file}:{node.lineno} imports runpy")
    return problems


def problems_in(source: str, file: str) -> list[str]:
    tree = ast.parse(source, file)
    problems = import_problems(tree, file)
    for name, node in calls(tree):
        where = f"{file}:{node.lineno}"
        # safetensors.torch.load is safe
        if name == "torch.load" and not keyword_is(node, "weights_only", True):
            problems.append(f"{where} calls torch.load without weights_only=True")
        if name in ("np.load", "numpy.load") and keyword_is(node, "allow_pickle", True):
            problems.append(f"{where} calls {name} with allow_pickle=True")
        if name in ("eval", "exec", "compile", "__import__") and not (
            name in ("exec", "compile") and file in CODE_RUNNERS
        ):
            problems.append(f"{where} calls {name}")
        if (name.endswith("exec_module") and file != RECIPE_LOADER) or (
            name.endswith("import_module") and file not in IMPORTERS
        ):
            problems.append(f"{where} calls {name}")
    return problems


def test_the_package_source_never_unpickles_or_evaluates() -> None:
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) >= 10
    assert [
        problem for path in sources for problem in problems_in(path.read_text(), path.name)
    ] == []


def test_the_static_check_would_catch_each_kind_of_problem() -> None:
    bad = """
import pickle
from torch import load
import importlib
x = torch.load(f)
y = torch.load(f, weights_only=True)
z = safetensors.torch.load(b)
a = np.load(f, allow_pickle=True)
eval("1")
importlib.import_module("m")
"""
    found = problems_in(bad + "import runpy\n", "store.py")
    assert len(found) == 8, found
    assert problems_in("import runpy\nrunpy.run_path('x')\n", SCRIPT_RUNNER) == []
    assert problems_in("import importlib\nimportlib.import_module('m')\n", RECIPE_LOADER) == []


AUDITED = textwrap.dedent(
    """
    import json, shutil, sys, warnings
    from pathlib import Path
    import numpy as np, torch
    from bisect_repro import Run
    from bisect_repro.diagnose.show.summary import run_summary
    from bisect_repro.store.writer import RunWriter

    root = Path(sys.argv[1])
    tree = {
        "w": torch.ones(3), "a": np.arange(4), "t": (1, 2.5, None), "d": torch.bfloat16,
        "k": {3: "x"}, "hashes": {}, "streams": {},
    }
    writer = RunWriter.create(root / "warm", {"target": "evil.py:build", "config": {}})
    writer.append_steps([{"step": 0, "loss": 1.0, "order": None, "batch": "00"}])
    writer.commit("snapshot", 0, tree)
    writer.commit("checkpoint", 0, tree)
    writer.close()
    shutil.copytree(root / "warm", root / "cold")

    def read(path):
        run = Run.open(path)
        run_summary(run)
        for step in run.snapshots:
            run.snapshot(step)
        for step in run.checkpoints:
            run.checkpoint(step)

    read(root / "warm")  # lazy imports of the libraries themselves happen here, not under audit
    watched = (
        "import", "exec", "compile", "pickle.find_class", "marshal.load", "marshal.loads",
        "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork", "ctypes.dlopen",
        "builtins.input",
    )
    events = []

    def audit(event, args):
        if event in watched:
            events.append([event, repr(args)[:200]])

    sys.addaudithook(audit)
    read(root / "cold")
    print(json.dumps(events))
    """
)


def test_reading_a_run_imports_and_executes_nothing(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", AUDITED, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_the_audit_would_see_an_import(tmp_path) -> None:
    probe = AUDITED.replace('read(root / "cold")\n', 'read(root / "cold"); import wave\n')
    result = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert any(event == "import" for event, _ in json.loads(result.stdout.strip().splitlines()[-1]))


def test_show_never_imports_the_recipe_a_run_names(examples, tmp_path) -> None:
    evil = tmp_path / "evil.py"
    marker = tmp_path / "imported"
    evil.write_text(f"open({str(marker)!r}, 'w').write('yes')\ndef build(): pass\n")
    args = [
        "record",
        f"{examples / 'mlp.py'}:build",
        "--out",
        str(tmp_path / "r"),
        "--steps",
        "2",
        "--every",
        "1",
        "--quiet",
    ]
    assert CliRunner().invoke(app, args).exit_code == 0
    meta_path = tmp_path / "r" / "run.json"
    meta = json.loads(meta_path.read_text())
    meta["target"] = f"{evil}:build"
    meta_path.write_text(json.dumps(meta))
    shown = CliRunner().invoke(app, ["show", str(tmp_path / "r"), "--json"])
    assert shown.exit_code == 0 and json.loads(shown.stdout)["target"] == f"{evil}:build"
    assert not marker.exists() and not any("evil" in name for name in sys.modules)
