"""The run directory: its layout and validated reads (writing is :mod:`bisect_repro.store.writer`).

Layout (format 1: one process; format 2: a distributed run, one ``rank{r}/`` per rank)::

    RUN/
      run.json                  metadata: versions, target, config, options, environment, model;
                                a distributed run's also ``distributed`` (world size, backend,
                                layout, mesh)
      .lock                     held by the recorder writing the run (rank 0's if distributed)
      rank0/                    one sub-record per rank: a single process writes rank0/ only
        rank.json               a distributed run's rank: who, where it ran, its environment
        .lock                   held by the rank writing this folder (ranks other than 0)
        steps.jsonl             one line per step: step, loss, data-order hash, batch hash
        index.jsonl             one line per committed snapshot or checkpoint, then "end"
        snapshots/step-00000050.st.zst
        checkpoints/step-00000100.st.zst
        superseded/resume-001/  what a resume dropped: its log lines and files, kept, never read
      rank1/ ...

Design decisions (writing, crash safety, the locks and resume: :mod:`bisect_repro.store.writer`):
- A file is committed only by its index line; a reader ignores files that no index line names
  and a torn last line of a log.
- The index carries each file's name, size, checksum and decompressed size; a reader accepts only
  the name the step and kind imply (no path leaves the run), checks that it is a regular file of
  the declared size and its checksum before decompressing it, and refuses a decompression bomb by
  the size the index declared.
- Every file is reached from the run directory one name at a time, through no symbolic link
  (``rank0/``, ``snapshots/``, ``run.json``, a snapshot: a link is refused, never followed), opened
  without blocking and checked to be a regular file before a byte is read
  (:mod:`bisect_repro.store.files`): a FIFO or a device in a run is an error, not a hang.
- JSON is measured before it is parsed: ``run.json`` and ``rank.json`` at most 16 MiB and 2
  million values, a log line at most 1 MiB and 65,536 values; a log is read line by line.
- A run (a rank) is complete when its index ends with an ``end`` line; otherwise its last
  complete step is the last committed snapshot.
- A reader opens one rank (:meth:`Run.open` with ``rank=``, :meth:`Run.open_rank`); every rank
  shares ``run.json``, and a distributed run's rank also has ``rank.json``, checked to be that
  rank's. A single-process run is format 1 exactly as before; a distributed run is format 2,
  which an older reader refuses rather than reading rank 0 as if it were the whole run.

Where the guarantees stop: the logs have no checksums, so a bit flipped inside a step line's
number is read as a number; a crafted run can carry consistent wrong data with matching checksums.
The run directory as the user names it may itself be a link, and is followed (the user chose it).
A log has no total cap: its memory grows with its lines, as a long real run's does. Each file is
opened afresh from the run directory, so a run changed while it is read is read as it then is.
"""

from __future__ import annotations

import json
import re
import sys
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..capture.entropy import check_value
from ..errors import RunFormatError, RunNotFoundError
from . import codec, files
from .meta import DISTRIBUTED_FORMAT, FORMAT, Distributed, RankMeta, RunMeta
from .sketches import Sketches, read_sketches

__all__ = ["DISTRIBUTED_FORMAT", "FORMAT", "FileEntry", "Run", "file_name", "rank_folder"]

_META = "run.json"
_RANK_META = "rank.json"
_RANK = "rank0"
_LOCK = ".lock"
# run.json and rank.json: a real one is kilobytes; its largest part, 'model', takes about 8 JSON
# values per tensor, so 2 million values is a model of 250,000 tensors (several times the largest
# published), and 16 MiB is 60 bytes for each of them. A step or index line is about 150 bytes and
# 20 values. Each cap bounds what json.loads can build (about 64 bytes a value) before it runs.
_META_CAP = 16 * 1024 * 1024
_META_NODES = 2_000_000
_LINE_CAP = 1024 * 1024
_LINE_NODES = 65_536
_KINDS = ("snapshot", "checkpoint")
MAX_STEP = 2**53
"""The largest step a run may name: every step is exact as a float, and no loop over steps is
unbounded."""
_LARGEST_FLOAT = int(sys.float_info.max)
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
    mac: str | None = field(default=None, compare=False)
    """This user's MAC over the line and the run's signature (:mod:`bisect_repro.store.signing`);
    ``None``: unsigned."""

    def line(self) -> dict[str, Any]:
        """The index line as signed: every field but the MAC."""
        fields = ("kind", "step", "file", "bytes", "raw_bytes", "checksum")
        return {name: getattr(self, name) for name in fields}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> FileEntry:
        """An index line, checked field by field; ``ValueError`` names what is wrong."""
        entry = cls(**record)
        if entry.mac is not None and not isinstance(entry.mac, str):
            raise ValueError(f"mac {entry.mac!r} is not text")
        if entry.kind not in _KINDS:
            raise ValueError(f"unknown kind {entry.kind!r}")
        for name in ("step", "bytes", "raw_bytes"):
            value = getattr(entry, name)
            if type(value) is not int or not 0 <= value <= MAX_STEP:
                raise ValueError(f"{name} {value!r:.40} is not a count")
        if entry.file != file_name(entry.kind, entry.step):  # never a path out of the run
            raise ValueError(
                f"file {entry.file!r} is not the name of a {entry.kind} at step {entry.step}"
            )
        if not isinstance(entry.checksum, str) or not _HEX.fullmatch(entry.checksum):
            raise ValueError(f"checksum {entry.checksum!r} is not hexadecimal")
        return entry


def _log_lines(path: Path, root: Path | None = None) -> list[tuple[bytes, dict[str, Any]]]:
    """Every whole JSON line with its bytes (newline included); a torn last line is skipped with a
    warning.

    ``path`` is reached from ``root`` (the run directory; its parent when not given) through no
    link; each line is at most ``_LINE_CAP`` bytes and ``_LINE_NODES`` JSON values."""
    root = path.parent if root is None else root
    found: list[tuple[bytes, dict[str, Any]]] = []
    # a line that is not a JSON object: torn if it is the last, damage if any line follows
    bad: int | None = None
    for number, line in enumerate(
        files.lines(root, path.relative_to(root).as_posix(), _LINE_CAP), 1
    ):
        if bad is not None:
            raise RunFormatError(path, f"line {bad} is not a JSON object", "the file is damaged")
        line = line.removesuffix(b"\n")
        if not line.strip():
            continue
        if files.json_nodes(line) > _LINE_NODES:
            raise RunFormatError(
                path,
                f"line {number} holds more than {_LINE_NODES:,} JSON values",
                "the file is damaged or crafted",
            )
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except (ValueError, RecursionError):
            bad = number
            continue
        found.append((line + b"\n", record))
    if bad is not None:
        warnings.warn(
            f"{path}: line {bad} is torn (the recorder was interrupted); it is skipped",
            stacklevel=3,
        )
    return found


def _read_lines(path: Path, root: Path) -> list[dict[str, Any]]:
    """Every whole JSON line; a torn last line is skipped with a warning."""
    return [record for _, record in _log_lines(path, root)]


def _read_json(root: Path, relative: str, what: str) -> Any:
    """A JSON file of the run of at most ``_META_CAP`` bytes and ``_META_NODES`` values, or one line
    naming what is wrong with it."""
    path = root / relative
    return files.parse_json(
        files.read_file(root, relative, _META_CAP, what), path, what, max_nodes=_META_NODES
    )


_SEEDING_TEXT = ("call", "stream", "where")


def _check_step_line(record: dict[str, Any]) -> int:
    """A ``steps.jsonl`` line's step, after checking every field a reader uses: ``loss`` a number or
    null, ``order``, ``batch`` and ``first`` text or null, ``streams`` and ``start`` a digest
    (text) per stream, ``seeded`` a list of seeding calls (``call``, ``stream``, ``where`` text,
    ``entropy`` true or false, ``value`` what entropy gave the call, as
    :func:`~bisect_repro.capture.entropy.check_value` allows). ``ValueError`` names the first bad
    field."""
    step = record["step"]
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        raise ValueError(f"step {step!r:.40} is not a step number (0 to {MAX_STEP})")
    loss = record.get("loss")
    if loss is not None and (isinstance(loss, bool) or not isinstance(loss, (int, float))):
        raise ValueError(f"step {step}: loss {loss!r:.40} is not a number")
    if isinstance(loss, int) and abs(loss) > _LARGEST_FLOAT:
        raise ValueError(f"step {step}: loss {str(loss)[:20]}... is larger than any float")
    for key in ("order", "batch", "first"):
        if record.get(key) is not None and not isinstance(record[key], str):
            raise ValueError(f"step {step}: {key} {record[key]!r} is not a digest")
    for key in ("streams", "start"):
        streams = record.get(key, {})
        if not isinstance(streams, dict) or not all(isinstance(d, str) for d in streams.values()):
            raise ValueError(f"step {step}: {key} is not a digest per stream")
    seeded = record.get("seeded", [])
    if not isinstance(seeded, list):
        raise ValueError(f"step {step}: seeded is not a list")
    for call in seeded:
        ok = isinstance(call, dict) and all(
            call.get(k) is None or isinstance(call[k], str) for k in _SEEDING_TEXT
        )
        if not ok or not isinstance(call.get("entropy", False), bool):
            raise ValueError(
                f"step {step}: a seeding call {call!r:.80} is not call, stream, where and entropy"
            )
        wrong = check_value(call.get("call") or "", call.get("value"))
        if wrong is not None:
            raise ValueError(
                f"step {step}: the value of seeding call {call.get('call')!r:.40} {wrong}"
            )
    return step


def _moved(entry: FileEntry, offset: int) -> FileEntry:
    return replace(entry, step=entry.step + offset)


@dataclass
class Run:
    """One rank of a run directory, opened for reading (a single-process run has rank 0 only).
    Reading never imports or executes anything."""

    path: Path
    meta: RunMeta
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    snapshots: dict[int, FileEntry] = field(default_factory=dict)
    checkpoints: dict[int, FileEntry] = field(default_factory=dict)
    complete: bool = False
    rank: int = 0
    rank_meta: RankMeta | None = None
    """``rank{r}/rank.json`` of a distributed run (who the rank was, its environment); ``None``
    otherwise."""
    offset: int = 0
    """How far :meth:`shifted` moved this view's step numbers from the ones the run recorded."""

    def shifted(self, offset: int) -> Run:
        """This run with every step ``offset`` later: a script resumed from another run's
        checkpoint, whose own count started again at 0, seen at the steps of the run it resumed.
        Its start step moves with it; the files are the same."""
        if offset == 0:
            return self
        options = replace(self.meta.options, start_step=self.meta.options.start_step + offset)
        return replace(
            self,
            meta=replace(self.meta, options=options),
            steps={s + offset: {**line, "step": s + offset} for s, line in self.steps.items()},
            snapshots={s + offset: _moved(e, offset) for s, e in self.snapshots.items()},
            checkpoints={s + offset: _moved(e, offset) for s, e in self.checkpoints.items()},
            offset=self.offset + offset,
        )

    @classmethod
    def open(cls, path: Path | str, rank: int = 0) -> Run:
        """Open a run at one of its ranks (rank 0 by default: the only one of a single-process
        run)."""
        path = Path(path)
        if not path.exists():
            raise RunNotFoundError(f"{path}: no such run directory; check the path")
        missing = RunNotFoundError(
            f"{path}: not a bisect-repro run (no {_META}); give a directory written by "
            "'bisect-repro record'"
        )
        if not path.is_dir():  # the run directory itself may be a link: the user named it
            raise missing
        meta_path = path / _META
        try:
            meta = _read_json(path, _META, "run metadata")
        except FileNotFoundError:
            raise missing from None
        return cls._open_rank(path, RunMeta.parse(meta_path, meta), rank)

    def open_rank(self, rank: int) -> Run:
        """Another rank of the same run (``run.json`` is not read again), shifted as this one."""
        original = replace(
            self.meta,
            options=replace(
                self.meta.options, start_step=self.meta.options.start_step - self.offset
            ),
        )
        return self._open_rank(self.path, original, rank).shifted(self.offset)

    @classmethod
    def _open_rank(cls, path: Path, meta: RunMeta, rank: int) -> Run:
        world = meta.world_size
        if type(rank) is not int or not 0 <= rank < world:
            raise RunNotFoundError(
                f"{path}: has no rank {rank} (its world size is {world}); give a rank from 0 to "
                f"{world - 1}"
            )
        run = cls(path, meta, rank=rank)
        folder = path / rank_folder(rank)
        if meta.distributed is not None:
            if not files.is_folder(path, rank_folder(rank)):
                raise RunFormatError(
                    folder,
                    f"rank {rank} of {world} has no records",
                    "the run was partly copied, or the rank never ran",
                )
            try:
                rank_meta = _read_json(path, f"{rank_folder(rank)}/{_RANK_META}", "rank metadata")
            except FileNotFoundError:
                raise RunFormatError(
                    folder / _RANK_META,
                    "missing",
                    "the rank was stopped as it started; record the run again",
                ) from None
            run.rank_meta = RankMeta.parse(folder / _RANK_META, rank_meta, rank)
        log = folder
        try:
            log = folder / "steps.jsonl"
            for record in _read_lines(log, path):
                run.steps[_check_step_line(record)] = record
            log = folder / "index.jsonl"
            for record in _read_lines(log, path):
                if record.get("kind") == "end":
                    run.complete = True
                    continue
                entry = FileEntry.from_record(record)
                (run.snapshots if entry.kind == "snapshot" else run.checkpoints)[entry.step] = entry
        except (KeyError, TypeError, ValueError) as error:
            problem = " ".join(str(error).split())[:200]
            raise RunFormatError(
                log, f"a log line has missing or bad fields ({problem})", "the file is damaged"
            ) from None
        except OSError as error:
            raise RunFormatError(
                log, f"cannot be read ({error.strerror or error})", "check its permissions"
            ) from None
        return run

    @property
    def distributed(self) -> Distributed | None:
        """``run.json``'s ``distributed`` (world size, backend, layout, mesh); ``None`` for a single
        process."""
        return self.meta.distributed

    @property
    def world_size(self) -> int:
        return self.meta.world_size

    @property
    def layout(self) -> str:
        """``single``, ``ddp``, ``fsdp`` or ``dtensor`` (see
        :mod:`bisect_repro.capture.parallel`)."""
        return self.meta.distributed.layout if self.meta.distributed is not None else "single"

    @property
    def environment(self) -> dict[str, Any]:
        """This rank's environment fingerprint (``rank.json``'s, else ``run.json``'s)."""
        return (
            self.rank_meta.environment if self.rank_meta is not None else None
        ) or self.meta.environment

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

    def _load(self, entry: FileEntry) -> dict[str, Any]:
        file = self.folder / entry.file
        if entry.bytes > codec.memory_cap():
            problem = f"the run index declares {entry.bytes} bytes, more than this machine's memory"
            raise RunFormatError(file, problem, "read the run on a larger machine")
        try:  # no more than the index declares is read: fstat must agree before a byte is
            data = files.read_file(
                self.path,
                f"{rank_folder(self.rank)}/{entry.file}",
                entry.bytes,
                entry.kind,
                size=entry.bytes,
            )
        except FileNotFoundError:
            raise RunFormatError(
                file,
                f"{entry.kind} for step {entry.step} is in the index but missing",
                "the run was damaged or partly copied",
            ) from None
        if len(data) != entry.bytes:
            raise RunFormatError(
                file,
                f"{len(data)} bytes, the run index declares {entry.bytes}",
                "the file is truncated or damaged",
            )
        tree = codec.decode(data, file, raw_size=entry.raw_bytes, digest=entry.checksum)
        if not isinstance(tree, dict):
            raise RunFormatError(
                file, f"holds a {type(tree).__name__}, not a {entry.kind}", "the file is damaged"
            )
        return tree

    def snapshot(self, step: int) -> dict[str, Any]:
        if step not in self.snapshots:
            raise RunFormatError(
                self._where,
                f"no snapshot at step {step}",
                f"snapshots are at {sorted(self.snapshots)}",
            )
        tree = self._load(self.snapshots[step])
        if self.offset and isinstance(tree.get("step"), int):
            tree["step"] += self.offset
        for key in ("hashes", "streams", "data"):
            if key in tree and not isinstance(tree[key], dict):
                file = self.folder / self.snapshots[step].file
                raise RunFormatError(
                    file, f"{key!r} is a {type(tree[key]).__name__}", "the file is damaged"
                )
        return tree

    def sketches(self, step: int) -> Sketches | None:
        """The parameters' sketches in the snapshot of ``step``, checked; ``None`` where the run
        predates them."""
        return read_sketches(self.snapshot(step), self.folder / self.snapshots[step].file)

    def checkpoint(self, step: int) -> dict[str, Any]:
        if step not in self.checkpoints:
            raise RunFormatError(
                self._where,
                f"no checkpoint at step {step}",
                f"checkpoints are at {sorted(self.checkpoints)}",
            )
        tree = self._load(self.checkpoints[step])
        if self.offset and isinstance(tree.get("step"), int):
            tree["step"] += self.offset
        return tree

    def losses(self) -> dict[int, float | None]:
        return {step: record.get("loss") for step, record in sorted(self.steps.items())}
