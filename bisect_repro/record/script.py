"""``bisect-repro record --out DIR -- python train.py ARGS``: recording a script that is not changed at all.

The command is read as a person types it: an interpreter (``python``, ``python3``, a path to one),
then a script or ``-m module``, then the script's own arguments. It runs in a process of its
own (:func:`main`, given the command and the options as JSON), which installs :class:`~bisect_repro.record.autohooks.AutoHooks`
and runs the script as ``__main__`` with its own ``sys.argv``, in the current working directory,
as ``python train.py ARGS`` would: its output goes where it would, and its exit code is the
command's. The run it writes names the script and its arguments, so ``compare`` replays it by
running it again under the same hooks.

Where the guarantees stop: options of the interpreter itself (``-O``, ``-X ...``) are refused, and
the script runs on this interpreter (the one bisect-repro is installed in), whatever the command
names; ``torchrun`` is not supported here yet (record a recipe with ``--nproc-per-node``, or use
the Recorder in the script).
"""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import BisectReproError
from ..store.meta import CodeKind
from .autohooks import AutoHooks
from .options import RecordOptions

__all__ = ["ScriptCommand", "is_interpreter", "parse_command", "record_script", "run_as_main"]

_INTERPRETER = re.compile(r"python[0-9.]*(\.exe)?")


@dataclass(frozen=True, kw_only=True)
class ScriptCommand:
    """What a command runs: a script by its path, or a module by its name, with the script's ``sys.argv``."""

    kind: CodeKind
    path: str | None = None
    module: str | None = None
    argv: tuple[str, ...]


def is_interpreter(word: str) -> bool:
    """Whether a command's first word names a Python interpreter (``python``, ``python3.11``, a path to one)."""
    return _INTERPRETER.fullmatch(Path(word).name) is not None


def parse_command(words: list[str]) -> ScriptCommand:
    """``python train.py ARGS`` or ``python -m pkg.train ARGS``; a one-line error with the fix otherwise."""
    usage = "give the command as: -- python train.py ARGS, or -- python -m package.module ARGS"
    if not words or not is_interpreter(words[0]):
        shown = words[0] if words else "nothing"
        raise BisectReproError(f"record: the command starts with {shown!r}, not a Python interpreter; {usage}")
    rest = words[1:]
    if rest[:1] == ["-m"] and len(rest) >= 2:
        return ScriptCommand(kind=CodeKind.MODULE, module=rest[1], argv=(rest[1], *rest[2:]))
    if not rest or rest[0].startswith("-"):
        raise BisectReproError(f"record: {' '.join(words)!r} names no script (interpreter options are not supported); {usage}")
    path = Path(rest[0])
    if not path.is_file():
        raise BisectReproError(f"record: {rest[0]}: no such script; check the path")
    return ScriptCommand(kind=CodeKind.SCRIPT, path=str(path.resolve()), argv=(rest[0], *rest[1:]))


def run_as_main(command: ScriptCommand) -> None:
    """Run the script or module as ``__main__`` with its own ``sys.argv``, as the interpreter would."""
    sys.argv = list(command.argv)
    if command.kind is CodeKind.MODULE:
        runpy.run_module(command.module or "", run_name="__main__", alter_sys=True)
        return
    path = command.path or ""
    sys.path.insert(0, str(Path(path).parent))
    runpy.run_path(path, run_name="__main__")


def record_script(command: ScriptCommand, out: Path, options: RecordOptions) -> int:
    """Run the command under the hooks in a process of its own; its exit code."""
    spec = {"out": str(out.resolve()), "options": asdict(options), "command": {**asdict(command), "kind": command.kind.value}}
    package = str(Path(__file__).resolve().parents[2])  # this very package, wherever it is installed
    path = os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p)
    entry = "import sys; from bisect_repro.record.script import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.call([sys.executable, "-c", entry, json.dumps(spec)], env={**os.environ, "PYTHONPATH": path})


def main(argv: list[str] | None = None) -> int:
    """The process of :func:`record_script`: the hooks, then the script, then the final snapshot."""
    spec: dict[str, Any] = json.loads((argv or sys.argv[1:])[0])
    found = spec["command"]
    command = ScriptCommand(kind=CodeKind(found["kind"]), path=found["path"], module=found["module"], argv=tuple(found["argv"]))
    if command.kind is CodeKind.MODULE:
        sys.path.insert(0, os.getcwd())  # as python -m does
    hooks = AutoHooks(spec["out"], RecordOptions(**spec["options"])).install()
    code = 0
    try:
        run_as_main(command)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        hooks.close(failed=True)  # what was committed stays; the run is incomplete
        raise
    hooks.close(failed=code != 0)
    if hooks.recorder is None:
        print("bisect-repro: the script never stepped an optimizer after a forward pass; nothing was recorded", file=sys.stderr)
        return code or 3
    return code
