"""Durable files: whole files written atomically, and fsynced appends of JSON lines.

Design decisions: a whole file is written to a temporary name beside it (``.NAME.tmp``), fsynced,
then renamed into place, and the folder is fsynced, so that no file is ever visible under its
final name half-written; a failed write removes its temporary file, so that a full disk is not
made fuller. A log is appended to with one write of whole lines and fsynced.

Where the guarantees stop: durability is what ``fsync`` gives on the file system; an append cut
short by a crash can leave a torn last line, which the reader (:mod:`bisect_repro.store.run`) skips.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["append_lines", "discard", "fsync_dir", "lines", "write_atomic", "write_temporary"]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_temporary(path: Path, data: bytes) -> Path:
    """``data`` in ``path``'s temporary name, fsynced; removed again if that fails."""
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        discard(temporary)
        raise
    return temporary


def discard(temporary: Path) -> None:
    with contextlib.suppress(OSError):
        temporary.unlink()


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` holds either the old or the new bytes."""
    temporary = write_temporary(path, data)
    try:
        os.replace(temporary, path)
    except BaseException:
        discard(temporary)
        raise
    fsync_dir(path.parent)


def lines(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, allow_nan=True) + "\n" for r in records).encode()


def append_lines(path: Path, records: list[dict[str, Any]]) -> None:
    if not records:
        return
    with open(path, "ab") as handle:
        handle.write(lines(records))
        handle.flush()
        os.fsync(handle.fileno())
