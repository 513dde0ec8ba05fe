"""One background thread that commits snapshots in order, several at a time, with a bounded number
pending; the first failure stops it.

The recorder hands it each snapshot as a job that makes its
:class:`~bisect_repro.store.commit.Commit` (see :mod:`bisect_repro.record.session` for the
guarantees this gives). Design decisions:

- One thread, first in first out: the on-disk order of a synchronous writer.
- The bound: at most ``depth + 1`` snapshots are accepted and not yet committed (one slot each,
  taken by :meth:`BackgroundWriter.submit`, which blocks while none is free, and given back once the
  snapshot is committed), so memory stays flat when the disk is slower than the training.
- Group commit: the thread takes the first waiting snapshot, then the others waiting, and waits
  (a blocking wait on the queue, never a spin) up to ``linger`` seconds for more, until it holds
  ``max(depth, 1)``: the last slot stays free, so the training does not wait while a group is
  written. It makes each snapshot's commit (its job: the digests, taking the tree apart, a
  recording's check against its reference) as it takes the snapshot, before it waits for more,
  and commits the group with shared fsyncs (:func:`~bisect_repro.store.commit.commit_group`). On a
  fast
  training loop snapshots arrive faster than ``linger`` and the fsyncs are shared; on a slow one a
  group holds one snapshot, whose fsyncs cost little beside its step.
- After a failure every later snapshot is dropped, so nothing lands after a gap; what came before
  the failed one in its group is committed (``committed``), and ``failed_at`` names its step.
- ``depth=0``: every job runs and commits on the calling thread, alone.

Where the guarantees stop: a snapshot may wait up to ``linger`` seconds for others before it is
written, within the bound (a crash loses at most the ``depth + 1`` snapshots not yet committed).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from ..store.commit import Commit, GroupCommitError

__all__ = ["BackgroundWriter"]

LINGER = 1.0  # seconds a group waits for more snapshots
_DROPPED = RuntimeError("dropped after an earlier failure")

_Job = tuple[int, Callable[[], Commit]]
_Made = tuple[int, Commit | BaseException]  # a job's commit, or why it could not be made


class BackgroundWriter:
    """Commits snapshots in order on one thread, in groups, with at most ``depth + 1`` pending; the
    first failure stops it."""

    def __init__(
        self,
        name: str,
        depth: int,
        commit: Callable[[list[Commit]], None],
        *,
        linger: float = LINGER,
    ) -> None:
        self.error: BaseException | None = None
        self.failed_at: int | None = None
        self.committed: int | None = None
        self._commit = commit
        self._linger = linger
        self._group = max(depth, 1)
        self._slots = threading.Semaphore(depth + 1)
        self._queue: queue.Queue[_Job | None] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        if depth > 0:
            self._queue = queue.Queue()
            # A daemon: an interpreter that exits without close() must not hang on an idle writer.
            self._thread = threading.Thread(target=self._work, name=name, daemon=True)
            self._thread.start()

    def submit(self, step: int, job: Callable[[], Commit]) -> None:
        """Hand over a snapshot: ``job`` makes its commit, on the writer's thread."""
        if self.error is not None:
            return
        if self._queue is None:
            self._run([self._make(step, job)])
        else:
            self._slots.acquire()  # blocks while every slot is taken: the memory bound
            self._queue.put((step, job))

    def _make(self, step: int, job: Callable[[], Commit]) -> _Made:
        """The job's commit, made now; after a failure, nothing (it is dropped)."""
        if self.error is not None:
            return step, _DROPPED
        try:
            return step, job()
        except BaseException as error:
            return step, error

    def _run(self, group: list[_Made]) -> None:
        if self.error is not None:
            return  # everything after a failed write is dropped: nothing may land after a gap
        commits: list[Commit] = []
        failed: tuple[int, BaseException] | None = None
        for step, made in group:
            if isinstance(made, BaseException):
                failed = (step, made)  # the snapshots before it are still committed
                break
            commits.append(made)
        try:
            if commits:
                self._commit(commits)
                self.committed = commits[-1].step
        except GroupCommitError as error:
            self.committed = error.committed if error.committed is not None else self.committed
            failed = (error.step, error.__cause__ or error)
        except BaseException as error:
            failed = (commits[0].step, error)
        if failed is not None:
            self.failed_at, self.error = failed

    def _take(self) -> list[_Made]:
        """The next group: the first snapshot waiting (waiting for one), then more, for up to
        ``linger`` seconds, each one's commit made as it is taken."""
        assert self._queue is not None
        group: list[_Made] = []
        deadline: float | None = None
        while not self._stopping and len(group) < self._group:
            try:
                if deadline is None:
                    item = self._queue.get()
                    deadline = time.monotonic() + self._linger
                else:
                    item = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                break
            if item is None:
                self._stopping = True
            else:
                group.append(self._make(*item))
        return group

    def _work(self) -> None:
        while not self._stopping:
            group = self._take()
            try:
                self._run(group)
            finally:
                for _ in group:
                    self._slots.release()

    def drain(self) -> None:
        """Write everything submitted, then stop the thread."""
        if self._thread is not None and self._queue is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
