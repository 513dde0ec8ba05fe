"""The recorder's replay mode: a process relaunched to replay a run serves its controller, step by step.

When ``BISECT_REPRO_REPLAY`` is set (see :mod:`bisect_repro.record.channel`), a
:class:`~bisect_repro.record.recorder.Recorder` records nothing: it connects to the controller
(``compare`` or ``doctor``) and its ``batches()`` becomes :meth:`StepServer.batches`, a loop of
requests. The loop body the user wrote is the step: to run a step, the server puts the state in
place, yields the batch, and the body trains on it; ``recorder.log(loss)`` hands the loss back. A
script therefore replays unchanged, and a recipe replays through the same loop (``record``'s), so
there is one replay engine for both.

Requests (a JSON object, and a state tree for those that carry one):

- ``restore {run, step, environment}``: load a checkpoint of a run directory (read, never
  executed) and the recorded in-process settings; a rank of a distributed run loads its own
  rank's checkpoint (``RANK``);
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

import copy
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..capture import env
from ..capture.batch import batch_tensors, combine_digests
from ..capture.data import describe_loader
from ..capture.hashing import hash_tensor, hash_tensors
from ..capture.hidden import hidden_streams, recipe_streams, stream_kind
from ..capture.parallel import local
from ..capture.rng import RandomStreams, draw_once, tree_digest
from ..capture.seeding import SeedingWatch
from ..capture.state import TrainingState, model_structure
from ..store.run import Run
from ..trainee import Trainee
from .channel import Channel
from .instrument import InstrumentedStep, loss_value

__all__ = ["StepServer", "batch_digest", "order_digest"]

THREADS_SET: list[int] = []  # torch.set_num_threads calls before the trainee was built (the bootstrap notes them)
WATCH: SeedingWatch | None = None  # installed by the bootstrap before the code runs, to see the build's seeding too


def batch_digest(batch: Any) -> str:
    """The digest of a batch as the recorder logs it: each tensor's hash and the other leaves."""
    tensors, others = batch_tensors(batch)
    return combine_digests([*hash_tensors(tensors).values(), *others])


def order_digest(indices: list[int] | None) -> str | None:
    """The digest of a batch's sample indices as the recorder logs it."""
    return hash_tensor(torch.tensor(indices, dtype=torch.int64)) if indices is not None else None


@dataclass
class _Start:
    """Everything a step starts from, kept in memory so that it can run again."""

    step: int
    batch: Any
    indices: list[int] | None
    tensors: dict[str, Any]
    streams: dict[str, Any]
    pre_streams: dict[str, Any]  # before the batch was fetched: what the data drew from
    data: dict[str, Any]  # the data position before the fetch


class StepServer:
    """Serves one controller from inside the user's loop (see the module docstring)."""

    def __init__(self, trainee: Trainee, channel: Channel) -> None:
        self.trainee = trainee
        self.channel = channel
        self.state = TrainingState(trainee)
        self.step = 0
        self.current = 0  # the step being run now (a kept step may run again after later ones)
        self.loss: Any = None
        self.starts: dict[int, _Start] = {}
        self.watch = WATCH or SeedingWatch().install()
        self.build_seeding = [call.to_json() for call in self.watch.calls]

    reruns = True
    """A kept step can run again in this process (a framework's hooks cannot; see ``hooks.py``)."""

    @classmethod
    def connect(cls, trainee: Trainee, address: str, token: str) -> StepServer:
        hello = {
            "pid": os.getpid(),
            "rank": int(os.environ.get("RANK", 0)),
            "world_size": int(os.environ.get("WORLD_SIZE", 1)),
            "structure": model_structure(trainee.model),
            "reruns": cls.reruns,
        }
        return cls(trainee, Channel.connect(address, token, hello))

    def log(self, loss: Any) -> None:
        self.loss = loss

    # -- the loop ------------------------------------------------------------------------------
    def batches(self) -> Iterator[Any]:
        while True:
            request, tree = self.channel.receive()
            op = request.get("op")
            if op == "run":
                yield from self._run(request, tree)
            elif op == "skip":
                yield from self._skip(request)
            elif op == "exit":
                self._exit()
            else:
                handler = getattr(self, f"_{op}", None) if op in _SIMPLE else None
                if handler is None:
                    self.channel.send({"error": f"unknown request {op!r}"})
                    continue
                reply, payload = handler(request, tree)
                self.channel.send(reply, payload)

    def _exit(self) -> None:
        self.channel.send({"ok": True})
        self.channel.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the rest of the script (evaluation, saving, uploads) must not run

    # -- simple requests -----------------------------------------------------------------------
    def _restore(self, request: dict[str, Any], tree: Any) -> tuple[dict[str, Any], Any]:
        env.apply(request.get("environment") or {})
        built = _hyperparameters(self.trainee) if request.get("rebuilt") else None
        run = Run.open(request["run"])
        if run.distributed:  # each rank restores its own records
            run = run.open_rank(int(os.environ.get("RANK", 0)))
        self.state.load_state_dict(run.checkpoint(int(request["step"])))
        if built is not None:
            _overlay_hyperparameters(self.trainee, *built)
        self.step = int(request["step"])
        self.starts.clear()
        return {"step": self.step}, None

    def _fetch(self, request: dict[str, Any], tree: Any) -> tuple[dict[str, Any], Any]:
        pre_streams, data = self.state.streams.state_dict(), self.state.data.state_dict()
        batch, indices = self.state.data.next_batch()
        self.starts = {s: start for s, start in self.starts.items() if s in request.get("keep", ())}
        self.starts[self.step] = _Start(self.step, batch, indices, self._tensors(), self.state.streams.state_dict(), pre_streams, data)
        reply = {"step": self.step, "indices": indices, "order": order_digest(indices), "batch": batch_digest(batch)}
        return {**reply, "base_seed": self.state.data.base_seed}, None

    def _streams(self, request: dict[str, Any], tree: Any) -> tuple[dict[str, Any], Any]:
        start = self.starts[int(request["step"])]
        return {"step": start.step}, {"streams": start.streams, "pre_streams": start.pre_streams, "data": start.data}

    def _hashes(self, request: dict[str, Any], tree: Any) -> tuple[dict[str, Any], Any]:
        return {"hashes": self._state_hashes()}, None

    def _data(self, request: dict[str, Any], tree: Any) -> tuple[dict[str, Any], Any]:
        """Fetch a kept step's batch again from its data position, under other streams; then put
        the data back where it was."""
        start = self.starts[int(request["step"])]
        tree = tree or {}
        now = (self.state.data.state_dict(), self.state.streams.state_dict())
        position = dict(start.data)
        if tree.get("epoch_streams") is not None and position.get("epoch_streams") is not None:
            position["epoch_streams"] = tree["epoch_streams"]
        self.state.data.load_state_dict(position)
        self.state.streams.load_state_dict(tree.get("pre_streams") or start.pre_streams)
        batch, indices = self.state.data.next_batch()
        reply = {"indices": indices, "order": order_digest(indices), "batch": batch_digest(batch)}
        self.state.data.load_state_dict(now[0])
        self.state.streams.load_state_dict(now[1])
        return reply, None

    def _describe(self, request: dict[str, Any], tree: Any) -> tuple[dict[str, Any], Any]:
        hidden = hidden_streams(self.trainee)
        states = self.state.streams.state_dict()
        hidden_states = RandomStreams(hidden).state_dict()
        return {
            "init": self._state_hashes(),
            "streams": {name: tree_digest(value) for name, value in states.items()},
            "hidden": {n: {"kind": stream_kind(s), "digest": tree_digest(hidden_states[n])} for n, s in hidden.items()},
            "environment": env.fingerprint(),
            "threads_set": list(THREADS_SET),
            "loader": describe_loader(self.trainee.loader),
            "convolutions": any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in self.trainee.model.modules()),
            "build_seeding": self.build_seeding,
        }, None

    def _items(self, request: dict[str, Any], tree: Any) -> tuple[dict[str, Any], Any]:
        """Do the dataset's items at a kept step's indices change with ``stream`` one draw further?"""
        start = self.starts[int(request["step"])]
        dataset: Any = getattr(self.trainee.loader, "dataset", None)
        sources = recipe_streams(self.trainee)
        name = request["stream"]
        if start.indices is None or not hasattr(dataset, "__getitem__") or (name not in sources and name not in start.streams):
            return {"changes": None}, None
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
            return {"changes": contents() != before}, None
        finally:
            streams.load_state_dict(saved)
            self.state.streams.load_state_dict(saved_global)

    # -- stepping ------------------------------------------------------------------------------
    def _skip(self, request: dict[str, Any]) -> Iterator[Any]:
        until, hashes_at = int(request["until"]), set(request.get("hashes_at", ()))
        records: list[dict[str, Any]] = []
        hashes: dict[str, dict[str, str]] = {}
        last_progress = time.monotonic()
        while self.step < until:
            if self.step in hashes_at:
                hashes[str(self.step)] = self._state_hashes()
            batch, indices = self.state.data.next_batch()
            record: dict[str, Any] = {"step": self.step, "order": order_digest(indices), "batch": batch_digest(batch)}
            self.loss, self.current = None, self.step
            yield batch
            record["loss"] = loss_value(self.loss)
            records.append(record)
            self.step += 1
            if time.monotonic() - last_progress > 0.5:
                self.channel.send({"progress": self.step})
                last_progress = time.monotonic()
        if self.step in hashes_at:
            hashes[str(self.step)] = self._state_hashes()
        self.starts.clear()
        self.channel.send({"step": self.step, "records": records, "hashes": hashes})

    def _run(self, request: dict[str, Any], tree: Any) -> Iterator[Any]:
        step = int(request["step"])
        start = self.starts[step]
        commit = bool(request.get("commit")) and step == max(self.starts)
        self._load_start(start, (tree or {}).get("streams"))
        run = InstrumentedStep(self.trainee, self.state, self.watch, request, lambda: self._state_hashes(grads=True))
        run.note_batch(start.batch, start.indices)
        self.loss, self.current = None, step
        with run:
            yield start.batch
        run.loss = self.loss
        reply, payload = run.reply(step)
        if commit:
            self.step = step + 1
        self.channel.send(reply, payload)

    # -- state ---------------------------------------------------------------------------------
    def _state_hashes(self, *, grads: bool = False) -> dict[str, str]:
        tensors = self.state.tensors()
        if grads:
            tensors.update({f"{n}.grad": local(p.grad) for n, p in self.trainee.model.named_parameters() if p.grad is not None})
        return {**hash_tensors(tensors), **self.state.extra_digests()}

    def _tensors(self) -> dict[str, Any]:
        trainee = self.trainee
        return {
            "model": {k: v.detach().clone() for k, v in trainee.model.state_dict().items()},
            "optimizer": copy.deepcopy(trainee.optimizer.state_dict()),
            "scheduler": copy.deepcopy(trainee.scheduler.state_dict()) if trainee.scheduler is not None else None,
            "grads": [p.grad.detach().clone() if p.grad is not None else None for p in trainee.model.parameters()],
            "extra": {name: copy.deepcopy(value.state_dict()) for name, value in self.state.extra.items()},
        }

    def _load_start(self, start: _Start, streams: dict[str, Any] | None) -> None:
        trainee, saved = self.trainee, start.tensors
        trainee.model.load_state_dict(saved["model"])
        trainee.optimizer.load_state_dict(copy.deepcopy(saved["optimizer"]))
        if trainee.scheduler is not None:
            trainee.scheduler.load_state_dict(copy.deepcopy(saved["scheduler"]))
        for parameter, grad in zip(trainee.model.parameters(), saved["grads"], strict=True):
            parameter.grad = grad.clone() if grad is not None else None
        for name, value in saved["extra"].items():
            self.state.extra[name].load_state_dict(copy.deepcopy(value))
        self.state.streams.load_state_dict(streams if streams is not None else start.streams)


def _hyperparameters(trainee: Trainee) -> tuple[list[dict[str, Any]], list[Any] | None]:
    groups = [{k: v for k, v in group.items() if k != "params"} for group in trainee.optimizer.param_groups]
    return groups, list(getattr(trainee.scheduler, "base_lrs", None) or []) or None


def _overlay_hyperparameters(trainee: Trainee, groups: list[dict[str, Any]], base_lrs: list[Any] | None) -> None:
    """After a checkpoint is restored into a trainee built with another config: keep the
    checkpoint's tensors and position but the built optimizer's hyperparameters (a learning rate
    a scheduler has moved is scaled by the ratio of the two initial rates)."""
    for group, built in zip(trainee.optimizer.param_groups, groups, strict=False):
        for key, value in built.items():
            if key == "lr" and group.get("initial_lr") and built.get("initial_lr"):
                group["lr"] = group["lr"] * built["initial_lr"] / group["initial_lr"]
            elif key != "lr" or not group.get("initial_lr"):
                group[key] = value
        if "initial_lr" in built:
            group["initial_lr"] = built["initial_lr"]
    if base_lrs is not None and trainee.scheduler is not None:
        trainee.scheduler.base_lrs = base_lrs  # type: ignore[attr-defined]
        trainee.scheduler._last_lr = [group["lr"] for group in trainee.optimizer.param_groups]  # type: ignore[attr-defined]


_SIMPLE = ("restore", "fetch", "streams", "hashes", "data", "describe", "items")
