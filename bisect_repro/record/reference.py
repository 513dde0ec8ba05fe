"""The reference run of a recording made ``--against`` it: opened, checked, and read as it grows.

:func:`open_reference` checks the reference before anything is trained or written, each problem
one :class:`~bisect_repro.errors.BisectReproError` naming it and the fix: it must be a run
directory of one process, complete or being written now (its recorder holds its lock), recorded
from the same code as the new run (the same script, module or recipe function: the ``code`` of
``run.json``'s launch, by path and name, not by content, so an edited script is still the same
target), and apart from the new run's directory (neither inside the other).

:class:`ReferenceRun` serves its records to the
:class:`~bisect_repro.record.against.Matcher`: the step lines and the snapshots' digests (state
hashes, and a digest of each random stream's state). Only what the reference committed is read:
the step lines before its last indexed snapshot (all of them once it is complete) and the indexed
snapshots. A reference being written is read again when asked for a step it has not committed,
at most once a second.

Where the guarantees stop: the reference is hostile input, read through the store's validated
reads (:class:`~bisect_repro.store.run.Run`), never written, and nothing it holds decides what
runs; a reference that is damaged after it was opened stops the checking with a note, and the
recording goes on. Each read of a growing reference parses its logs again from the start, so a
reference being written costs one such read per second at most while the new run waits for it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..capture.rng import tree_digest
from ..errors import BisectReproError, RunFormatError
from ..store.lock import is_held
from ..store.meta import CodeRecord
from ..store.run import Run

__all__ = ["ReferenceRun", "SnapshotDigests", "code_identity", "open_reference"]

_REREAD = 1.0  # seconds between two reads of a reference being written


@dataclass(frozen=True)
class SnapshotDigests:
    """What a snapshot is checked by: its state hashes, and a digest of each stream's state."""

    hashes: Mapping[str, str]
    streams: Mapping[str, str]

    @classmethod
    def of(cls, tree: Mapping[str, Any]) -> SnapshotDigests:
        """The digests of a snapshot's tree (as read, or as the recorder made it)."""
        streams = tree.get("streams") or {}
        return cls(dict(tree["hashes"]), {name: tree_digest(s) for name, s in streams.items()})


def code_identity(code: CodeRecord | Mapping[str, Any] | None) -> tuple[str, ...] | None:
    """What names the code a run ran, as ``run.json``'s ``launch.code`` records it: its kind and
    path (a script), its module (``-m``), or its file and function (a recipe); ``None`` where none
    was recorded (an interactive session, a test runner)."""
    if code is None:
        return None
    if isinstance(code, CodeRecord):
        kind, path, module, target = code.kind.value, code.path, code.module, code.target
    else:
        kind, path = str(code.get("kind")), code.get("path")
        module, target = code.get("module"), code.get("target")
    if kind == "module":
        return (kind, str(module))
    if kind == "recipe":
        function = str(target or "").rpartition(":")[2]
        return (kind, str(path or str(target or "").rpartition(":")[0]), function)
    return (kind, str(path))


def _shown(identity: tuple[str, ...] | None) -> str:
    if identity is None:
        return "no recorded script or recipe"
    kind, *names = identity
    return f"{kind} {':'.join(names)}"


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def open_reference(
    path: Path | str, out: Path | str, code: Mapping[str, Any] | None
) -> ReferenceRun:
    """The reference of a recording into ``out`` of ``code`` (as
    :func:`~bisect_repro.record.provenance.launch_info` names it), checked (see the module
    docstring)."""
    path = Path(path)
    run = Run.open(path)
    if run.distributed is not None:
        raise BisectReproError(
            f"--against {path}: a run of {run.world_size} ranks; record against a run of one "
            "process"
        )
    here, there = Path(out).resolve(), path.resolve()
    if _inside(here, there) or _inside(there, here):
        raise BisectReproError(
            f"--out {out}: is {path} or inside it (or holds it); record the new run to a folder "
            "of its own"
        )
    writing = not run.complete and is_held(path)
    if not run.complete and not writing:
        last = run.last_step
        at = f"its last complete step is {last}" if last is not None else "it holds no snapshot"
        raise BisectReproError(
            f"--against {path}: a partial run ({at}, and no recorder is writing it); record "
            "it again to its end, or give a complete run"
        )
    launch = run.meta.launch
    theirs = code_identity(launch.code if launch is not None else None)
    ours = code_identity(code)
    if theirs != ours:
        raise BisectReproError(
            f"--against {path}: was recorded from {_shown(theirs)}, this run is {_shown(ours)}; "
            "give a run of the same script or recipe"
        )
    return ReferenceRun(path, run)


class ReferenceRun:
    """The committed records of a reference run, read again as it grows (see the module
    docstring)."""

    def __init__(self, path: Path, run: Run) -> None:
        self.path = path
        self._run = run
        self._read_at = time.monotonic()
        self.failed: str | None = None
        """Why the reference could no longer be read (damaged after it was opened), if it was."""

    @property
    def environment(self) -> Mapping[str, Any]:
        """The reference's recorded environment (:func:`~bisect_repro.capture.env.fingerprint`)."""
        return self._run.meta.environment

    @property
    def end(self) -> int | None:
        """The reference's last step, once it is complete."""
        run = self._run
        return max(run.snapshots, default=0) if run.complete else None

    @property
    def through(self) -> int | None:
        """The last step whose records the reference committed: its step lines before it and its
        snapshots up to it are read."""
        return max(self._run.snapshots, default=None)

    def step_line(self, step: int) -> Mapping[str, Any] | None:
        """The reference's step line of ``step``, if it committed one."""
        through = self.through
        if through is None or (step >= through and not self._run.complete):
            return None
        return self._run.steps.get(step)

    def snapshot(self, step: int) -> SnapshotDigests | None:
        """The digests of the reference's snapshot at ``step``, if it committed one."""
        if step not in self._run.snapshots:
            return None
        tree = self._run.snapshot(step)
        try:
            hashes, streams = tree["hashes"], tree.get("streams") or {}
            if not all(isinstance(v, str) for v in hashes.values()):
                raise TypeError("a hash is not text")
            return SnapshotDigests.of({"hashes": hashes, "streams": dict(streams)})
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as error:
            raise RunFormatError(
                self.path, f"the snapshot at step {step} is malformed ({error})", "record it again"
            ) from None

    def refresh(self) -> None:
        """Read the reference again, when it is not complete and was last read over a second
        ago."""
        if self._run.complete or self.failed is not None:
            return
        if time.monotonic() - self._read_at < _REREAD:
            return
        self._read_at = time.monotonic()
        try:
            self._run = Run.open(self.path)
        except BisectReproError as error:
            self.failed = str(error)
