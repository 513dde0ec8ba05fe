"""The recorder's replay mode when a framework drives the loop: serving the controller from its
hooks.

A framework (Lightning, the Hugging Face ``Trainer``) owns its training loop and its data loader,
so the loop cannot be made to yield a batch again. Its integration calls the recorder at the
start and the end of each optimizer step (:meth:`~bisect_repro.record.recorder.Recorder.begin_step`,
``note_batch``, ``log``, ``end_step``, each passed on to this server); in a replay,
:class:`HookServer` answers the controller's requests at the start of each step the controller wants
to see, and lets the framework run the others untraced. It answers the same requests as
:class:`~bisect_repro.serve.server.StepServer` with one difference: a step runs once per process, in
order, from wherever the script starts (step 0, or the step a framework checkpoint resumes from).
The controller repeats a step by starting another process
(:class:`~bisect_repro.replay.replica.Replica` does it for it), or by rewinding this one (an
unchanged script's, :mod:`bisect_repro.serve.rewind`; a framework callback's,
:mod:`bisect_repro.serve.framework_rewind`), and a batch cannot be fetched again under other
streams.

Where the guarantees stop: the batch a step trains on is known only once the framework hands it
over, after the data loader drew it; overrides of the random streams apply from the start of the
step's first micro-batch, so they reach the model's randomness (dropout) but not the data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from ..capture import compiled, env
from ..capture.batch import batch_tensors, combine_digests
from ..capture.hashing import hash_tensors
from ..store.run import Run as RunDirectory
from .instrument import InstrumentedStep, loss_value
from .protocol import Fetched, Restored, SkipResult, StepRecord, StepStart
from .requests import Data, Exit, Fetch, Items, Request, Restore, Run, Skip, Streams
from .server import Reply, StepServer

__all__ = ["HookServer"]


@dataclass
class _Skipping:
    """A ``skip`` under way: the framework trains untraced up to ``request.until``."""

    request: Skip
    result: SkipResult
    digests: list[str] = field(default_factory=list)


class HookServer(StepServer):
    """Serves the controller from a framework's step hooks (see the module docstring)."""

    reruns = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first: int | None = None
        self._skipping: _Skipping | None = None
        self._running: InstrumentedStep | None = None
        self._start_streams: dict[str, Any] = {}
        self._batch_tensors: dict[str, Any] = {}
        self._others: list[str] = []

    # -- the recorder's calls, from the framework's hooks ---------------------------------------
    def begin_step(self) -> None:
        step = self.current
        self.first = step if self.first is None else self.first
        self._batch_tensors, self._others, self.loss = {}, [], None
        self._start_streams = self.state.streams.state_dict()
        skip = self._skipping
        if skip is not None:
            if step in skip.request.hashes_at:
                skip.result.hashes[step] = self._state_hashes()
            if step < skip.request.until:
                return
            self._skipping = None
            skip.result.step = step
            self.channel.send(skip.result.to_json())
        self._serve()

    def note_batch(self, batch: Any, indices: list[int] | None = None) -> None:
        tensors, others = batch_tensors(batch)
        self._batch_tensors.update(
            {f"{len(self._batch_tensors) + i}": t for i, t in enumerate(tensors.values())}
        )
        self._others += others
        if self._running is not None:
            self._running.note_batch(batch, None)

    def note_loss(self, loss: torch.Tensor) -> None:
        if self._running is not None:
            self._running.note_loss(loss)

    def end_step(self) -> None:
        batch = combine_digests([*hash_tensors(self._batch_tensors).values(), *self._others])
        if self._running is not None:
            running, self._running = self._running, None
            running.__exit__(None, None, None)
            running.loss = self.loss
            result = running.result(self.current)
            result.batch = batch
            self._send_result(result.to_reply())
        elif self._skipping is not None:
            self._skipping.result.records.append(
                StepRecord(step=self.current, order=None, batch=batch, loss=loss_value(self.loss))
            )
        self.current += 1
        self.position = self.current

    def _send_result(self, reply: Reply) -> None:
        """Answer a ``run`` with its result (a rewinding server may hold it back)."""
        self.channel.send(*reply)

    def close(self) -> None:
        """The framework finished training: tell a waiting controller, and end the process."""
        self.channel.send(
            {"error": f"training ended after step {self.current}; the replay cannot go further"}
        )
        self._exit()

    # -- requests ------------------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            request = self._receive()
            refused = self._refusal_to_train(request)
            if refused is not None:
                self.channel.send({"error": refused})
                continue
            if isinstance(request, Run) and request.step == self.current:
                self._start_run(request)
                return
            if isinstance(request, Skip) and request.until > self.current:
                self._skipping = _Skipping(request, SkipResult(step=self.current))
                return
            if isinstance(request, Exit):
                self._exit()
            if isinstance(request, Skip):  # already there
                self.channel.send(SkipResult(step=self.current).to_json())
            elif isinstance(request, Run):
                self.channel.send(
                    {
                        "error": f"step {request.step} cannot run here: this process stands at "
                        f"step {self.current}"
                    }
                )
            elif request is not None:
                self.channel.send(*self.answer(request))

    def _refusal_to_train(self, request: Request | None) -> str | None:
        """Why this process may not train as ``request`` asks (``None``: it may)."""
        return None

    # -- the answers that differ from a step server's (see server.ANSWERS)
    # --------------------------
    def _restore(self, request: Restore) -> Reply:
        if request.step != self.first:
            return {
                "error": f"a framework's run replays from its own start (step {self.first}), not "
                f"from step {request.step}"
            }, None
        self._restore_streams(request)
        return Restored(step=self.current).to_json(), None

    def _fetch(self, request: Fetch) -> Reply:
        return Fetched(step=self.current).to_json(), None

    def _streams(self, request: Streams) -> Reply:
        return {"step": self.current}, StepStart(
            streams=self._start_streams, pre_streams=self._start_streams, data=None
        ).to_tree()

    def _data(self, request: Data) -> Reply:
        return self._not_here(request)

    def _items(self, request: Items) -> Reply:
        return self._not_here(request)

    def _not_here(self, request: Data | Items) -> Reply:
        """A request that needs the batch fetched again."""
        return {
            "error": f"{request.op!r} needs the batch fetched again, which a framework's loader "
            "does not allow"
        }, None

    def _restore_streams(self, request: Restore) -> None:
        """At the run's own start: the recorded settings and random streams, as its checkpoint there
        holds them, so that streams no seed reaches (an unseeded one) start as they did."""
        env.apply(request.environment)
        run = RunDirectory.open(request.run)
        if run.distributed:
            run = run.open_rank(int(os.environ.get("RANK", 0)))
        # a script replayed at another run's steps (it resumed from that run's checkpoint)
        start = run.meta.options.start_step
        run = run.shifted((start if self.first is None else self.first) - start)
        self.feed_entropy(run, request)
        streams = (
            run.checkpoint(request.step).get("streams") if request.step in run.checkpoints else None
        )
        # a checkpoint without them (damaged, edited) leaves the process's own
        if isinstance(streams, dict):
            kept = {name: value for name, value in streams.items() if name not in request.seeded}
            self.state.streams.load_state_dict(kept)
            self._start_streams = self.state.streams.state_dict()

    def _start_run(self, request: Run) -> None:
        if request.compile_bisect is not None:
            compiled.bisect_trial(request.compile_bisect)
        if request.streams is not None:
            self.state.streams.load_state_dict(request.streams)
        self._running = InstrumentedStep(
            self.trainee, self.state, self.watch, request, lambda: self._state_hashes(grads=True)
        )
        self._running.__enter__()
