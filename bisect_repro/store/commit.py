"""Group commit: several snapshots' step lines, files and index lines committed with shared fsyncs.

A :class:`Commit` is what one snapshot commits: the step lines since the last snapshot, then its
files (the snapshot, then its checkpoint when one is due), or the run's end line.
:func:`commit_group` commits several, in step order, in four phases:

1. each commit's step lines are appended to ``steps.jsonl`` (not yet fsynced), and each of its
   files is written under its temporary name (``.NAME.tmp``) as it is encoded, and fsynced: a
   file is never renamed into place before its bytes are durable;
2. every file is renamed into place, in order;
3. ``steps.jsonl`` is fsynced once, and each folder that got a file (``snapshots/``,
   ``checkpoints/``) once, so that the step lines and the new names are durable;
4. only then are the group's index lines (and the end line) appended, in one write, and
   ``index.jsonl`` fsynced once.

So the rule of :mod:`bisect_repro.store.writer` holds for every file of the group: its index line
is written after the file and the step lines it covers are durable. A group of n snapshots costs
n file fsyncs plus one per log and per folder, where committing them one by one costs four per
snapshot. A group of one is the commit one at a time.

A failure stops the group at the file (or step lines) it hit: the files before it are committed as
above (a snapshot before its own checkpoint, as one at a time), the failed file's temporary is
removed, nothing after it is written, and :class:`GroupCommitError` names the failed step and the
last committed one. A failure in phase 3 or 4 commits nothing of the group.

Where the guarantees stop: a crash in the middle of a group may leave files renamed into place
with no index line (never read as part of the run; a resume moves them to ``superseded/``) and
step lines past the last index line (which a resume drops), as a crash between a file and its
index line always could; an index append cut short leaves a torn last line, which a reader skips.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from . import codec
from .anchor import Folder
from .durable import append_lines, lines, write_temporary
from .run import FileEntry, file_name

__all__ = ["Commit", "GroupCommitError", "commit_group"]


@dataclass
class Commit:
    """What one snapshot commits: the step lines since the last one, then its files (``(kind,
    prepared tree)``, the snapshot before the checkpoint), or the run's end (``end``, no files)."""

    step: int
    steps: list[dict[str, Any]] = field(default_factory=list)
    files: list[tuple[str, codec.Prepared]] = field(default_factory=list)
    end: bool = False


class GroupCommitError(Exception):
    """A group commit stopped at ``step``: what came before it is committed (up to ``committed``,
    ``None`` for nothing of the group), nothing after it is written; ``__cause__`` is why."""

    def __init__(self, step: int, committed: int | None) -> None:
        super().__init__(f"the commit of step {step} failed")
        self.step, self.committed = step, committed


@dataclass
class _Staged:
    """A file written under its temporary name and fsynced (or the end line, with no file), and its
    index line."""

    step: int
    line: dict[str, Any]
    folder: Folder | None = None
    temporary: str | None = None
    final: str | None = None


def commit_group(
    rank: Folder, commits: Sequence[Commit], sign: Callable[[dict[str, Any]], dict[str, Any]] = dict
) -> None:
    """Commit ``commits`` (in step order) into the rank folder ``rank``; see the module docstring.
    ``sign`` turns each index line into the line written (this user's MAC added)."""
    staged: list[_Staged] = []
    failed: tuple[int, BaseException] | None = None
    folders: dict[str, Folder] = {}
    try:
        with rank.appending("steps.jsonl") as log:
            for commit in commits:  # 1. step lines, and files under their temporary names
                try:
                    log.write(lines(commit.steps))
                    for kind, prepared in commit.files:
                        staged.append(_stage(rank, folders, kind, commit.step, prepared))
                except BaseException as error:
                    failed = (commit.step, error)
                    break
                if commit.end:
                    staged.append(_Staged(commit.step, {"kind": "end", "step": commit.step}))
            try:
                # a failed commit's step lines too, as a commit one at a time writes them
                log.flush()
            except BaseException:
                _discard_all(staged)
                raise
            for number, item in enumerate(staged):  # 2. files into place, in order
                if item.folder is None or item.temporary is None or item.final is None:
                    continue
                try:
                    item.folder.replace(item.temporary, item.final)
                except BaseException as error:
                    _discard_all(staged[number:])
                    failed, staged = (item.step, error), staged[:number]
                    break
            if staged:
                _make_durable(rank, log, staged, sign)
    finally:
        for folder in folders.values():
            folder.close()
    if failed is not None:
        failed_step, cause = failed
        raise GroupCommitError(failed_step, staged[-1].step if staged else None) from cause


def _make_durable(
    rank: Folder,
    log: IO[bytes],
    staged: list[_Staged],
    sign: Callable[[dict[str, Any]], dict[str, Any]],
) -> None:
    """3. The step lines and the new names durable, 4. before the index lines that commit them."""
    try:
        os.fsync(log.fileno())
        for folder in dict.fromkeys(item.folder for item in staged if item.folder is not None):
            folder.fsync()
        append_lines(rank, "index.jsonl", [sign(item.line) for item in staged])
    except BaseException as error:
        raise GroupCommitError(staged[0].step, None) from error


def _stage(
    rank: Folder, folders: dict[str, Folder], kind: str, step: int, prepared: codec.Prepared
) -> _Staged:
    encoding = codec.encoding_of(prepared)
    name = file_name(kind, step)
    where, _, base = name.rpartition("/")
    if where not in folders:
        folders[where] = rank.sub(where)
    temporary = write_temporary(folders[where], base, encoding)
    entry = FileEntry(kind, step, name, encoding.size, encoding.raw_size, encoding.checksum)
    return _Staged(step, entry.line(), folders[where], temporary, base)


def _discard_all(staged: list[_Staged]) -> None:
    for item in staged:
        if item.folder is not None and item.temporary is not None:
            item.folder.discard(item.temporary)
