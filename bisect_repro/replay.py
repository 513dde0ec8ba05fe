"""Replaying a recorded run in this process, step by step, next to another one.

A :class:`Replica` rebuilds a run's recipe with the run's own recorded config, restores one of
its checkpoints, and steps it with tracing. Two replicas live in one process, so each keeps its
own copy of the global random streams and of its recorded environment settings, and swaps them
in while it runs (:meth:`Replica.active`): stepping A never disturbs B.

Before each step a replica keeps, in memory, the state it starts from (tensors, scheduler,
streams) and the batch, so that the step can be run again, with more tracing or under changed
conditions (another run's streams or environment), without replaying from the checkpoint.

Where guarantees stop: only what :func:`bisect_repro.env.apply` can set in-process is applied;
environment variables read at start-up (``OMP_NUM_THREADS``, ``CUBLAS_WORKSPACE_CONFIG``) are
not, and a replay in such an environment may not reproduce its run: :meth:`Replica.faithful_at`
says so by checking the replay against the recorded hashes.
"""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from . import env
from .errors import RecipeError
from .hashing import hash_tensors
from .recipe import build, recipe_file
from .rng import GLOBAL_STREAMS, RandomStreams
from .state import TrainingState
from .store import Run
from .trace import OpRecord, OpTracer, StepTracer, TraceEntry

__all__ = ["Replica", "StepStart", "StepTrace"]


@dataclass
class StepStart:
    """What a step starts from: the batch and the state before ``step(batch)``."""

    step: int
    batch: Any
    indices: list[int] | None
    tensors: dict[str, Any]
    streams: dict[str, Any]


@dataclass
class StepTrace:
    """A traced step: its entries in execution order, and tensors kept on request."""

    entries: list[TraceEntry]
    kept: dict[int, torch.Tensor]
    ops: list[OpRecord] | None = None


class Replica:
    """One recorded run, rebuilt here and restored to a checkpoint."""

    def __init__(self, run: Run, label: str) -> None:
        self.run: Run | None = run
        self.label = label
        target = run.meta.get("target")
        if not target:
            raise RecipeError(f"{run.path}: the run names no recipe TARGET (recorded with the Recorder API); compare it with --no-replay")
        path = recipe_file(target)
        if path is not None and not path.is_file():
            raise RecipeError(f"{run.path}: its recipe {path} is not on this machine; compare with --no-replay")
        self._open(target, run.meta.get("config", {}), dict(run.meta.get("environment", {})))

    @classmethod
    def from_recipe(cls, target: str, config: Mapping[str, Any] | None = None, label: str = "") -> Replica:
        """A recipe built here with no recorded run: its environment is what the recipe sets up."""
        replica = cls.__new__(cls)
        replica.run, replica.label = None, label
        replica._open(target, config or {}, None)
        return replica

    def _open(self, target: str, config: Mapping[str, Any], environment: dict[str, Any] | None) -> None:
        self.environment: dict[str, Any] = environment or {}
        self._globals: dict[str, Any] | None = None
        self._before: dict[str, Any] = {}
        with self.active():
            self.trainee = build(target, config)
            self.state = TrainingState(self.trainee)
            if environment is None:  # keep what the recipe set (threads, determinism switches)
                self.environment = {k: v for k, v in env.fingerprint().items() if k in env.APPLICABLE}
        self.step = 0

    # -- switching between replicas ---------------------------------------------------------
    @contextlib.contextmanager
    def active(self, environment: Mapping[str, Any] | None = None) -> Iterator[Replica]:
        """Swap in this replica's global streams and recorded settings (or ``environment``)."""
        outer = copy.copy(_global_states())
        self._before = env.apply(environment if environment is not None else self.environment)
        if self._globals is not None:
            _load_globals(self._globals)
        try:
            yield self
        finally:
            self._globals = _global_states()
            _load_globals(outer)
            env.apply(self._before)

    def close(self) -> None:
        self.state.close()

    # -- stepping ----------------------------------------------------------------------------
    def restore(self, step: int) -> None:
        assert self.run is not None
        with self.active():
            self.state.load_state_dict(self.run.checkpoint(step))
        self.step = step

    def fetch(self) -> StepStart:
        """Fetch the next batch and keep the state the step starts from."""
        with self.active():
            batch, indices = self.state.data.next_batch()
            start = StepStart(self.step, batch, indices, self._tensor_state(), self.state.streams.state_dict())
        return start

    def run_step(
        self,
        start: StepStart,
        *,
        keep: set[int] | None = None,
        ops: bool = False,
        streams: Mapping[str, Any] | None = None,
        environment: Mapping[str, Any] | None = None,
        full: bool = True,
        within: contextlib.AbstractContextManager[Any] | None = None,
        trace: bool = True,
    ) -> StepTrace:
        """Run the step from ``start`` with tracing; optionally with other streams or settings.

        ``full=False`` traces only the batch and the state after the step: enough to tell
        whether two steps agree, at a fraction of the cost. ``within`` is a context entered
        around the step function only; ``trace=False`` runs it untraced (no entries), for when
        only the state after the step matters.
        """
        assert self.trainee.step is not None
        trainee = self.trainee
        with self.active(environment):
            self._load_tensor_state(start.tensors)
            self.state.streams.load_state_dict(streams if streams is not None else start.streams)
            tracer = StepTracer(trainee.model, trainee.optimizer, self.state._names, keep=set(keep or ()), full=full) if trace else None
            if tracer is not None:
                tracer.note_batch(start.batch, start.indices)
            op_tracer = OpTracer(trainee.model) if ops else None
            with (
                tracer or contextlib.nullcontext(),
                op_tracer.tracing() if op_tracer else contextlib.nullcontext(),
                within or contextlib.nullcontext(),
            ):
                trainee.step(start.batch)
            result = StepTrace(tracer.result() if tracer else [], tracer.kept if tracer else {}, op_tracer.result() if op_tracer else None)
        return result

    def advance(self, start: StepStart) -> StepTrace:
        """Run the fetched step for real (lightly traced) and move on to the next step."""
        trace = self.run_step(start, full=False)
        self.step = start.step + 1
        return trace

    def skip(self) -> None:
        """Run the next step for real, untraced and without keeping the state it starts from."""
        assert self.trainee.step is not None
        with self.active():
            batch, _ = self.state.data.next_batch()
            self.trainee.step(batch)
        self.step += 1

    def state_hashes(self) -> dict[str, str]:
        """The hash of every parameter, buffer and optimizer-state tensor, as a snapshot holds them."""
        with self.active():
            return hash_tensors(self.state.tensors())

    def faithful_at(self, step: int) -> bool | None:
        """Whether the replayed state equals the recorded snapshot (``None``: no snapshot there)."""
        if self.run is None or step not in self.run.snapshots:
            return None
        return self.state_hashes() == self.run.snapshot(step)["hashes"]

    # -- in-memory state ---------------------------------------------------------------------
    def _tensor_state(self) -> dict[str, Any]:
        trainee = self.trainee
        return {
            "model": {k: v.detach().clone() for k, v in trainee.model.state_dict().items()},
            "optimizer": copy.deepcopy(trainee.optimizer.state_dict()),
            "scheduler": copy.deepcopy(trainee.scheduler.state_dict()) if trainee.scheduler is not None else None,
            "grads": [p.grad.detach().clone() if p.grad is not None else None for p in trainee.model.parameters()],
        }

    def _load_tensor_state(self, state: dict[str, Any]) -> None:
        trainee = self.trainee
        trainee.model.load_state_dict(state["model"])
        trainee.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        if trainee.scheduler is not None:
            trainee.scheduler.load_state_dict(copy.deepcopy(state["scheduler"]))
        for parameter, grad in zip(trainee.model.parameters(), state["grads"], strict=True):
            parameter.grad = grad.clone() if grad is not None else None


def streams_deciding_init(run: Run, candidates: list[str]) -> list[str] | None:
    """Which of the global streams ``candidates`` decide the initial parameters, by rebuilding.

    The recipe is built with the candidates set to one fixed state and every other global stream
    scrambled, twice: when the parameters come out equal, those streams decide them. ``None``
    when even all global streams fixed do not (the recipe draws from the OS or the clock).
    """
    target, config = run.meta.get("target"), run.meta.get("config", {})
    outer = _global_states()

    def parameters_with(fixed: list[str], scramble: int) -> dict[str, str]:
        torch.manual_seed(scramble)
        RandomStreams().load_state_dict(_seeded_globals(scramble + 1000), only=[n for n in GLOBAL_STREAMS if n not in fixed])
        RandomStreams().load_state_dict(_seeded_globals(12345), only=fixed)
        trainee = build(str(target), config)
        found = hash_tensors(dict(trainee.model.state_dict()))
        TrainingState(trainee).close()
        return found

    try:
        if parameters_with(list(GLOBAL_STREAMS), 1) != parameters_with(list(GLOBAL_STREAMS), 2):
            return None
        culprits = [n for n in candidates if n in GLOBAL_STREAMS and parameters_with([n], 1) == parameters_with([n], 2)]
        return culprits or [n for n in candidates if n in GLOBAL_STREAMS]
    finally:
        _load_globals(outer)


def _seeded_globals(seed: int) -> dict[str, Any]:
    saved = _global_states()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    seeded = _global_states()
    _load_globals(saved)
    return seeded


def _global_states() -> dict[str, Any]:
    return RandomStreams().state_dict()


def _load_globals(states: Mapping[str, Any]) -> None:
    RandomStreams().load_state_dict(states, only=[*GLOBAL_STREAMS, *(k for k in states if k.startswith("cuda:"))])
