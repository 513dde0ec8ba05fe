"""The recorder: snapshots of a training run, taken while it trains.

Every step it logs the loss, a hash of the batch's sample indices (the data order) and a hash of
the batch's tensors. Every ``every`` steps, at step 0 and at the last step, it commits a
snapshot: a hash of every parameter, buffer and optimizer-state tensor, the full state of every
random stream, and the data position. Every ``checkpoint_every`` steps, and at the first step, it
commits a checkpoint from which training resumes exactly.

"The state at step s" is the state before the s-th call of ``step()``, counted from 0.

Design decisions:
- Nothing forces a host-device synchronisation on a step without a snapshot: losses and batch
  hashes stay on their devices and are fetched together at the next snapshot.
- A failure to write (disk full, permission denied, a file removed underneath) raises a
  :class:`RecordingError` naming the run and the cause, after which what was committed stays
  readable; with ``on_error="warn"`` it warns once, stops recording and lets training go on.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import torch

from . import env
from .errors import BisectReproError, RecordingError
from .hashing import PendingHashes, hash_tensor, hash_tensors
from .recipe import Trainee
from .state import TrainingState, model_structure
from .store import Run, RunWriter

__all__ = ["RecordOptions", "Recorder", "batch_tensors", "combine_digests", "record"]


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
    order: str | None
    batch_names: list[str]
    others: list[str]
    loss: torch.Tensor | float | None = None


class Recorder:
    """Records a training loop, yours or the one :func:`record` drives.

    Use it as a context manager and drive it with :meth:`batches` and :meth:`log`::

        with Recorder("runs/a", trainee, RecordOptions(steps=1000, every=10)) as recorder:
            for batch in recorder.batches():
                recorder.log(train_step(batch))

    ``resume_from=(run, step)`` restores a checkpoint of another run first and records from that
    step on; ``restore_streams=False`` restores everything but the random streams.
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
    ) -> None:
        self.options = options or RecordOptions()
        self.trainee = trainee
        self.state = TrainingState(trainee)
        self.step = 0
        if resume_from is not None:
            source, step = resume_from
            self.state.load_state_dict(Run.open(source).checkpoint(step), streams=restore_streams)
            self.step = step
        self.start_step = self.step
        self._pending: list[_PendingStep] = []
        self._batch_hashes = PendingHashes()
        self._last_loss: float | None = None
        self._last_snapshot: int | None = None
        self._stopped = False
        meta = {
            "target": target,
            "config": dict(config or {}),
            "options": {
                **asdict(self.options),
                "start_step": self.start_step,
                "resumed_from": [str(resume_from[0]), resume_from[1]] if resume_from else None,
            },
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "environment": env.fingerprint(),
            "model": model_structure(trainee.model),
            "loader": _describe_loader(trainee.loader),
            "streams": self.state.streams.names(),
        }
        self.writer = RunWriter(out, meta, force=self.options.force)

    # -- the loop ------------------------------------------------------------------------
    def batches(self, steps: int | None = None) -> Iterator[Any]:
        """Yield one batch per step up to ``steps`` (total, counted from 0), snapshotting as due."""
        total = steps if steps is not None else self.options.steps
        while total is None or self.step < total:
            if self._due(self.step):
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
        """Commit the final snapshot and mark the run complete when all planned steps ran."""
        if self._stopped:
            return
        try:
            if self._last_snapshot != self.step:
                self._snapshot(self.step)
            total = self.options.steps
            if total is None or self.step >= total:
                self._guard(lambda: self.writer.finish(self.step))
        finally:
            self._stopped = True
            self.state.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:  # keep what was committed; the run stays incomplete
            self._stopped = True
            self.state.close()

    # -- internals -----------------------------------------------------------------------
    def _due(self, step: int) -> bool:
        return step == self.start_step or step % self.options.every == 0

    def _note_batch(self, batch: Any, indices: list[int] | None) -> None:
        order = hash_tensor(torch.tensor(indices, dtype=torch.int64)) if indices is not None else None
        tensors, others = batch_tensors(batch)
        names = [f"{self.step}:{path}" for path in tensors]
        self._batch_hashes.add(dict(zip(names, tensors.values(), strict=True)))
        self._pending.append(_PendingStep(self.step, order, names, others))

    def _flush_steps(self) -> list[dict[str, Any]]:
        digests = self._batch_hashes.fetch() if len(self._batch_hashes) else {}
        tensor_losses = [p.loss for p in self._pending if isinstance(p.loss, torch.Tensor)]
        fetched = iter(torch.stack([t.float().reshape(()) for t in tensor_losses]).cpu().tolist()) if tensor_losses else iter(())
        records = []
        for pending in self._pending:
            loss = next(fetched) if isinstance(pending.loss, torch.Tensor) else pending.loss
            batch_parts = [digests[name] for name in pending.batch_names] + pending.others
            records.append({"step": pending.step, "loss": loss, "order": pending.order, "batch": combine_digests(batch_parts)})
            if loss is not None:
                self._last_loss = float(loss)
        self._pending.clear()
        self._batch_hashes = PendingHashes()
        return records

    def _snapshot(self, step: int) -> None:
        records = self._flush_steps()
        if self._stopped:
            return
        state = self.state
        tree = {
            "step": step,
            "hashes": hash_tensors(state.tensors()),
            "streams": state.streams.state_dict(),
            "data": state.data.state_dict(),
        }
        checkpoint_every = self.options.checkpoint_every
        checkpoint = step == self.start_step or (checkpoint_every is not None and step % checkpoint_every == 0)

        def write() -> None:
            self.writer.append_steps(records)
            self.writer.commit("snapshot", step, tree)
            if checkpoint:
                self.writer.commit("checkpoint", step, state.state_dict())

        self._guard(write)
        self._last_snapshot = step

    def _guard(self, action: Callable[[], None]) -> None:
        if self._stopped:
            return
        try:
            action()
        except OSError as error:
            message = f"{self.writer.path}: recording failed ({error.strerror or error}); what was committed before is intact"
            if self.options.on_error == "raise":
                self._stopped = True
                raise RecordingError(message + "; free space or fix permissions, then resume") from error
            warnings.warn(message + "; recording stopped, training goes on", stacklevel=3)
            self._stopped = True


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
) -> Path:
    """Run ``trainee.step`` for ``options.steps`` steps under a :class:`Recorder`."""
    if trainee.step is None:
        raise BisectReproError(f"{target or 'trainee'}: the Trainee has no step function; give step=... to record it")
    if options.steps is None:
        raise BisectReproError("record: give the number of steps (--steps)")
    with Recorder(out, trainee, options, target=target, config=config, resume_from=resume_from) as recorder:
        for batch in recorder.batches():
            recorder.log(trainee.step(batch))
            if on_step is not None:
                on_step(recorder.step + 1, recorder.last_loss)
    return Path(out)
