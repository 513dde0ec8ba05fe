"""Durable files: whole files written atomically, and fsynced appends of JSON lines, inside a run.

Design decisions: every file is named by one component in a
:class:`~bisect_repro.store.anchor.Folder` of the run, so nothing is written through a link or
outside the run. A whole file is written to a new temporary name beside it (``.NAME.tmp``, created
``O_EXCL``: a leftover of a crash, or a link someone placed there, is removed as a name, never
written through), fsynced, then renamed into place, and the folder is fsynced, so that no file is
ever visible under its final name half-written; a failed write removes its temporary file, so that a
full disk is not made fuller. A log is appended to with one write of whole lines and fsynced.

Where the guarantees stop: durability is what ``fsync`` gives on the file system; an append cut
short by a crash can leave a torn last line, which the reader (:mod:`bisect_repro.store.run`) skips.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from .anchor import Folder

__all__ = ["append_lines", "lines", "temporary_name", "write_atomic", "write_temporary"]


def temporary_name(name: str) -> str:
    return f".{name}.tmp"


def write_temporary(folder: Folder, name: str, data: bytes | Iterable[bytes]) -> str:
    """``data`` (bytes, or chunks) under ``name``'s temporary name in ``folder``, fsynced; removed
    again if that fails."""
    temporary = temporary_name(name)
    # a leftover of a crash, or anything placed there: removed, never written through
    folder.discard(temporary)
    folder.create(temporary, data)
    return temporary


def write_atomic(folder: Folder, name: str, data: bytes | Iterable[bytes]) -> None:
    """Write ``data`` (bytes, or chunks) to ``folder``'s ``name`` so that it holds either the old or
    the new bytes."""
    temporary = write_temporary(folder, name, data)
    try:
        folder.replace(temporary, name)
    except BaseException:
        folder.discard(temporary)
        raise
    folder.fsync()


def lines(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, allow_nan=True) + "\n" for r in records).encode()


def append_lines(folder: Folder, name: str, records: list[dict[str, Any]]) -> None:
    if not records:
        return
    with folder.appending(name) as handle:
        handle.write(lines(records))
        handle.flush()
        os.fsync(handle.fileno())
