"""Running a step of a framework's loop again in its own replaying process: the framework rewind.

A framework (Lightning, the Hugging Face ``Trainer``) draws a step's batch before the step starts
and hands it to the callback, so the step's start is taken after the draw, and the process cannot
be made to draw that batch again. It need not: when the controller fetches a step,
:class:`FrameworkRewindServer` keeps what the step starts from (the trainee's state, the random
streams, the loop counters the framework keeps, :class:`LoopCounters`) and, as the step runs, a
copy of each batch the framework hands over. Asked to ``rewind {step}`` while it stands at the
next step's start (whose batch the framework has just drawn), it puts the kept state and counters
back and, as the framework hands over each batch of the step run again, copies the kept batch
into it, in place (the framework's loop then trains on the kept data). The reply to a rewound
step's ``run`` is held until the framework reaches the next step's start, and sent only where the
loop stands there as it did after the step's first run (:meth:`LoopCounters.position`: the
same step count, the same epoch); otherwise the reply is an error and the controller takes a fresh
process.

=============================================  =================================================
a rewound step                                 its ``run`` reply
=============================================  =================================================
hands over a batch of another structure,       an error: the kept batch cannot be put in
shape or non-tensor leaf, or more or fewer     its place
batches than its first run
reaches the next step's start elsewhere (an    an error: the framework's loop did not go on
epoch ended, another step count), or           as after the first run
training ends
any other                                      the step's result
=============================================  =================================================

Each rewind draws a batch no step trains on (the next step's, drawn before the rewind), so a process
that has rewound refuses to train on past the rewound step: it runs that step again, or nothing.

Where the guarantees stop: what the loop keeps of its own beyond :class:`LoopCounters` (a local
``batch_idx`` handed to the step, an attribute of a callback) is not put back; the controller uses a
rewind only once one has reproduced the step's first run and its records
(:mod:`bisect_repro.replay.rewind`). A batch drawn during the step (a micro-batch after the first,
where the framework draws them one by one) is replaced by the kept one: a run under other streams
then takes a fresh process (``consumes``), where the draw sees those streams.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..capture.batch import batch_tensors
from .requests import Request, Rewind, Run, Skip
from .rewind import RewindingHookServer
from .server import Reply

__all__ = [
    "FrameworkRewindServer",
    "KeptBatch",
    "LoopCounters",
    "feed_batch",
    "keep_batch",
    "refusal_after_rewind",
    "rewound_answer",
]


class LoopCounters(Protocol):
    """The counters a framework's loop keeps (its step count, its batch progress), kept and put back
    with a step's start."""

    draws_during_step: bool
    """The framework draws a step's micro-batches after the first once the step has started."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def position(self) -> Any:
        """Where the loop stands, compared at the next step's start after a step and after its
        rewound run."""
        ...


@dataclass
class KeptBatch:
    """A copy of a batch the framework handed over: its tensors by path, its other leaves as
    text."""

    tensors: dict[str, torch.Tensor]
    others: list[str]


def keep_batch(batch: Any) -> KeptBatch:
    """A copy of ``batch`` (the step may change it in place)."""
    tensors, others = batch_tensors(batch)
    return KeptBatch({path: tensor.detach().clone() for path, tensor in tensors.items()}, others)


def feed_batch(kept: KeptBatch, batch: Any) -> str | None:
    """Copy the kept batch's tensors into ``batch``, in place; why not (``None``: done), in
    words."""
    tensors, others = batch_tensors(batch)
    if others != kept.others or sorted(tensors) != sorted(kept.tensors):
        return "the framework handed over a batch of another structure"
    for path, tensor in tensors.items():
        if (tensor.shape, tensor.dtype) != (kept.tensors[path].shape, kept.tensors[path].dtype):
            return f"the framework handed over a batch whose {path} has another shape or dtype"
    # the copy is no op of the step: tracers do not see it
    with torch.no_grad(), _disable_current_modes():
        for path, tensor in tensors.items():
            tensor.copy_(kept.tensors[path])
    return None


def rewound_answer(result: Reply, unfed: str | None, first: Any, arrival: Any) -> Reply:
    """The reply to a rewound step's ``run`` once the loop stands at the next step's start
    (``arrival``, where the step's first run left it: ``first``); ``unfed``: why its batches were
    not all put in place."""
    if unfed is not None:
        return {"error": f"cannot run the rewound step: {unfed}"}, None
    if arrival != first:
        return {
            "error": "the rewound step left the framework's loop elsewhere than its first run did "
            "(an epoch ended, or training)"
        }, None
    return result


def refusal_after_rewind(rewound: int | None, current: int, request: Request | None) -> str | None:
    """Why a process standing at ``current`` that rewound step ``rewound`` (``None``: none) may not
    train as ``request`` asks: past the rewound step (``None``: it may)."""
    onward = (isinstance(request, Run) and request.step != rewound) or (
        isinstance(request, Skip) and request.until > current
    )
    if rewound is not None and onward:
        return (
            f"this process rewound step {rewound}: its loader has handed over batches no step "
            "trained on, it cannot train on"
        )
    return None


@dataclass
class _Rewound:
    """The framework-side record of the kept step."""

    counters: dict[str, Any]
    batches: list[KeptBatch] = field(default_factory=list)
    arrival: Any = None
    """Where the loop stood at the next step's start after the step's first run (``None``: not yet
    there)."""
    rewound: bool = False
    """The step was rewound: the loader has run ahead of the steps trained."""


class FrameworkRewindServer(RewindingHookServer):
    """A hook server that can run the last fetched step of a framework's loop again (see the module
    docstring)."""

    start_after_draw = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counters: LoopCounters | None = None
        """The framework's loop counters (the integration sets them; without them no rewind is
        made)."""
        self._loop: _Rewound | None = None
        # a rewound step's batches still to put in place
        self._feeding_batches: list[KeptBatch] | None = None
        self._unfed: str | None = None  # why a rewound step's batches could not all be put in place
        # a rewound step's result, and why its batches were not fed
        self._held: tuple[Reply, str | None] | None = None
        # at a rewound step's end: its kept batches not handed over
        self._left: list[KeptBatch] | None = None

    # -- the recorder's calls --------------------------------------------------------------------
    def begin_step(self) -> None:
        held, self._held = self._held, None
        loop, kept = self._loop, self._kept
        if (
            loop is not None
            and kept is not None
            and kept.ran
            and loop.arrival is None
            and self.current == kept.start.step + 1
        ):
            loop.arrival = self._arrival()  # the step's first run ended here
        if held is not None and loop is not None:
            self.channel.send(*rewound_answer(*held, loop.arrival, self._arrival()))
        super().begin_step()

    def note_batch(self, batch: Any, indices: list[int] | None = None) -> None:
        if self._feeding_batches is not None:
            why = (
                feed_batch(self._feeding_batches.pop(0), batch)
                if self._feeding_batches
                else "more batches than its first run"
            )
            self._unfed = self._unfed or why
        elif self._keeping and self._loop is not None:
            self._loop.batches.append(keep_batch(batch))
        super().note_batch(batch, indices)

    def end_step(self) -> None:
        self._feeding_batches, self._left = None, self._feeding_batches
        try:
            super().end_step()  # sends the step's result through _send_result
        finally:
            self._left = None

    def _send_result(self, reply: Reply) -> None:
        left, self._left = self._left, None
        if left is None:  # not a rewound step
            super()._send_result(reply)
            return
        unfed, self._unfed = (
            self._unfed or ("fewer batches than its first run" if left else None),
            None,
        )
        self._held = reply, unfed

    def close(self) -> None:
        self._held = None  # the error close sends answers the rewound step's run
        super().close()

    # -- the kept step
    # ------------------------------------------------------------------------------
    def _arrival(self) -> Any:
        assert self.counters is not None
        return self.counters.position()

    def _keep(self) -> None:
        super()._keep()
        self._loop = _Rewound(self.counters.state_dict()) if self.counters is not None else None

    def _refusal(self, step: int) -> str | None:
        if self.counters is None or self._loop is None:
            return "the framework's loop counters are not known"
        return super()._refusal(step)

    def _refusal_to_train(self, request: Request | None) -> str | None:
        rewound = (
            self._kept.start.step
            if self._kept is not None and self._loop is not None and self._loop.rewound
            else None
        )
        return refusal_after_rewind(rewound, self.current, request)

    def _rewind(self, request: Rewind) -> Reply:
        reply, tree = super()._rewind(request)
        if "error" in reply:
            return reply, tree
        assert self.counters is not None and self._loop is not None
        self.counters.load_state_dict(self._loop.counters)
        self._loop.rewound = True
        self._feeding_batches, self._unfed = list(self._loop.batches), None
        consumes = self.counters.draws_during_step and len(self._loop.batches) > 1
        return {**reply, "consumes": consumes}, tree
