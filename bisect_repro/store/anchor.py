"""Writing inside a run, and nowhere else: every name reached from a folder descriptor of the run.

A run directory may be prepared by someone else (``mkdir D; ln -s ~/victim D/.lock``), so the
writer never hands a path to the kernel below the run directory. A :class:`Folder` holds an open
descriptor of one folder of the run; every file it creates, opens for writing, renames, moves or
removes is named by one component relative to that descriptor (``openat``, ``mkdirat``,
``renameat``, ``unlinkat`` through ``dir_fd=``), and every folder below is opened the same way
with ``O_NOFOLLOW | O_DIRECTORY``:

- a new file is created ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a link or anything under its name is an
  error, never a target); a log or the lock is opened ``O_NOFOLLOW`` and checked by ``fstat`` to be
  a regular file before a byte is written;
- a rename replaces the name in the folder (a link under the final name is replaced, not followed);
- a removal unlinks the name (a link is removed, never its target); a folder is emptied the same
  way through its own descriptor, then removed;
- a name with ``/`` in it, ``.`` or ``..`` is refused.

The run directory itself, as the user names it, is opened following links: it is the user's choice.

Where the guarantees stop: the descriptors need ``dir_fd`` support (Linux, macOS, the BSDs);
another process that swaps a folder of the run while it is written is contained by the
descriptors (it can only make the writer fail), not stopped.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from ..errors import RecordingError

__all__ = ["Folder", "LinkedError"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
_FIX = "a run directory holds no links or foreign files; remove them, or record to a new --out"


class LinkedError(RecordingError):
    """A name inside a run that is a link, or not the kind of file the run holds there."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}; nothing was written through it; {_FIX}")


def _component(name: str) -> str:
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ValueError(f"{name!r} is not one name inside a folder")
    return name


class Folder:
    """An open folder of a run; see the module docstring. Close it (or use ``with``) when done."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = path, fd

    @classmethod
    def open(cls, path: Path | str, *, create: bool = False) -> Folder:
        """The run directory as the user names it (followed if it is a link; made if ``create``)."""
        path = Path(path)
        if create:
            path.mkdir(parents=True, exist_ok=True)
        return cls(path, os.open(path, _DIRECTORY))

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # a folder never closed: its descriptor goes with it
            self.close()

    def close(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            os.close(self.fd)
            self.fd = -1

    def _lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(_component(name), dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def kind(self, name: str) -> str | None:
        """``file``, ``folder``, ``link``, ``other``, or ``None`` when nothing has that name;
        nothing is followed."""
        found = self._lstat(name)
        if found is None:
            return None
        mode = found.st_mode
        return (
            "link"
            if stat.S_ISLNK(mode)
            else "folder"
            if stat.S_ISDIR(mode)
            else "file"
            if stat.S_ISREG(mode)
            else "other"
        )

    def names(self) -> list[str]:
        return sorted(os.listdir(self.fd))

    def sub(self, name: str, *, create: bool = False) -> Folder:
        """The folder ``name`` in this one (made first if ``create``), never through a link."""
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(_component(name), 0o777, dir_fd=self.fd)
        try:
            fd = os.open(_component(name), _DIRECTORY | _NOFOLLOW, dir_fd=self.fd)
        except OSError as error:
            if (
                error.errno in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR)
                and self.kind(name) is not None
            ):
                raise LinkedError(
                    self.path / name, f"is a {self.kind(name)}, not a folder of the run"
                ) from None
            raise
        return Folder(self.path / name, fd)

    def _regular(self, fd: int, name: str) -> int:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise LinkedError(self.path / name, "is not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open(self, name: str, flags: int, mode: int = 0o666) -> int:
        flags |= _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0)
        try:
            return self._regular(os.open(_component(name), flags, mode, dir_fd=self.fd), name)
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.EMLINK) or (
                error.errno == errno.EEXIST and self.kind(name) == "link"
            ):
                raise LinkedError(self.path / name, "is a symbolic link") from None
            raise

    def open_existing(self, name: str, flags: int = os.O_RDONLY) -> int:
        """A descriptor of the regular file ``name`` (created if ``flags`` has ``O_CREAT``); a link
        is an error."""
        return self._open(name, flags)

    @contextlib.contextmanager
    def appending(self, name: str) -> Iterator[IO[bytes]]:
        """``name`` opened to append to (created if missing), a regular file of this folder."""
        with os.fdopen(self._open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as handle:
            yield handle

    def create(self, name: str, data: bytes | Iterable[bytes]) -> None:
        """A new file ``name`` holding ``data`` (bytes, or chunks written as they come), fsynced:
        ``O_EXCL``, so nothing under that name is written through."""
        fd = self._open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb") as handle:
                for chunk in (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data:
                    handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            self.remove(name)
            raise

    def replace(self, name: str, final: str, into: Folder | None = None) -> None:
        """Rename ``name`` to ``final`` (in ``into``, this folder by default); a link under
        ``final`` is replaced, not followed."""
        target = self if into is None else into
        os.replace(_component(name), _component(final), src_dir_fd=self.fd, dst_dir_fd=target.fd)

    def remove(self, name: str) -> None:
        """Remove the name ``name`` if it is there (a link itself, a file, or a whole folder),
        following nothing."""
        kind = self.kind(name)
        if kind == "folder":
            with self.sub(name) as inner:
                for child in inner.names():
                    inner.remove(child)
            os.rmdir(_component(name), dir_fd=self.fd)
        elif kind is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_component(name), dir_fd=self.fd)

    def discard(self, name: str) -> None:
        """:meth:`remove`, ignoring a failure (the clean-up after a failed write)."""
        with contextlib.suppress(OSError):
            self.remove(name)

    def fsync(self) -> None:
        os.fsync(self.fd)
