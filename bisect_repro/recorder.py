"""The recorder: snapshots of a training run, taken while it trains.

Every step it logs the loss, a hash of the batch's sample indices (the data order) and a hash of
the batch's tensors. Every ``every`` steps, at step 0 and at the last step, it commits a
snapshot: a hash of every parameter, buffer and optimizer-state tensor, the full state of every
random stream, and the data position. Every ``checkpoint_every`` steps, and at the first step, it
commits a checkpoint from which training resumes exactly.

"The state at step s" is the state before the s-th call of ``step()``, counted from 0.

Design decisions:
- Nothing forces a host-device synchronisation on a step without a snapshot: losses stay on their
  devices, batches wait (up to 64 MiB; more are hashed at once, on their device) and are hashed
  together at the next snapshot, and every hash of a snapshot is fetched in one transfer per
  device. A step that changes its batch in place before the snapshot changes its recorded hash,
  the same way in every run.
- Writing is done by one background thread (:class:`_BackgroundWriter`). At a snapshot the
  training thread fetches the hashes, takes host copies of what must be written
  (:func:`codec.prepare`) and hands them over; encoding, compression, the writes and the fsyncs
  happen while training goes on. The queue is bounded (``max_pending_writes`` snapshots, 2 by
  default), so a disk slower than the training makes the training wait rather than memory grow:
  at most ``max_pending_writes + 1`` snapshots with their checkpoints are held in host memory.
  One thread, first in first out, keeps the on-disk order of the synchronous writer: per
  snapshot, its step lines, the snapshot file, its index line, then the checkpoint file and its
  index line, snapshots in step order. ``max_pending_writes=0`` writes on the training thread.
- A failure to write (disk full, permission denied, a file removed underneath) is re-raised on
  the training thread at the next snapshot or at :meth:`Recorder.close` as a one-line
  :class:`RecordingError` naming the run and the cause, after which what was committed stays
  readable and nothing more is written (a later write could land after a missing one); with
  ``on_error="warn"`` it warns once, stops recording and lets training go on. Any other exception
  from the writer is a bug and is re-raised as it is.
- ``resume=True`` continues an interrupted run in its own directory from its last readable
  checkpoint (:meth:`RunWriter.resume`), with the schedule of the original run (its start step,
  ``every`` and ``checkpoint_every``), so that the resumed run equals an uninterrupted one.

Where the guarantees stop: training goes on while the last snapshots are written, so a crash
loses up to ``max_pending_writes + 1`` snapshots that a synchronous writer would have committed;
they are never torn, only absent, and ``close()`` (or leaving the ``with`` block) waits for them.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import queue
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import torch

from . import codec, env
from .errors import BisectReproError, RecordingError
from .hashing import PendingHashes
from .recipe import Trainee
from .state import TrainingState, model_structure
from .store import Run, RunWriter

__all__ = ["RecordOptions", "Recorder", "RecordingWarning", "batch_tensors", "combine_digests", "record"]


@dataclass(kw_only=True)
class RecordOptions:
    """How often a run is snapshotted and checkpointed."""

    steps: int | None = None
    """Total number of steps of the run (``None``: as many as the loop drives)."""
    every: int = 10
    """Snapshot every this many steps (and always at the first and the last step)."""
    checkpoint_every: int | None = 100
    """Full checkpoint every this many steps, and at the first step; ``None``: at the first step only."""
    force: bool = False
    """Overwrite an existing run directory."""
    on_error: Literal["raise", "warn"] = "raise"
    """On a write failure, stop training (``raise``) or warn once and stop recording (``warn``)."""

    def __post_init__(self) -> None:
        if self.steps is not None and self.steps < 0:
            raise BisectReproError(f"--steps {self.steps}: must be 0 or more")
        if self.every < 1:
            raise BisectReproError(f"--every {self.every}: must be at least 1")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise BisectReproError(f"--checkpoint-every {self.checkpoint_every}: must be at least 1")
        if self.on_error not in ("raise", "warn"):
            raise BisectReproError(f"--on-error {self.on_error}: must be 'raise' or 'warn'")


def batch_tensors(batch: Any, prefix: str = "batch") -> tuple[dict[str, torch.Tensor], list[str]]:
    """The tensors in a batch by path (``batch[0]``, ``batch.image``), and its other leaves as text."""
    tensors: dict[str, torch.Tensor] = {}
    others: list[str] = []

    def visit(value: Any, path: str) -> None:
        if isinstance(value, torch.Tensor):
            tensors[path] = value
        elif isinstance(value, Mapping):
            for key, item in value.items():
                visit(item, f"{path}.{key}")
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                visit(item, f"{path}[{index}]")
        else:
            others.append(f"{path}={value!r}")

    visit(batch, prefix)
    return tensors, others


def combine_digests(parts: Mapping[str, str] | list[str]) -> str:
    """One digest for several named digests (a whole batch)."""
    text = json.dumps(parts if isinstance(parts, list) else sorted(parts.items()))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@dataclass
class _PendingStep:
    step: int
    order_name: str | None
    batch_names: list[str]
    others: list[str]
    loss: torch.Tensor | float | None = None


_SCHEDULE = ("steps", "every", "checkpoint_every")
_DEFERRED_BATCH_BYTES = 64 << 20  # batch bytes held for hashing at the next snapshot, at most


class _BackgroundWriter:
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


class Recorder:
    """Records a training loop, yours or the one :func:`record` drives.

    Use it as a context manager and drive it with :meth:`batches` and :meth:`log`::

        with Recorder("runs/a", trainee, RecordOptions(steps=1000, every=10)) as recorder:
            for batch in recorder.batches():
                recorder.log(train_step(batch))

    ``resume_from=(run, step)`` restores a checkpoint of another run first and records from that
    step on into a new directory; ``restore_streams=False`` restores everything but the random
    streams. ``resume=True`` continues the interrupted run ``out`` itself from its last
    checkpoint; ``options`` may then be left out (the run's own are used) and must otherwise
    schedule the same steps. ``max_pending_writes`` bounds the snapshots waiting to be written.
    """

    def __init__(
        self,
        out: Path | str,
        trainee: Trainee,
        options: RecordOptions | None = None,
        *,
        target: str | None = None,
        config: Mapping[str, Any] | None = None,
        resume_from: tuple[Path | str, int] | None = None,
        restore_streams: bool = True,
        resume: bool = False,
        max_pending_writes: int = 2,
    ) -> None:
        if resume and resume_from is not None:
            raise BisectReproError(f"{out}: give resume=True (continue this run) or resume_from (start a new run), not both")
        if max_pending_writes < 0:
            raise BisectReproError(f"max_pending_writes {max_pending_writes}: must be 0 or more")
        self.trainee = trainee
        self.state = TrainingState(trainee)
        self.step = 0
        self._pending: list[_PendingStep] = []
        self._batch_hashes = PendingHashes()
        self._deferred: dict[str, torch.Tensor] = {}
        self._deferred_bytes = 0
        self._last_loss: float | None = None
        self._last_snapshot: int | None = None
        self._committed: int | None = None
        self._stopped = False
        self._closed = False
        self._reported = False
        try:
            if resume:
                self.options = self._resume(Path(out), options, target, config)
            else:
                self.options = options or RecordOptions()
                if resume_from is not None:
                    source, step = resume_from
                    self.state.load_state_dict(Run.open(source).checkpoint(step), streams=restore_streams)
                    self.step = step
                self.start_step = self.step
                meta = {
                    "target": target,
                    "config": dict(config or {}),
                    "options": {
                        **asdict(self.options),
                        "start_step": self.start_step,
                        "resumed_from": [str(resume_from[0]), resume_from[1]] if resume_from else None,
                    },
                    "created": _now(),
                    "environment": env.fingerprint(),
                    "model": model_structure(trainee.model),
                    "loader": _describe_loader(trainee.loader),
                    "streams": self.state.streams.names(),
                }
                self.writer = RunWriter(out, meta, force=self.options.force)
        except BaseException:
            self.state.close()
            raise
        self._writer = _BackgroundWriter(f"bisect-repro writer for {self.writer.path}", max_pending_writes)

    def _resume(self, out: Path, options: RecordOptions | None, target: str | None, config: Mapping[str, Any] | None) -> RecordOptions:
        """Reopen ``out`` at its last checkpoint, restore it, and check that the caller records the same run."""
        self.writer, resumed = RunWriter.resume(out)
        try:
            meta = resumed.meta
            recorded = meta.get("options", {})
            if options is None:
                options = RecordOptions(**{k: recorded[k] for k in (*_SCHEDULE, "on_error") if k in recorded})
            for key in _SCHEDULE:
                if key in recorded and recorded[key] != getattr(options, key):
                    flag = "--" + key.replace("_", "-")
                    raise BisectReproError(
                        f"{out}: was recorded with {flag} {recorded[key]}, not {getattr(options, key)}; resume with the same options"
                    )
            if config is not None and dict(config) != meta.get("config", {}):
                raise BisectReproError(
                    f"{out}: was recorded with --set {meta.get('config')}, not {dict(config)}; resume with the same settings"
                )
            if target is not None and meta.get("target") not in (None, target):
                warnings.warn(f"{out}: was recorded from {meta.get('target')}, resumed from {target}", stacklevel=4)
            self.state.load_state_dict(resumed.checkpoint)
            self.step = resumed.step
            self.start_step = int(recorded.get("start_step", 0))
            self._last_snapshot = self._committed = resumed.step  # committed already: not written again
            resumes = [*meta.get("resumes", []), {"step": resumed.step, "created": _now()}]
            changed = env.diff(meta.get("environment", {}), env.fingerprint())
            if changed:
                resumes[-1]["environment"] = changed
            self.writer.update_meta({"resumes": resumes})
        except OSError as error:
            self.writer.close()
            raise RecordingError(f"{out}: cannot resume ({error.strerror or error}); check its permissions and free space") from error
        except BaseException:
            self.writer.close()
            raise
        return options

    # -- the loop ------------------------------------------------------------------------
    def batches(self, steps: int | None = None) -> Iterator[Any]:
        """Yield one batch per step up to ``steps`` (total, counted from 0), snapshotting as due."""
        total = steps if steps is not None else self.options.steps
        while total is None or self.step < total:
            if self._due(self.step) and self._last_snapshot != self.step:
                self._snapshot(self.step)
            batch, indices = self.state.data.next_batch()
            self._note_batch(batch, indices)
            yield batch
            self.step += 1
        self.close()

    def log(self, loss: torch.Tensor | float | None) -> None:
        """The loss of the current step; a tensor stays on its device until the next snapshot."""
        if self._pending and self._pending[-1].step == self.step:
            self._pending[-1].loss = loss.detach() if isinstance(loss, torch.Tensor) else loss

    @property
    def last_loss(self) -> float | None:
        """The last loss fetched to the host (at the last snapshot)."""
        return self._last_loss

    def close(self) -> None:
        """Commit the final snapshot, mark the run complete when all planned steps ran, wait for the writes.

        Raises the :class:`RecordingError` of a failed write (``on_error="raise"``).
        """
        if self._closed:
            return
        self._closed = True
        try:
            if self._last_snapshot != self.step:
                self._snapshot(self.step)
            total = self.options.steps
            if not self._stopped and (total is None or self.step >= total):
                final = self.step
                self._writer.submit(final, lambda: self.writer.finish(final))
        finally:
            self._shut_down()
        self._check_writer()

    def _shut_down(self) -> None:
        """Wait for what was handed to the writer, release the run's lock, give the loader back."""
        try:
            self._writer.drain()
        finally:
            self.writer.close()
            self.state.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
        elif not self._closed:  # keep what was committed and what is queued; the run stays incomplete
            self._closed = self._stopped = True
            self._shut_down()

    # -- internals -----------------------------------------------------------------------
    def _due(self, step: int) -> bool:
        return step == self.start_step or step % self.options.every == 0

    def _note_batch(self, batch: Any, indices: list[int] | None) -> None:
        if self._stopped:
            return
        tensors, others = batch_tensors(batch)
        named = {f"{self.step}:{path}": tensor for path, tensor in tensors.items()}
        order_name = None
        if indices is not None:
            order_name = f"{self.step}:order"
            named[order_name] = torch.tensor(indices, dtype=torch.int64)
        # Small batches wait for the next snapshot and are hashed together, in one packed
        # reduction: per-step hashing of a few small tensors costs more in launches than in bytes.
        self._deferred.update(named)
        self._deferred_bytes += sum(t.numel() * t.element_size() for t in named.values())
        if self._deferred_bytes > _DEFERRED_BATCH_BYTES:
            self._hash_deferred()
        self._pending.append(_PendingStep(self.step, order_name, [n for n in named if n != order_name], others))

    def _hash_deferred(self) -> None:
        if self._deferred:
            self._batch_hashes.add(self._deferred)
        self._deferred, self._deferred_bytes = {}, 0

    def _flush_steps(self, state: Mapping[str, torch.Tensor]) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """The step records since the last snapshot, and the hashes of the ``state`` tensors.

        Batch and state hashes travel to the host together, in one transfer per device.
        """
        self._hash_deferred()
        self._batch_hashes.add({f"state:{name}": tensor for name, tensor in state.items()})  # batch names are "<step>:..."
        digests = self._batch_hashes.fetch()
        state_hashes = {name: digests[f"state:{name}"] for name in state}
        tensor_losses = [p.loss for p in self._pending if isinstance(p.loss, torch.Tensor)]
        fetched = iter(torch.stack([t.float().reshape(()) for t in tensor_losses]).cpu().tolist()) if tensor_losses else iter(())
        records = []
        for pending in self._pending:
            loss = next(fetched) if isinstance(pending.loss, torch.Tensor) else pending.loss
            batch_parts = [digests[name] for name in pending.batch_names] + pending.others
            order = digests[pending.order_name] if pending.order_name else None
            records.append({"step": pending.step, "loss": loss, "order": order, "batch": combine_digests(batch_parts)})
            if loss is not None:
                self._last_loss = float(loss)
        self._pending.clear()
        self._batch_hashes = PendingHashes()
        return records, state_hashes

    def _snapshot(self, step: int) -> None:
        self._check_writer()
        if self._stopped:
            return
        state = self.state
        records, hashes = self._flush_steps(state.tensors())
        snapshot = codec.prepare(
            {
                "step": step,
                "hashes": hashes,
                "streams": state.streams.state_dict(),
                "data": state.data.state_dict(),
            }
        )
        checkpoint_every = self.options.checkpoint_every
        due = step == self.start_step or (checkpoint_every is not None and step % checkpoint_every == 0)
        checkpoint = codec.prepare(state.state_dict()) if due else None
        writer = self.writer

        def write() -> None:
            writer.append_steps(records)
            writer.commit_prepared("snapshot", step, snapshot)
            if checkpoint is not None:
                writer.commit_prepared("checkpoint", step, checkpoint)
            self._committed = step

        self._writer.submit(step, write)
        self._last_snapshot = step
        self._check_writer()

    def _check_writer(self) -> None:
        """Raise (or warn about, once) the writer's failure on the training thread."""
        error = self._writer.error
        if error is None or self._reported:
            return
        self._reported = self._stopped = True
        if not isinstance(error, (OSError, MemoryError)):
            raise error  # not a fault of the disk: a bug, shown as it is
        cause = (error.strerror or str(error)) if isinstance(error, OSError) else "out of memory"
        if isinstance(error, OSError) and error.filename:
            cause += f": {error.filename}"
        kept = f"what was committed, up to step {self._committed}, is intact" if self._committed is not None else "nothing was committed"
        message = f"{self.writer.path}: recording failed writing step {self._writer.failed_at} ({cause}); {kept}"
        if self.options.on_error == "raise":
            raise RecordingError(f"{message}; free space or fix permissions, then record again with --resume") from error
        warnings.warn(f"{message}; recording stopped, training goes on", RecordingWarning, stacklevel=4)


class RecordingWarning(UserWarning):
    """Recording stopped after a failed write (``on_error="warn"``); training went on."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _describe_loader(loader: Any) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    if not isinstance(loader, DataLoader):
        return {"type": type(loader).__name__}
    sampler = loader.batch_sampler.sampler if loader.batch_sampler is not None else loader.sampler
    return {
        "type": "DataLoader",
        "batch_size": loader.batch_size,
        "num_workers": loader.num_workers,
        "sampler": type(getattr(sampler, "inner", sampler)).__name__,
        "generator": loader.generator is not None,
        "worker_init_fn": loader.worker_init_fn is not None,
        "persistent_workers": loader.persistent_workers,
        "drop_last": loader.drop_last,
    }


def record(
    trainee: Trainee,
    out: Path | str,
    options: RecordOptions,
    *,
    target: str | None = None,
    config: Mapping[str, Any] | None = None,
    on_step: Callable[[int, float | None], None] | None = None,
    resume_from: tuple[Path | str, int] | None = None,
    resume: bool = False,
) -> Path:
    """Run ``trainee.step`` for ``options.steps`` steps under a :class:`Recorder` (``resume``: see there)."""
    if trainee.step is None:
        raise BisectReproError(f"{target or 'trainee'}: the Trainee has no step function; give step=... to record it")
    if options.steps is None:
        raise BisectReproError("record: give the number of steps (--steps)")
    with Recorder(out, trainee, options, target=target, config=config, resume_from=resume_from, resume=resume) as recorder:
        for batch in recorder.batches():
            recorder.log(trainee.step(batch))
            if on_step is not None:
                on_step(recorder.step + 1, recorder.last_loss)
    return Path(out)
