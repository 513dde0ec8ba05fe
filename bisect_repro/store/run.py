"""The run directory: its layout and validated reads (writing is :mod:`bisect_repro.store.writer`).

Layout (format 1: one process; format 2: a distributed run, one ``rank{r}/`` per rank)::

    RUN/
      run.json                    metadata: versions, target, config, options, environment, model;
                                  a distributed run's also ``distributed`` (world size, backend, layout, mesh)
      .lock                       held by the recorder writing the run (rank 0's in a distributed run)
      rank0/                      one sub-record per rank: a single process writes rank0/ only
        rank.json                 a distributed run's rank: who it was, where it ran, its environment
        .lock                     held by the rank writing this folder (ranks other than 0)
        steps.jsonl               one line per step: step, loss, data-order hash, batch hash
        index.jsonl               one line per committed snapshot or checkpoint, then "end"
        snapshots/step-00000050.st.zst
        checkpoints/step-00000100.st.zst
        superseded/resume-001/    what a resume dropped: its log lines and files, kept, never read
      rank1/ ...

Design decisions (writing, crash safety, the locks and resume: :mod:`bisect_repro.store.writer`):
- A file is committed only by its index line; a reader ignores files that no index line names
  and a torn last line of a log.
- The index carries each file's name, size, checksum and decompressed size; a reader accepts only
  the name the step and kind imply (no path leaves the run), checks that it is a regular file of
  the declared size and its checksum before decompressing it, and refuses a decompression bomb by
  the size the index declared.
- A run (a rank) is complete when its index ends with an ``end`` line; otherwise its last
  complete step is the last committed snapshot.
- A reader opens one rank (:meth:`Run.open` with ``rank=``, :meth:`Run.open_rank`); every rank
  shares ``run.json``, and a distributed run's rank also has ``rank.json``, checked to be that
  rank's. A single-process run is format 1 exactly as before; a distributed run is format 2,
  which an older reader refuses rather than reading rank 0 as if it were the whole run.

Where the guarantees stop: the logs have no checksums, so a bit flipped inside a step line's
number is read as a number; a crafted run can carry consistent wrong data with matching checksums.
"""

from __future__ import annotations

import json
import os
import re
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RunFormatError, RunNotFoundError
from . import codec

__all__ = ["DISTRIBUTED_FORMAT", "FORMAT", "FileEntry", "Run", "file_name", "rank_folder"]

FORMAT = 1
"""The format of a single-process run, as it always was."""
DISTRIBUTED_FORMAT = 2
"""The format of a distributed run, and the newest this reads."""
_META = "run.json"
_RANK_META = "rank.json"
_RANK = "rank0"
_LOCK = ".lock"
_META_CAP = 64 * 1024 * 1024
_KINDS = ("snapshot", "checkpoint")
_HEX = re.compile(r"[0-9a-f]+")


def rank_folder(rank: int) -> str:
    """The folder of a rank's records, relative to the run: ``rank0``, ``rank1``, ..."""
    return f"rank{rank}"


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
    "distributed": dict,
}


def _check_meta(path: Path, meta: Any) -> dict[str, Any]:
    if not isinstance(meta, dict) or type(meta.get("format")) is not int:
        raise RunFormatError(path, "no format version", "the file is damaged or not a bisect-repro run")
    if meta["format"] > DISTRIBUTED_FORMAT:
        newest = DISTRIBUTED_FORMAT
        raise RunFormatError(path, f"format {meta['format']} is newer than this bisect-repro reads ({newest})", "upgrade bisect-repro")
    if meta["format"] < 1:
        raise RunFormatError(path, f"unknown format version {meta['format']}", "the file is damaged")
    for key, kind in _META_TYPES.items():
        if key in meta and not isinstance(meta[key], kind):
            raise RunFormatError(path, f"{key!r} is a {type(meta[key]).__name__}", "the file is damaged")
    if not all(isinstance(v, dict) for v in meta.get("model", {}).values()):
        raise RunFormatError(path, "'model' does not map kinds to tensors", "the file is damaged")
    if (meta["format"] >= 2) != ("distributed" in meta):
        without = "out" if meta["format"] >= 2 else ""
        raise RunFormatError(path, f"format {meta['format']} with{without} 'distributed'", "the file is damaged")
    world = meta.get("distributed", {}).get("world_size", 1)
    if type(world) is not int or world < 1:
        raise RunFormatError(path, f"world size {world!r} is not a number of ranks", "the file is damaged")
    return meta


def _read_json(path: Path, what: str) -> Any:
    """A JSON file of at most ``_META_CAP`` bytes, or one line naming what is wrong with it."""
    try:
        text = _read_regular(path, _META_CAP)
        if len(text) > _META_CAP:
            raise RunFormatError(path, f"too large to be {what}", "the file is damaged")
        return json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        problem = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise RunFormatError(path, f"not valid JSON ({problem})", "the file is damaged or truncated") from None
    except RecursionError:
        raise RunFormatError(path, "not valid JSON (nested too deeply)", "the file is damaged") from None
    except FileNotFoundError:
        raise
    except OSError as error:
        raise RunFormatError(path, f"cannot be read ({error.strerror or error})", "check its permissions") from None


@dataclass
class Run:
    """One rank of a run directory, opened for reading (a single-process run has rank 0 only).
    Reading never imports or executes anything."""

    path: Path
    meta: dict[str, Any]
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    snapshots: dict[int, FileEntry] = field(default_factory=dict)
    checkpoints: dict[int, FileEntry] = field(default_factory=dict)
    complete: bool = False
    rank: int = 0
    rank_meta: dict[str, Any] = field(default_factory=dict)
    """``rank{r}/rank.json`` of a distributed run (who the rank was, its environment); ``{}`` otherwise."""

    @classmethod
    def open(cls, path: Path | str, rank: int = 0) -> Run:
        """Open a run at one of its ranks (rank 0 by default: the only one of a single-process run)."""
        path = Path(path)
        if not path.exists():
            raise RunNotFoundError(f"{path}: no such run directory; check the path")
        missing = RunNotFoundError(f"{path}: not a bisect-repro run (no {_META}); give a directory written by 'bisect-repro record'")
        if not path.is_dir() or not (path / _META).is_file():
            raise missing
        meta_path = path / _META
        try:
            meta = _read_json(meta_path, "run metadata")
        except FileNotFoundError:
            raise missing from None
        return cls._open_rank(path, _check_meta(meta_path, meta), rank)

    def open_rank(self, rank: int) -> Run:
        """Another rank of the same run (``run.json`` is not read again)."""
        return self._open_rank(self.path, self.meta, rank)

    @classmethod
    def _open_rank(cls, path: Path, meta: dict[str, Any], rank: int) -> Run:
        world = meta.get("distributed", {}).get("world_size", 1)
        if type(rank) is not int or not 0 <= rank < world:
            raise RunNotFoundError(f"{path}: has no rank {rank} (its world size is {world}); give a rank from 0 to {world - 1}")
        run = cls(path, meta, rank=rank)
        folder = path / rank_folder(rank)
        if "distributed" in meta:
            if not folder.is_dir():
                raise RunFormatError(folder, f"rank {rank} of {world} has no records", "the run was partly copied, or the rank never ran")
            try:
                rank_meta = _read_json(folder / _RANK_META, "rank metadata")
            except FileNotFoundError:
                raise RunFormatError(folder / _RANK_META, "missing", "the rank was stopped as it started; record the run again") from None
            if not isinstance(rank_meta, dict) or rank_meta.get("rank") != rank:
                raise RunFormatError(folder / _RANK_META, f"does not describe rank {rank}", "the file is damaged or was moved")
            if not isinstance(rank_meta.get("environment", {}), dict):
                raise RunFormatError(folder / _RANK_META, "'environment' is not an object", "the file is damaged")
            run.rank_meta = rank_meta
        log = folder
        try:
            log = folder / "steps.jsonl"
            for record in _read_lines(log):
                step = record["step"]
                if type(step) is not int or step < 0:
                    raise ValueError(f"step {step!r} is not a step number")
                run.steps[step] = record
            log = folder / "index.jsonl"
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
    def distributed(self) -> dict[str, Any] | None:
        """``run.json``'s ``distributed`` (world size, backend, layout, mesh); ``None`` for a single process."""
        return self.meta.get("distributed")

    @property
    def world_size(self) -> int:
        return int((self.distributed or {}).get("world_size", 1))

    @property
    def layout(self) -> str:
        """``single``, ``ddp``, ``fsdp`` or ``dtensor`` (see :mod:`bisect_repro.capture.parallel`)."""
        return str((self.distributed or {}).get("layout", "single"))

    @property
    def environment(self) -> dict[str, Any]:
        """This rank's environment fingerprint (``rank.json``'s, else ``run.json``'s)."""
        return self.rank_meta.get("environment") or self.meta.get("environment", {})

    @property
    def folder(self) -> Path:
        return self.path / rank_folder(self.rank)

    @property
    def _where(self) -> Path:
        return self.folder if self.distributed else self.path

    @property
    def last_step(self) -> int | None:
        """The last step whose state is committed (the last snapshot)."""
        return max(self.snapshots) if self.snapshots else None

    def _load(self, entry: FileEntry) -> Any:
        file = self.folder / entry.file
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
            raise RunFormatError(self._where, f"no snapshot at step {step}", f"snapshots are at {sorted(self.snapshots)}")
        tree = self._load(self.snapshots[step])
        for key in ("hashes", "streams", "data"):
            if key in tree and not isinstance(tree[key], dict):
                file = self.folder / self.snapshots[step].file
                raise RunFormatError(file, f"{key!r} is a {type(tree[key]).__name__}", "the file is damaged")
        return tree

    def checkpoint(self, step: int) -> dict[str, Any]:
        if step not in self.checkpoints:
            raise RunFormatError(self._where, f"no checkpoint at step {step}", f"checkpoints are at {sorted(self.checkpoints)}")
        return self._load(self.checkpoints[step])

    def losses(self) -> dict[int, float | None]:
        return {step: record.get("loss") for step, record in sorted(self.steps.items())}
