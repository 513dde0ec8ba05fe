"""A model of what a crash keeps, for checking the writer's order of operations without crashing.

:class:`DiskModel` replaces ``os.fsync`` and ``os.replace`` with versions that call the real ones
and record what each makes durable, as POSIX promises it and no more: a file's bytes when the
file is fsynced (by inode), a folder's names when the folder is fsynced. Nothing else survives a
power cut in this model, the harshest one a file system may give. It also records every write of
index lines (the commits), and at each of these moments it can rebuild the run directory as a
crash would leave it (:meth:`DiskModel.crashed`): only what was durable, or everything written
so far (a process killed at that moment, the page cache intact).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bisect_repro.store import codec


class DiskModel:
    def __init__(self, monkeypatch: Any, root: Path) -> None:
        self.root = root
        self.data: dict[int, bytes] = {}  # inode -> bytes made durable by fsync
        # folder -> its names made durable by fsync of the folder
        self.names: dict[Path, dict[str, int]] = {}
        self.events: list[tuple[str, str]] = []
        self.on_event: Callable[[], None] | None = None
        fsync, replace = os.fsync, os.replace

        def recording_fsync(fd: int) -> None:
            fsync(fd)
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
            if path.is_dir():
                self.names[path] = {child.name: child.lstat().st_ino for child in path.iterdir()}
            else:
                self.data[os.fstat(fd).st_ino] = path.read_bytes()
            self._event("fsync", path)

        def recording_replace(source: Any, target: Any, **folders: Any) -> None:
            replace(source, target, **folders)
            into = folders.get("dst_dir_fd")
            self._event(
                "rename",
                Path(os.readlink(f"/proc/self/fd/{into}")) / target
                if into is not None
                else Path(target),
            )

        monkeypatch.setattr(os, "fsync", recording_fsync)
        monkeypatch.setattr(os, "replace", recording_replace)

    def _event(self, kind: str, path: Path) -> None:
        self.events.append(
            (
                kind,
                str(path.relative_to(self.root)) if path.is_relative_to(self.root) else str(path),
            )
        )
        if self.on_event is not None:
            self.on_event()

    def durable_bytes(self, path: Path) -> bytes | None:
        """What a power cut would leave at ``path``: ``None`` if its name is not durable."""
        inode = self.names.get(path.parent, {}).get(path.name)
        if inode is None or not path.exists() or path.lstat().st_ino != inode:
            return None
        return self.data.get(inode, b"")

    def crashed(self, into: Path, *, durable: bool) -> Path:
        """The run directory as a crash now would leave it, copied into ``into``: with ``durable``
        only what was made durable (a power cut), else everything written (a killed process)."""
        if into.exists():
            shutil.rmtree(into)
        if not durable:
            shutil.copytree(self.root, into, ignore=shutil.ignore_patterns(".lock"))
            return into

        def copy(folder: Path, target: Path) -> None:
            target.mkdir()
            for name in self.names.get(folder, {}):
                source = folder / name
                if name == ".lock" or not source.exists():
                    continue
                if source.is_dir():
                    copy(source, target / name)
                else:
                    found = self.durable_bytes(source)
                    if found is not None:
                        (target / name).write_bytes(found)

        copy(self.root, into)
        return into


def committed_files_are_durable(
    model: DiskModel, rank: Path, lines: list[dict[str, Any]], start: int = 0
) -> None:
    """Each index line about to be written names a file whose name and bytes are durable, and
    the step lines from ``start`` to its step are durable too (the rule of
    ``bisect_repro.store.writer``)."""
    steps = model.durable_bytes(rank / "steps.jsonl") or b""
    logged = {json.loads(line)["step"] for line in steps.splitlines() if line.strip()}
    for line in lines:
        if line.get("kind") != "end":
            durable = model.durable_bytes(rank / line["file"])
            assert durable is not None, f"index line for {line['file']} before its name is durable"
            assert codec.checksum(durable) == line["checksum"], (
                f"index line for {line['file']} before its bytes are durable"
            )
        covered = set(range(start, line["step"]))
        assert covered <= logged, (
            f"index line for step {line['step']} before step lines {sorted(covered - logged)} are "
            "durable"
        )


def check_every_commit(
    monkeypatch: Any, model: DiskModel, start: int = 0
) -> list[list[dict[str, Any]]]:
    """Check :func:`committed_files_are_durable` at every write of index lines by the group commit;
    returns the groups of index lines written, in order."""
    from bisect_repro.store import commit

    written: list[list[dict[str, Any]]] = []
    append = commit.append_lines

    def checked(folder: Any, name: str, records: list[dict[str, Any]]) -> None:
        if name == "index.jsonl":
            committed_files_are_durable(model, folder.path, records, start)
            written.append(records)
        append(folder, name, records)

    monkeypatch.setattr(commit, "append_lines", checked)
    return written
