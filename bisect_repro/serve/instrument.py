"""One step run under what a replay controller asked for: tracing, overrides, and the reply.

:class:`InstrumentedStep` is entered just before a step runs and left just after, around the
user's own code: in the loop a :class:`~bisect_repro.serve.server.StepServer` drives, the
``yield`` of the batch; in a framework's loop, the hooks that start and end a step
(:mod:`bisect_repro.serve.hooks`). It applies the request's in-process settings, draws the
streams it asks to advance, fixes entropy seeding when asked, installs the step tracer, the op
tracer and the determinism-alert catcher, and on leaving undoes the settings and builds the reply:
the trace, the loss, one digest of the state and gradients after the step, each stream's digest
after it and the seeding calls made during it.

Where the guarantees stop: the settings are those :func:`bisect_repro.capture.env.apply` can
set in-process; a step that changes them itself keeps its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch

from ..capture import env
from ..capture.batch import combine_digests
from ..capture.hidden import recipe_streams
from ..capture.rng import draw_once, tree_digest
from ..capture.scope import DeterminismAlerts, ScopedOps
from ..capture.seeding import SeedingCall, SeedingWatch
from ..capture.state import TrainingState
from ..capture.trace import StepTracer
from ..trainee import Trainee
from .protocol import StepResult
from .requests import Run

__all__ = ["InstrumentedStep", "loss_value"]

_SKIP = {"forward": "backward", "backward": "forward"}


def loss_value(loss: Any) -> float | None:
    """A logged loss as the recorder stores it: a Python float (a tensor is fetched once)."""
    if isinstance(loss, torch.Tensor):
        return float(loss.detach().float().reshape(()).cpu())
    return float(loss) if isinstance(loss, (int, float)) else None


class InstrumentedStep:
    """A step under a ``run`` request (see the module docstring); use as a context manager."""

    def __init__(
        self,
        trainee: Trainee,
        state: TrainingState,
        watch: SeedingWatch,
        request: Run,
        state_hashes: Callable[[], dict[str, str]],
    ) -> None:
        self.trainee, self.state, self.watch, self.request = trainee, state, watch, request
        self.state_hashes = state_hashes
        model = trainee.model
        self.tracer = None
        if request.trace != "none":
            self.tracer = StepTracer(
                model,
                trainee.named_optimizers,
                state._names,
                keep=set(request.keep),
                full=request.trace == "full",
            )
        self.ops = ScopedOps(model, skip=_SKIP.get(request.ops)) if request.ops else None
        self.alerts = DeterminismAlerts(model) if request.alerts else None
        self.seeding: list[SeedingCall] = []
        self.loss: Any = None
        self._before: dict[str, Any] | None = None
        self._stack = contextlib.ExitStack()

    def note_batch(self, batch: Any, indices: list[int] | None) -> None:
        if self.tracer is not None:
            self.tracer.note_batch(batch, indices)

    def note_loss(self, loss: torch.Tensor) -> None:
        if self.tracer is not None:
            self.tracer.note_loss(loss)

    def __enter__(self) -> InstrumentedStep:
        request = self.request
        self._before = env.apply(request.environment) if request.environment else None
        for name in request.advance:
            draw_once(name, recipe_streams(self.trainee))
        self.watch.fixed = request.fixed_entropy
        feed = self.watch.feed
        if request.kept_entropy and feed is not None:
            self._stack.callback(setattr, feed, "kept_from", feed.kept_from)
            feed.kept_from = request.step
        self.seeding = self._stack.enter_context(self.watch.collecting())
        for part in (
            self.tracer,
            self.ops.tracing() if self.ops else None,
            self.alerts.catching() if self.alerts else None,
        ):
            if part is not None:
                self._stack.enter_context(part)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._stack.__exit__(kind, error, tb)
        finally:
            self.watch.fixed = None
            if self._before is not None:
                env.apply(self._before)

    def result(self, step: int) -> StepResult:
        """The reply to the ``run`` request: the trace, the outcome, the streams and seeding after
        it."""
        tracer = self.tracer
        return StepResult(
            step=step,
            loss=loss_value(self.loss),
            outcome=combine_digests(self.state_hashes()),
            streams_after={n: tree_digest(v) for n, v in self.state.streams.state_dict().items()},
            seeding=[call.to_json() for call in self.seeding],
            entries=tracer.result() if tracer is not None else [],
            kept=dict(tracer.kept) if tracer is not None else {},
            ops=self.ops.result() if self.ops is not None else None,
            alerts=self.alerts.alerts if self.alerts is not None else [],
        )
