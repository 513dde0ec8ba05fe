"""Opening a run's files as hostile input: no links, no FIFOs or devices, nothing read past a cap.

A run directory is handed between people, so a reader treats every name in it the way safetensors
treats a file. Every file of a run is reached from the run directory by a walk that opens one
component at a time relative to the folder before it (``openat``) with ``O_NOFOLLOW``: a symbolic
link anywhere inside the run (``rank0/``, ``snapshots/``, ``run.json``, a snapshot) is refused,
never followed out of the run, and there is no window between a check and the open for a swapped
name to slip through. The run directory itself, as the user names it, may be a link: that is the
user's choice, and it is followed.

Each file is opened ``O_NONBLOCK`` (a FIFO opens at once instead of waiting for a writer), checked
with ``fstat`` to be a regular file before a byte is read, and read up to a cap the caller gives.
JSON is measured before it is parsed: :func:`json_nodes` counts its structural characters, a cheap
``bytes.count`` that bounds how many Python objects :func:`json.loads` could build from it.

Every failure is one :class:`RunFormatError` line naming the file, except a missing file, which
is a :class:`FileNotFoundError` for the caller to word (an optional log, a committed file lost).
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import RunFormatError

__all__ = ["LINK_FIX", "is_folder", "json_nodes", "lines", "parse_json", "read_file"]

LINK_FIX = "a run directory holds no links; copy the run with its files (cp -rL) or record it again"
_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)
_FILE_FLAGS = _FLAGS | getattr(os, "O_NOFOLLOW", 0)
_DIR_FLAGS = _FILE_FLAGS | getattr(os, "O_DIRECTORY", 0)
# POSIX opens relative to a folder's descriptor; elsewhere (Windows: no FIFOs in its file system)
# each component is checked with lstat before the path is opened, which a concurrent swap can race.
_AT = os.open in os.supports_dir_fd and hasattr(os, "O_NOFOLLOW") and hasattr(os, "O_DIRECTORY")
_STRUCTURE = (b"[", b"{", b",", b":")


def _linked(error: OSError, name: str, folder: int) -> bool:
    """Whether an open with ``O_NOFOLLOW`` failed on a symbolic link: ELOOP (Linux, macOS), EMLINK
    (FreeBSD), or ENOTDIR where ``O_DIRECTORY`` is checked first; ``lstat`` settles it."""
    if error.errno not in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR):
        return False
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _lstat_walk(root: Path, relative: str) -> None:
    """Without ``openat``: every component below ``root`` checked by ``lstat`` not to be a link."""
    where = root
    for number, name in enumerate(relative.split("/"), 1):
        where = where / name
        if stat.S_ISLNK(os.lstat(where).st_mode):
            last = number == relative.count("/") + 1
            raise RunFormatError(
                where,
                f"is a symbolic link, not a {'regular file' if last else 'folder of the run'}",
                LINK_FIX,
            )


def _walk(root: Path, relative: str) -> int:
    """An open descriptor of ``root / relative``'s folder: each component opened below the last,
    never through a link."""
    folder = os.open(root, _FLAGS | getattr(os, "O_DIRECTORY", 0))  # the user's path: followed
    where = root
    try:
        for name in relative.split("/")[:-1]:
            where = where / name
            try:
                inner = os.open(name, _DIR_FLAGS, dir_fd=folder)
            except OSError as error:
                if _linked(error, name, folder):
                    raise RunFormatError(
                        where, "is a symbolic link, not a folder of the run", LINK_FIX
                    ) from None
                if error.errno == errno.ENOTDIR:
                    raise RunFormatError(
                        where, "is not a folder", "the run was damaged or tampered with"
                    ) from None
                raise
            os.close(folder)
            folder = inner
    except BaseException:
        os.close(folder)
        raise
    return folder


def _open(root: Path, relative: str) -> tuple[int, os.stat_result]:
    """A descriptor of a regular file inside the run and its ``fstat``, or one line saying why
    not."""
    path = root / relative
    if not _AT:
        _lstat_walk(root, relative)
        handle = os.open(path, _FILE_FLAGS)
    else:
        folder = _walk(root, relative)
        name = relative.rsplit("/", 1)[-1]
        try:
            handle = os.open(name, _FILE_FLAGS, dir_fd=folder)
        except OSError as error:
            if _linked(error, name, folder):
                raise RunFormatError(
                    path, "is a symbolic link, not a regular file", LINK_FIX
                ) from None
            raise
        finally:
            os.close(folder)
    try:
        status = os.fstat(handle)
        if not stat.S_ISREG(status.st_mode):  # a FIFO, a device, a socket, a folder: never read
            raise RunFormatError(path, "not a regular file", "the run was damaged or tampered with")
    except BaseException:
        os.close(handle)
        raise
    return handle, status


def read_file(root: Path, relative: str, cap: int, what: str, *, size: int | None = None) -> bytes:
    """The bytes of ``root / relative``: a regular file of at most ``cap`` bytes (exactly ``size``
    when given).

    The size is checked by ``fstat`` before anything is read, and no more than one byte past the
    cap is ever read (a file growing underneath is caught, not followed)."""
    path = root / relative
    try:
        handle, status = _open(root, relative)
        with os.fdopen(handle, "rb") as file:
            if size is not None and status.st_size != size:
                raise RunFormatError(
                    path,
                    f"{status.st_size} bytes, the run index declares {size}",
                    "the file is truncated or damaged",
                )
            if status.st_size > cap:
                raise RunFormatError(
                    path,
                    f"{status.st_size} bytes, more than {what} can be ({cap})",
                    "the file is damaged",
                )
            # one byte more than fstat said: a file that grew is seen
            data = file.read(status.st_size + 1)
    except (RunFormatError, FileNotFoundError):
        raise
    except OSError as error:
        raise RunFormatError(
            path, f"cannot be read ({error.strerror or error})", "check its permissions"
        ) from None
    if len(data) > min(cap, status.st_size):
        raise RunFormatError(
            path, "changed while it was read", "read the run when nothing writes to it"
        )
    return data


def is_folder(root: Path, relative: str) -> bool:
    """Whether ``root / relative`` is a folder of the run; ``False`` when it is missing, an error
    when it is a link."""
    try:
        if not _AT:
            _lstat_walk(root, relative)
            return (root / relative).is_dir()
        os.close(_walk(root, f"{relative}/-"))  # walks every component but the last, here "-"
    except FileNotFoundError:
        return False
    except OSError as error:
        raise RunFormatError(
            root / relative, f"cannot be read ({error.strerror or error})", "check its permissions"
        ) from None
    return True


def lines(root: Path, relative: str, cap: int) -> Iterator[bytes]:
    """The lines of a log, each with its newline (the last one may have none), each at most ``cap``
    bytes.

    Read line by line: a log is never held whole in memory. Nothing when the log is missing."""
    path = root / relative
    try:
        handle, _ = _open(root, relative)
    except FileNotFoundError:
        return
    except OSError as error:
        raise RunFormatError(
            path, f"cannot be read ({error.strerror or error})", "check its permissions"
        ) from None
    with os.fdopen(handle, "rb") as file:
        for number in itertools.count(1):
            try:
                line = file.readline(cap + 1)
            except OSError as error:
                raise RunFormatError(
                    path, f"cannot be read ({error.strerror or error})", "check its permissions"
                ) from None
            if not line:
                return
            if len(line) > cap and not line.endswith(b"\n"):
                raise RunFormatError(
                    path, f"line {number} is longer than {cap} bytes", "the file is damaged"
                )
            yield line


def json_nodes(text: bytes | str) -> int:
    """An upper bound on the values and members JSON text holds: its ``[``, ``{``, ``,`` and ``:``
    (counted inside strings too, so never fewer than the parse builds). Linear, no allocation."""
    if isinstance(text, str):
        return sum(text.count(mark.decode()) for mark in _STRUCTURE)
    return sum(text.count(mark) for mark in _STRUCTURE)


def parse_json(text: bytes | str, path: Path, what: str, *, max_nodes: int) -> Any:
    """JSON text parsed only if it holds at most ``max_nodes`` values and members; one line naming
    the file otherwise."""
    nodes = json_nodes(text)
    if nodes > max_nodes:
        raise RunFormatError(
            path,
            f"{what} holds {nodes:,} JSON values, more than {max_nodes:,}",
            "the file is damaged or crafted",
        )
    try:
        return json.loads(text)
    # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
    except ValueError as error:
        problem = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise RunFormatError(
            path, f"{what} is not valid JSON ({problem})", "the file is damaged or truncated"
        ) from None
    except RecursionError:
        raise RunFormatError(
            path, f"{what} is not valid JSON (nested too deeply)", "the file is damaged"
        ) from None
