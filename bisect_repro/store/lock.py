"""One writer per folder of a run: ``fcntl.flock`` on the folder's ``.lock``.

The lock is held for the writer's lifetime, so the kernel releases it when the process dies,
however it dies; the lock file stays behind (removing it would let a second writer lock a
different inode). The file is opened in the folder's descriptor without following a link
(:mod:`bisect_repro.store.anchor`): a link named ``.lock`` is an error, never a file written
through.

:func:`is_held` tells a reader whether a recorder is writing a folder now, writing nothing: it opens
an existing ``.lock`` read-only and tries a shared lock, released at once.

Where the guarantees stop: the lock is advisory and per host (``flock`` on NFS may not exclude
writers on other machines); without ``fcntl`` (Windows) there is no lock.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

from ..errors import RecordingError, RunLockedError
from .anchor import Folder

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK", "RunLock", "is_held"]

LOCK = ".lock"


class RunLock:
    """``fcntl.flock`` on a folder's ``.lock``, with this process's PID written in the file.

    The lock file is opened in the folder's descriptor without following a link: a link under
    that name is an error, never a file written through."""

    def __init__(self, folder: Folder) -> None:
        self.path = folder.path / LOCK
        self._folder = folder
        self._handle: IO[bytes] | None = None
        if fcntl is None:  # pragma: no cover - no advisory locks on this platform
            return
        fd = folder.open_existing(LOCK, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLockedError(
                f"{folder.path}: another recorder ({self.holder()}) is writing this run; wait for "
                "it to finish, or record to another --out"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        # closed (the flock released) when the lock is released or collected
        self._handle = os.fdopen(fd, "r+b")

    def holder(self) -> str:
        try:
            fd = self._folder.open_existing(LOCK)
            try:
                text = os.read(fd, 32).decode("ascii", "replace").strip()
            finally:
                os.close(fd)
        except (OSError, RecordingError):
            text = ""
        return f"pid {text}" if text.isdigit() else "pid unknown"

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the descriptor releases the flock
            self._handle = None


def is_held(path: Path | str) -> bool:
    """Whether a recorder holds the lock of the folder ``path`` now (it is being written). Nothing
    is created or written: a folder with no ``.lock`` (or a link under that name) is not held."""
    if fcntl is None:  # pragma: no cover - no advisory locks on this platform
        return False
    try:
        with Folder.open(path) as folder:
            fd = folder.open_existing(LOCK)
    except (OSError, RecordingError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing the descriptor releases a shared lock taken
    return False
