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

Where the guarantees stop: a script's steps are re-run from its start, so a step that repeats
only because everything before it was reproduced is judged with everything before it; a module
(``-m``) or torchrun command is refused: give the script's path.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BisectReproError
from ..record.script import parse_command
from ..replay.launch import spec_for_command, spec_for_recipe
from ..replay.replica import Replica
from ..store.meta import CodeKind

__all__ = ["Subject", "recipe_subject", "script_subject"]

_PINNED = {"python": 0, "numpy": 0, "torch": 0}


@dataclass(frozen=True)
class Subject:
    """What runs, by name (a recipe TARGET, or a script's command line), and how to start a process of it."""

    name: str
    start: Callable[[str], Replica]
    """A fresh process of the code with this ``PYTHONHASHSEED``."""
    pinned: Callable[[], Replica] | None = None
    """A script's: a fresh process with the global streams seeded alike before the script runs, for
    the steps run again (``None``: a recipe's steps run again in the process that first ran them)."""


def recipe_subject(target: str, config: Mapping[str, Any]) -> Subject:
    def start(hash_seed: str) -> Replica:
        spec = spec_for_recipe(target, dict(config), {"PYTHONHASHSEED": hash_seed})
        return Replica(spec, f"{target} (PYTHONHASHSEED={hash_seed})")

    return Subject(target, start)


def script_subject(words: list[str]) -> Subject:
    """``python train.py ARGS``: a one-line error for anything else (see the module docstring)."""
    command = parse_command(words)
    if command.kind is not CodeKind.SCRIPT or command.nproc is not None or command.path is None:
        raise BisectReproError(
            "doctor: give the script itself, as in: doctor -- python train.py ARGS (a module or torchrun is not audited yet)"
        )
    name = shlex.join(["python", *command.argv])
    path = Path(command.path)

    def start(hash_seed: str) -> Replica:
        spec = spec_for_command(path, command.argv, {"PYTHONHASHSEED": hash_seed})
        return Replica(spec, f"{name} (PYTHONHASHSEED={hash_seed})").from_start()

    def pinned() -> Replica:
        spec = spec_for_command(path, command.argv, {"PYTHONHASHSEED": "1"}).with_seeds(_PINNED)
        return Replica(spec, f"{name} (global streams seeded)").from_start()

    return Subject(name, start, pinned)
