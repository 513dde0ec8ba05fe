"""Running a step of an unchanged script again in its own replaying process: the rewind.

An unchanged script's loop (:mod:`bisect_repro.record.autohooks`) cannot be re-entered, but it
need not be: each step begins inside the optimizer step of the step before, before the loop draws
its next batch. :class:`RewindingHookServer` keeps, when the controller fetches a step, everything
that step starts from (the trainee's state as :func:`~bisect_repro.serve.start.keep_start` keeps
it, the learning-rate schedulers the script made, the random streams) and, as the step runs, each
batch the loop draws from a ``DataLoader`` with gradients enabled, with the streams after the draw.
Asked to ``rewind {step}`` while it stands at the next step's start, it puts the kept state back,
gives the step's recorded calls from entropy again (as a fresh process replayed to it would), and
feeds the kept batches again, in order, instead of the loaders' next ones: the loop body runs the
same step again. The reply says whether the step's draws moved a random stream (``consumes``):
then a run under other streams would draw other data in a fresh process, and the controller runs
it in one.

=========================  ==============================================================
the kept step              a rewind
=========================  ==============================================================
is not the last fetched,   refused
or the process is not at
the next step's start
has not run to its end     refused: its batches are not all kept
is the process's first     refused: its start is taken after its batch was drawn (a
(``start_after_draw``      framework's loop takes every step's start so, and rewinds it:
false)                     :mod:`bisect_repro.serve.framework_rewind`)
any other                  state restored, batches fed again
=========================  ==============================================================

Where the guarantees stop: what the loop keeps of its own (a local counter, an object's attribute,
a batch drawn with no ``DataLoader``) is not put back; a rewind is used only once the controller
has checked that it reproduces the step's first run (:mod:`bisect_repro.replay.rewind`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_map

from ..capture.rng import tree_digest
from .hooks import HookServer
from .protocol import StepStart
from .requests import Fetch, Rewind, Streams
from .server import Reply
from .start import KeptStart, keep_start, load_start

__all__ = ["Draw", "RewindingHookServer"]

Draw = tuple[Any, list[int] | None]
"""A batch a loader yielded, with its sample indices (``None`` when unknown)."""


def _copied(batch: Any) -> Any:
    """The batch with each tensor copied (the loop may change a batch in place)."""
    return tree_map(
        lambda leaf: leaf.detach().clone() if isinstance(leaf, torch.Tensor) else leaf, batch
    )


@dataclass
class _KeptDraw:
    source: int
    """The loader it came from (its ``id``)."""
    batch: Any
    indices: list[int] | None
    consumed: bool
    """The draw moved a random stream."""
    after: dict[str, Any]
    """The streams after the draw."""


@dataclass
class _KeptStep:
    start: KeptStart
    schedulers: list[dict[str, Any]]
    draws: list[_KeptDraw] = field(default_factory=list)
    ran: bool = False
    """The step ran to its end since it was kept: its draws are all here."""


class RewindingHookServer(HookServer):
    """A :class:`HookServer` that can run the last fetched step again (see the module docstring)."""

    rewinds = True
    start_after_draw: bool = False
    """Each step's start is taken after its batch was drawn (a framework's loop), not only the
    process's first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.schedulers: list[Any] = []
        """The learning-rate schedulers the script made (kept and put back with the step's
        start)."""
        self._kept: _KeptStep | None = None
        self._keeping = False  # the kept step is running: its draws are kept
        self._feeding: list[_KeptDraw] = []  # a rewound step's draws still to feed

    def draw(self, source: int, take: Callable[[], Draw | None]) -> Draw | None:
        """The next batch of a loader (``take`` draws it; ``None``: the loader is exhausted): in a
        rewound step the kept one again, otherwise drawn, and kept while the kept step runs."""
        if not torch.is_grad_enabled():
            return take()
        if self._feeding and self._feeding[0].source == source:
            kept = self._feeding.pop(0)
            if kept.consumed:
                self.state.streams.load_state_dict(kept.after)
            return _copied(kept.batch), kept.indices
        if not self._keeping or self._kept is None:
            return take()
        before = tree_digest(self.state.streams.state_dict())
        drawn = take()
        if drawn is not None:
            after = self.state.streams.state_dict()
            kept_draw = _KeptDraw(
                source, _copied(drawn[0]), drawn[1], tree_digest(after) != before, after
            )
            self._kept.draws.append(kept_draw)
        return drawn

    def end_step(self) -> None:
        if self._keeping and self._kept is not None:
            self._kept.ran = True
        self._keeping, self._feeding = False, []
        super().end_step()

    def _fetch(self, request: Fetch) -> Reply:
        self._keep()
        return super()._fetch(request)

    def _streams(self, request: Streams) -> Reply:
        # the kept step's, from here
        if self._kept is not None and self._refusal(request.step) is None:
            streams = self._kept.start.streams
            return {"step": self._kept.start.step}, StepStart(
                streams=streams, pre_streams=streams, data=None
            ).to_tree()
        return super()._streams(request)

    def _keep(self) -> None:
        """Keep the start of the step this process stands at (see the module docstring)."""
        streams = self.state.streams.state_dict()
        start = keep_start(self.state, self.current, None, None, streams, {})
        self._kept = _KeptStep(start, [copy.deepcopy(s.state_dict()) for s in self.schedulers])
        self._keeping = True

    def _refusal(self, step: int) -> str | None:
        kept = self._kept
        if kept is None or kept.start.step != step or self.current != step + 1:
            return f"step {step} is not kept here (this process stands at step {self.current})"
        if not kept.ran:
            return f"step {step} did not run to its end since it was kept"
        if step == self.first and not self.start_after_draw:
            return (
                f"step {step} is this process's first: its start was taken after its batch was "
                "drawn"
            )
        return None

    def _rewind(self, request: Rewind) -> Reply:
        step = request.step
        refused = self._refusal(step)
        if refused is not None:
            return {"error": f"cannot rewind: {refused}"}, None
        kept = self._kept
        assert kept is not None
        load_start(self.state, kept.start, None)
        for scheduler, state in zip(self.schedulers, kept.schedulers, strict=True):
            scheduler.load_state_dict(copy.deepcopy(state))
        self.current = self.position = step
        self._feeding = list(kept.draws)
        self._start_streams = kept.start.streams
        self._batch_tensors, self._others, self.loss = {}, [], None
        if self.watch.feed is not None:
            self.watch.feed.give_again(step)
        return {"step": step, "consumes": any(d.consumed for d in kept.draws)}, None
