"""The entry point of a replaying process: ``python -m bisect_repro.replay.bootstrap``.

The controller starts it with ``BISECT_REPRO_SPEC`` (a JSON object) and the channel's variables in
the environment. It runs what the run recorded, the way it was run:

- a recipe (``{"kind": "recipe", "target", "config"}``): built, then trained by the same loop as
  ``bisect-repro record``, whose :class:`~bisect_repro.record.recorder.Recorder` serves the
  controller;
- a script (``{"kind": "script", "path", "argv"}``) or module (``{"kind": "module", "module",
  "argv"}``): run as ``__main__`` with the recorded ``sys.argv``, as ``python train.py ...`` or
  ``python -m pkg.train ...`` would; its own Recorder serves the controller, or, for a script
  recorded unchanged (``"auto"``), the hooks of :mod:`bisect_repro.record.autohooks`, installed
  first, make one that does.

Under ``torchrun`` (the replay of a distributed run, see :mod:`bisect_repro.replay.ranked`; the
spec's ``world_size`` says so) each rank runs this module: a recipe's process group is
initialised first, as ``record --nproc-per-node`` does, and with ``BISECT_REPRO_RANK_LOGS`` set
each rank writes its output to ``rank{r}.log`` in that folder, so that the controller can quote
the rank that failed.

Before the code runs, ``torch.compile`` is watched (:mod:`bisect_repro.capture.compiled`), so
that a compiler bisection can compile what the code compiled again. Before that it can seed the
global streams with fixed values (``"seeds": {"python": 1, ...}``), which ``compare`` uses to
find which streams decide a model's initial parameters, and it notes whether the code pins the
thread count (``doctor``).

The process starts in the controller's private folder, so that nothing from the recorded working
directory is imported: :func:`_isolate` drops that folder from ``sys.path``, then moves to the
recorded working directory (``"cwd"``). The code then runs from the file the controller checked
(``"path"``, see :mod:`bisect_repro.replay.launch`): a script by its path, a module from its
``"root"`` once the module name is seen to resolve to that file, a recipe only if its function
is a Python function of that file; and that file runs only from bytes whose SHA-256 is the one
the controller checked and announced (``"sha256"``, :mod:`bisect_repro.record.pinned`).

Where the guarantees stop: code that runs before the Recorder is built runs as in the recording
(downloads, prints); a script that never reaches ``Recorder.batches()`` exits with code 3.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..capture.compiled import watch_compile
from ..errors import BisectReproError
from ..record.autohooks import AutoHooks
from ..record.options import RecordOptions
from ..record.pinned import pin
from ..record.recipe import build, module_file
from ..record.recorder import Recorder
from ..record.script import ScriptCommand, run_as_main
from ..record.torchrun import init_process_group
from ..serve.process import watch_process
from ..store.meta import CodeKind

SPEC_VARIABLE = "BISECT_REPRO_SPEC"
LOGS_VARIABLE = "BISECT_REPRO_RANK_LOGS"


def _rank_log() -> None:
    """Under torchrun with ``BISECT_REPRO_RANK_LOGS``: this rank's output to its own log."""
    folder = os.environ.get(LOGS_VARIABLE)
    if not folder:
        return
    handle = os.open(
        Path(folder) / f"rank{int(os.environ.get('RANK', '0'))}.log",
        os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        0o600,
    )
    os.dup2(handle, 1)
    os.dup2(handle, 2)
    os.close(handle)


def _seed(seeds: dict[str, int]) -> None:
    if "python" in seeds:
        random.seed(seeds["python"])
    if "numpy" in seeds:
        np.random.seed(seeds["numpy"])
    if "torch" in seeds:
        torch.manual_seed(seeds["torch"])


def _isolate(spec: dict[str, Any]) -> None:
    """Drop the private folder this process started in from the import path, put a module's root
    there instead, and move to the recorded working directory."""
    start = os.path.realpath(os.getcwd())
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != start]
    if spec.get("root"):
        sys.path.insert(0, spec["root"])
    if spec.get("cwd"):
        os.chdir(spec["cwd"])


def _check_module(module: str, path: str | None) -> None:
    """Refuse to run ``module`` unless it resolves to the file whose hash was checked."""
    if path is None:
        return
    name = (
        f"{module}.__main__"
        if Path(path).name == "__main__.py" and not module.endswith("__main__")
        else module
    )
    found = module_file(name)
    if found != Path(path).resolve():
        raise BisectReproError(
            f"{module}: imports {found or 'nothing'} here, not {path}, the file that was checked; "
            "nothing was run"
        )


def _run_recipe(spec: dict[str, Any], ranks: bool) -> None:
    target, expected = spec["target"], Path(spec["path"]) if spec.get("path") else None
    # a module recipe: its module must be the checked file
    if expected is not None and spec.get("root"):
        _check_module(target.rpartition(":")[0], spec["path"])
    if ranks:  # a rank under torchrun: the group first, as record --nproc-per-node does
        init_process_group()
    trainee = build(target, spec.get("config") or {}, expected=expected)
    if trainee.step is None:
        raise BisectReproError(
            f"{target}: the Trainee has no step function; give step=... to replay the recipe"
        )
    with Recorder("<replay>", trainee) as recorder:
        for batch in recorder.batches():
            recorder.log(trainee.step(batch))


def main() -> None:
    _rank_log()
    spec = json.loads(os.environ[SPEC_VARIABLE])
    _isolate(spec)
    if spec.get("path") and spec.get("sha256"):
        pin(spec["path"], spec["sha256"])  # what runs is the bytes whose hash was checked and shown
    _seed(spec.get("seeds") or {})
    # before the code runs: its seeding and thread count while it builds are seen too
    watch_process()
    watch_compile()  # and what it compiles, which a compiler bisection compiles again
    try:
        if spec["kind"] == "recipe":
            _run_recipe(spec, ranks=spec.get("world_size") is not None)
        else:
            if spec["kind"] == "module":
                _check_module(spec["module"], spec.get("path"))
            command = ScriptCommand(
                kind=CodeKind(spec["kind"]),
                path=spec.get("path"),
                module=spec.get("module"),
                argv=tuple(spec["argv"]),
            )
            # recorded unchanged
            start = spec.get("start_step", 0)
            start = start if type(start) is int else 0
            hooks = (
                AutoHooks("<replay>", RecordOptions(), start_step=start).install()
                if spec.get("auto")
                else None
            )
            run_as_main(command)
            if hooks is not None:
                hooks.close()  # ends the process: the replay is over
    except BisectReproError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(
        "bisect-repro: the code ended without reaching Recorder.batches(); nothing to replay",
        file=sys.stderr,
    )
    sys.exit(3)


if __name__ == "__main__":
    main()
