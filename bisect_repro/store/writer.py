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
  Overwriting (``force``) first proves the folder is a run of this tool and nothing else
  (:mod:`bisect_repro.store.overwrite`), takes each rank folder's lock before deleting it, and
  deletes ``run.json`` last, so a run is never pulled from under a rank still writing it.
- Nothing outside the run is written, moved or deleted: every file is reached from descriptors
  of the run folder and the rank folder, one name at a time, no link followed
  (:mod:`bisect_repro.store.anchor`).
- Resume (:meth:`RunWriter.resume`) goes back to the last readable checkpoint C: it keeps the
  index lines up to C and the step lines before C, rewriting each log atomically (index first: a
  crash in between leaves extra step lines, which a second resume drops). Nothing committed is
  deleted: dropped lines and files move to ``rank{r}/superseded/resume-NNN/``, because a run that is
  not reproducible may record different snapshots the second time, and the first ones are
  evidence.
- ``run.json`` carries this user's signature over its launch claim
  (:mod:`bisect_repro.store.signing`), and every index line carries this user's MAC bound to that
  signature, so that ``compare`` replays the runs this user recorded, as written, with no flag and
  any other only with consent (:mod:`bisect_repro.store.trust`). A resume rewrites ``run.json`` with
  the signature it had and signs the lines it adds only when that signature is this user's: it never
  signs a launch it did not write.

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
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RecordingError, RecordingWarning, RunExistsError, RunFormatError
from . import codec, files, signing
from .anchor import Folder
from .commit import Commit, commit_group
from .durable import append_lines, write_atomic
from .lock import RunLock
from .meta import RunMeta
from .overwrite import not_a_run, remove_contents_but_lock
from .run import (
    _KINDS,
    _LOCK,
    _META,
    _META_CAP,
    _RANK_META,
    DISTRIBUTED_FORMAT,
    FORMAT,
    FileEntry,
    Run,
    _log_lines,
    file_name,
    rank_folder,
)

__all__ = ["RunLock", "RunWriter", "write_atomic"]


def _recording_error(path: Path, doing: str, error: OSError) -> RecordingError:
    cause = error.strerror or str(error)
    where = f" ({error.filename})" if error.filename else ""
    return RecordingError(
        f"{path}: cannot {doing}: {cause}{where}; check the path, its permissions and free space"
    )


def _signed_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """``run.json``'s content: ``meta`` with its format and this user's signature over its launch
    claim, computed on the values as a reader will see them (see :mod:`bisect_repro.store.signing`);
    when no key can sign, a one-line warning with the fix."""
    version = DISTRIBUTED_FORMAT if "distributed" in meta else FORMAT
    written: dict[str, Any] = json.loads(json.dumps({"format": version, **meta}))
    written.pop("signature", None)
    signature = signing.sign(written)
    if signature is not None:
        written["signature"] = signature
    else:
        problem = signing.key_problem() or f"{signing.key_path()}: cannot be used"
        warnings.warn(
            f"{problem}; this run is recorded unsigned, and compare replays it only with your "
            "consent (--trust)",
            RecordingWarning,
            stacklevel=4,
        )
    return written


@dataclass
class Resumed:
    """What :meth:`RunWriter.resume` went back to."""

    step: int
    checkpoint: dict[str, Any]
    meta: RunMeta
    superseded: Path | None


class RunWriter:
    """Writes one run directory (or one rank's folder of it), holding its lock; see the module
    docstring.

    Every write goes through the descriptors of the run folder and the rank folder
    (:mod:`bisect_repro.store.anchor`): nothing outside the run is written, moved or removed."""

    def __init__(self, path: Path | str, rank: int = 0) -> None:
        """A writer of ``path``'s folder for ``rank``, holding no lock yet: :meth:`create`,
        :meth:`join` and :meth:`resume` make the ones that write."""
        self.path = Path(path)
        self.rank = self.path / rank_folder(rank)
        self._number = rank
        self._lock: RunLock | None = None
        self._root: Folder | None = None
        self._folder: Folder | None = None
        self._sign: Callable[[dict[str, Any]], dict[str, Any]] = dict

    @property
    def folder(self) -> Folder:
        """The rank folder's descriptor."""
        assert self._folder is not None, "the writer is not open"
        return self._folder

    @classmethod
    def create(
        cls,
        path: Path | str,
        meta: dict[str, Any],
        *,
        force: bool = False,
        rank_meta: dict[str, Any] | None = None,
    ) -> RunWriter:
        """Create the run (rank 0 of a distributed one, whose ``meta`` has ``distributed`` and who
        writes its own ``rank_meta``)."""
        writer = cls(path)
        path = writer.path
        with writer._closed_on_error(path, "create the run"):
            writer._root = root = Folder.open(path, create=True)
            if any(name not in (_LOCK, f".{_META}.tmp") for name in root.names()):
                if not force:
                    raise RunExistsError(
                        f"{path}: already exists; pass --force to overwrite it, --resume to "
                        "continue it, or choose another --out"
                    )
                refused = not_a_run(root)
                if refused is not None:
                    raise RunExistsError(
                        f"{path}: not provably a bisect-repro run: {refused}; --force removes only "
                        "a run, so nothing was removed; "
                        "move the folder's files away or choose another --out"
                    )
                # before deleting anything: never pull a run from under its recorder
                writer._lock = RunLock(root)
                remove_contents_but_lock(root)
            else:
                writer._lock = RunLock(root)
            # run.json first: a directory killed before it holds only the lock file and counts as
            # empty
            written = _signed_meta(meta)
            write_atomic(root, _META, json.dumps(written, indent=2).encode())
            writer._sign = signing.line_signer(written, 0)
            writer._make_folder(rank_meta)
            root.fsync()
        return writer

    @contextlib.contextmanager
    def _closed_on_error(self, path: Path, doing: str) -> Iterator[None]:
        """Release the lock if what the block does fails; a failure of the disk becomes a one-line
        RecordingError."""
        try:
            yield
        except RecordingError:
            self.close()
            raise
        except OSError as error:
            self.close()
            raise _recording_error(path, doing, error) from error
        except BaseException:
            self.close()
            raise

    def _make_folder(self, rank_meta: dict[str, Any] | None) -> None:
        assert self._root is not None
        if self._folder is None:
            self._folder = self._root.sub(rank_folder(self._number), create=True)
        folder = self._folder
        if rank_meta is not None:
            write_atomic(folder, _RANK_META, json.dumps(rank_meta, indent=2).encode())
        for name in ("snapshots", "checkpoints"):
            folder.sub(name, create=True).close()
        for log in ("steps.jsonl", "index.jsonl"):
            # empty: the fsync below makes the names durable
            os.close(folder.open_existing(log, os.O_RDONLY | os.O_CREAT))
        folder.fsync()

    @classmethod
    def join(cls, path: Path | str, rank: int, rank_meta: dict[str, Any]) -> RunWriter:
        """Rank ``rank`` (not 0) of a distributed run that rank 0 has just created: lock and write
        its folder."""
        path = Path(path)
        run = Run.open(path)
        if rank_meta.get("rank") != rank or not 0 < rank < run.world_size:
            raise RecordingError(
                f"{path}: rank {rank} cannot join a run of world size {run.world_size}"
            )
        writer = cls(path, rank)
        with writer._closed_on_error(writer.rank, "create the rank's folder"):
            writer._root = Folder.open(path)
            writer._folder = writer._root.sub(rank_folder(rank), create=True)
            writer._lock = RunLock(writer._folder)
            if any(name not in (_LOCK, f".{_RANK_META}.tmp") for name in writer._folder.names()):
                raise RunExistsError(
                    f"{writer.rank}: already holds records; record the run again with --force"
                )
            writer._sign = signing.line_signer(run.meta.raw, rank)
            writer._make_folder(rank_meta)
            writer._root.fsync()
        return writer

    @classmethod
    def resume(
        cls, path: Path | str, rank: int = 0, at: int | None = None
    ) -> tuple[RunWriter, Resumed]:
        """Lock an interrupted run (one rank of it), go back to its last readable checkpoint (or to
        the checkpoint at step ``at``), and reopen it for writing."""
        path = Path(path)
        # a missing or foreign directory gets the reader's error, before anything is created
        Run.open(path, rank)
        writer = cls(path, rank)
        with writer._closed_on_error(path, "resume the run"):
            writer._root = Folder.open(path)
            writer._folder = writer._root.sub(rank_folder(rank))
            writer._lock = RunLock(writer._root if rank == 0 else writer._folder)
            resumed = writer._go_back(rank, at)
        return writer, resumed

    def _go_back(self, rank: int, at: int | None) -> Resumed:
        run = Run.open(self.path, rank)
        if run.complete and at is None:
            raise RecordingError(
                f"{self.path}: the run is complete; nothing to resume (pass --force to record it "
                "again)"
            )
        step, checkpoint = self._last_readable_checkpoint(run, at)
        self._sign = signing.line_signer(run.meta.raw, rank)
        keep_index: list[bytes] = []
        drop_index: list[bytes] = []
        named: set[str] = set()
        for raw, record in _log_lines(self.rank / "index.jsonl", self.path):
            # Run.open checked every field
            if record.get("kind") in _KINDS and record["step"] <= step:
                keep_index.append(raw)
                named.add(record["file"])
            else:
                drop_index.append(raw)
        keep_steps: list[bytes] = []
        drop_steps: list[bytes] = []
        for raw, record in _log_lines(self.rank / "steps.jsonl", self.path):
            (keep_steps if record["step"] < step else drop_steps).append(raw)
        folders: dict[str, Folder] = {}
        try:
            for name in ("snapshots", "checkpoints"):
                folders[name] = self.folder.sub(name, create=True)
            strays = [
                (name, f)
                for name, folder in folders.items()
                for f in folder.names()
                if f"{name}/{f}" not in named
            ]
            moved = [(folders[name], name, f) for name, f in strays]
            superseded = (
                self._supersede(drop_index, drop_steps)
                if drop_index or drop_steps or strays
                else None
            )
            try:
                # Index first: once it is rewritten, the dropped files are no longer part of the
                # run.
                write_atomic(self.folder, "index.jsonl", b"".join(keep_index))
                write_atomic(self.folder, "steps.jsonl", b"".join(keep_steps))
                if superseded is not None:
                    self._move_strays(superseded, moved)
            finally:
                if superseded is not None:
                    superseded.close()
            for folder in folders.values():
                folder.fsync()
        finally:
            for folder in folders.values():
                folder.close()
        return Resumed(step, checkpoint, run.meta, None if superseded is None else superseded.path)

    def _last_readable_checkpoint(self, run: Run, at: int | None) -> tuple[int, dict[str, Any]]:
        """The step and tree of the checkpoint to resume from: ``at``'s, or the last readable."""
        for step in sorted(run.checkpoints, reverse=True):
            if at is not None and step != at:
                continue
            try:
                return step, run.checkpoint(step)
            except RunFormatError as error:
                warnings.warn(f"{error}; resuming from an earlier checkpoint", stacklevel=4)
        where = f"at step {at}" if at is not None else "to resume from"
        raise RecordingError(
            f"{self.path}: no readable checkpoint {where}; record it again with --force"
        )

    def _supersede(self, drop_index: list[bytes], drop_steps: list[bytes]) -> Folder:
        """A new ``superseded/resume-NNN/`` holding the dropped log lines (its files are moved in
        afterwards)."""
        with self.folder.sub("superseded", create=True) as root:
            number = 1 + max(
                (
                    int(m.group(1))
                    for name in root.names()
                    if (m := re.fullmatch(r"resume-(\d+)", name))
                ),
                default=0,
            )
            # new: an existing name is an error
            os.mkdir(f"resume-{number:03d}", 0o777, dir_fd=root.fd)
            folder = root.sub(f"resume-{number:03d}")
            root.fsync()
        try:
            write_atomic(folder, "index.jsonl", b"".join(drop_index))
            write_atomic(folder, "steps.jsonl", b"".join(drop_steps))
        except BaseException:
            folder.close()
            raise
        return folder

    def _move_strays(self, superseded: Folder, strays: list[tuple[Folder, str, str]]) -> None:
        """Files no kept index line names: a temporary removed (never complete under its own name),
        the rest moved."""
        for folder, kind, name in strays:
            if name.endswith(".tmp"):
                folder.remove(name)
            else:
                with superseded.sub(kind, create=True) as into:
                    folder.replace(name, name, into)
                    into.fsync()

    def update_meta(self, changes: dict[str, Any]) -> None:
        """Rewrite ``run.json`` atomically with some keys changed."""
        assert self._root is not None
        meta = json.loads(files.read_file(self.path, _META, _META_CAP, "run metadata"))
        meta.update(changes)
        write_atomic(self._root, _META, json.dumps(meta, indent=2).encode())

    def append_steps(self, records: list[dict[str, Any]]) -> None:
        append_lines(self.folder, "steps.jsonl", records)

    def commit(self, kind: str, step: int, tree: Any) -> FileEntry:
        """Write a snapshot or checkpoint file, then the index line that makes it visible."""
        return self.commit_prepared(kind, step, codec.prepare(tree))

    def commit_prepared(self, kind: str, step: int, prepared: codec.Prepared) -> FileEntry:
        """:meth:`commit` for a tree already taken apart (on another thread) by
        :func:`codec.prepare`."""
        encoding = codec.encoding_of(prepared)
        name = file_name(kind, step)
        where, _, base = name.rpartition("/")
        with self.folder.sub(where) as folder:
            write_atomic(folder, base, encoding)
        entry = FileEntry(kind, step, name, encoding.size, encoding.raw_size, encoding.checksum)
        append_lines(self.folder, "index.jsonl", [self._sign(entry.line())])
        return entry

    def commit_group(self, commits: Sequence[Commit]) -> None:
        """Commit ``commits`` (in step order) sharing their fsyncs: see
        :mod:`bisect_repro.store.commit`.

        Raises :class:`GroupCommitError` (from the cause) when a write fails, after committing
        everything before the failed one."""
        commit_group(self.folder, commits, self._sign)

    def finish(self, step: int) -> None:
        append_lines(self.folder, "index.jsonl", [self._sign({"kind": "end", "step": step})])

    def close(self) -> None:
        """Release the lock and the folders' descriptors; the directory stays as it is."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        for folder in (self._folder, self._root):
            if folder is not None:
                folder.close()
        self._folder = self._root = None
