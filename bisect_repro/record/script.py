"""``bisect-repro record --out DIR -- python train.py ARGS``: recording a script that is not changed
at all.

The command is read as a person types it: an interpreter (``python``, ``python3``, a path to one),
then a script or ``-m module``, then the script's own arguments. It runs in a process of its
own (:func:`main`, given the command and the options as JSON), which installs
:class:`~bisect_repro.record.autohooks.AutoHooks` and runs the script as ``__main__`` with its own
``sys.argv``, in the current working directory, as ``python train.py ARGS`` would: its output goes
where it would, and its exit code is the command's. The run it writes names the script and its
arguments, so ``compare`` replays it by running it again under the same hooks.

The user's own ``torchrun`` works the same way: ``-- torchrun --nproc-per-node 2 train.py ARGS``
(or ``-- python -m torch.distributed.run ...``) starts that many ranks through PyTorch's launcher,
each running the script under the hooks; the script initialises its process group itself, as it
does without bisect-repro, and each rank records into its own ``rank{r}/``, keyed by its global
rank. On several nodes each node runs the same command into the same folder on a shared file
system, with torchrun's rendezvous options (``--nnodes 2 --node-rank R --rdzv-backend c10d
--rdzv-endpoint HOST:PORT``), which are passed to the launcher as given. ``compare`` replays such a
run under torchrun with as many ranks, on this machine (:mod:`bisect_repro.replay.ranked`).

Where the guarantees stop: options of the interpreter itself (``-O``, ``-X ...``) are refused, and
the script runs on this interpreter (the one bisect-repro is installed in), whatever the command
names. Of torchrun's options only those in :data:`_OPTIONS` are accepted; on one node the ranks
always rendezvous as ``--standalone`` does, on a free port; on several, ``--nnodes`` must be a
fixed count (not elastic, ``1:4``) and a rendezvous endpoint (``--rdzv-endpoint`` or
``--master-addr``) must be given.
"""

from __future__ import annotations

import builtins
import json
import os
import re
import runpy
import subprocess
import sys
import time
import types
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BisectReproError
from ..store.meta import CodeKind
from . import pinned
from .arguments import capture_arguments
from .options import RecordOptions

if TYPE_CHECKING:
    from .against import Against

# The command line parses a command and starts its process without importing torch: what records
# (the hooks, the check against a reference, torchrun's launcher) is imported where it runs.

__all__ = [
    "ScriptCommand",
    "is_interpreter",
    "is_launcher",
    "launcher_options",
    "parse_command",
    "progress_line",
    "record_script",
    "run_as_main",
]

_INTERPRETER = re.compile(r"python[0-9.]*(\.exe)?")
_USAGE = (
    "give the command as: -- python train.py ARGS, -- python -m package.module ARGS or -- "
    "torchrun --nproc-per-node N train.py ARGS"
)
_RANKS_FIX = "give one, as in --nproc-per-node 2"
_NUMBER = re.compile(r"[0-9]+")
_NODES = re.compile(r"([0-9]+)(:\1)?")
_OPTIONS: dict[str, re.Pattern[str] | None] = {
    "--standalone": None,
    "--nproc-per-node": _NUMBER,
    "--nnodes": _NODES,
    "--node-rank": _NUMBER,
    "--master-addr": re.compile(r"[A-Za-z0-9.:_\[\]-]+"),
    "--master-port": _NUMBER,
    "--rdzv-backend": re.compile(r"c10d|static|etcd|etcd-v2"),
    "--rdzv-endpoint": re.compile(r"[A-Za-z0-9.:_\[\]-]+"),
    "--rdzv-id": re.compile(r"[A-Za-z0-9._-]+"),
}
"""The torchrun options accepted: a flag (``None``), or the pattern its value must match."""
_PASSED = (
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--rdzv-backend",
    "--rdzv-endpoint",
    "--rdzv-id",
)
"""The options passed to the launcher of a run on several nodes (with ``--nnodes`` and
``--nproc-per-node``)."""


@dataclass(frozen=True, kw_only=True)
class ScriptCommand:
    """What a command runs: a script by its path, or a module by its name, with the script's
    ``sys.argv``."""

    kind: CodeKind
    path: str | None = None
    module: str | None = None
    argv: tuple[str, ...]
    nproc: int | None = None
    """Ranks on this node, for a command run under torchrun; ``None``: one process."""
    launcher: tuple[str, ...] = ()
    """The launcher options of a run on several nodes (``--nnodes 2 --node-rank 1 ...``); empty on
    one node."""


def is_interpreter(word: str) -> bool:
    """Whether a command's first word names a Python interpreter (``python``, ``python3.11``, a path
    to one)."""
    return _INTERPRETER.fullmatch(Path(word).name) is not None


def is_launcher(words: list[str]) -> bool:
    """Whether a command starts with torchrun (``torchrun``, or an interpreter with ``-m
    torch.distributed.run``)."""
    if not words:
        return False
    return Path(words[0]).name == "torchrun" or (
        is_interpreter(words[0]) and words[1:3] == ["-m", "torch.distributed.run"]
    )


def _options(words: list[str]) -> tuple[dict[str, str | None], list[str]]:
    """torchrun's options (see :data:`_OPTIONS`) by name, and the words after them."""
    found: dict[str, str | None] = {}
    rest = list(words)
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "--module"):
        name, given, value = rest.pop(0).partition("=")
        name = "--" + name.lstrip("-").replace("_", "-")
        if name not in _OPTIONS:
            raise BisectReproError(
                f"record: torchrun option {name} is not supported; the options read are "
                f"{', '.join(_OPTIONS)}"
            )
        pattern = _OPTIONS[name]
        if pattern is None:
            found[name] = None
            continue
        if not given:
            if not rest:
                raise BisectReproError(f"record: torchrun option {name} needs a value; {_USAGE}")
            value = rest.pop(0)
        if name == "--nproc-per-node" and not pattern.fullmatch(value):
            raise BisectReproError(
                f"record: --nproc-per-node {value!r} is not a number of ranks from 1 to 64; "
                f"{_RANKS_FIX}"
            )
        if not pattern.fullmatch(value):
            raise BisectReproError(
                f"record: torchrun {name} {value!r} is not a value it takes; see torchrun --help"
            )
        found[name] = value
    return found, rest


def _ranks(words: list[str]) -> tuple[int, tuple[str, ...], list[str]]:
    """The ranks on this node, the launcher options of several nodes (empty on one), and the words
    after them."""
    found, rest = _options(words)
    nproc = int(found.get("--nproc-per-node") or 1)
    if not 1 <= nproc <= 64:
        raise BisectReproError(
            f"record: --nproc-per-node {nproc} is not a number of ranks from 1 to 64; {_RANKS_FIX}"
        )
    nodes = int((found.get("--nnodes") or "1").partition(":")[0])
    if nodes < 1:
        raise BisectReproError("record: torchrun --nnodes 0: give the number of nodes, at least 1")
    if nodes == 1:
        return nproc, (), rest
    if "--standalone" in found:
        raise BisectReproError(
            f"record: torchrun --standalone is one node, --nnodes {nodes} several; drop one of them"
        )
    if found.get("--rdzv-endpoint") is None and found.get("--master-addr") is None:
        raise BisectReproError(
            f"record: torchrun --nnodes {nodes} needs where the nodes meet: give --rdzv-endpoint "
            "HOST:PORT"
        )
    launcher = [
        f"--nnodes={nodes}",
        *(f"{name}={found[name]}" for name in _PASSED if found.get(name) is not None),
    ]
    return nproc, tuple(launcher), rest


def launcher_options(words: list[str]) -> tuple[str, ...]:
    """The launcher options of several nodes given to a recipe (``--nnodes=2``, ``--node-rank=1``,
    ``--rdzv-endpoint=HOST:PORT``, ...), checked as a command's are; empty on one node."""
    _, launcher, rest = _ranks(words)
    if rest:
        raise BisectReproError(
            f"record: --torchrun {rest[0]!r} is not a torchrun option; give one a time, as "
            "--torchrun=--nnodes=2"
        )
    return launcher


def parse_command(words: list[str]) -> ScriptCommand:
    """``python train.py ARGS``, ``python -m pkg.train ARGS`` or ``torchrun [OPTIONS] train.py
    ARGS``; a one-line error with the fix otherwise."""
    nproc: int | None = None
    launcher: tuple[str, ...] = ()
    if is_launcher(words):
        nproc, launcher, rest = _ranks(
            words[1:] if Path(words[0]).name == "torchrun" else words[3:]
        )
        words = [
            sys.executable,
            *("-m" if word == "--module" else word for word in rest[:1]),
            *rest[1:],
        ]
    if not words or not is_interpreter(words[0]):
        shown = words[0] if words else "nothing"
        raise BisectReproError(
            f"record: the command starts with {shown!r}, not a Python interpreter or torchrun; "
            f"{_USAGE}"
        )
    rest = words[1:]
    if rest[:1] == ["-m"] and len(rest) >= 2:
        return ScriptCommand(
            kind=CodeKind.MODULE,
            module=rest[1],
            argv=(rest[1], *rest[2:]),
            nproc=nproc,
            launcher=launcher,
        )
    if not rest or rest[0].startswith("-"):
        raise BisectReproError(
            f"record: {' '.join(words)!r} names no script (interpreter options are not supported); "
            f"{_USAGE}"
        )
    path = Path(rest[0])
    if not path.is_file():
        raise BisectReproError(f"record: {rest[0]}: no such script; check the path")
    return ScriptCommand(
        kind=CodeKind.SCRIPT,
        path=str(path.resolve()),
        argv=(rest[0], *rest[1:]),
        nproc=nproc,
        launcher=launcher,
    )


def run_as_main(command: ScriptCommand) -> None:
    """Run the script or module as ``__main__`` with its own ``sys.argv``, as the interpreter
    would."""
    sys.argv = list(command.argv)
    if command.kind is CodeKind.MODULE:
        runpy.run_module(command.module or "", run_name="__main__", alter_sys=True)
        return
    path = command.path or ""
    sys.path.insert(0, str(Path(path).parent))
    verified = pinned.code(path)  # a replay: the checked bytes, read once
    if verified is None:
        runpy.run_path(path, run_name="__main__")
        return
    main = types.ModuleType("__main__")
    main.__dict__.update({"__file__": path, "__builtins__": builtins, "__cached__": None})
    sys.modules["__main__"] = main
    exec(verified, main.__dict__)


def record_script(
    command: ScriptCommand,
    out: Path,
    options: RecordOptions,
    against: Against | None = None,
    *,
    quiet: bool = False,
    output_to_stderr: bool = False,
) -> int:
    """Run the command under the hooks in a process of its own; its exit code. ``against``: check
    the recording against that reference (its run, ``keep_going`` and ``stop_at_end``; the notes
    and, unless ``quiet``, a progress line go to stderr). ``output_to_stderr``: the script's own
    standard output goes to standard error (so that stdout holds only the command's JSON)."""
    spec: dict[str, Any] = {
        "out": str(out.resolve()),
        "options": asdict(options),
        "command": {**asdict(command), "kind": command.kind.value},
        "quiet": quiet,
    }
    if against is not None:
        spec["against"] = {
            "run": str(Path(against.run).resolve()),
            "keep_going": against.keep_going,
            "stop_at_end": against.stop_at_end,
        }
    # this very package, wherever it is installed
    package = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p)
    entry = [
        sys.executable,
        "-c",
        "import sys; from bisect_repro.record.script import main; sys.exit(main(sys.argv[1:]))",
    ]
    if command.nproc is not None:  # each rank runs main()
        from .torchrun import torchrun_command

        entry = [*torchrun_command(command.nproc, command.launcher), "--no-python", *entry]
    return subprocess.call(
        [*entry, json.dumps(spec)],
        env={**os.environ, "PYTHONPATH": path},
        stdout=2 if output_to_stderr else None,
    )


def progress_line(interval: float = 5.0) -> Callable[[int], None]:
    """A progress callback that writes, at most once per ``interval`` seconds, that the run still
    matches its reference up to a step."""
    shown = [0.0]

    def show(step: int) -> None:
        if time.monotonic() - shown[0] >= interval:
            shown[0] = time.monotonic()
            print(f"bisect-repro: still matches the reference up to step {step}", file=sys.stderr)

    return show


def main(argv: list[str] | None = None) -> int:
    """The process of :func:`record_script`: the hooks, then the script, then the final snapshot."""
    from .against import Against, StopRecording
    from .autohooks import AutoHooks

    spec: dict[str, Any] = json.loads((argv or sys.argv[1:])[0])
    found = spec["command"]
    command = ScriptCommand(
        kind=CodeKind(found["kind"]),
        path=found["path"],
        module=found["module"],
        argv=tuple(found["argv"]),
    )
    if command.kind is CodeKind.MODULE:
        sys.path.insert(0, os.getcwd())  # as python -m does
    given = spec.get("against")
    against = (
        Against(
            run=given["run"],
            keep_going=given["keep_going"],
            stop_at_end=given["stop_at_end"],
            on_progress=None if spec.get("quiet") else progress_line(),
        )
        if given is not None
        else None
    )
    hooks = AutoHooks(spec["out"], RecordOptions(**spec["options"]), against=against).install()
    read_arguments = capture_arguments(hooks.config, command.argv)
    code = 0
    try:
        run_as_main(command)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except StopRecording:
        pass  # the run stopped at a difference from its reference, closed as complete
    except BisectReproError as error:
        hooks.close(failed=True)
        if against is None or hooks.recorder is not None:
            raise
        # the reference, checked when the model first runs (it changed since the command did)
        print(f"error: {error}", file=sys.stderr)
        return 2
    except BaseException:
        hooks.close(failed=True)  # what was committed stays; the run is incomplete
        raise
    finally:
        read_arguments()
    hooks.close(failed=code != 0)
    if hooks.recorder is None:
        print(
            "bisect-repro: the script never stepped an optimizer after a forward pass; nothing was "
            "recorded",
            file=sys.stderr,
        )
        return code or 3
    return code
