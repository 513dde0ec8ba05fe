"""A recording session: snapshots of a training run, taken while it trains.

This is the role a :class:`~bisect_repro.record.recorder.Recorder` takes when it records (in a
process started to replay a run it serves instead: :mod:`bisect_repro.serve.server`).

Every step it logs the loss, a hash of the batch's sample indices (the data order) and a hash of
the batch's tensors. Every ``every`` steps, at step 0 and at the last step, it commits a
snapshot: a hash of every parameter, buffer and optimizer-state tensor, a linear sketch of every
parameter (:mod:`bisect_repro.capture.sketch`, for the distance between runs that differ by
rounding) with the activation sketches of the step that started at the previous snapshot
(:mod:`bisect_repro.capture.activations`), the full state of every random stream, and the data
position. Every ``checkpoint_every`` steps, and at the first step, it commits a checkpoint from
which training resumes exactly.

"The state at step s" is the state before the s-th call of ``step()``, counted from 0.

Design decisions:
- Nothing forces a host-device synchronisation on a step without a snapshot: losses stay on their
  devices, batches wait (up to 64 MiB; more are hashed at once, on their device) and are hashed
  together at the next snapshot, and every hash of a snapshot is fetched in one transfer per
  device. A step that changes its batch in place before the snapshot changes its recorded hash,
  the same way in every run.
- One background thread writes (:class:`~bisect_repro.record.background.BackgroundWriter`). At a
  snapshot the training thread only runs the hash of the state tensors (on its device; on the CPU
  the C kernel, on torch's own threads, which sketches the plain float32 parameters in the same
  pass), fetches the hash lanes and the losses, captures the random streams and the data position
  (copies), takes host copies of a checkpoint's tensors (:func:`codec.prepare`) and queues the
  snapshot. The digests, the step records, the CPU's activation sketches, taking the snapshot's tree
  apart, encoding, compression, the writes and the fsyncs happen on the writer's thread, while
  training goes on. At most ``max_pending_writes + 1`` snapshots (3 by default) are queued and not
  yet committed, so a disk slower than the training makes the training wait rather than memory grow:
  at most that many snapshots with their checkpoints are held in host memory. The writer commits the
  snapshots it finds waiting together, sharing their fsyncs (group commit,
  :mod:`bisect_repro.store.commit`), in the order of the synchronous writer: per snapshot, its step
  lines, the snapshot file, then the checkpoint file, snapshots in step order, each file's index
  line written after the file and the step lines it covers are durable. ``max_pending_writes=0``
  writes on the training thread, one at a time.
- A failure to write (disk full, permission denied, a file removed underneath) is re-raised on
  the training thread at the next snapshot or at :meth:`Recorder.close` as a one-line
  :class:`RecordingError` naming the run and the cause, after which what was committed stays
  readable and nothing more is written (a later write could land after a missing one); with
  ``on_error="warn"`` it warns once, stops recording and lets training go on. Any other exception
  from the writer is a bug and is re-raised as it is.
- ``resume=True`` continues an interrupted run in its own directory from its last readable
  checkpoint (:meth:`RunWriter.resume`), with the schedule of the original run (its start step,
  ``every`` and ``checkpoint_every``), so that the resumed run equals an uninterrupted one.
- Recorded against a reference run (``SessionPlan.against``), each snapshot's step records and
  digests are checked against the reference's on the writer's thread, as they are committed
  (:mod:`bisect_repro.record.against`); at each due snapshot the training thread waits for the
  check of the one before, and at the first difference the run stops at its next snapshot, closed
  as complete (:attr:`RecordingSession.stopped_early`).
- In a distributed run (``torch.distributed`` initialised, under ``torchrun`` or ``record
  --nproc-per-node``) each rank records what it holds into its own ``rank{r}/``: its streams
  (its own CUDA device's), its sampler's state, its losses and batches, and the hashes of its
  local tensors (a DTensor's local shard); rank 0 also writes ``run.json`` with the world size,
  backend and layout. The ranks agree on the directory once, at the start
  (:mod:`bisect_repro.record.directory`); nothing is communicated during training.

Where the guarantees stop: training goes on while the last snapshots are written, so a crash
loses up to ``max_pending_writes + 1`` snapshots that a synchronous writer would have committed
(a snapshot may wait up to a second for another to share its commit, within that bound); they are
never torn, only absent, and ``close()`` (or leaving the ``with`` block) waits for them.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ..capture import env
from ..capture.activations import ActivationSketches
from ..capture.batch import batch_tensors
from ..capture.data import next_micro_batches
from ..capture.hashing import PendingHashes
from ..capture.parallel import RankInfo, rank_info
from ..capture.seeding import SeedingCall, SeedingWatch
from ..capture.sketch import SEED, WIDTH, PendingSketches, fusable, sketch_tensors
from ..capture.state import TrainingState
from ..errors import BisectReproError, RecordingError, RecordingWarning
from ..store import codec
from ..store.commit import Commit
from ..store.run import Run
from .against import ReferenceCheck
from .background import BackgroundWriter
from .directory import distributed_meta, open_writer, resume_writer
from .options import RecordOptions, SessionPlan
from .provenance import launch_info, now, run_meta
from .reference import open_reference
from .steplog import PendingStep, fetch_losses, step_records

__all__ = ["RecordingSession"]


_SCHEDULE = ("steps", "every", "checkpoint_every")
_DEFERRED_BATCH_BYTES = 64 << 20  # batch bytes held for hashing at the next snapshot, at most


def _check_plan(plan: SessionPlan) -> None:
    """Refuse a plan that asks for two contradictory things, or a negative queue."""
    if plan.resume and plan.resume_from is not None:
        raise BisectReproError(
            f"{plan.out}: give resume=True (continue this run) or resume_from (start a new run), "
            "not both"
        )
    if plan.max_pending_writes < 0:
        raise BisectReproError(f"max_pending_writes {plan.max_pending_writes}: must be 0 or more")


class RecordingSession:
    """Records a training loop (see the module docstring): the recording role of a Recorder."""

    replaying = False

    def __init__(self, plan: SessionPlan) -> None:
        out, trainee, options, target, config = (
            plan.out,
            plan.trainee,
            plan.options,
            plan.target,
            plan.config,
        )
        resume_from, resume = plan.resume_from, plan.resume
        _check_plan(plan)
        info = rank_info()  # this process's rank in a distributed run, None for a single process
        self.trainee = trainee
        self.state = TrainingState(trainee, plan.scope)
        self.step = 0
        self._pending: list[PendingStep] = []
        self.start_streams: dict[str, Any] | None = None
        """A script's streams before its first step drew its data (see ``PendingStep.start``)."""
        self._batch_hashes = PendingHashes()
        self._deferred: dict[str, torch.Tensor] = {}
        self._deferred_bytes = 0
        self._last_loss: float | None = None
        self._last_snapshot: int | None = None
        self._committed: int | None = None
        self._stopped = False
        self._closed = self._handed_out = False
        self._reported = False
        # hooks on the model during a snapshot's step
        self._activations: ActivationSketches | None = None
        self._taking = False  # the hooks are taking the outputs of the current step
        # that step's activation sketches, for the next snapshot
        self._sketched: tuple[int, PendingSketches] | None = None
        self.stopped_early = False
        """The run stopped at a difference from its reference (or at its end), closed as
        complete."""
        self._check: ReferenceCheck | None = None
        self._checked_last: int | None = None  # the last snapshot submitted with its check
        try:
            self._check = self._reference_check(plan, info)
            if resume:
                self.options = self._resume(Path(out), options, target, config, info)
            else:
                self.options = options or RecordOptions()
                self.step = plan.start_step
                if resume_from is not None:
                    source, step = resume_from
                    self.state.load_state_dict(
                        Run.open(source, info.rank if info else 0).checkpoint(step),
                        streams=plan.restore_streams,
                    )
                    self.step = step
                self.start_step = self.step
                meta = run_meta(plan, self.options, self.start_step, self.state.streams.names())
                rank_meta = None
                if info is not None:
                    meta["distributed"], rank_meta = distributed_meta(
                        trainee, info, meta["environment"]
                    )
                self.writer = open_writer(
                    out, meta, force=self.options.force, info=info, rank_meta=rank_meta
                )
        except BaseException:
            self.state.close()
            raise
        self._writer = BackgroundWriter(
            f"bisect-repro writer for {self.writer.path}",
            plan.max_pending_writes,
            self.writer.commit_group,
        )
        # entropy seeding calls by step, logged with the step
        self._seeded: dict[int, list[dict[str, Any]]] = {}
        self._watch = SeedingWatch(on_call=self._note_seeding).install()

    @staticmethod
    def _reference_check(plan: SessionPlan, info: RankInfo | None) -> ReferenceCheck | None:
        """The check against the plan's reference run, which is opened and checked now, before
        anything is written (:func:`~bisect_repro.record.reference.open_reference`)."""
        if plan.against is None:
            return None
        if plan.resume or info is not None:
            raise BisectReproError(
                f"{plan.out}: --against records a new run of one process; drop --resume (or the "
                "ranks)"
            )
        code = launch_info(plan.target).get("code")
        reference = open_reference(plan.against.run, plan.out, code)
        # what can make the weights differ by rounding (a hash seed acts on the data, checked)
        numerics = env.diff(reference.environment, env.fingerprint())
        numerics.pop("env.PYTHONHASHSEED", None)
        return ReferenceCheck(plan.against, reference, numerics)

    def _note_seeding(self, call: SeedingCall) -> None:
        if call.entropy:
            # with the value entropy gave
            self._seeded.setdefault(self.step, []).append(call.to_record())

    def _resume(
        self,
        out: Path,
        options: RecordOptions | None,
        target: str | None,
        config: Mapping[str, Any] | None,
        info: RankInfo | None,
    ) -> RecordOptions:
        """Reopen ``out`` at its last checkpoint, restore it, and check that the caller records the
        same run."""
        self.writer, resumed = resume_writer(out, info)
        try:
            meta = resumed.meta
            written = meta.raw.get("options") or {}
            recorded = {
                k: getattr(meta.options, k) for k in (*_SCHEDULE, "on_error") if k in written
            }
            if options is None:
                options = RecordOptions(
                    **{k: recorded[k] for k in (*_SCHEDULE, "on_error") if k in recorded}
                )
            for key in _SCHEDULE:
                if key in recorded and recorded[key] != getattr(options, key):
                    flag = "--" + key.replace("_", "-")
                    raise BisectReproError(
                        f"{out}: was recorded with {flag} {recorded[key]}, not "
                        f"{getattr(options, key)}; resume with the same options"
                    )
            if config is not None and dict(config) != meta.config:
                raise BisectReproError(
                    f"{out}: was recorded with --set {meta.config}, not {dict(config)}; resume "
                    "with the same settings"
                )
            if target is not None and meta.target not in (None, target):
                warnings.warn(
                    f"{out}: was recorded from {meta.target}, resumed from {target}", stacklevel=4
                )
            self.state.load_state_dict(resumed.checkpoint)
            self.step = resumed.step
            self.start_step = meta.options.start_step
            # committed already: not written again
            self._last_snapshot = self._committed = resumed.step
            resumes = [*(meta.raw.get("resumes") or []), {"step": resumed.step, "created": now()}]
            changed = env.diff(meta.environment, env.fingerprint())
            if changed:
                resumes[-1]["environment"] = changed
            if info is None or info.rank == 0:
                self.writer.update_meta({"resumes": resumes})
        except OSError as error:
            self.writer.close()
            raise RecordingError(
                f"{out}: cannot resume ({error.strerror or error}); check its permissions and free "
                "space"
            ) from error
        except BaseException:
            self.writer.close()
            raise
        return options

    # -- the loop ------------------------------------------------------------------------
    def batches(self, steps: int | None = None) -> Iterator[Any]:
        """Yield one batch per step up to ``steps`` (total, from 0), else the planned steps, else
        one pass over a source with a length, snapshotting as due; close the run once the planned
        steps are done (with none planned: this call's), so that a loop may call this once per
        epoch."""
        planned = (
            self.options.steps
            if self.options.steps is not None
            else (None if steps is not None else self._one_pass())
        )
        bound = steps if steps is not None else planned
        assert bound is not None
        while self.step < bound:
            self.begin_step()
            if self.stopped_early:
                break
            batch, indices = next_micro_batches(self.state.data, self.options.accumulate)
            if self.options.accumulate == 1:
                self.note_batch(batch, indices)
            else:
                for micro, part in enumerate(batch):
                    # the step's order: all its samples
                    self.note_batch(part, indices if micro == 0 else None)
            self._handed_out = True
            yield batch
            self.end_step()
        if planned is None or self.step >= planned or self.stopped_early:
            self.close()

    def _one_pass(self) -> int:
        """The steps of one pass over the data (its batches, over the micro-batches per step): a run
        given no step count stops at the end of a finite source, and is refused on a source with no
        length, which may never end."""
        loader = self.trainee.loader
        try:
            return len(loader) // self.options.accumulate  # type: ignore[arg-type]
        except TypeError:
            self.abandon()
            raise BisectReproError(
                f"{self.writer.path}: no step count, and the data ({type(loader).__name__}) has no "
                "length, so the run "
                "may never end; give RecordOptions(steps=N) or recorder.batches(steps=N)"
            ) from None

    # -- the step, for loops the recorder does not drive (a framework's) ------------------------
    def begin_step(self) -> None:
        """A step starts: snapshot the state it starts from, when one is due; recorded against a
        reference, stop here when a difference is known (:attr:`stopped_early`)."""
        due = self._due(self.step)
        check = self._check
        if check is not None and not self._stopped:
            if due:
                check.wait(self._checked_last, lambda: self._writer.error is not None)
            if check.stops_at(self.step, due):
                if self._last_snapshot != self.step:
                    self._snapshot(self.step)
                self.stopped_early = True
                return
        if due and self._last_snapshot != self.step:
            self._snapshot(self.step)

    def note_batch(self, batch: Any, indices: list[int] | None = None) -> None:
        """The batch (and its sample indices, when known) the current step trains on."""
        self._note_batch(batch, indices)

    def end_step(self) -> None:
        """The current step is done (its optimizer step taken)."""
        self._handed_out = False
        self._close_activations()
        self.step += 1

    def _close_activations(self) -> None:
        """The activation sketches of the step that started at the last snapshot, kept for the next
        one."""
        if self._activations is not None and self._taking:
            found, self._taking = (
                self._activations.take(keep=self._due(self.step + 1) and not self._stopped),
                False,
            )
            if found is not None:
                self._sketched = (self.step, found)

    def note_loss(self, loss: torch.Tensor) -> None:
        """Nothing to do: the step's loss is recorded by :meth:`log`."""

    def log(self, loss: torch.Tensor | float | None) -> None:
        """The loss of the current step; a tensor stays on its device until the next snapshot."""
        if self._pending and self._pending[-1].step == self.step:
            self._pending[-1].loss = loss.detach() if isinstance(loss, torch.Tensor) else loss

    @property
    def last_loss(self) -> float | None:
        """The last loss fetched to the host (at the last snapshot)."""
        return self._last_loss

    def close(self) -> None:
        """Commit the final snapshot, mark the run complete when all planned steps ran, wait for the
        writes.

        Raises the :class:`RecordingError` of a failed write (``on_error="raise"``).
        """
        if self._closed:
            return
        self._closed = True
        try:
            # the loop stopped after the body of the step it was handed: that step is done
            if self._handed_out:
                self.end_step()
            # begun, never ended: not a step that ran
            if self._pending and self._pending[-1].step == self.step:
                self._pending.pop()
            if self._last_snapshot != self.step:
                self._snapshot(self.step)
            total = self.options.steps
            if not self._stopped and (self.stopped_early or total is None or self.step >= total):
                final = self.step
                self._writer.submit(final, lambda: Commit(final, end=True))
        finally:
            self._shut_down()
        self._check_writer()

    def _shut_down(self) -> None:
        """Wait for what was handed to the writer, release the run's lock, give the loader back."""
        self._watch.uninstall()
        if self._activations is not None:
            self._activations.remove()
        try:
            self._writer.drain()
        finally:
            self.writer.close()
            self.state.close()

    def abandon(self) -> None:
        """The loop raised: keep what was committed and what is queued; the run stays incomplete."""
        if not self._closed:
            self._closed = self._stopped = True
            self._shut_down()

    # -- internals -----------------------------------------------------------------------
    def _due(self, step: int) -> bool:
        return step == self.start_step or step % self.options.every == 0

    def _note_batch(self, batch: Any, indices: list[int] | None) -> None:
        """Note a batch of the current step; a step of several micro-batches (gradient
        accumulation) notes each, and its batch hash covers them all in order."""
        if self._stopped:
            return
        same_step = bool(self._pending) and self._pending[-1].step == self.step
        micro = len(self._pending[-1].batch_names) if same_step else 0
        tensors, others = batch_tensors(batch)
        named = {
            f"{self.step}.{micro + i}:{path}": tensor
            for i, (path, tensor) in enumerate(tensors.items())
        }
        order_name = None
        if indices is not None and not same_step:
            order_name = f"{self.step}:order"
            named[order_name] = torch.tensor(indices, dtype=torch.int64)
        # Small batches wait for the next snapshot and are hashed together, in one packed
        # reduction: per-step hashing of a few small tensors costs more in launches than in bytes.
        self._deferred.update(named)
        self._deferred_bytes += sum(t.numel() * t.element_size() for t in named.values())
        if self._deferred_bytes > _DEFERRED_BATCH_BYTES:
            self._hash_deferred()
        if same_step:
            pending = self._pending[-1]
            if pending.first is None:
                pending.first = (len(pending.batch_names), len(pending.others))
            pending.batch_names += [n for n in named if n != order_name]
            pending.others += others
        else:
            # at a snapshot step, the streams as its first batch is noted (see PendingStep.streams)
            streams = self.state.streams.state_dict() if self._last_snapshot == self.step else None
            start, self.start_streams = self.start_streams, None
            names = [n for n in named if n != order_name]
            self._pending.append(
                PendingStep(self.step, order_name, names, others, streams=streams, start=start)
            )

    def _hash_deferred(self) -> None:
        if self._deferred:
            self._batch_hashes.add(self._deferred)
        self._deferred, self._deferred_bytes = {}, 0

    def _snapshot(self, step: int) -> None:
        self._check_writer()
        if self._stopped:
            return
        state = self.state
        # placed: how each DTensor's local shard is laid out
        tensors, placed = state.tensors_and_placements()
        # Batch and state hashes travel to the host together, in one transfer per device; the
        # digests and step records are made from them on the writer's thread. Plain float32
        # parameters are sketched in the hash's pass. hashed with the state, in one call
        deferred, self._deferred, self._deferred_bytes = self._deferred, {}, 0
        parameters, hashed = (
            state.parameters(),
            deferred | {f"state:{name}": tensor for name, tensor in tensors.items()},
        )
        # batch names: "<step>:..."
        self._batch_hashes.add(
            hashed, {f"state:{n}": at for n, at in fusable(parameters, tensors).items()}
        )
        lanes, self._batch_hashes = self._batch_hashes.fetch_lanes(), PendingHashes()
        # fresh host arrays
        in_pass = {
            n: lanes.sketches[f"state:{n}"] for n in parameters if f"state:{n}" in lanes.sketches
        }
        # a fresh host tensor: shares nothing with the training
        sketched, sketches = sketch_tensors(parameters, in_pass)
        self._close_activations()
        (sketched_step, activations), self._sketched = self._sketched or (None, None), None
        if activations is not None:
            activations.transfer()  # a device's, now; the CPU's are sketched on the writer's thread
        if self._activations is None:
            self._activations = ActivationSketches(self.trainee.model)
        self._activations.start()
        self._taking = True
        pending, self._pending = self._pending, []
        losses = fetch_losses(pending)
        self._last_loss = next(
            (float(loss) for loss in reversed(losses) if loss is not None), self._last_loss
        )
        seeded = {p.step: self._seeded.pop(p.step) for p in pending if p.step in self._seeded}
        names, extra = list(tensors), state.extra_digests()
        # The snapshot's tree shares nothing the training changes: digests are strings, and the
        # streams' and data position's states are copies taken now. So it is taken apart on the
        # writer's thread; only a checkpoint, which holds the training's own tensors, is copied
        # here.
        streams, data, settings = (
            state.streams.state_dict(),
            state.data.state_dict(),
            state.settings(),
        )
        checkpoint_every = self.options.checkpoint_every
        due = step == self.start_step or (
            checkpoint_every is not None and step % checkpoint_every == 0
        )
        checkpoint = codec.prepare(state.state_dict()) if due else None
        check = self._check

        def commit() -> Commit:  # on the writer's thread
            digests = lanes.digests()
            hashes = {name: digests[f"state:{name}"] for name in names} | extra
            sketch = {"width": WIDTH, "seed": SEED, "names": sketched, "values": sketches}
            tree = {
                "step": step,
                "hashes": hashes,
                "streams": streams,
                "data": data,
                **placed,
                "settings": settings,
                "sketch": sketch,
            }
            if activations is not None:
                tree["activations"] = {
                    "step": sketched_step,
                    **sketch,
                    "names": activations.names,
                    "values": activations.fetch(),
                }
            files = [("snapshot", codec.prepare(tree))] + (
                [("checkpoint", checkpoint)] if checkpoint is not None else []
            )
            lines = step_records(pending, losses, digests, seeded)
            if check is not None:
                check.check(step, lines, tree)
            return Commit(step, lines, files)

        self._writer.submit(step, commit)
        if check is not None:
            self._checked_last = step
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
        committed = (
            self._writer.committed if self._writer.committed is not None else self._committed
        )
        kept = (
            f"what was committed, up to step {committed}, is intact"
            if committed is not None
            else "nothing was committed"
        )
        message = (
            f"{self.writer.path}: recording failed writing step {self._writer.failed_at} "
            f"({cause}); {kept}"
        )
        if self.options.on_error == "raise":
            raise RecordingError(
                f"{message}; free space or fix permissions, then record again with --resume"
            ) from error
        warnings.warn(
            f"{message}; recording stopped, training goes on", RecordingWarning, stacklevel=4
        )
