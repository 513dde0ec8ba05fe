"""The run directory: its layout, crash-safe writes, and validated reads.

Layout (format 1)::

    RUN/
      run.json                    metadata: versions, target, config, options, environment, model
      .lock                       held by the recorder writing the run
      rank0/                      one sub-record per distributed rank
        steps.jsonl               one line per step: step, loss, data-order hash, batch hash
        index.jsonl               one line per committed snapshot or checkpoint, then "end"
        snapshots/step-00000050.st.zst
        checkpoints/step-00000100.st.zst

Design decisions:
- Whole files (``run.json``, snapshots, checkpoints) are written to a temporary name, fsynced,
  renamed into place, and the directory is fsynced: no file is ever visible under its final name
  half-written.
- The two logs are append-only, one JSON object per line, fsynced at each snapshot. A file is
  committed only by its index line, which is written last, after the file and the step lines it
  covers are durable; a reader ignores files that no index line names and a torn last line.
- The index carries each file's size, checksum and decompressed size, so a reader checks a file
  before decompressing it, and a decompression bomb is refused by the size the index declared.
- A run is complete when its index ends with an ``end`` line; otherwise its last complete step is
  the last committed snapshot.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import codec
from .errors import RunFormatError, RunNotFoundError

__all__ = ["FORMAT", "FileEntry", "Run", "RunWriter"]

FORMAT = 1
_META = "run.json"
_RANK = "rank0"
_META_CAP = 64 * 1024 * 1024


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` holds either the old or the new bytes."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    _fsync_dir(path.parent)


def _append_lines(path: Path, records: list[dict[str, Any]]) -> None:
    if not records:
        return
    text = "".join(json.dumps(r, allow_nan=True) + "\n" for r in records)
    with open(path, "ab") as handle:
        handle.write(text.encode())
        handle.flush()
        os.fsync(handle.fileno())


@dataclass(frozen=True)
class FileEntry:
    """A committed snapshot or checkpoint file, as its index line declares it."""

    kind: str
    step: int
    file: str
    bytes: int
    raw_bytes: int
    checksum: str


class RunWriter:
    """Writes one run directory; see the module docstring for the guarantees."""

    def __init__(self, path: Path | str, meta: dict[str, Any], *, force: bool = False) -> None:
        self.path = Path(path)
        if self.path.exists() and any(self.path.iterdir()):
            if not force:
                raise RunNotFoundError(f"{self.path}: already exists; pass --force to overwrite it, or choose another --out")
            if not (self.path / _META).exists():
                raise RunNotFoundError(f"{self.path}: not empty and not a bisect-repro run; refusing to overwrite it even with --force")
            shutil.rmtree(self.path)
        self.rank = self.path / _RANK
        for folder in (self.rank / "snapshots", self.rank / "checkpoints"):
            folder.mkdir(parents=True, exist_ok=True)
        _fsync_dir(self.path)
        write_atomic(self.path / _META, json.dumps({"format": FORMAT, **meta}, indent=2).encode())

    def append_steps(self, records: list[dict[str, Any]]) -> None:
        _append_lines(self.rank / "steps.jsonl", records)

    def commit(self, kind: str, step: int, tree: Any) -> FileEntry:
        """Write a snapshot or checkpoint file, then the index line that makes it visible."""
        data, raw_size = codec.encode(tree)
        name = f"{kind}s/step-{step:08d}.st.zst"
        write_atomic(self.rank / name, data)
        entry = FileEntry(kind, step, name, len(data), raw_size, codec.checksum(data))
        _append_lines(self.rank / "index.jsonl", [entry.__dict__])
        return entry

    def finish(self, step: int) -> None:
        _append_lines(self.rank / "index.jsonl", [{"kind": "end", "step": step}])


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """Every whole JSON line; a torn last line is skipped with a warning."""
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError:
            if number >= len(lines) - 1:
                warnings.warn(f"{path}: line {number} is torn (the recorder was interrupted); it is skipped", stacklevel=3)
                break
            raise RunFormatError(path, f"line {number} is not a JSON object", "the file is damaged") from None
        records.append(record)
    return records


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
        if meta_path.stat().st_size > _META_CAP:
            raise RunFormatError(meta_path, "too large to be run metadata", "the file is damaged")
        try:
            meta = json.loads(meta_path.read_bytes())
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise RunFormatError(meta_path, f"not valid JSON ({error})", "the file is damaged or truncated") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("format"), int):
            raise RunFormatError(meta_path, "no format version", "the file is damaged or not a bisect-repro run")
        if meta["format"] > FORMAT:
            raise RunFormatError(
                meta_path, f"format {meta['format']} is newer than this bisect-repro reads ({FORMAT})", "upgrade bisect-repro"
            )
        if meta["format"] < 1:
            raise RunFormatError(meta_path, f"unknown format version {meta['format']}", "the file is damaged")
        run = cls(path, meta)
        rank = path / _RANK
        try:
            for record in _read_lines(rank / "steps.jsonl"):
                run.steps[int(record["step"])] = record
            for record in _read_lines(rank / "index.jsonl"):
                if record.get("kind") == "end":
                    run.complete = True
                    continue
                entry = FileEntry(**record)
                (run.snapshots if entry.kind == "snapshot" else run.checkpoints)[entry.step] = entry
        except (KeyError, TypeError, ValueError) as error:
            raise RunFormatError(rank, f"a log line has missing or bad fields ({error})", "the file is damaged") from None
        return run

    @property
    def last_step(self) -> int | None:
        """The last step whose state is committed (the last snapshot)."""
        return max(self.snapshots) if self.snapshots else None

    def _load(self, entry: FileEntry) -> Any:
        file = self.path / _RANK / entry.file
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            raise RunFormatError(
                file, f"{entry.kind} for step {entry.step} is in the index but missing", "the run was damaged or partly copied"
            ) from None
        if len(data) != entry.bytes:
            raise RunFormatError(file, f"{len(data)} bytes, the run index declares {entry.bytes}", "the file is truncated or damaged")
        return codec.decode(data, file, raw_size=entry.raw_bytes, digest=entry.checksum)

    def snapshot(self, step: int) -> dict[str, Any]:
        if step not in self.snapshots:
            raise RunFormatError(self.path, f"no snapshot at step {step}", f"snapshots are at {sorted(self.snapshots)}")
        return self._load(self.snapshots[step])

    def checkpoint(self, step: int) -> dict[str, Any]:
        if step not in self.checkpoints:
            raise RunFormatError(self.path, f"no checkpoint at step {step}", f"checkpoints are at {sorted(self.checkpoints)}")
        return self._load(self.checkpoints[step])

    def losses(self) -> dict[int, float | None]:
        return {step: record.get("loss") for step, record in sorted(self.steps.items())}
