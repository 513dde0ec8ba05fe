"""Writing a run directory: crash-safe files, the writers' locks, and resume.

See :mod:`bisect_repro.store.run` for the layout and the reader. Design decisions:

- Whole files (``run.json``, ``rank.json``, snapshots, checkpoints, rewritten logs) are written
  to a temporary name, fsynced, renamed into place, and the directory is fsynced: no file is ever
  visible under its final name half-written. A failed write removes its temporary file, so a full
  disk is not made fuller.
- The two logs are append-only, one JSON object per line. A file is committed only by its index
  line, which is written last, after the file and the step lines it covers are durable.
- Group commit (:mod:`bisect_repro.store.commit`): the recorder commits the snapshots it finds
  waiting together, with one fsync per file and one per log and folder for the group, the index
  lines last, after everything they cover is durable. A failure commits what came before it.
- One writer per folder: :class:`RunLock` holds ``fcntl.flock`` on ``RUN/.lock`` for the writer's
  lifetime, so the kernel releases it when the process dies, however it dies; the lock file stays
  behind (removing it would let a second writer lock a different inode). In a distributed run rank
  0 holds ``RUN/.lock`` and writes ``run.json`` and ``rank0/``; rank r joins it afterwards
  (:meth:`RunWriter.join`, once rank 0 has written ``run.json``) and holds ``rank{r}/.lock``.
  Overwriting (``force``) takes each rank folder's lock before deleting it, and deletes
  ``run.json`` last, so a run is never pulled from under a rank still writing it.
- Resume (:meth:`RunWriter.resume`) goes back to the last readable checkpoint C: it keeps the
  index lines up to C and the step lines before C, rewriting each log atomically (index first: a
  crash in between leaves extra step lines, which a second resume drops). Nothing committed is
  deleted: dropped lines and files move to ``rank{r}/superseded/resume-NNN/``, because a run that is
  not reproducible may record different snapshots the second time, and the first ones are
  evidence.
- ``run.json`` carries this user's signature over its launch claim (:mod:`bisect_repro.store.signing`),
  so that ``compare`` replays the runs this user recorded with no flag and any other only with
  consent. A resume rewrites ``run.json`` with the signature it had: it never signs a launch it
  did not write.

Where the guarantees stop: durability is what ``fsync`` gives on the file system (a network file
system or a disk that lies about flushes may lose the last commits, never tear a committed file);
a crash between renaming files into place and writing their index lines leaves files with no
index line, which are never read as part of the run and which a resume moves to ``superseded/``;
the lock is advisory and per host (``flock`` on NFS may not exclude writers on other machines, so
ranks on several hosts need a shared file system that honours it); without ``fcntl`` (Windows)
there is no lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import RecordingError, RunExistsError, RunFormatError, RunLockedError
from . import codec, signing
from .commit import Commit, commit_group
from .durable import append_lines as _append_lines
from .durable import fsync_dir as _fsync_dir
from .durable import write_atomic
from .meta import RunMeta
from .run import _KINDS, _LOCK, _META, _RANK_META, DISTRIBUTED_FORMAT, FORMAT, FileEntry, Run, _log_lines, file_name, rank_folder

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system
    fcntl = None  # type: ignore[assignment]

__all__ = ["RunLock", "RunWriter", "write_atomic"]


class RunLock:
    """``fcntl.flock`` on ``RUN/.lock``, with this process's PID written in the file."""

    def __init__(self, run: Path) -> None:
        self.path = run / _LOCK
        self._handle: IO[bytes] | None = None
        if fcntl is None:  # pragma: no cover - no advisory locks on this platform
            return
        handle = open(self.path, "a+b")  # noqa: SIM115 - held open for the writer's lifetime
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RunLockedError(
                f"{run}: another recorder ({self.holder()}) is writing this run; wait for it to finish, or record to another --out"
            ) from None
        except BaseException:
            handle.close()
            raise
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n".encode())
        handle.flush()
        self._handle = handle

    def holder(self) -> str:
        try:
            text = self.path.read_text(errors="replace").strip()
        except OSError:
            text = ""
        return f"pid {text}" if text.isdigit() else "pid unknown"

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the descriptor releases the flock
            self._handle = None


def _remove_contents_but_lock(path: Path) -> None:
    """Empty a run directory but its lock: only once every rank folder's lock is taken (refused
    while a rank holds one), and ``run.json`` last, so that an interrupted overwrite leaves a run
    that can be overwritten again."""
    held: list[RunLock] = []
    try:
        for child in sorted(path.iterdir()):
            if child.is_dir() and not child.is_symlink() and (child / _LOCK).exists():
                held.append(RunLock(child))
        for child in sorted(path.iterdir(), key=lambda child: child.name == _META):
            if child.name == _LOCK:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    finally:
        for lock in held:
            lock.release()


def _recording_error(path: Path, doing: str, error: OSError) -> RecordingError:
    cause = error.strerror or str(error)
    where = f" ({error.filename})" if error.filename else ""
    return RecordingError(f"{path}: cannot {doing}: {cause}{where}; check the path, its permissions and free space")


def _signed_meta(meta: dict[str, Any]) -> bytes:
    """``run.json``'s bytes: ``meta`` with its format and this user's signature over its launch
    claim, computed on the values as a reader will see them (see :mod:`bisect_repro.store.signing`)."""
    version = DISTRIBUTED_FORMAT if "distributed" in meta else FORMAT
    written = json.loads(json.dumps({"format": version, **meta}))
    written.pop("signature", None)
    signature = signing.sign(written)
    if signature is not None:
        written["signature"] = signature
    return json.dumps(written, indent=2).encode()


@dataclass
class Resumed:
    """What :meth:`RunWriter.resume` went back to."""

    step: int
    checkpoint: dict[str, Any]
    meta: RunMeta
    superseded: Path | None


class RunWriter:
    """Writes one run directory (or one rank's folder of it), holding its lock; see the module docstring."""

    def __init__(self, path: Path | str, rank: int = 0) -> None:
        """A writer of ``path``'s folder for ``rank``, holding no lock yet: :meth:`create`,
        :meth:`join` and :meth:`resume` make the ones that write."""
        self.path = Path(path)
        self.rank = self.path / rank_folder(rank)
        self._lock: RunLock | None = None

    @classmethod
    def create(cls, path: Path | str, meta: dict[str, Any], *, force: bool = False, rank_meta: dict[str, Any] | None = None) -> RunWriter:
        """Create the run (rank 0 of a distributed one, whose ``meta`` has ``distributed`` and who
        writes its own ``rank_meta``)."""
        writer = cls(path)
        path = writer.path
        with writer._closed_on_error(path, "create the run"):
            if path.exists() and any(c.name not in (_LOCK, f".{_META}.tmp") for c in path.iterdir()):
                if not force:
                    raise RunExistsError(
                        f"{path}: already exists; pass --force to overwrite it, --resume to continue it, or choose another --out"
                    )
                if not (path / _META).exists():
                    raise RunExistsError(f"{path}: not empty and not a bisect-repro run; refusing to overwrite it even with --force")
                writer._lock = RunLock(path)  # before deleting anything: never pull a run from under its recorder
                _remove_contents_but_lock(path)
            else:
                path.mkdir(parents=True, exist_ok=True)
                writer._lock = RunLock(path)
            # run.json first: a directory killed before it holds only the lock file and counts as empty
            write_atomic(path / _META, _signed_meta(meta))
            writer._make_folder(rank_meta)
            _fsync_dir(path)
        return writer

    @contextlib.contextmanager
    def _closed_on_error(self, path: Path, doing: str) -> Iterator[None]:
        """Release the lock if what the block does fails; a failure of the disk becomes a one-line RecordingError."""
        try:
            yield
        except OSError as error:
            self.close()
            raise _recording_error(path, doing, error) from error
        except BaseException:
            self.close()
            raise

    def _make_folder(self, rank_meta: dict[str, Any] | None) -> None:
        self.rank.mkdir(exist_ok=True)
        if rank_meta is not None:
            write_atomic(self.rank / _RANK_META, json.dumps(rank_meta, indent=2).encode())
        for folder in (self.rank / "snapshots", self.rank / "checkpoints"):
            folder.mkdir(parents=True, exist_ok=True)
        for log in (self.rank / "steps.jsonl", self.rank / "index.jsonl"):
            log.touch()  # empty, so that the fsync below makes the logs' names durable before any line
        _fsync_dir(self.rank)

    @classmethod
    def join(cls, path: Path | str, rank: int, rank_meta: dict[str, Any]) -> RunWriter:
        """Rank ``rank`` (not 0) of a distributed run that rank 0 has just created: lock and write its folder."""
        path = Path(path)
        run = Run.open(path)
        if rank_meta.get("rank") != rank or not 0 < rank < run.world_size:
            raise RecordingError(f"{path}: rank {rank} cannot join a run of world size {run.world_size}")
        writer = cls(path, rank)
        with writer._closed_on_error(writer.rank, "create the rank's folder"):
            writer.rank.mkdir(exist_ok=True)
            writer._lock = RunLock(writer.rank)
            if any(c.name not in (_LOCK, f".{_RANK_META}.tmp") for c in writer.rank.iterdir()):
                raise RunExistsError(f"{writer.rank}: already holds records; record the run again with --force")
            writer._make_folder(rank_meta)
            _fsync_dir(path)
        return writer

    @classmethod
    def resume(cls, path: Path | str, rank: int = 0, at: int | None = None) -> tuple[RunWriter, Resumed]:
        """Lock an interrupted run (one rank of it), go back to its last readable checkpoint (or to
        the checkpoint at step ``at``), and reopen it for writing."""
        path = Path(path)
        Run.open(path, rank)  # a missing or foreign directory gets the reader's error, before anything is created
        writer = cls(path, rank)
        with writer._closed_on_error(path, "resume the run"):
            writer._lock = RunLock(path if rank == 0 else writer.rank)
            resumed = writer._go_back(rank, at)
        return writer, resumed

    def _go_back(self, rank: int, at: int | None) -> Resumed:
        run = Run.open(self.path, rank)
        if run.complete and at is None:
            raise RecordingError(f"{self.path}: the run is complete; nothing to resume (pass --force to record it again)")
        checkpoint: dict[str, Any] | None = None
        for step in sorted(run.checkpoints, reverse=True):
            if at is not None and step != at:
                continue
            try:
                checkpoint = run.checkpoint(step)
                break
            except RunFormatError as error:
                warnings.warn(f"{error}; resuming from an earlier checkpoint", stacklevel=3)
        if checkpoint is None:
            where = f"at step {at}" if at is not None else "to resume from"
            raise RecordingError(f"{self.path}: no readable checkpoint {where}; record it again with --force")
        keep_index: list[bytes] = []
        drop_index: list[bytes] = []
        named: set[str] = set()
        for raw, record in _log_lines(self.rank / "index.jsonl"):
            if record.get("kind") in _KINDS and record["step"] <= step:  # Run.open checked every field
                keep_index.append(raw)
                named.add(record["file"])
            else:
                drop_index.append(raw)
        keep_steps: list[bytes] = []
        drop_steps: list[bytes] = []
        for raw, record in _log_lines(self.rank / "steps.jsonl"):
            (keep_steps if record["step"] < step else drop_steps).append(raw)
        strays = [
            f
            for folder in ("snapshots", "checkpoints")
            if (self.rank / folder).is_dir()
            for f in sorted((self.rank / folder).iterdir())
            if f"{folder}/{f.name}" not in named
        ]
        superseded = None
        if drop_index or drop_steps or strays:
            superseded = self._superseded_folder()
            write_atomic(superseded / "index.jsonl", b"".join(drop_index))
            write_atomic(superseded / "steps.jsonl", b"".join(drop_steps))
        # Index first: once it is rewritten, the dropped files are no longer part of the run.
        write_atomic(self.rank / "index.jsonl", b"".join(keep_index))
        write_atomic(self.rank / "steps.jsonl", b"".join(keep_steps))
        for stray in strays:
            if stray.name.endswith(".tmp"):  # never complete under its own name
                stray.unlink()
            else:
                assert superseded is not None
                (superseded / stray.parent.name).mkdir(exist_ok=True)
                os.replace(stray, superseded / stray.parent.name / stray.name)
        for folder in ("snapshots", "checkpoints"):
            (self.rank / folder).mkdir(exist_ok=True)
            _fsync_dir(self.rank / folder)
        return Resumed(step, checkpoint, run.meta, superseded)

    def _superseded_folder(self) -> Path:
        root = self.rank / "superseded"
        root.mkdir(exist_ok=True)
        number = 1 + max((int(m.group(1)) for c in root.iterdir() if (m := re.fullmatch(r"resume-(\d+)", c.name))), default=0)
        folder = root / f"resume-{number:03d}"
        folder.mkdir()
        _fsync_dir(root)
        return folder

    def update_meta(self, changes: dict[str, Any]) -> None:
        """Rewrite ``run.json`` atomically with some keys changed."""
        meta = json.loads((self.path / _META).read_bytes())
        meta.update(changes)
        write_atomic(self.path / _META, json.dumps(meta, indent=2).encode())

    def append_steps(self, records: list[dict[str, Any]]) -> None:
        _append_lines(self.rank / "steps.jsonl", records)

    def commit(self, kind: str, step: int, tree: Any) -> FileEntry:
        """Write a snapshot or checkpoint file, then the index line that makes it visible."""
        return self.commit_prepared(kind, step, codec.prepare(tree))

    def commit_prepared(self, kind: str, step: int, prepared: codec.Prepared) -> FileEntry:
        """:meth:`commit` for a tree already taken apart (on another thread) by :func:`codec.prepare`."""
        data, raw_size = codec.encode_prepared(prepared)
        name = file_name(kind, step)
        write_atomic(self.rank / name, data)
        entry = FileEntry(kind, step, name, len(data), raw_size, codec.checksum(data))
        _append_lines(self.rank / "index.jsonl", [entry.__dict__])
        return entry

    def commit_group(self, commits: Sequence[Commit]) -> None:
        """Commit ``commits`` (in step order) sharing their fsyncs: see :mod:`bisect_repro.store.commit`.

        Raises :class:`GroupCommitError` (from the cause) when a write fails, after committing
        everything before the failed one."""
        commit_group(self.rank, commits)

    def finish(self, step: int) -> None:
        _append_lines(self.rank / "index.jsonl", [{"kind": "end", "step": step}])

    def close(self) -> None:
        """Release the lock; the directory stays as it is."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None
