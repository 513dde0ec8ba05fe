"""What ``record --force`` may remove: only a folder it can prove is a run of this tool.

``--force`` deletes a whole folder, so it first proves the folder holds nothing but a run: its
``run.json`` and every rank's index read as a run (:meth:`Run.open`), and every name in it, at
every depth, is one this tool writes there, of the kind it writes (a file or a folder, never a
link, a FIFO or a device). The names are a table (:data:`_RUN`): the run's own, each rank folder's,
the snapshot and checkpoint names, what a resume keeps in ``superseded/``, and the temporary
names of each. The first name outside the table is reported and nothing is removed.

Where the guarantees stop: the walk is bounded by what the folder holds; a file that matches a
name of the table is removed whatever its content (a run's own files may be damaged).
"""

from __future__ import annotations

import re

from ..errors import BisectReproError
from .anchor import Folder
from .lock import LOCK, RunLock
from .run import Run

__all__ = ["foreign_entry", "not_a_run", "remove_contents_but_lock"]

_Table = tuple[tuple[str, str, "tuple[object, ...] | None"], ...]

_STEP_FILES: _Table = ((r"step-\d{8}\.st\.zst|\.step-\d{8}\.st\.zst\.tmp", "file", None),)
_LOGS: _Table = (
    (r"(steps|index)\.jsonl|\.(steps|index)\.jsonl\.tmp", "file", None),
    (r"snapshots|checkpoints", "folder", _STEP_FILES),
)
_RESUMES: _Table = ((r"resume-\d{3,}", "folder", _LOGS),)
_RANK: _Table = (
    *_LOGS,
    (r"\.lock|rank\.json|\.rank\.json\.tmp", "file", None),
    (r"superseded", "folder", _RESUMES),
)
_RUN: _Table = (
    (r"\.lock|run\.json|\.run\.json\.tmp", "file", None),
    (r"rank\d{1,6}", "folder", _RANK),
)
"""Every name a run of this tool holds, by folder: (name pattern, kind, the table of its
contents)."""


def foreign_entry(folder: Folder, table: _Table = _RUN, where: str = "") -> str | None:
    """The first name under ``folder`` (relative to the run) that is not this tool's, or
    ``None``."""
    for name in folder.names():
        kind = folder.kind(name)
        rule = next((rule for rule in table if re.fullmatch(rule[0], name)), None)
        if rule is None or kind != rule[1]:
            return f"{where}{name}"
        if rule[2] is not None:
            with folder.sub(name) as inner:
                found = foreign_entry(inner, rule[2], f"{where}{name}/")  # type: ignore[arg-type]
            if found is not None:
                return found
    return None


def not_a_run(root: Folder) -> str | None:
    """Why ``root`` cannot be proved a run of this tool (one clause), or ``None`` when it is one."""
    try:
        run = Run.open(root.path)
        for rank in range(1, run.world_size if run.distributed else 1):
            if root.kind(f"rank{rank}") is not None:
                run.open_rank(rank)
    except BisectReproError as error:
        return f"it does not read as a run ({str(error).splitlines()[0]})"
    found = foreign_entry(root)
    return None if found is None else f"it holds {found!r}, which is not a file bisect-repro writes"


def remove_contents_but_lock(root: Folder) -> None:
    """Empty a run directory (proved a run by :func:`~bisect_repro.store.overwrite.foreign_entry`)
    but its lock: only once every rank folder's lock is taken (refused while a rank holds one), and
    ``run.json`` last, so that an interrupted overwrite leaves a run that can be overwritten
    again."""
    held: list[RunLock] = []
    opened: list[Folder] = []
    try:
        for name in root.names():
            if root.kind(name) == "folder":
                opened.append(root.sub(name))
                if opened[-1].kind(LOCK) == "file":
                    held.append(RunLock(opened[-1]))
        for name in sorted(root.names(), key=lambda name: name == "run.json"):
            if name != LOCK:
                root.remove(name)
        root.fsync()
    finally:
        for lock in held:
            lock.release()
        for folder in opened:
            folder.close()
