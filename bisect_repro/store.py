"""The run directory: its layout, crash-safe writes, validated reads, the writer's lock and resume.

Layout (format 1)::

    RUN/
      run.json                    metadata: versions, target, config, options, environment, model
      .lock                       held by the recorder writing the run (its PID inside)
      rank0/                      one sub-record per distributed rank
        steps.jsonl               one line per step: step, loss, data-order hash, batch hash
        index.jsonl               one line per committed snapshot or checkpoint, then "end"
        snapshots/step-00000050.st.zst
        checkpoints/step-00000100.st.zst
        superseded/resume-001/    what a resume dropped: its log lines and files, kept, never read

Design decisions:
- Whole files (``run.json``, snapshots, checkpoints, rewritten logs) are written to a temporary
  name, fsynced, renamed into place, and the directory is fsynced: no file is ever visible under
  its final name half-written. A failed write removes its temporary file, so a full disk is not
  made fuller.
- The two logs are append-only, one JSON object per line, fsynced at each snapshot. A file is
  committed only by its index line, which is written last, after the file and the step lines it
  covers are durable; a reader ignores files that no index line names and a torn last line.
- The index carries each file's name, size, checksum and decompressed size; a reader accepts only
  the name the step and kind imply (no path leaves the run), checks that it is a regular file of
  the declared size and its checksum before decompressing it, and refuses a decompression bomb by
  the size the index declared.
- A run is complete when its index ends with an ``end`` line; otherwise its last complete step is
  the last committed snapshot.
- One writer at a time: :class:`RunLock` holds ``fcntl.flock`` on ``RUN/.lock`` for the writer's
  lifetime, so the kernel releases it when the process dies, however it dies; the lock file stays
  behind (removing it would let a second writer lock a different inode).
- Resume (:meth:`RunWriter.resume`) goes back to the last readable checkpoint C: it keeps the
  index lines up to C and the step lines before C, rewriting each log atomically (index first: a
  crash in between leaves extra step lines, which a second resume drops). Nothing committed is
  deleted: dropped lines and files move to ``rank0/superseded/resume-NNN/``, because a run that is
  not reproducible may record different snapshots the second time, and the first ones are
  evidence.

Where the guarantees stop: durability is what ``fsync`` gives on the file system (a network file
system or a disk that lies about flushes may lose the last commits, never tear a committed file);
the lock is advisory and per host (``flock`` on NFS may not exclude writers on other machines);
the logs have no checksums, so a bit flipped inside a step line's number is read as a number;
without ``fcntl`` (Windows) there is no lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from . import codec
from .errors import RecordingError, RunFormatError, RunLockedError, RunNotFoundError

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system
    fcntl = None  # type: ignore[assignment]

__all__ = ["FORMAT", "FileEntry", "Run", "RunLock", "RunWriter", "write_atomic"]

FORMAT = 1
_META = "run.json"
_RANK = "rank0"
_LOCK = ".lock"
_META_CAP = 64 * 1024 * 1024
_KINDS = ("snapshot", "checkpoint")
_HEX = re.compile(r"[0-9a-f]+")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` holds either the old or the new bytes."""
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    _fsync_dir(path.parent)


def _append_lines(path: Path, records: list[dict[str, Any]]) -> None:
    if not records:
        return
    text = "".join(json.dumps(r, allow_nan=True) + "\n" for r in records)
    with open(path, "ab") as handle:
        handle.write(text.encode())
        handle.flush()
        os.fsync(handle.fileno())


def file_name(kind: str, step: int) -> str:
    """The one name a snapshot or checkpoint of a step may have, relative to the rank folder."""
    return f"{kind}s/step-{step:08d}.st.zst"


@dataclass(frozen=True)
class FileEntry:
    """A committed snapshot or checkpoint file, as its index line declares it."""

    kind: str
    step: int
    file: str
    bytes: int
    raw_bytes: int
    checksum: str

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> FileEntry:
        """An index line, checked field by field; ``ValueError`` names what is wrong."""
        entry = cls(**record)
        if entry.kind not in _KINDS:
            raise ValueError(f"unknown kind {entry.kind!r}")
        for name in ("step", "bytes", "raw_bytes"):
            value = getattr(entry, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} {value!r} is not a count")
        if entry.file != file_name(entry.kind, entry.step):  # never a path out of the run
            raise ValueError(f"file {entry.file!r} is not the name of a {entry.kind} at step {entry.step}")
        if not isinstance(entry.checksum, str) or not _HEX.fullmatch(entry.checksum):
            raise ValueError(f"checksum {entry.checksum!r} is not hexadecimal")
        return entry


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
    for child in path.iterdir():
        if child.name == _LOCK:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _recording_error(path: Path, doing: str, error: OSError) -> RecordingError:
    cause = error.strerror or str(error)
    where = f" ({error.filename})" if error.filename else ""
    return RecordingError(f"{path}: cannot {doing}: {cause}{where}; check the path, its permissions and free space")


@dataclass
class Resumed:
    """What :meth:`RunWriter.resume` went back to."""

    step: int
    checkpoint: dict[str, Any]
    meta: dict[str, Any]
    superseded: Path | None


class RunWriter:
    """Writes one run directory, holding its lock; see the module docstring for the guarantees."""

    def __init__(self, path: Path | str, meta: dict[str, Any], *, force: bool = False) -> None:
        self.path = Path(path)
        self.rank = self.path / _RANK
        self._lock: RunLock | None = None
        try:
            if self.path.exists() and any(c.name not in (_LOCK, f".{_META}.tmp") for c in self.path.iterdir()):
                if not force:
                    raise RunNotFoundError(
                        f"{self.path}: already exists; pass --force to overwrite it, --resume to continue it, or choose another --out"
                    )
                if not (self.path / _META).exists():
                    raise RunNotFoundError(f"{self.path}: not empty and not a bisect-repro run; refusing to overwrite it even with --force")
                self._lock = RunLock(self.path)  # before deleting anything: never pull a run from under its recorder
                _remove_contents_but_lock(self.path)
            else:
                self.path.mkdir(parents=True, exist_ok=True)
                self._lock = RunLock(self.path)
            # run.json first: a directory killed before it holds only the lock file and counts as empty
            write_atomic(self.path / _META, json.dumps({"format": FORMAT, **meta}, indent=2).encode())
            for folder in (self.rank / "snapshots", self.rank / "checkpoints"):
                folder.mkdir(parents=True, exist_ok=True)
            _fsync_dir(self.rank)
            _fsync_dir(self.path)
        except OSError as error:
            self.close()
            raise _recording_error(self.path, "create the run", error) from error
        except BaseException:
            self.close()
            raise

    @classmethod
    def resume(cls, path: Path | str) -> tuple[RunWriter, Resumed]:
        """Lock an interrupted run, go back to its last readable checkpoint, and reopen it for writing."""
        path = Path(path)
        Run.open(path)  # a missing or foreign directory gets the reader's error, before anything is created
        writer = cls.__new__(cls)
        writer.path, writer.rank, writer._lock = path, path / _RANK, None
        try:
            writer._lock = RunLock(path)
            resumed = writer._go_back()
        except OSError as error:
            writer.close()
            raise _recording_error(path, "resume the run", error) from error
        except BaseException:
            writer.close()
            raise
        return writer, resumed

    def _go_back(self) -> Resumed:
        run = Run.open(self.path)
        if run.complete:
            raise RecordingError(f"{self.path}: the run is complete; nothing to resume (pass --force to record it again)")
        checkpoint: dict[str, Any] | None = None
        for step in sorted(run.checkpoints, reverse=True):
            try:
                checkpoint = run.checkpoint(step)
                break
            except RunFormatError as error:
                warnings.warn(f"{error}; resuming from an earlier checkpoint", stacklevel=3)
        if checkpoint is None:
            raise RecordingError(f"{self.path}: no readable checkpoint to resume from; record it again with --force")
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

    def finish(self, step: int) -> None:
        _append_lines(self.rank / "index.jsonl", [{"kind": "end", "step": step}])

    def close(self) -> None:
        """Release the lock; the directory stays as it is."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def _read_regular(path: Path, cap: int | None = None) -> bytes:
    """A regular file's bytes, at most ``cap + 1`` of them: never a device or FIFO that does not end."""
    with open(path, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise RunFormatError(path, "not a regular file", "the run was damaged or tampered with")
        return handle.read() if cap is None else handle.read(cap + 1)


def _log_lines(path: Path) -> list[tuple[bytes, dict[str, Any]]]:
    """Every whole JSON line with its bytes (newline included); a torn last line is skipped with a warning."""
    if not path.exists():
        return []
    lines = _read_regular(path).split(b"\n")
    found: list[tuple[bytes, dict[str, Any]]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except (ValueError, RecursionError):
            if number >= len(lines) - 1:
                warnings.warn(f"{path}: line {number} is torn (the recorder was interrupted); it is skipped", stacklevel=4)
                break
            raise RunFormatError(path, f"line {number} is not a JSON object", "the file is damaged") from None
        found.append((line + b"\n", record))
    return found


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """Every whole JSON line; a torn last line is skipped with a warning."""
    return [record for _, record in _log_lines(path)]


_META_TYPES: dict[str, type | tuple[type, ...]] = {
    "target": (str, type(None)),
    "config": dict,
    "options": dict,
    "environment": dict,
    "model": dict,
    "loader": dict,
    "streams": list,
    "resumes": list,
}


def _check_meta(path: Path, meta: Any) -> dict[str, Any]:
    if not isinstance(meta, dict) or type(meta.get("format")) is not int:
        raise RunFormatError(path, "no format version", "the file is damaged or not a bisect-repro run")
    if meta["format"] > FORMAT:
        raise RunFormatError(path, f"format {meta['format']} is newer than this bisect-repro reads ({FORMAT})", "upgrade bisect-repro")
    if meta["format"] < 1:
        raise RunFormatError(path, f"unknown format version {meta['format']}", "the file is damaged")
    for key, kind in _META_TYPES.items():
        if key in meta and not isinstance(meta[key], kind):
            raise RunFormatError(path, f"{key!r} is a {type(meta[key]).__name__}", "the file is damaged")
    if not all(isinstance(v, dict) for v in meta.get("model", {}).values()):
        raise RunFormatError(path, "'model' does not map kinds to tensors", "the file is damaged")
    return meta


@dataclass
class Run:
    """A run directory opened for reading. Reading never imports or executes anything."""

    path: Path
    meta: dict[str, Any]
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    snapshots: dict[int, FileEntry] = field(default_factory=dict)
    checkpoints: dict[int, FileEntry] = field(default_factory=dict)
    complete: bool = False

    @classmethod
    def open(cls, path: Path | str) -> Run:
        path = Path(path)
        if not path.exists():
            raise RunNotFoundError(f"{path}: no such run directory; check the path")
        if not path.is_dir() or not (path / _META).is_file():
            raise RunNotFoundError(f"{path}: not a bisect-repro run (no {_META}); give a directory written by 'bisect-repro record'")
        meta_path = path / _META
        try:
            text = _read_regular(meta_path, _META_CAP)
            if len(text) > _META_CAP:
                raise RunFormatError(meta_path, "too large to be run metadata", "the file is damaged")
            meta = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            problem = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise RunFormatError(meta_path, f"not valid JSON ({problem})", "the file is damaged or truncated") from None
        except RecursionError:
            raise RunFormatError(meta_path, "not valid JSON (nested too deeply)", "the file is damaged") from None
        except OSError as error:
            raise RunFormatError(meta_path, f"cannot be read ({error.strerror or error})", "check its permissions") from None
        run = cls(path, _check_meta(meta_path, meta))
        rank = path / _RANK
        log = rank
        try:
            log = rank / "steps.jsonl"
            for record in _read_lines(log):
                step = record["step"]
                if type(step) is not int or step < 0:
                    raise ValueError(f"step {step!r} is not a step number")
                run.steps[step] = record
            log = rank / "index.jsonl"
            for record in _read_lines(log):
                if record.get("kind") == "end":
                    run.complete = True
                    continue
                entry = FileEntry.from_record(record)
                (run.snapshots if entry.kind == "snapshot" else run.checkpoints)[entry.step] = entry
        except (KeyError, TypeError, ValueError) as error:
            problem = " ".join(str(error).split())[:200]
            raise RunFormatError(log, f"a log line has missing or bad fields ({problem})", "the file is damaged") from None
        except OSError as error:
            raise RunFormatError(log, f"cannot be read ({error.strerror or error})", "check its permissions") from None
        return run

    @property
    def last_step(self) -> int | None:
        """The last step whose state is committed (the last snapshot)."""
        return max(self.snapshots) if self.snapshots else None

    def _load(self, entry: FileEntry) -> Any:
        file = self.path / _RANK / entry.file
        try:
            data = _read_regular(file, entry.bytes)
        except FileNotFoundError:
            raise RunFormatError(
                file, f"{entry.kind} for step {entry.step} is in the index but missing", "the run was damaged or partly copied"
            ) from None
        except OSError as error:
            raise RunFormatError(file, f"cannot be read ({error.strerror or error})", "check its permissions") from None
        if len(data) != entry.bytes:
            raise RunFormatError(file, f"{len(data)} bytes, the run index declares {entry.bytes}", "the file is truncated or damaged")
        tree = codec.decode(data, file, raw_size=entry.raw_bytes, digest=entry.checksum)
        if not isinstance(tree, dict):
            raise RunFormatError(file, f"holds a {type(tree).__name__}, not a {entry.kind}", "the file is damaged")
        return tree

    def snapshot(self, step: int) -> dict[str, Any]:
        if step not in self.snapshots:
            raise RunFormatError(self.path, f"no snapshot at step {step}", f"snapshots are at {sorted(self.snapshots)}")
        tree = self._load(self.snapshots[step])
        for key in ("hashes", "streams", "data"):
            if key in tree and not isinstance(tree[key], dict):
                file = self.path / _RANK / self.snapshots[step].file
                raise RunFormatError(file, f"{key!r} is a {type(tree[key]).__name__}", "the file is damaged")
        return tree

    def checkpoint(self, step: int) -> dict[str, Any]:
        if step not in self.checkpoints:
            raise RunFormatError(self.path, f"no checkpoint at step {step}", f"checkpoints are at {sorted(self.checkpoints)}")
        return self._load(self.checkpoints[step])

    def losses(self) -> dict[int, float | None]:
        return {step: record.get("loss") for step, record in sorted(self.steps.items())}
