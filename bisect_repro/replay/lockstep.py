"""Two runs replayed side by side, to the first step where they part ways.

:class:`Lockstep` starts a :class:`~bisect_repro.replay.replica.Replica` for each run, restores
each from its last checkpoint at or before the last snapshot the runs agree on, trains both
untraced up to that snapshot, and from there steps them together, each step lightly traced (the
batch, the loss, the state after it), until the traces differ: the divergent step. The replicas
stay there, each holding the state its divergent step starts from, for the experiments.

Every replayed step is checked against its own run's records (data order, batch content, loss,
and the state hashes at each snapshot): ``faithful`` means the replay reproduced what was
recorded, step by step, and ``parted`` names where a replica first did not. A replica that parts
from its records before the divergence reads state no checkpoint holds (a counter in a closure),
or runs in another environment; :meth:`Lockstep.find` then tries once more, in fresh processes,
from the runs' first checkpoint, which a step counter kept outside the trainee does start from. A
step where the replicas agree with each other but one of them not with its records is returned too
(``parted_only``): a nondeterministic step that happened to agree in the replay. ``attempts``
holds each walk. Where the divergent step, run again in its process, seeds from entropy otherwise
than its first run (the loop's ``enumerate`` counter moved on), :meth:`Lockstep.settle_repeats`
has every repeat of it run in a fresh process replayed from the first checkpoints. A replayed call
from entropy not given its recorded value is noted (:mod:`bisect_repro.capture.entropy`).

For a distributed run each replica is a :class:`~bisect_repro.replay.ranked.RankedReplica`: all
its ranks step together, and what is checked and compared is the focus rank's (its replies against
its own records, and against the other run's focus rank).

The two replicas train side by side, except where each trains on as many torch threads as this
machine has cores (as their runs recorded, two threads each on two cores): two OpenMP teams on
too few cores wait on each other's spinning threads, and one after the other is faster; the
answers are the same either way, each replica being its own process. A framework's replicas are
always asked at once, since what they wait on is mostly other processes starting; an unchanged
script's, whose repeats may rewind its one process (:meth:`Lockstep.settle_rewinds`), take turns
as a recipe's do.

Where a framework runs each step once per process, each replica starts a spare process at once,
restored and trained to the last equal snapshot
(:meth:`~bisect_repro.replay.replica.Replica.prefetch`): no experiment repeats a step before it, and
the first repeat then finds its process ready. Its steps are traced in full as they are walked: a
step that runs once per process cannot be traced again in the same state, and a light trace (the
batch, the loss, the state after) misses a difference that a loop with no optimizer only shows at
its next step.

Where the guarantees stop: the replay is only as exact as the recording: the steps between a
checkpoint and the divergence are run again, so their cost is paid once more, and a
nondeterministic kernel may make the replay part from the records by itself (``parted`` says so).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, TypeVar

from ..capture.entropy import FEED_OUTCOMES
from ..capture.seeding import SeedingCall
from ..capture.trace import first_difference
from ..serve.protocol import Fetched, StepResult
from ..serve.requests import Trace
from ..store.run import Run
from .interface import ReplicaFactory, ReplicaLike
from .launch import LaunchSpec, ReplayUnavailable
from .ranked import start_replica
from .replica import ReplicaFailed
from .rewind import unfaithful

__all__ = ["Attempt", "Divergence", "Lockstep", "Parted", "both"]

_log = logging.getLogger(__name__)

T = TypeVar("T")
Progress = Callable[[str, int, int], None]


def both(first: Callable[[], T], second: Callable[[], T]) -> tuple[T, T]:
    """Run two replica requests at once (each waits on its own process)."""
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.submit(first), pool.submit(second)
        return a.result(), b.result()


@dataclass(frozen=True, kw_only=True)
class Parted:
    """Where a replica first parted from its own run's records."""

    run: str
    """``A`` or ``B``."""
    step: int
    what: str
    """What differed: ``data order``, ``batch content``, ``loss`` or ``state at the snapshot``."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Attempt:
    """One walk of the replay: where it started, how many steps it replayed, where it parted."""

    checkpoints: tuple[int, int]
    replayed: int
    parted: tuple[Parted, ...]
    divergent: int | None
    """The step where the replicas differed (or one parted there), ``None`` when none did."""


@dataclass
class Divergence:
    """The first step at which the two replicas differ (or one parts from its records)."""

    step: int
    fetched: tuple[Fetched, Fetched]
    """Each replica's fetch reply at the divergent step (indices, order and batch digests)."""
    light: tuple[StepResult, StepResult]
    parted_only: bool = False
    """The replicas agree at this step, but one of them parted from its own records here."""


class Lockstep:
    """Two replicas of two runs (see the module docstring)."""

    def __init__(
        self,
        runs: tuple[Run, Run],
        specs: tuple[LaunchSpec, LaunchSpec],
        progress: Progress | None = None,
        *,
        start: ReplicaFactory = start_replica,
    ) -> None:
        self.runs = runs
        self.start = start
        """What starts a replica of a spec (:func:`~bisect_repro.replay.ranked.start_replica`)."""
        self.progress = progress or (lambda *args: None)
        self.parted: list[Parted] = []
        self.notes: list[str] = []
        self.from_step: int | None = None
        self.replayed = 0
        self.specs = specs
        self._drawn: set[str] = set()
        self.attempts: list[Attempt] = []
        """Each walk :meth:`find` made, in order."""
        self.first: tuple[int, int] | None = None
        """The runs' first checkpoints, once :meth:`find` was given them."""
        self.started = time.perf_counter()
        threads = sum(int(run.meta.environment.get("torch.get_num_threads") or 1) for run in runs)
        self._fit = threads <= (os.cpu_count() or 1)
        self._launch()

    def _launch(self) -> None:
        runs, specs = self.runs, self.specs
        first = self.start(specs[0], f"run A ({runs[0].path})")
        try:  # run A's process must not outlive a failure to start run B's
            self.replicas = (first, self.start(specs[1], f"run B ({runs[1].path})"))
        except BaseException:
            first.close()
            raise
        try:
            both(self.replicas[0].connect, self.replicas[1].connect)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """End both replicas, at once: each waits for its own process (and spares) to exit."""
        both(self.replicas[0].close, self.replicas[1].close)

    def pair(self, first: Callable[[], T], second: Callable[[], T]) -> tuple[T, T]:
        """A request to each replica: at once, unless both train on more torch threads than this
        machine has cores (as recorded) and each reruns its steps in-process (or may rewind them, an
        unchanged script's), when they run one after the other (see the module docstring)."""
        if (
            all(r.reruns or (r.hello is not None and r.hello.rewinds) for r in self.replicas)
            and not self._fit
        ):
            return first(), second()
        return both(first, second)

    # -- faithfulness --------------------------------------------------------------------------
    def _note_parted(self, which: int, step: int, what: str) -> None:
        label = "AB"[which]
        if not any(p.run == label for p in self.parted):
            _log.info("run %s's replay parted from its records at step %d (%s)", label, step, what)
            self.parted.append(Parted(run=label, step=step, what=what))

    def _check_record(self, which: int, step: int, order: Any, batch: Any, loss: Any) -> None:
        recorded = self.runs[which].steps.get(step)
        if recorded is None:
            return
        for key, value in (("order", order), ("batch", batch), ("loss", loss)):
            if (
                key in recorded
                and recorded[key] is not None
                and value is not None
                and recorded[key] != value
            ):
                self._note_parted(
                    which,
                    step,
                    {"order": "data order", "batch": "batch content", "loss": "loss"}[key],
                )
                return

    def _check_hashes(self, which: int, step: int, hashes: dict[str, str]) -> None:
        run = self.runs[which]
        recorded = run.snapshot(step)["hashes"] if step in run.snapshots else None
        # what the records hold
        if recorded is not None and {name: hashes.get(name) for name in recorded} != recorded:
            self._note_parted(which, step, "state at the snapshot")

    def _note_drawn(self, which: int, step: int, seeding: list[dict[str, Any]]) -> None:
        """Say, once per run, where a replayed call from entropy was not given its recorded
        value."""
        label = "AB"[which]
        for call in seeding:
            how = call.get("replayed")
            if how in ("beyond", "other") and label not in self._drawn:
                self._drawn.add(label)
                self.notes.append(
                    f"run {label}'s {SeedingCall.from_json(call)} at step {step} was "
                    f"{FEED_OUTCOMES[how]}"
                )

    # -- the walk ------------------------------------------------------------------------------
    def _restore(self, checkpoints: tuple[int, int]) -> None:
        for which, replica in enumerate(self.replicas):
            run = self.runs[which]
            replica.restore(run.path, checkpoints[which], run.meta.environment)

    def _skip(self, until: int) -> None:
        def skip(which: int) -> None:
            replica, run = self.replicas[which], self.runs[which]
            assert replica.step is not None
            hashes_at = [s for s in run.snapshots if replica.step < s <= until]
            result = replica.skip(
                until, hashes_at, progress=lambda done: self.progress("replaying", done, until)
            )
            for record in result.records:
                self._check_record(which, record.step, record.order, record.batch, record.loss)
            for step, hashes in result.hashes.items():
                self._check_hashes(which, step, hashes)

        self.pair(lambda: skip(0), lambda: skip(1))

    def find(
        self,
        checkpoints: tuple[int, int],
        last_equal: int,
        end: int,
        first: tuple[int, int] | None = None,
    ) -> Divergence | None:
        """Replay from the checkpoints to the first step in ``[last_equal, end]`` where the two
        replicas differ; ``first``: the runs' first checkpoints, tried when a replica parts from its
        records on the way (see the module docstring)."""
        self.first = first
        found = self._attempt(checkpoints, last_equal, end)
        if (
            (found is None or found.parted_only)
            and self.parted
            and first is not None
            and first != checkpoints
        ):
            where = ", ".join(f"run {p.run} at step {p.step} ({p.what})" for p in self.parted)
            self.notes.append(
                f"the replay from the checkpoints at steps {checkpoints[0]}/{checkpoints[1]} "
                f"parted from the records ({where}): "
                "the loop reads state the checkpoints do not hold (a local counter of the running "
                "loop, such as enumerate's, "
                "or an object's attribute; read recorder.step or bisect_repro.current_step() "
                "instead); "
                "replaying from the first checkpoints instead"
            )
            self.parted.clear()
            # fresh processes: the state the first replay left in them is what misled it
            self.close()
            self._launch()
            found = self._attempt(first, min(first), end)
        return found

    def _attempt(
        self, checkpoints: tuple[int, int], last_equal: int, end: int
    ) -> Divergence | None:
        found = self._walk(checkpoints, last_equal, end)
        self.attempts.append(
            Attempt(
                checkpoints,
                self.replayed,
                tuple(self.parted),
                found.step if found is not None else None,
            )
        )
        return found

    def _bounded(self, checkpoints: tuple[int, int], end: int) -> None:
        """Refuse a span the step logs do not hold: every step replayed is a step its run logged
        (each run from its own checkpoint: one that resumed from the other's state starts
        later)."""
        for which, run in enumerate(self.runs):
            start = checkpoints[which]
            logged = sum(1 for step in run.steps if start <= step <= end)
            if logged < end + 1 - start:
                raise ReplayUnavailable(
                    f"run {'AB'[which]}: the replay would train steps {start} to {end}, of which "
                    "its step log holds "
                    f"{logged}; the run was edited or partly copied; the verdict is from the "
                    "records alone"
                )

    def _walk(self, checkpoints: tuple[int, int], last_equal: int, end: int) -> Divergence | None:
        _log.info(
            "replaying from the checkpoints at steps %d/%d, untraced to step %d, then step by step "
            "to %d",
            *checkpoints,
            last_equal,
            end,
        )
        self.from_step = min(checkpoints)
        self._bounded(checkpoints, end)
        self._restore(checkpoints)
        # a framework's run repeats a step in a fresh process: have one ready
        for replica in self.replicas:
            replica.prefetch(last_equal)
        self._skip(last_equal)
        start = last_equal
        hashes = both(self.replicas[0].hashes, self.replicas[1].hashes)
        if hashes[0] != hashes[1]:
            start = max(checkpoints)
            self.notes.append(
                f"the replayed runs already differ at step {last_equal}, where the records agree; "
                f"replaying step by step from {start}"
            )
            self._restore(checkpoints)
            self._skip(start)
        total = end + 1 - self.from_step
        for step in range(start, end + 1):
            self.progress("replaying", step + 1 - self.from_step, total)
            fetched = self.pair(self.replicas[0].fetch, self.replicas[1].fetch)
            # a step that runs once a process: traced in full at once
            trace: Trace = "light" if self.replicas[0].reruns else "full"
            light = self.pair(
                *(partial(replica.run, step, trace=trace, commit=True) for replica in self.replicas)
            )
            for which in (0, 1):
                # a framework's loop tells the batch only as it runs
                batch = fetched[which].batch or light[which].batch
                self._check_record(which, step, fetched[which].order, batch, light[which].loss)
                self._note_drawn(which, step, light[which].seeding)
                if step + 1 in self.runs[which].snapshots:
                    self._check_hashes(which, step + 1, self.replicas[which].hashes())
            self.replayed = step + 1 - self.from_step
            if first_difference(light[0].entries, light[1].entries) is not None:
                return Divergence(step, fetched, light)
            # the runs agree, but not with their records
            if any(p.step == step for p in self.parted):
                return Divergence(step, fetched, light, parted_only=True)
        return None

    def settle_repeats(self, divergence: Divergence) -> None:
        """Where the divergent step, run again in its process, makes other seeding calls from
        entropy than its first run did (the loop's own state, such as ``enumerate``'s counter, has
        moved on), every repeat of it runs in a fresh process replayed from the runs' first
        checkpoints instead, whose first run of the step is the run's (see the module docstring)."""
        if self.first is None or not all(r.reruns for r in self.replicas):
            return
        again = self.pair(
            *(partial(replica.run, divergence.step, trace="none") for replica in self.replicas)
        )

        def calls(result: StepResult) -> list[tuple[Any, Any]]:
            return [(c.get("call"), c.get("where")) for c in result.seeding if c.get("entropy")]

        moved = [
            label
            for label, first, rerun in zip("AB", divergence.light, again, strict=True)
            if calls(first) != calls(rerun)
        ]
        if not moved:
            return
        for replica, first in zip(self.replicas, self.first, strict=True):
            replica.repeat_afresh(first)
        self.notes.append(
            f"step {divergence.step} run again in the same process makes other seeding calls than "
            "its first run "
            f"(run {' and run '.join(moved)}): it reads state a repeat does not put back (a loop's "
            "enumerate counter, an object's "
            "attribute); every experiment repeats the step in a fresh process replayed from the "
            "first checkpoints "
            f"(steps {self.first[0]}/{self.first[1]})"
        )

    def settle_rewinds(self, divergence: Divergence) -> None:
        """Where a replica's process runs each step once but can rewind (an unchanged script's),
        show that a rewind reproduces the divergent step's first run and its records: then its
        repeats rewind that process; otherwise they are fresh processes, and a note says why (see
        :mod:`~bisect_repro.replay.rewind`)."""
        trace: Trace = "light" if self.replicas[0].reruns else "full"  # as the walk traced the step

        def settle(which: int) -> None:
            replica = self.replicas[which]
            if replica.reruns or replica.hello is None or not replica.hello.rewinds:
                return
            why = self._rewound(
                replica, self.runs[which], divergence.step, divergence.light[which], trace
            )
            if why is None:
                return
            self.notes.append(
                f"run {'AB'[which]}'s step {divergence.step} is repeated in fresh processes "
                "replayed to it, "
                f"not by rewinding its replaying process: rewound, it {why}"
            )
            replica.prefetch(divergence.step)

        self.pair(lambda: settle(0), lambda: settle(1))

    def stopped_rewinds(self) -> list[str]:
        """A note for each run whose verified rewind stopped serving its repeats
        (:attr:`~bisect_repro.replay.rewind.Rewinds.stopped`)."""
        return [
            f"run {'AB'[which]}'s later repeats ran in fresh processes, not by rewinding its "
            f"replaying process: {replica.rewinds.stopped}"
            for which, replica in enumerate(self.replicas)
            if replica.rewinds.stopped is not None
        ]

    @staticmethod
    def _rewound(
        replica: ReplicaLike, run: Run, step: int, first: StepResult, trace: Trace
    ) -> str | None:
        """Rewind ``replica`` to ``step`` and run it as its first run (``first``) was traced:
        ``None`` when it reproduces that run and the records (the step's repeats then rewind), else
        why not."""
        try:
            consumes = replica.rewind(step)
            why = unfaithful(first, replica.run(step, trace=trace), run, step, replica.hashes())
        except ReplicaFailed as error:
            replica.step = step + 1  # whatever happened, the next repeat takes a fresh process
            why = f"failed: {error}"
        if why is None:
            replica.rewinds.step, replica.rewinds.consumes = step, consumes
        else:
            replica.rewinds.refused = True
        return why

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started
