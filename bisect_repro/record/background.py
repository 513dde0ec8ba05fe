"""One background thread that runs write jobs in order, with a bounded queue; the first failure stops it.

The recorder hands it each snapshot's writes (see :mod:`bisect_repro.record.recorder` for the
guarantees this gives): first in first out keeps the on-disk order of a synchronous writer, the
bound keeps memory flat when the disk is slower than the training, and after a failed job every
later one is dropped, so nothing lands after a gap.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

__all__ = ["BackgroundWriter"]


class BackgroundWriter:
    """Runs write jobs in order on one thread, with at most ``depth`` waiting; the first failure stops it."""

    def __init__(self, name: str, depth: int) -> None:
        self.error: BaseException | None = None
        self.failed_at: int | None = None
        self._queue: queue.Queue[tuple[int, Callable[[], None]] | None] | None = None
        self._thread: threading.Thread | None = None
        if depth > 0:
            self._queue = queue.Queue(maxsize=depth)
            # A daemon: an interpreter that exits without close() must not hang on an idle writer.
            self._thread = threading.Thread(target=self._work, name=name, daemon=True)
            self._thread.start()

    def submit(self, step: int, job: Callable[[], None]) -> None:
        if self.error is not None:
            return
        if self._queue is None:
            self._run(step, job)
        else:
            self._queue.put((step, job))  # blocks while the queue is full: the memory bound

    def _run(self, step: int, job: Callable[[], None]) -> None:
        if self.error is not None:
            return  # everything after a failed write is dropped: nothing may land after a gap
        try:
            job()
        except BaseException as error:
            self.error, self.failed_at = error, step

    def _work(self) -> None:
        assert self._queue is not None
        while (item := self._queue.get()) is not None:
            self._run(*item)

    def drain(self) -> None:
        """Write everything submitted, then stop the thread."""
        if self._thread is not None and self._queue is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
