"""The replay server: a process relaunched to replay a run serves its controller, step by step.

When ``BISECT_REPRO_REPLAY`` is set (see :mod:`bisect_repro.serve.channel`), a
:class:`~bisect_repro.record.recorder.Recorder` records nothing: it connects to the controller
(``compare`` or ``doctor``), and its ``batches()`` becomes :meth:`StepServer.batches`, a loop of
requests (their types: :mod:`bisect_repro.serve.requests`, the replies':
:mod:`bisect_repro.serve.protocol`). The loop body the user wrote is the
step: to run a step, the server puts the state in place, yields the batch, and the body trains
on it; ``recorder.log(loss)`` hands the loss back. A script therefore replays unchanged, and a
recipe replays through the same loop (``record``'s), so there is one replay engine for both.

Requests (each decoded by :func:`~bisect_repro.serve.requests.decode`; ``run`` and ``skip`` train
in the loop, ``exit`` ends it, and the rest are answered through :data:`ANSWERS`, the table
:class:`~bisect_repro.serve.hooks.HookServer` answers through too):

- ``restore {run, step, environment}``: load a checkpoint of a run directory (read, never
  executed) and the recorded in-process settings; a rank of a distributed run loads its own
  rank's checkpoint (``RANK``); from then on each seeding call from entropy is given the value
  the run recorded for it (:mod:`bisect_repro.capture.entropy`);
- ``skip {until, hashes_at}``: train untraced up to a step, returning what the recorder would have
  logged for each step (data order, batch, loss) and the state hashes at the steps asked for;
- ``fetch {}``: take the next batch and keep, in memory, everything the step starts from;
- ``run {step, trace, keep, ops, alerts, streams, environment, advance, fixed_entropy, commit}``:
  run a kept step again from its start, traced (``light``: the batch, the loss and the state
  after it; ``full``: every module's inputs and outputs, every gradient; ``ops``: every aten op of
  one pass), optionally under another run's streams or settings, with streams one draw further,
  or with entropy seeding fixed; ``commit`` moves on to the next step;
- ``streams {step}``: the streams a kept step starts from (as a state tree);
- ``data {step, streams, epoch_streams}``: fetch a kept step's batch again, from its data
  position, under other streams;
- ``describe {}``, ``items {step, stream}``: what ``doctor`` asks of a build;
- ``compiled {}``: the ``torch.compile`` calls the code made (see
  :mod:`bisect_repro.capture.compiled`); ``run`` with ``compile_bisect`` compiles them again first,
  as one trial of a compiler bisection;
- ``rewind {step}``: (an unchanged script's process, :mod:`bisect_repro.serve.rewind`) put the
  last fetched step's start back, where the process stands at the next step's start, so that the
  next ``run`` runs that step again;
- ``exit {}``: end the process at once, without running the rest of the script.

Where the guarantees stop: the loop body runs as written, so its side effects (prints, logging
to a tracker, files it saves) happen again in a replay; guard them with ``recorder.replaying``.
A step that reads state outside the :class:`~bisect_repro.trainee.Trainee` (a counter in a
closure, a global) sees that state as the replay left it, not as the recording did: the
controller detects this (the replay parts from the records, or a step re-run from the same state
runs other ops) and says so. A step body that raises ends the process; the controller reports
the last line it printed.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch

from ..capture import compiled, env
from ..capture.batch import batch_tensors, combine_digests
from ..capture.data import describe_loader, next_micro_batches
from ..capture.entropy import EntropyFeed
from ..capture.hashing import hash_tensor, hash_tensors
from ..capture.hidden import hidden_streams, recipe_streams, stream_kind
from ..capture.parallel import local
from ..capture.pystate import Scope
from ..capture.rng import RandomStreams, draw_once, tree_digest
from ..capture.seeding import SeedingWatch
from ..capture.state import TrainingState, model_structure
from ..store.run import Run as RunDirectory
from ..trainee import Trainee
from .channel import Channel
from .instrument import InstrumentedStep, loss_value
from .process import watched_process
from .protocol import (
    CompileCalls,
    Description,
    Exited,
    Fetched,
    Hello,
    HiddenStream,
    ItemsChange,
    Restored,
    SkipResult,
    StateHashes,
    StepRecord,
    StepStart,
)
from .requests import (
    Compiled,
    Data,
    Describe,
    Exit,
    Fetch,
    Hashes,
    Items,
    Request,
    Restore,
    Rewind,
    Run,
    Skip,
    Streams,
    UnknownRequest,
    decode,
)
from .start import KeptStart, hyperparameters, keep_start, load_start, overlay_hyperparameters

__all__ = ["ANSWERS", "StepServer", "batch_digest", "order_digest"]

Reply = tuple[dict[str, Any], Any]
"""A reply as it is sent: its JSON object, and the state tree beside it (``None`` for most); the
controller reads it back as a :data:`~bisect_repro.serve.protocol.Reply`."""

ANSWERS: dict[type[Request], str] = {
    Restore: "_restore",
    Fetch: "_fetch",
    Streams: "_streams",
    Hashes: "_hashes",
    Data: "_data",
    Describe: "_describe",
    Items: "_items",
    Compiled: "_compiled",
    Rewind: "_rewind",
}
"""The method of a server that answers each request not run in the loop (``run``, ``skip``,
``exit``); a framework's server overrides those it answers otherwise."""


def batch_digest(batch: Any) -> str:
    """The digest of a batch as the recorder logs it: each tensor's hash and the other leaves."""
    tensors, others = batch_tensors(batch)
    return combine_digests([*hash_tensors(tensors).values(), *others])


def order_digest(indices: list[int] | None) -> str | None:
    """The digest of a batch's sample indices as the recorder logs it."""
    return hash_tensor(torch.tensor(indices, dtype=torch.int64)) if indices is not None else None


class StepServer:
    """Serves one controller from inside the user's loop (see the module docstring).

    It is the role a :class:`~bisect_repro.record.recorder.Recorder` takes in a replaying process:
    it answers the recorder's calls (``batches``, ``log``, ``step``, ...) the way a recording
    session does, but by serving requests.
    """

    reruns = True
    """A kept step can run again in this process (a framework's hooks cannot; see ``hooks.py``)."""
    replaying = True
    stopped_early = False  # a replay serves the steps it is asked for; it never stops on its own
    rewinds = False
    """A step can run again in this process by rewinding it (:mod:`bisect_repro.serve.rewind`); only
    in a single process."""

    def __init__(
        self,
        trainee: Trainee,
        channel: Channel,
        start_step: int = 0,
        scope: Scope | None = None,
        accumulate: int = 1,
    ) -> None:
        self.trainee = trainee
        self.channel = channel
        self.accumulate = accumulate
        """Micro-batches per step (a list of them is each step's batch when more than one)."""
        self.state = TrainingState(trainee, scope)
        self.position = start_step
        """The step the next fetch takes the batch of."""
        self.current = start_step
        """The step being run now (a kept step may run again after later ones)."""
        self.loss: Any = None
        self.starts: dict[int, KeptStart] = {}
        watched = watched_process()
        self.watch = watched.watch if watched is not None else SeedingWatch().install()
        self.threads_set = watched.threads_set if watched is not None else []
        self.build_seeding = [call.to_json() for call in self.watch.calls]

    @classmethod
    def connect(
        cls,
        trainee: Trainee,
        address: str,
        token: str,
        start_step: int = 0,
        scope: Scope | None = None,
        accumulate: int = 1,
    ) -> StepServer:
        hello = Hello(
            pid=os.getpid(),
            rank=int(os.environ.get("RANK", 0)),
            world_size=int(os.environ.get("WORLD_SIZE", 1)),
            structure=model_structure(trainee.model),
            reruns=cls.reruns,
            rewinds=cls.rewinds and int(os.environ.get("WORLD_SIZE", 1)) == 1,
        )
        return cls(
            trainee, Channel.connect(address, token, hello.to_json()), start_step, scope, accumulate
        )

    # -- the recorder's calls --------------------------------------------------------------------
    @property
    def step(self) -> int:
        return self.current

    @property
    def last_loss(self) -> float | None:
        return loss_value(self.loss)

    def log(self, loss: Any) -> None:
        self.loss = loss

    def note_loss(self, loss: torch.Tensor) -> None:
        """Nothing to do: a served loop's step function returns its loss."""

    def begin_step(self) -> None:
        """Nothing to do: the served loop puts each step's state in place itself."""

    def note_batch(self, batch: Any, indices: list[int] | None = None) -> None:
        """Nothing to do: the served loop knows the batch it yields."""

    def end_step(self) -> None:
        """Nothing to do: the next request decides what runs next."""

    def close(self) -> None:
        """Nothing to do: the process ends when the controller says so."""

    def abandon(self) -> None:
        """Nothing to do (the loop body raised: the process ends with it)."""

    # -- the loop ------------------------------------------------------------------------------
    def batches(self, steps: int | None = None) -> Iterator[Any]:
        """Serve requests until ``exit``, yielding a batch for each step to run (``steps`` is the
        recording's business, not the replay's: the controller decides what runs)."""
        while True:
            request = self._receive()
            if isinstance(request, Run):
                yield from self._run(request)
            elif isinstance(request, Skip):
                yield from self._skip(request)
            elif isinstance(request, Exit):
                self._exit()
            elif request is not None:
                self.channel.send(*self.answer(request))

    def _receive(self) -> Request | None:
        """The next request (``None``: one whose ``op`` names none, answered with an error)."""
        message, tree = self.channel.receive()
        try:
            return decode(message, tree)
        except UnknownRequest as error:
            self.channel.send({"error": str(error)})
            return None

    def answer(self, request: Request) -> Reply:
        """The reply to a request answered outside the loop (see :data:`ANSWERS`)."""
        reply: Reply = getattr(self, ANSWERS[type(request)])(request)
        return reply

    def _exit(self) -> None:
        self.channel.send(Exited().to_json())
        self.channel.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the rest of the script (evaluation, saving, uploads) must not run

    # -- simple requests -----------------------------------------------------------------------
    def _restore(self, request: Restore) -> Reply:
        env.apply(request.environment)
        built = hyperparameters(self.trainee) if request.rebuilt else None
        run = RunDirectory.open(request.run)
        if run.distributed:  # each rank restores its own records
            run = run.open_rank(int(os.environ.get("RANK", 0)))
        self.state.load_state_dict(run.checkpoint(request.step), python=not request.rebuilt)
        self.feed_entropy(run, request)
        if built is not None:
            overlay_hyperparameters(self.trainee, built)
        self.position = self.current = request.step
        self.starts.clear()
        return Restored(step=self.position).to_json(), None

    def _fetch(self, request: Fetch) -> Reply:
        pre_streams, data = self.state.streams.state_dict(), self.state.data.state_dict()
        batch, indices = next_micro_batches(self.state.data, self.accumulate)
        self.starts = {s: start for s, start in self.starts.items() if s in request.keep}
        self.starts[self.position] = keep_start(
            self.state, self.position, batch, indices, pre_streams, data
        )
        fetched = Fetched(
            step=self.position,
            indices=indices,
            order=order_digest(indices),
            batch=batch_digest(batch),
            base_seed=self.state.data.base_seed,
        )
        return fetched.to_json(), None

    def _streams(self, request: Streams) -> Reply:
        start = self.starts[request.step]
        return {"step": start.step}, StepStart(
            streams=start.streams, pre_streams=start.pre_streams, data=start.data
        ).to_tree()

    def _hashes(self, request: Hashes) -> Reply:
        return StateHashes(hashes=self._state_hashes()).to_json(), None

    def _data(self, request: Data) -> Reply:
        """Fetch a kept step's batch again from its data position, under other streams; then put
        the data back where it was."""
        start = self.starts[request.step]
        now = (self.state.data.state_dict(), self.state.streams.state_dict())
        position = dict(start.data)
        if request.epoch_streams is not None and position.get("epoch_streams") is not None:
            position["epoch_streams"] = request.epoch_streams
        self.state.data.load_state_dict(position)
        self.state.streams.load_state_dict(request.pre_streams or start.pre_streams)
        batch, indices = next_micro_batches(self.state.data, self.accumulate)
        fetched = Fetched(
            step=start.step, indices=indices, order=order_digest(indices), batch=batch_digest(batch)
        )
        self.state.data.load_state_dict(now[0])
        self.state.streams.load_state_dict(now[1])
        return fetched.to_json(), None

    def _describe(self, request: Describe) -> Reply:
        hidden = hidden_streams(self.trainee)
        states = self.state.streams.state_dict()
        hidden_states = RandomStreams(hidden).state_dict()
        description = Description(
            init=self._state_hashes(),
            streams={name: tree_digest(value) for name, value in states.items()},
            hidden={
                n: HiddenStream(kind=stream_kind(s), digest=tree_digest(hidden_states[n]))
                for n, s in hidden.items()
            },
            environment=env.fingerprint(),
            threads_set=list(self.threads_set),
            loader=describe_loader(self.trainee.loader),
            convolutions=any(
                isinstance(m, torch.nn.modules.conv._ConvNd) for m in self.trainee.model.modules()
            ),
            build_seeding=self.build_seeding,
        )
        return description.to_json(), None

    def _items(self, request: Items) -> Reply:
        """Do the dataset's items at a kept step's indices change with ``stream`` one draw
        further?"""
        start = self.starts[request.step]
        dataset: Any = getattr(self.trainee.loader, "dataset", None)
        sources = recipe_streams(self.trainee)
        name = request.stream
        if (
            start.indices is None
            or not hasattr(dataset, "__getitem__")
            or (name not in sources and name not in start.streams)
        ):
            return ItemsChange(changes=None).to_json(), None
        streams = RandomStreams(sources)
        saved_global, saved = self.state.streams.state_dict(), streams.state_dict()

        def contents() -> str:
            return batch_digest([dataset[i] for i in start.indices or []])

        try:
            self.state.streams.load_state_dict(start.pre_streams)
            before = contents()
            self.state.streams.load_state_dict(start.pre_streams)
            streams.load_state_dict(saved)
            draw_once(name, sources)
            return ItemsChange(changes=contents() != before).to_json(), None
        finally:
            streams.load_state_dict(saved)
            self.state.streams.load_state_dict(saved_global)

    def _rewind(self, request: Rewind) -> Reply:
        """Only a process that runs each step once rewinds (:mod:`bisect_repro.serve.rewind`); a
        step server runs a kept step again."""
        return {
            "error": f"step {request.step} cannot be rewound here: this process runs a kept step "
            "again instead"
        }, None

    def _compiled(self, request: Compiled) -> Reply:
        return CompileCalls(calls=list(compiled.calls())).to_json(), None

    # -- stepping ------------------------------------------------------------------------------
    def _skip(self, request: Skip) -> Iterator[Any]:
        result = SkipResult(step=self.position)
        last_progress = time.monotonic()
        while self.position < request.until:
            if self.position in request.hashes_at:
                result.hashes[self.position] = self._state_hashes()
            batch, indices = next_micro_batches(self.state.data, self.accumulate)
            order, digest = order_digest(indices), batch_digest(batch)
            self.loss, self.current = None, self.position
            yield batch
            result.records.append(
                StepRecord(
                    step=self.position, order=order, batch=digest, loss=loss_value(self.loss)
                )
            )
            self.position += 1
            if time.monotonic() - last_progress > 0.5:
                self.channel.send({"progress": self.position})
                last_progress = time.monotonic()
        if self.position in request.hashes_at:
            result.hashes[self.position] = self._state_hashes()
        self.starts.clear()
        result.step = self.position
        self.channel.send(result.to_json())

    def _run(self, request: Run) -> Iterator[Any]:
        start = self.starts[request.step]
        commit = request.commit and request.step == max(self.starts)
        if request.compile_bisect is not None:
            compiled.bisect_trial(request.compile_bisect)
        load_start(self.state, start, request.streams)
        run = InstrumentedStep(
            self.trainee, self.state, self.watch, request, lambda: self._state_hashes(grads=True)
        )
        run.note_batch(start.batch, start.indices)
        self.loss, self.current = None, request.step
        with run:
            yield start.batch
        run.loss = self.loss
        if commit:
            self.position = request.step + 1
        self.channel.send(*run.result(request.step).to_reply())

    def feed_entropy(self, run: RunDirectory, request: Restore) -> None:
        """From here on, each seeding call from entropy is given the value ``run`` recorded for it
        (see :mod:`bisect_repro.capture.entropy`), or, from ``request.kept_from`` on, leaves its
        stream as it is."""
        self.watch.feed = EntropyFeed.of_steps(
            run.steps, request.step, lambda: self.current, kept_from=request.kept_from
        )

    # -- state ---------------------------------------------------------------------------------
    def _state_hashes(self, *, grads: bool = False) -> dict[str, str]:
        tensors = self.state.tensors()
        if grads:
            tensors.update(
                {
                    f"{n}.grad": local(p.grad)
                    for n, p in self.trainee.model.named_parameters()
                    if p.grad is not None
                }
            )
        return {**hash_tensors(tensors), **self.state.extra_digests()}
