"""The recorder: the public face of recording a training loop, yours or the one :func:`record`
drives.

A :class:`Recorder` takes one of two roles, chosen once, when it is made (:func:`_open_role`):

- in a training process, a :class:`~bisect_repro.record.session.RecordingSession`: it snapshots the
  run into its directory while it trains (what is written, when, and the crash-safety guarantee:
  see :mod:`bisect_repro.record.session`);
- in a process that ``compare`` or ``doctor`` started to replay a run (``BISECT_REPRO_REPLAY`` set),
  a replay server (:mod:`bisect_repro.serve.server`, :mod:`bisect_repro.serve.hooks`): it records
  nothing and its ``batches()`` serves the controller's requests, so the same loop replays.

Both roles answer the same calls (:class:`Role`), so the recorder itself holds no branch on which
it is. :class:`FrameworkRecorder` is the recorder a framework integration drives from its hooks
(``begin_step``, ``note_batch``, ``log``, ``end_step``), with the arguments only an integration
needs.

"The state at step s" is the state before the s-th call of ``step()``, counted from 0.

Where the guarantees stop: one Recorder per replaying process serves (the first made); a second
one in the same process records as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..capture.pystate import caller_scope
from ..errors import BisectReproError, RecordingWarning
from ..serve.channel import replay_address
from ..trainee import Trainee
from .against import Against
from .options import RecordOptions, SessionPlan
from .session import RecordingSession

if TYPE_CHECKING:  # a replay's roles, imported by the process that replays (_open_role)
    from ..serve.framework_rewind import LoopCounters
    from ..serve.rewind import RewindingHookServer
    from ..serve.server import StepServer

__all__ = [
    "FrameworkRecorder",
    "RecordOptions",
    "Recorder",
    "RecordingWarning",
    "Role",
    "current_step",
    "record",
]


class Role(Protocol):
    """What a recorder does, recording or serving a replay (see the module docstring)."""

    replaying: bool
    stopped_early: bool

    @property
    def step(self) -> int: ...

    @property
    def last_loss(self) -> float | None: ...

    def batches(self, steps: int | None = None) -> Iterator[Any]: ...

    def begin_step(self) -> None: ...

    def note_batch(self, batch: Any, indices: list[int] | None = None) -> None: ...

    def end_step(self) -> None: ...

    def log(self, loss: torch.Tensor | float | None) -> None: ...

    def note_loss(self, loss: torch.Tensor) -> None: ...

    def close(self) -> None: ...

    def abandon(self) -> None: ...


# the one server of a replaying process (see the module docstring)
_server: StepServer | None = None


def _open_role(plan: SessionPlan) -> Role:
    """A replay server when this process was started to replay a run (and none serves yet), else
    a recording session."""
    global _server
    address = replay_address()
    if address is not None and _server is None:
        from ..serve.framework_rewind import FrameworkRewindServer
        from ..serve.rewind import RewindingHookServer
        from ..serve.server import StepServer

        kind = (
            (RewindingHookServer if plan.auto else FrameworkRewindServer)
            if plan.framework
            else StepServer
        )
        accumulate = plan.options.accumulate if plan.options is not None else 1
        _server = kind.connect(
            plan.trainee,
            *address,
            start_step=plan.start_step,
            scope=plan.scope,
            accumulate=accumulate,
        )
        return _server
    return RecordingSession(plan)


class Recorder:
    """Records a training loop, yours or the one :func:`record` drives.

    Use it as a context manager and drive it with :meth:`batches` and :meth:`log`::

        with Recorder("runs/a", trainee, RecordOptions(steps=1000, every=10)) as recorder:
            for batch in recorder.batches():
                recorder.log(train_step(batch))

    or without one: ``recorder = Recorder(...)``, the loop, then ``recorder.close()``.

    ``resume_from=(run, step)`` restores a checkpoint of another run first and records from that
    step on into a new directory; ``restore_streams=False`` restores everything but the random
    streams. ``resume=True`` continues the interrupted run ``out`` itself from its last
    checkpoint; ``options`` may then be left out (the run's own are used) and must otherwise
    schedule the same steps. ``max_pending_writes`` bounds the snapshots waiting to be written.
    ``against`` (a run directory, or :class:`~bisect_repro.record.against.Against`) checks each
    record against that reference run as it is written: at the first difference the run stops at
    its next snapshot, complete, and :meth:`batches` ends (:attr:`stopped_early`); run
    ``compare`` on the two runs for the verdict.
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
        against: Against | Path | str | None = None,
    ) -> None:
        plan = SessionPlan(
            out=out,
            trainee=trainee,
            options=options,
            target=target,
            config=config,
            resume_from=resume_from,
            restore_streams=restore_streams,
            resume=resume,
            max_pending_writes=max_pending_writes,
            against=Against(run=against) if isinstance(against, (Path, str)) else against,
            # a recipe's step: its own module
            scope=caller_scope() if trainee.step is None else None,
        )
        self.trainee = trainee
        self._role = _open_role(plan)

    @property
    def step(self) -> int:
        """The step the loop is at: the 0-based count of steps before this one."""
        return self._role.step

    @property
    def replaying(self) -> bool:
        """Whether this process replays a run for ``compare`` or ``doctor`` instead of recording
        one: the loop body runs again, so guard side effects (saving files, logging to a tracker)
        with it."""
        return self._role.replaying

    @property
    def stopped_early(self) -> bool:
        """Whether the run stopped before its planned end: recorded ``against`` a reference, at a
        difference from it (or at its end, with ``stop_at_end``)."""
        return self._role.stopped_early

    @property
    def last_loss(self) -> float | None:
        """The last loss fetched to the host (recording: at the last snapshot; replaying: the last
        logged)."""
        return self._role.last_loss

    def batches(self, steps: int | None = None) -> Iterator[Any]:
        """Yield one batch per step up to ``steps`` (total, counted from 0), snapshotting as due.

        In a replay (see :attr:`replaying`) the batches are the ones the controller asks for, and
        the loop ends the process when the replay is done.
        """
        _current.append(self)
        try:
            yield from self._role.batches(steps)
        finally:
            _leave(self)

    def log(self, loss: torch.Tensor | float | None) -> None:
        """The loss of the current step; a tensor stays on its device until the next snapshot."""
        self._role.log(loss)

    def close(self) -> None:
        """Commit the final snapshot, mark the run complete when all planned steps ran, wait for the
        writes.

        Raises the :class:`~bisect_repro.errors.RecordingError` of a failed write
        (``on_error="raise"``).
        """
        _leave(self)
        self._role.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            self.close()
        else:
            _leave(self)
            self._role.abandon()


class FrameworkRecorder(Recorder):
    """A recorder a framework's hooks drive: they call :meth:`begin_step`, :meth:`note_batch` for
    each micro-batch, :meth:`log` and :meth:`end_step` for each optimizer step, and :meth:`close`
    at the end. Its steps run while it lives, so it is the running recorder from the start
    (:func:`current_step`). ``start_step``: the step the framework resumes from;
    ``environment``: settings recorded beside the process's fingerprint; ``auto``: driven by the
    hooks of ``record -- python train.py`` (:mod:`bisect_repro.record.autohooks`)."""

    def __init__(
        self,
        out: Path | str,
        trainee: Trainee,
        options: RecordOptions,
        *,
        config: Mapping[str, Any],
        environment: Mapping[str, Any],
        start_step: int,
        auto: bool = False,
        against: Against | None = None,
    ) -> None:
        plan = replace(
            SessionPlan(out=out, trainee=trainee, options=options, config=config, against=against),
            framework=True,
            auto=auto,
        )
        plan = replace(plan, start_step=start_step, environment=environment)
        self.trainee = trainee
        self._role = _open_role(plan)
        _current.append(self)

    def begin_step(self) -> None:
        """A step starts: snapshot the state it starts from, when one is due (replaying: serve the
        controller's requests for this step)."""
        self._role.begin_step()

    def note_batch(self, batch: Any, indices: list[int] | None = None) -> None:
        """The batch (and its sample indices, when known) the current step trains on."""
        self._role.note_batch(batch, indices)

    def end_step(self) -> None:
        """The current step is done (its optimizer step taken)."""
        self._role.end_step()

    def note_loss(self, loss: torch.Tensor) -> None:
        """A tensor ``backward()`` is called on, as it is called: a replay traces it as the last
        part of the forward phase (a loss weighted outside any module); :meth:`log` records it."""
        self._role.note_loss(loss)

    def note_start_streams(self, states: dict[str, Any]) -> None:
        """The random streams as the first step began, before it drew its data (recording only:
        a replay sets the streams at the first step's forward, as its snapshot holds them)."""
        if isinstance(self._role, RecordingSession):
            self._role.start_streams = states

    def follow_loop(self, counters: LoopCounters) -> None:
        """The framework's loop counters: in a replay, a step run again puts them back
        (:mod:`bisect_repro.serve.framework_rewind`)."""
        if not self._role.replaying:
            return
        from ..serve.framework_rewind import FrameworkRewindServer

        if isinstance(self._role, FrameworkRewindServer):
            self._role.counters = counters

    @property
    def rewinder(self) -> RewindingHookServer | None:
        """In a replay of an unchanged script, the server that feeds a rewound step its kept
        batches."""
        if not self._role.replaying:
            return None
        from ..serve.rewind import RewindingHookServer

        return self._role if isinstance(self._role, RewindingHookServer) else None


_current: list[Recorder] = []  # the recorders whose steps are running, innermost last


def _leave(recorder: Recorder) -> None:
    if recorder in _current:
        _current.remove(recorder)


def current_step() -> int:
    """The step the running recorder (recording or replaying) is at: the 0-based count of steps
    before this one. Read it in a step function instead of keeping a counter of your own, which a
    replay from a checkpoint would not restore."""
    if not _current:
        raise BisectReproError("current_step(): no Recorder loop is running; call it inside a step")
    return _current[-1].step


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
    against: Against | None = None,
) -> Path:
    """Run ``trainee.step`` for ``options.steps`` steps under a :class:`Recorder` (``resume``,
    ``against``: see there)."""
    if trainee.step is None:
        raise BisectReproError(
            f"{target or 'trainee'}: the Trainee has no step function; give step=... to record it"
        )
    if options.steps is None:
        raise BisectReproError("record: give the number of steps (--steps)")
    with Recorder(
        out,
        trainee,
        options,
        target=target,
        config=config,
        resume_from=resume_from,
        resume=resume,
        against=against,
    ) as recorder:
        for batch in recorder.batches():
            recorder.log(trainee.step(batch))
            if on_step is not None:
                on_step(recorder.step + 1, recorder.last_loss)
    return Path(out)
