"""What ``doctor`` audits: a recipe, or a script run unchanged, as a maker of fresh processes.

A :class:`Subject` makes a :class:`~bisect_repro.replay.replica.Replica` of the code for a
``PYTHONHASHSEED`` value, each a fresh process in this working directory and environment:

- a recipe (``doctor path/to/file.py:function``): built and trained by the loop ``record`` runs;
  a step runs again in the same process, from the state it started from;
- a script (``doctor -- python train.py ARGS``): run as ``python train.py ARGS`` would, under the
  hooks of ``record -- python train.py`` (:mod:`bisect_repro.record.autohooks`), which define its
  steps; its loop runs each step once, so a step runs again in a fresh process, trained from the
  script's own start to it (nothing is restored: the script reaches that step as it always does).
  The two processes compared keep their own entropy; the steps run again (and the process whose
  steps they repeat) start with the global streams seeded alike, so that a stream the script never
  seeds and never draws from does not pass for one reseeded during a step.

A module (``doctor -- python -m pkg.train ARGS``) runs the same way, imported from the folder its
name is found in from this working directory, as ``python -m`` would.

Where the guarantees stop: a script's steps are re-run from its start, so a step that repeats
only because everything before it was reproduced is judged with everything before it; a torchrun
command is refused: give the script's command.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import BisectReproError
from ...record.recipe import module_file
from ...record.script import parse_command
from ...replay.interface import Progress, ReplicaFactory, ReplicaLike
from ...replay.launch import LaunchSpec, spec_for_command, spec_for_recipe
from ...replay.replica import Replica
from ...serve.protocol import Restored
from ...serve.requests import Asks, Restore
from ...store.printable import printable

__all__ = ["Subject", "recipe_subject", "script_subject"]

_PINNED = {"python": 0, "numpy": 0, "torch": 0}


@dataclass(frozen=True)
class Subject:
    """What runs, by name (a recipe TARGET, or a script's command line), and how to start a process
    of it."""

    name: str
    start: Callable[[str], ReplicaLike]
    """A fresh process of the code with this ``PYTHONHASHSEED``."""
    pinned: Callable[[], ReplicaLike] | None = None
    """A script's: a fresh process with the global streams seeded alike before the script runs, for
    the steps run again (``None``: a recipe's steps run again in the process that first ran
    them)."""


def recipe_subject(
    target: str, config: Mapping[str, Any], replica: ReplicaFactory = Replica
) -> Subject:
    """A recipe TARGET built with ``config``; ``replica`` starts each process (a real one by
    default)."""

    def start(hash_seed: str) -> ReplicaLike:
        spec = spec_for_recipe(target, dict(config), {"PYTHONHASHSEED": hash_seed})
        return replica(spec, f"{target} (PYTHONHASHSEED={hash_seed})")

    return Subject(target, start)


class _FromStart(Replica):
    """A script's replica: every process runs the script from its own start and restores nothing, so
    a step runs again in a fresh process trained from the start to it."""

    def __init__(self, spec: LaunchSpec, label: str) -> None:
        super().__init__(spec, label)
        self._restored, self.step = (Path(spec.path or "."), 0, None), 0

    def _exchange(
        self, request: Asks[Any], progress: Progress | None = None
    ) -> tuple[dict[str, Any], Any]:
        # nothing to restore: the process stands at the script's own start
        if isinstance(request, Restore):
            return Restored(step=request.step).to_json(), None
        return super()._exchange(request, progress)


def script_subject(words: list[str], replica: ReplicaFactory | None = None) -> Subject:
    """``python train.py ARGS`` or ``python -m pkg.train ARGS``: a one-line error for anything else
    (see the module docstring); ``replica`` starts each process (by default a real one, run from the
    script's own start)."""
    make: ReplicaFactory = replica or _FromStart
    command = parse_command(words)
    if command.nproc is not None:
        raise BisectReproError(
            "doctor: give the script itself, as in: doctor -- python train.py ARGS (torchrun is "
            "not audited yet)"
        )
    name = shlex.join(["python", *(["-m"] if command.module else []), *command.argv])
    path = Path(command.path) if command.path else _module_path(command.module or "")

    def spec(hash_seed: str) -> LaunchSpec:
        return spec_for_command(
            path, command.argv, {"PYTHONHASHSEED": hash_seed}, module=command.module
        )

    def start(hash_seed: str) -> ReplicaLike:
        return make(spec(hash_seed), f"{name} (PYTHONHASHSEED={hash_seed})")

    def pinned() -> ReplicaLike:
        return make(spec("1").with_seeds(_PINNED), f"{name} (global streams seeded)")

    spec("1")  # a module that is not its file is refused here, before anything runs
    return Subject(name, start, pinned)


def _module_path(module: str) -> Path:
    """The file ``python -m module`` runs from this working directory (its package's ``__main__.py``
    for a package)."""
    sys.path.insert(0, os.getcwd())  # as python -m does
    try:
        path = module_file(module)
        package = (
            module_file(f"{module}.__main__")
            if path is not None and path.name == "__init__.py"
            else None
        )
    finally:
        sys.path.pop(0)
    if path is None:
        raise BisectReproError(
            f"doctor: no module {printable(module)} is found from {printable(os.getcwd())}; check "
            "its name"
        )
    return package or path
