"""``bisect-repro record --out DIR -- python train.py ARGS``: recording a script that is not changed at all.

The command is read as a person types it: an interpreter (``python``, ``python3``, a path to one),
then a script or ``-m module``, then the script's own arguments. It runs in a process of its
own (:func:`main`, given the command and the options as JSON), which installs :class:`~bisect_repro.record.autohooks.AutoHooks`
and runs the script as ``__main__`` with its own ``sys.argv``, in the current working directory,
as ``python train.py ARGS`` would: its output goes where it would, and its exit code is the
command's. The run it writes names the script and its arguments, so ``compare`` replays it by
running it again under the same hooks.

The user's own ``torchrun`` works the same way: ``-- torchrun --nproc-per-node 2 train.py ARGS``
(or ``-- python -m torch.distributed.run ...``) starts that many ranks through PyTorch's launcher,
each running the script under the hooks; the script initialises its process group itself, as it
does without bisect-repro, and each rank records into its own ``rank{r}/``. ``compare`` replays
such a run under torchrun with as many ranks (:mod:`bisect_repro.replay.ranked`).

Where the guarantees stop: options of the interpreter itself (``-O``, ``-X ...``) are refused, and
the script runs on this interpreter (the one bisect-repro is installed in), whatever the command
names. Of torchrun's options only those of one node are accepted (``--nproc-per-node``,
``--standalone``, ``--nnodes 1``, ``--node-rank 0``, ``--master-addr``, ``--master-port``); the
ranks always rendezvous as ``--standalone`` does, on a free port. Several nodes need the Recorder
in the script.
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
from .arguments import capture_arguments
from .autohooks import AutoHooks
from .options import RecordOptions
from .torchrun import torchrun_command

__all__ = ["ScriptCommand", "is_interpreter", "is_launcher", "parse_command", "record_script", "run_as_main"]

_INTERPRETER = re.compile(r"python[0-9.]*(\.exe)?")
_USAGE = "give the command as: -- python train.py ARGS, -- python -m package.module ARGS or -- torchrun --nproc-per-node N train.py ARGS"
_ONE_NODE = {"--standalone": None, "--nnodes": {"1", "1:1"}, "--node-rank": {"0"}, "--master-addr": (), "--master-port": ()}
"""The torchrun options of one node: a flag (``None``), the values allowed, or any value (``()``)."""


@dataclass(frozen=True, kw_only=True)
class ScriptCommand:
    """What a command runs: a script by its path, or a module by its name, with the script's ``sys.argv``."""

    kind: CodeKind
    path: str | None = None
    module: str | None = None
    argv: tuple[str, ...]
    nproc: int | None = None
    """Ranks on this node, for a command run under torchrun; ``None``: one process."""


def is_interpreter(word: str) -> bool:
    """Whether a command's first word names a Python interpreter (``python``, ``python3.11``, a path to one)."""
    return _INTERPRETER.fullmatch(Path(word).name) is not None


def is_launcher(words: list[str]) -> bool:
    """Whether a command starts with torchrun (``torchrun``, or an interpreter with ``-m torch.distributed.run``)."""
    if not words:
        return False
    return Path(words[0]).name == "torchrun" or (is_interpreter(words[0]) and words[1:3] == ["-m", "torch.distributed.run"])


def _ranks(words: list[str]) -> tuple[int, list[str]]:
    """torchrun's options (see :data:`_ONE_NODE`): the number of ranks, and the words after them."""
    nproc, rest = 1, list(words)
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "--module"):
        name, given, value = rest.pop(0).partition("=")
        name = "--" + name.lstrip("-").replace("_", "-")
        allowed = _ONE_NODE.get(name, ())
        if name not in (*_ONE_NODE, "--nproc-per-node"):
            raise BisectReproError(
                f"record: torchrun option {name} is not supported; record on one node: torchrun --nproc-per-node N train.py ARGS"
            )
        if allowed is None:
            continue
        if not given:
            if not rest:
                raise BisectReproError(f"record: torchrun option {name} needs a value; {_USAGE}")
            value = rest.pop(0)
        if name == "--nproc-per-node":
            if not value.isdigit() or not 1 <= int(value) <= 64:
                raise BisectReproError(
                    f"record: --nproc-per-node {value!r} is not a number of ranks from 1 to 64; give one, as in --nproc-per-node 2"
                )
            nproc = int(value)
        elif allowed and value not in allowed:
            raise BisectReproError(
                f"record: torchrun {name} {value}: only one node is supported; drop the option or record with the Recorder in the script"
            )
    return nproc, rest


def parse_command(words: list[str]) -> ScriptCommand:
    """``python train.py ARGS``, ``python -m pkg.train ARGS`` or ``torchrun [OPTIONS] train.py ARGS``;
    a one-line error with the fix otherwise."""
    nproc = None
    if is_launcher(words):
        nproc, rest = _ranks(words[1:] if Path(words[0]).name == "torchrun" else words[3:])
        words = [sys.executable, *("-m" if word == "--module" else word for word in rest[:1]), *rest[1:]]
    if not words or not is_interpreter(words[0]):
        shown = words[0] if words else "nothing"
        raise BisectReproError(f"record: the command starts with {shown!r}, not a Python interpreter or torchrun; {_USAGE}")
    rest = words[1:]
    if rest[:1] == ["-m"] and len(rest) >= 2:
        return ScriptCommand(kind=CodeKind.MODULE, module=rest[1], argv=(rest[1], *rest[2:]), nproc=nproc)
    if not rest or rest[0].startswith("-"):
        raise BisectReproError(f"record: {' '.join(words)!r} names no script (interpreter options are not supported); {_USAGE}")
    path = Path(rest[0])
    if not path.is_file():
        raise BisectReproError(f"record: {rest[0]}: no such script; check the path")
    return ScriptCommand(kind=CodeKind.SCRIPT, path=str(path.resolve()), argv=(rest[0], *rest[1:]), nproc=nproc)


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
    entry = [sys.executable, "-c", "import sys; from bisect_repro.record.script import main; sys.exit(main(sys.argv[1:]))"]
    if command.nproc is not None:  # each rank runs main()
        entry = [*torchrun_command(command.nproc), "--no-python", *entry]
    return subprocess.call([*entry, json.dumps(spec)], env={**os.environ, "PYTHONPATH": path})


def main(argv: list[str] | None = None) -> int:
    """The process of :func:`record_script`: the hooks, then the script, then the final snapshot."""
    spec: dict[str, Any] = json.loads((argv or sys.argv[1:])[0])
    found = spec["command"]
    command = ScriptCommand(kind=CodeKind(found["kind"]), path=found["path"], module=found["module"], argv=tuple(found["argv"]))
    if command.kind is CodeKind.MODULE:
        sys.path.insert(0, os.getcwd())  # as python -m does
    hooks = AutoHooks(spec["out"], RecordOptions(**spec["options"])).install()
    read_arguments = capture_arguments(hooks.config)
    code = 0
    try:
        run_as_main(command)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        hooks.close(failed=True)  # what was committed stays; the run is incomplete
        raise
    finally:
        read_arguments()
    hooks.close(failed=code != 0)
    if hooks.recorder is None:
        print("bisect-repro: the script never stepped an optimizer after a forward pass; nothing was recorded", file=sys.stderr)
        return code or 3
    return code
